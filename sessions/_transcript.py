"""Transcript verbs of `SessionStore`, mixed into it: inject, pop, rewind, reset, trim, fork and
compact. Each is one command: checked, then written in one transaction, or not at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import projections as pj
from eventlog import (
    ConcurrencyError,
    InvalidArgumentError,
    LengthConflictError,
    LimitExceededError,
    LogView,
    SessionExistsError,
    SessionLogError,
    check_encodable,
    limits,
)
from eventlog import events as ev
from sessions import _compact
from sessions._batches import PackedMessages, blame_message, message_events
from sessions._checks import check_count, check_text
from sessions._group import grouped
from sessions._host import Command, SessionHost
from sessions._ids import check_session_id
from sessions._messages import plain_message, to_dicts, to_message
from sessions._seal import Sealer


class TranscriptVerbs(SessionHost):
    """The verbs that change a transcript."""

    token_counter: _compact.TokenCounter
    summarizer: _compact.Summarizer | None

    @grouped
    def inject(
        self,
        session_id: str,
        message: Mapping[str, Any],
        *,
        expected_length: int | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        """Append one message (a dict with at least a non-empty `role`, or an `item`).

        `expected_length`: write only if the transcript holds exactly that many entries, else
        raise `LengthConflictError` (optimistic concurrency). `idempotency_key`: a command
        repeated with a key this session has already seen writes nothing (a retried write
        whose first attempt did commit is not applied twice)."""
        expected = _optional_count(expected_length, "expected_length", "inject")
        key = _check_key(idempotency_key, "inject")
        parsed = plain_message(message)
        checked = parsed is not None
        if parsed is None:
            parsed = to_message(message, where="inject")

        def decide(cmd: Command) -> None:
            if _seen(cmd, key, "inject"):
                return
            transcript = cmd.transcript
            if expected is not None:
                _check_length(transcript, expected, cmd.session_id, "inject")
            if transcript.length >= limits.messages_per_transcript_max:
                self._check_room(transcript, 1, "inject")  # raises, naming the bound
            cmd.emit([ev.MessageInjected(message=parsed, idempotency_key=key)], checked=checked)

        self._command("inject", session_id, decide)

    @grouped
    def inject_many(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any] | ev.Message] | PackedMessages,
        *,
        expected_length: int | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        """Append `messages` in order as one command: all of them or, on any bad message, none.

        They are recorded as `messages_injected` events of up to `messages_per_event_max`
        messages each (one record and one hash per batch, not per message); each message is
        still its own transcript entry, as after `inject`. A `Message` struct of the event catalog
        is taken as it is, and still read back once its record is encoded. `PackedMessages`
        (messages encoded already, as the agent-log importer keeps them) are decoded by the
        engine's own typed decoder, and not read back again. Returns how many were appended; an
        empty sequence appends nothing (the session must still exist). `expected_length` and
        `idempotency_key` as for `inject`; a repeated key appends nothing and returns 0.
        """
        expected = _optional_count(expected_length, "expected_length", "inject_many")
        key = _check_key(idempotency_key, "inject_many")
        if isinstance(messages, PackedMessages):
            pass
        elif isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise InvalidArgumentError(
                f"inject_many: messages must be a list of message dicts, "
                f"got {type(messages).__name__}"
            )
        events, count, checked = message_events(messages, key)

        def decide(cmd: Command) -> int:
            if _seen(cmd, key, "inject_many"):
                return 0
            _check_length(cmd.transcript, expected, cmd.session_id, "inject_many")
            self._check_room(cmd.transcript, count, "inject_many", batch=True)
            step = limits.events_per_append_max
            for first_event in range(0, len(events), step):
                chunk = events[first_event : first_event + step]
                try:
                    cmd.emit(chunk, checked=checked)
                except SessionLogError as exc:
                    blame_message(exc, events, first_event)
                    raise
            return count

        return self._command("inject_many", session_id, decide)

    def injected_with(self, session_id: str, idempotency_key: str) -> int | None:
        """The log position of the command that carried `idempotency_key` (`inject`,
        `inject_many`) on the session's current incarnation; None when none did."""
        key = _check_key(idempotency_key, "injected_with")
        with self.log.view() as view:  # inside `store.transaction()`, the transaction's view
            state = self._state(view, session_id, "injected_with")
            if key is None:
                return None
            return _key_position(view, state, key, self._sealer, "injected_with")

    @grouped
    def pop(self, session_id: str, *, expected_length: int | None = None) -> dict[str, Any] | None:
        """Take the last entry off the transcript and return it (None when it is empty, and
        then nothing is written). Recorded as `session_rewound`: the log keeps the entry."""
        expected = _optional_count(expected_length, "expected_length", "pop")

        def decide(cmd: Command) -> dict[str, Any] | None:
            transcript = cmd.transcript
            _check_length(transcript, expected, cmd.session_id, "pop")
            if transcript.length == 0:
                return None
            last = pj.ranges_window(transcript.ranges, transcript.length - 1, 1)
            opener = self._opener(cmd.tx, cmd.state, "pop")
            found = pj.read_messages(cmd.tx, transcript, ranges=last, opener=opener)
            popped = to_dicts(found, fresh=True)[0]
            cmd.emit([ev.SessionRewound(to_length=transcript.length - 1, removed=1, reason="pop")])
            return popped

        return self._command("pop", session_id, decide)

    @grouped
    def rewind(
        self,
        session_id: str,
        to_length: int,
        *,
        expected_length: int | None = None,
        reason: str | None = None,
    ) -> int:
        """Cut the transcript back to its first `to_length` entries; returns how many left it
        (0, writing nothing, when it is no longer than that). The log keeps them, and `as_of`
        a position before the rewind still shows them."""
        keep = check_count(to_length, "to_length", "rewind")
        expected = _optional_count(expected_length, "expected_length", "rewind")
        check_text(reason, "reason", "rewind")

        def decide(cmd: Command) -> int:
            _check_length(cmd.transcript, expected, cmd.session_id, "rewind")
            removed = cmd.transcript.length - keep
            if removed <= 0:
                return 0
            cmd.emit([ev.SessionRewound(to_length=keep, removed=removed, reason=reason)])
            return removed

        return self._command("rewind", session_id, decide)

    def _check_room(
        self, transcript: pj.Transcript, adding: int, verb: str, *, batch: bool = False
    ) -> None:
        """Refuse a write that would take the transcript past its bound; for a batch, the
        error's `index` is the first of its messages that does not fit."""
        room = limits.messages_per_transcript_max - transcript.length
        if adding > room:
            error = LimitExceededError(
                f"{verb}: transcript length",
                "messages_per_transcript_max",
                limits.messages_per_transcript_max,
                transcript.length + adding,
            )
            error.where = verb
            if batch:
                error.index = max(room, 0)
            raise error

    @grouped
    def reset(self, session_id: str) -> None:
        """Wipe the transcript; the id, its subscribers and everything else stay."""
        self._command("reset", session_id, lambda cmd: cmd.emit([ev.SessionReset()]))

    @grouped
    def trim(self, session_id: str, keep_last: int) -> int:
        """Keep only the last `keep_last` messages; returns how many are kept."""
        keep = check_count(keep_last, "keep_last", "trim")

        def decide(cmd: Command) -> int:
            kept = min(keep, cmd.transcript.length)
            cmd.emit([ev.SessionTrimmed(keep_last=keep, kept_count=kept)])
            return kept

        return self._command("trim", session_id, decide)

    @grouped
    def fork(self, source_id: str, destination_id: str | None = None) -> str:
        """A child session sharing the whole transcript; subscribers are not copied."""
        return self._fork("fork", source_id, destination_id, None)

    @grouped
    def fork_at(self, source_id: str, keep_first: int, destination_id: str | None = None) -> str:
        """A child session keeping only the first `keep_first` messages."""
        keep = check_count(keep_first, "keep_first", "fork_at")
        return self._fork("fork_at", source_id, destination_id, keep)

    def _fork(self, verb: str, source_id: str, destination_id: str | None, keep: int | None) -> str:
        def decide(cmd: Command) -> str:
            child = self._claim_new_id(cmd.tx, destination_id, verb)
            if child == cmd.session_id:
                raise SessionExistsError(f"{verb}: a session cannot be forked onto itself")
            self._check_capacity(cmd.tx, verb)
            kept = None if keep is None else min(keep, cmd.transcript.length)
            forked = ev.SessionForked(
                session_id=child,
                parent_id=cmd.session_id,
                parent_version=cmd.transcript.version,
                created_at=datetime.now(UTC),
                keep_first=kept,
                branched_at_event_index=kept,
                key_slot=self._new_key(cmd.tx, child, verb),
            )
            cmd.emit([forked], stream=child)
            return child

        return self._command(verb, source_id, decide)

    def compact(self, session_id: str, **options: Any) -> int:
        """Compact the transcript (see `sessions._compact` for the strategies); returns the
        number of messages kept. The event records the outcome, so replay calls nothing.

        The strategy, and the model or callbacks it calls, runs outside the write transaction on
        the transcript as read, so nobody waits for a model. The outcome commits if the
        transcript is still that one, or that one with messages appended (kept after the
        replaced run); any other change meanwhile (trim, reset, another compaction, the
        forgetting of an ancestor whose messages it read) raises `ConcurrencyError` and writes
        nothing.
        """
        self._writable("compact")
        _compact.parse_options(options, self.summarizer)  # refuse bad options before any work
        sid = check_session_id(session_id, where="compact")
        with self._view() as view:
            seen = self._state(view, sid, "compact")
            transcript = pj.load_transcript(view, sid) or pj.Transcript()
            expected = view.stream_version(sid)
            messages = pj.read_messages(
                view, transcript, opener=self._opener(view, seen, "compact")
            )
            inherited = self._cache_usable(view, seen)  # no ancestor read was forgotten
        plan, kept = _compact.plan(
            messages, options, token_counter=self.token_counter, summarizer=self.summarizer
        )
        if plan is None:
            return kept

        def decide(cmd: Command) -> int:
            now = cmd.transcript
            if (
                cmd.state.generation != seen.generation
                or pj.ranges_added(transcript.ranges, now.ranges) is None
                # an ancestor whose messages it read was forgotten: they must not live on here
                or (inherited and not self._cache_usable(cmd.tx, cmd.state))
            ):
                conflict = ConcurrencyError(sid, expected, cmd.tx.stream_version(sid))
                conflict.args = (
                    f"compact: {conflict}: the transcript changed while the strategy ran; "
                    "nothing was written, compact again",
                )
                raise conflict
            compacted = ev.SessionCompacted(
                strategy=plan.strategy,
                replace_start=plan.replace_start,
                replace_end=plan.replace_end,
                replacement=plan.replacement,
                tokens_before=plan.tokens_before,
                tokens_after=plan.tokens_after,
            )
            cmd.emit([compacted])
            return kept + now.length - transcript.length

        return self._command("compact", sid, decide)


