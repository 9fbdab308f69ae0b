"""The engine's one command doorway, and the host its verb mixins share.

Every write of the engine takes the same way in. The arguments are checked first, outside any
transaction; then `transact` runs the command's decision inside the calling thread's write
transaction (or a new one); the decision reads the projection, refuses by raising before it
appends anything, and hands the events it decided to `append`, which validates and encodes them
once; the log's projector folds them into the projection in the same transaction. Session verbs
come in through `SessionHost._command`, which adds the checks every such verb makes (the store is
writable, the id is well formed, the session is open) and gives the decision a `Command`.

No append here passes the version it read: a write transaction holds the log's write lock (LMDB's,
or PostgreSQL's exclusive lock), so nobody else can have written to the stream since the decision
read it, and the check could never fail; it would only cost an index lookup per command.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import projections as pj
from eventlog import (
    ANY,
    NO_STREAM,
    CapacityError,
    EventLog,
    InvalidArgumentError,
    LogView,
    SessionExistsError,
    Transaction,
    UnknownSessionError,
)
from eventlog import events as ev
from eventlog.errors import ForgottenError
from sessions._hot import HotTranscripts
from sessions._ids import check_session_id, uuid7
from sessions._keyring import Keyring
from sessions._seal import Sealer

R = TypeVar("R")

_VALID_IDS_MAX = 4096
"""Session ids `_checked_id` remembers as valid before it starts over."""


def transact(log: EventLog, decide: Callable[[Transaction], R]) -> R:
    """`decide(tx)` inside the calling thread's write transaction on `log`, or inside a new one
    that commits when it returns. A decision raises before it appends anything, so joining the
    caller's transaction needs no savepoint."""
    tx = log.current_transaction()
    if tx is not None and not log.closed:  # the common case inside `store.transaction()`
        return decide(tx)
    with log.transaction() as tx:
        return decide(tx)


def append(
    tx: Transaction,
    stream: str,
    events: Sequence[ev.Event],
    *,
    meta: dict[str, Any] | None = None,
    checked: bool = False,
    new: bool = False,
    sealer: Sealer | None = None,
) -> list[int]:
    """Append what a decision decided, at the version the stream has (see the module's text), or,
    with `new`, only if the stream does not exist yet (`ConcurrencyError` otherwise). `checked`:
    every field of every event already holds exactly its declared, immutable type (see
    `Transaction.append`). A store with keys passes its `sealer`: the content of an encrypted
    session's events is sealed here, on the one way in (`sessions/_seal.py`), and so are the
    digests a stamp on the transaction names (`key_stamp`)."""
    if sealer is not None and events:
        events = sealer.seal(tx, stream, list(events))
        key_stamp(tx, sealer.keyring, stream, events[0])
    return tx.append(
        stream, events, expected_version=NO_STREAM if new else ANY, meta=meta, checked=checked
    )


def key_stamp(tx: Transaction, keyring: Keyring, stream: str, first: ev.Event) -> None:
    """Key the digests the transaction's pending stamp names (`Transaction.stamp_next_append`)
    when its append goes to an encrypted session (`stream`, starting with `first`): each is kept
    as its digest under the session's data key (`Keyring.keyed`), as a caller's idempotency key
    is, so a retry that keys its own the same way finds it while the key lives, and once `forget`
    destroys the key no guess of what the caller sent can be checked against it."""
    stamp = tx.next_stamp
    if stamp is None or not stamp.digests or stamp.stream not in (None, stream):
        return
    if isinstance(first, (ev.SessionOpened, ev.SessionForked)):
        slot = first.key_slot  # a session this append creates: its key is new
    else:
        state = pj.load_state(tx, stream)
        slot = 0 if state is None else state.key_slot
    if not slot:
        return  # a plain session keeps the stamp as it is
    keyed: dict[str, Any] = {}
    for name in stamp.digests:
        keyed[name] = keyring.keyed(slot, stamp.meta[name], "write")
        if keyed[name] is None:
            raise ForgottenError(stream, "write")
    tx.stamp_next_append({**stamp.meta, **keyed})


class Command:
    """What a session verb's decision works with: the open write transaction, and the state and
    transcript of the session it acts on, as the projection holds them in that transaction."""

    __slots__ = ("sealer", "session_id", "state", "transcript", "tx")

    def __init__(
        self,
        tx: Transaction,
        state: pj.SessionState,
        transcript: pj.Transcript,
        sealer: Sealer | None = None,
    ) -> None:
        self.tx = tx
        self.sealer = sealer
        self.session_id = state.session_id
        self.state = state
        self.transcript = transcript

    def emit(
        self,
        events: Sequence[ev.Event],
        *,
        stream: str | None = None,
        meta: dict[str, Any] | None = None,
        checked: bool = False,
    ) -> list[int]:
        """`append` `events` to the session (or to `stream`, a session the command creates)."""
        target = self.session_id if stream is None else stream
        return append(self.tx, target, events, meta=meta, checked=checked, sealer=self.sealer)


