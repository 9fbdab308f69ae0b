"""Forgetting on purpose: `forget` destroys a session's data key; `rotate_keys` re-wraps them all;
`keyed_digest` keys a caller's digest by a session's key, so `forget` takes that with it too.

`forget` is crash-safe in three steps, each synced before the next: the keyring's header names the
slot being destroyed; the `session_forgotten` event commits; the slot is zeroed and the mark
cleared. Whoever opens the store next finishes a forget that stopped half way: the slot is
zeroed when the event committed, and kept when it did not, so a crash leaves the session either
as it was or forgotten, never between. Every step runs under the log's write lock, which is also
what a rotation in another process takes, so neither ever sees the other half done.
"""

from __future__ import annotations

import projections as pj
from eventlog import (
    ConcurrencyError,
    EventLog,
    InvalidArgumentError,
    Transaction,
    UnknownSessionError,
)
from eventlog import events as ev
from sessions._checks import check_text
from sessions._host import SessionHost, append
from sessions._ids import check_session_id, possible_id
from sessions._keyring import FileSlots, Keyring, Slots
from sessions._keys import KeyProvider


def keyring_of(log: EventLog, keys: KeyProvider | None) -> Keyring:
    """The keyring of `log`'s store: a file in an LMDB store's directory, a table of a database
    store, memory for the memory log."""
    if log.path is not None:
        return Keyring(FileSlots(log.path), keys)
    served = log.keyring_slots()
    if served is not None:
        return Keyring(served, keys)
    return Keyring(Slots(), keys)


def finish_shredding(log: EventLog, keyring: Keyring) -> None:
    """Finish what a `forget` or a rotation left half done when its process died."""
    if not keyring.slots.exists():
        return
    if keyring.pending_shred() is None and not _leftover(keyring):
        return
    with log.transaction() as tx:
        _finish(tx, keyring)


def _leftover(keyring: Keyring) -> bool:
    return isinstance(keyring.slots, FileSlots) and keyring.slots.has_leftover()


def _finish(tx: Transaction, keyring: Keyring) -> None:
    keyring.slots.tidy()
    pending = keyring.pending_shred()
    if pending is None:
        return
    slot, session_id = pending
    state = pj.load_state(tx, session_id)
    committed = state is not None and state.forgotten and state.key_slot == slot
    keyring.end_shred(destroy=committed)


class ShredVerbs(SessionHost):
    """`forget` and `rotate_keys`, mixed into the store."""

    def _forget_cached(self) -> None:
        """Drop whatever this process holds decrypted (the store clears its caches)."""

    def forget(
        self, session_id: str, reason: str | None = None, *, expected_version: int | None = None
    ) -> None:
        """Crypto-shred a session: append `session_forgotten` and destroy its data key, so its
        content can never be read again while the log still verifies. Reads then raise
        `ForgottenError`; its ancestry and its events' kinds remain. A fork keeps its own
        messages; what it shares of this session reads as placeholders marked
        ``metadata.forgotten``, and what it wrote itself from them (a summary, a reply) stays
        under its own key. Forgetting a forgotten session does nothing.

        `expected_version`: forget only if the session's stream is still at that version (what
        the caller judged, e.g. a closed session a sweep found due), checked in the same commit
        that forgets; else raise `ConcurrencyError` with nothing written and no key destroyed."""
        verb = "forget"
        self._writable(verb)
        sid = check_session_id(session_id, where=verb)
        check_text(reason, "reason", verb)
        if expected_version is not None and (
            isinstance(expected_version, bool)
            or not isinstance(expected_version, int)
            or expected_version < 1
        ):
            raise InvalidArgumentError(
                f"{verb}: `expected_version` must be an int >= 1 or None, got {expected_version!r}",
                where=verb,
                expected="int >= 1",
                got=expected_version,
            )
        if self.log.in_transaction:
            raise InvalidArgumentError(
                f"{verb}: runs in commits of its own; call it outside store.transaction()",
                where=verb,
            )
        keyring = self._keyring
        with self.log.transaction() as tx:
            _finish(tx, keyring)
            state = pj.load_state(tx, sid)
            if state is None:
                raise UnknownSessionError(sid, verb)
            if state.forgotten:
                return
            if expected_version is not None:
                version = tx.stream_version(sid)
                if version != expected_version:
                    raise ConcurrencyError(sid, expected_version, version)
            if not state.key_slot:
                raise InvalidArgumentError(
                    f"{verb}: session `{sid}` is not encrypted, so it has no key to destroy "
                    "(open the store with keys= to encrypt new sessions)",
                    where=verb,
                )
            keyring.provider_checked(verb)  # a wrong key changes nothing, this included
            keyring.begin_shred(state.key_slot, sid)
            try:
                forgotten = ev.SessionForgotten(reason=reason, key_slot=state.key_slot)
                append(tx, sid, [forgotten], sealer=self._sealer)
            except BaseException:
                keyring.end_shred(destroy=False)
                raise
        with self.log.transaction() as tx:
            _finish(tx, keyring)
        self._forget_cached()

    def keyed_digest(self, session_id: object, text: str) -> str | None:
        """`text`, a digest of what a caller sent, as a write to `session_id` keeps the digests
        its stamp names (`Transaction.stamp_next_append`): keyed by the session's data key when
        the session is encrypted, so a retry that keys its own finds the first attempt's while
        the key lives, and nothing can be checked against it after `forget`. None when
        `session_id` names no encrypted session (a plain one, none, or no session id at all):
        such a stamp is kept as it is. `ForgottenError` once the session was forgotten;
        `MissingKeyError` in a store opened without its keys. Inside `store.transaction()` it
        reads that transaction's view."""
        verb = "keyed_digest"
        if not isinstance(text, str) or not text:
            raise InvalidArgumentError(
                f"{verb}: `text` must be a non-empty str, got {type(text).__name__}", where=verb
            )
        sid = possible_id(session_id)
        if sid is None:
            return None
        with self.log.view() as view:  # inside `store.transaction()`, the transaction's view
            state = pj.load_state(view, sid)
        return None if state is None else self._keyring.keyed_for(state, text, verb)

    def rotate_keys(self, new: KeyProvider) -> int:
        """Re-wrap every data key under the key-encryption key of `new` and use it from now on;
        no event changes. Returns how many keys were re-wrapped. The old key opens nothing after."""
        verb = "rotate_keys"
        self._writable(verb)
        if self.log.in_transaction:
            raise InvalidArgumentError(
                f"{verb}: runs in a commit of its own; call it outside store.transaction()",
                where=verb,
            )
        keyring = self._keyring
        if not keyring.slots.exists():
            raise InvalidArgumentError(f"{verb}: the store has no encrypted session", where=verb)
        with self.log.transaction() as tx:
            _finish(tx, keyring)
            return keyring.rotate(new, verb)