_IDEMPOTENCY_KEY_CHARS_MAX = 512


def _seen(cmd: Command, key: str | None, verb: str) -> bool:
    """Whether a command on the session carried idempotency `key` already."""
    return key is not None and _key_position(cmd.tx, cmd.state, key, cmd.sealer, verb) is not None


def _key_position(
    view: LogView, state: pj.SessionState, key: str, sealer: Sealer | None, verb: str
) -> int | None:
    """Where the session's projection saw idempotency `key`: an encrypted session's events carry
    its digest under the session's key (`Keyring.keyed`), those written before digests the key
    itself (its retry after the upgrade still finds it)."""
    keyed = None if sealer is None else sealer.keyring.keyed_for(state, key, verb)
    for text in (key,) if keyed is None else (keyed, key):
        found = view.kv_get(pj.idempotency_key(state.session_id, text))
        if found is not None:
            return int.from_bytes(found, "big")
    return None


def _optional_count(value: object, name: str, verb: str) -> int | None:
    return None if value is None else check_count(value, name, verb)


def _check_key(value: object, verb: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > _IDEMPOTENCY_KEY_CHARS_MAX:
        raise InvalidArgumentError(
            f"{verb}: `idempotency_key` must be a non-empty str of at most "
            f"{_IDEMPOTENCY_KEY_CHARS_MAX} characters, got {value!r:.80}"
        )
    check_encodable(value, what=f"{verb}: `idempotency_key`")
    return value


def _check_length(transcript: pj.Transcript, expected: int | None, sid: str, verb: str) -> None:
    if expected is not None and transcript.length != expected:
        raise LengthConflictError(sid, expected, transcript.length, verb)