class SessionHost:
    """What `SessionStore` and its verb mixins share: the log, the checks every command makes,
    and `_command`, the doorway every verb on an open session writes through."""

    log: EventLog
    readonly: bool
    readonly_at: int | None
    max_sessions: int | None
    _hot: HotTranscripts
    """The transcripts (and polled pages) this process read last, kept decoded."""
    _valid_ids: set[str]
    _sealer: Sealer | None
    """Seals and opens the content of encrypted sessions; None in a store that has none."""
    _keyring: Keyring

    def _new_key(self, tx: Transaction, session_id: str, verb: str) -> int:
        """The keyring slot a session opened (or forked) now encrypts under; 0 in a store without
        keys. An id opened again keeps its key, so `forget` has one key to destroy."""
        keyring = self._keyring
        if not keyring.encrypted:
            return 0
        before = pj.load_state(tx, session_id)
        if before is not None and before.key_slot and not before.forgotten:
            keyring.provider_checked(verb)
            return before.key_slot
        slot, _ = keyring.new_key(session_id, verb, above=pj.highest_key_slot(tx))
        return slot

    def _opener(self, view: LogView, state: pj.SessionState, verb: str) -> pj.Opener | None:
        """What opens the sealed messages `state`'s transcript may hold (None: no keyring);
        `ForgottenError` for a forgotten session."""
        sealer = self._sealer
        return None if sealer is None else sealer.opener(view, state, verb)

    def _keeps_reads(self) -> bool:
        """Whether what is read now may be kept for later reads: there is a cache to keep it in,
        and the read is not inside a transaction, whose writes could still be rolled back."""
        return self._hot.cap > 0 and not self.log.in_transaction

    def _cache_usable(self, view: LogView, state: pj.SessionState) -> bool:
        """Whether what this process cached of `state`'s messages may still be shown: not when
        an ancestor whose messages a fork shares was forgotten (in any process) since."""
        if self._sealer is None:
            return True
        seen = {state.session_id}
        parent_id = state.parent_id
        while parent_id is not None and parent_id not in seen:
            parent = pj.load_state(view, parent_id)
            if parent is None:
                return True
            if parent.forgotten:
                return False
            seen.add(parent_id)
            parent_id = parent.parent_id
        return True

    def _opened(self, state: pj.SessionState, verb: str) -> pj.SessionState:
        """`state` with its sealed texts and values opened."""
        sealer = self._sealer
        return state if sealer is None else sealer.open_state(state, verb)

    def _view(self) -> AbstractContextManager[LogView]:
        return self.log.view()

    def _writable(self, verb: str) -> None:
        if self.readonly_at is not None:
            raise InvalidArgumentError(
                f"{verb}: this is a read-only view of the store as of position {self.readonly_at}"
            )
        if self.readonly:
            raise InvalidArgumentError(
                f"{verb}: the store {self.log.description} is open read-only"
            )

    def _checked_id(self, session_id: object, verb: str) -> str:
        """`check_session_id`, remembered: a command names the same few sessions again and
        again, and an id that passed once passes always."""
        if type(session_id) is str and session_id in self._valid_ids:
            return session_id
        sid = check_session_id(session_id, where=verb)
        if len(self._valid_ids) >= _VALID_IDS_MAX:
            self._valid_ids.clear()
        self._valid_ids.add(sid)
        return sid

    def _command(self, verb: str, session_id: object, decide: Callable[[Command], R]) -> R:
        """The doorway of a verb on an open session: refuse a read-only store and a malformed id,
        then run `decide` inside the write transaction on the session as the projection holds
        it there (`UnknownSessionError` when it is not open); the decision appends through
        `Command.emit` and returns the verb's result."""
        if self.readonly:  # also set for a view as of a position
            self._writable(verb)
        sid = self._checked_id(session_id, verb)
        log = self.log
        tx = log.current_transaction()
        if tx is None or log.closed:  # not inside `store.transaction()`: a commit of its own
            return transact(log, lambda tx: self._decide_on(tx, verb, sid, decide))
        return self._decide_on(tx, verb, sid, decide)

    def _decide_on(self, tx: Transaction, verb: str, sid: str, decide: Callable[[Command], R]) -> R:
        state, transcript = pj.load_session(tx, sid)
        if state is None or state.status != pj.ACTIVE or transcript is None:
            raise UnknownSessionError(
                sid, verb, closed=state is not None and state.status == pj.CLOSED
            )
        if state.forgotten:
            raise ForgottenError(sid, verb, state.forgotten_reason)
        return decide(Command(tx, state, transcript, self._sealer))

    def _state(
        self, view: LogView, session_id: object, verb: str, *, closed: bool = False
    ) -> pj.SessionState:
        """The state of an open session (or, with `closed=True`, of a closed one too: reads of a
        closed session still work; only `delete` makes a session unreadable)."""
        sid = check_session_id(session_id, where=verb)
        state = pj.load_state(view, sid)
        if state is None or not readable(state, closed):
            raise UnknownSessionError(
                sid, verb, closed=state is not None and state.status == pj.CLOSED
            )
        return state

    def _check_capacity(self, tx: Transaction, verb: str) -> None:
        if self.max_sessions is not None and pj.active_count(tx) >= self.max_sessions:
            raise CapacityError(
                f"{verb}: the store holds max_sessions = {self.max_sessions} open sessions"
            )

    def _claim_new_id(self, tx: Transaction, session_id: object, verb: str) -> str:
        if session_id is None:
            return uuid7()
        sid = check_session_id(session_id, where=verb)
        existing = pj.load_state(tx, sid)
        if existing is not None and existing.status == pj.ACTIVE:
            raise SessionExistsError(f"{verb}: session `{sid}` already exists")
        return sid


def readable(state: pj.SessionState, closed: bool) -> bool:
    """Whether a session in `state` can be read (closed ones only when `closed`)."""
    return state.status == pj.ACTIVE or (closed and state.status == pj.CLOSED)
