"""Retention: closed sessions past their age archived and forgotten, and the log's old prefix dropped.

`RetentionPolicy` says which closed sessions are due and what to do with them; `sweep` applies it
(archive each to an `ArchiveSink`, then forget it), a batch of sessions per commit, so a killed sweep
leaves each session before or after, and the next sweep finishes the work. `truncate_log` archives a
prefix of the log to a sink and drops it from the store, refusing while a session that can still be
read needs any event in it. Nothing here ever drops an event that is not in an archive first.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import blake3
import msgspec

import projections as pj
from eventlog import (
    ConcurrencyError,
    Envelope,
    InvalidArgumentError,
    LogView,
    StorageError,
    Transaction,
    limits,
)
from eventlog import events as ev
from sessions._host import SessionHost

if TYPE_CHECKING:
    from sessions._store import SessionStore

ACTIONS = ("forget", "archive")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MAX_DAYS = 1_000_000
"""The longest age or grace, about 2700 years: beyond any retention, and a session's last activity
plus both still a date a datetime holds."""
_ZERO = timedelta(0)
_PAGE_SESSIONS = 1000
"""Session states read per short read transaction while a sweep looks for due sessions."""
_encoder = msgspec.json.Encoder()
"""Keys in the order written: the whole-log export's lines are compared byte for byte."""


class ArchiveSink(Protocol):
    """Where archives go: named, durable, replaceable. `put` returns only once the archive is
    durable (a sweep forgets a session right after), and replaces an archive of the same name
    whole (a sweep killed after `put` puts it again)."""

    def put(self, name: str, lines: Iterable[bytes]) -> None: ...

    def read(self, name: str) -> Iterator[bytes]: ...


class DirectorySink:
    """An `ArchiveSink` of files in a directory: `<name>.jsonl`, written to a temporary file,
    synced and renamed into place, so an archive is whole or absent."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def _file(self, name: str) -> Path:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidArgumentError(
                f"archive name must match {_NAME.pattern}, got {name!r}", got=name
            )
        return self.path / f"{name}.jsonl"

    def put(self, name: str, lines: Iterable[bytes]) -> None:
        target = self._file(name)
        handle, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=self.path)
        try:
            with os.fdopen(handle, "wb") as out:
                for line in lines:
                    out.write(line + b"\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
            directory = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except BaseException as exc:
            # Whatever stopped it (the disk, or making a line: a key that does not open), the
            # part written goes: no copy of an archive may stay behind unnamed.
            Path(temporary).unlink(missing_ok=True)
            if isinstance(exc, OSError) and not isinstance(exc, StorageError):
                raise StorageError(f"archiving `{name}` to `{self.path}`: {exc}") from exc
            raise

    def read(self, name: str) -> Iterator[bytes]:
        with self._file(name).open("rb") as lines:
            for line in lines:
                yield line.rstrip(b"\n")

    def names(self) -> list[str]:
        return sorted(path.stem for path in self.path.glob("*.jsonl"))


@dataclass(frozen=True)
class RetentionPolicy:
    """Which closed sessions a sweep retires, and how.

    A closed (or deleted) session is due once its last event is `max_age` old. It is then
    `expiring` for `grace` more (reported by the sweep, untouched, so an operator can still
    reopen or export it) and retired by the first sweep after that. `action` is "forget"
    (`SessionStore.forget`: its content becomes unreadable everywhere) or "archive" (its events
    are copied to `sink` first, recorded by a `session_archived` event, then it is forgotten).
    A session is kept while any session forked from it, at any depth, is still open.
    `batch_sessions` sessions are retired per commit."""

    max_age: timedelta
    grace: timedelta = timedelta(0)
    action: str = "forget"
    sink: ArchiveSink | None = None
    batch_sessions: int = 100

    @classmethod
    def in_days(
        cls, max_age_days: float, grace_days: float = 0.0, archive: str | None = None
    ) -> RetentionPolicy:
        """The policy of ages in days, archiving to the directory `archive` when given (else
        only forgetting): what the command line's and the service's options say."""
        return cls(
            max_age=_days(max_age_days, "max_age_days"),
            grace=_days(grace_days, "grace_days"),
            action="archive" if archive else "forget",
            sink=DirectorySink(archive) if archive else None,
        )

    def __post_init__(self) -> None:
        for name in ("max_age", "grace"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or not _ZERO <= value <= timedelta(days=_MAX_DAYS):
                raise InvalidArgumentError(
                    f"RetentionPolicy: `{name}` must be a timedelta from 0 to {_MAX_DAYS} days, "
                    f"got {value!r}",
                    expected=f"0 to {_MAX_DAYS} days",
                    got=value,
                )
        if self.action not in ACTIONS:
            raise InvalidArgumentError(
                f"RetentionPolicy: `action` must be one of {', '.join(ACTIONS)}, "
                f"got {self.action!r}",
                expected=ACTIONS,
                got=self.action,
            )
        if self.action == "archive" and self.sink is None:
            raise InvalidArgumentError("RetentionPolicy: action 'archive' needs a `sink`")
        batch = self.batch_sessions
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 10_000:
            raise InvalidArgumentError(
                f"RetentionPolicy: `batch_sessions` must be an int from 1 to 10000, got {batch!r}"
            )


def _days(days: float, name: str) -> timedelta:
    if (
        isinstance(days, bool)
        or not isinstance(days, (int, float))
        or not 0 <= days <= _MAX_DAYS  # NaN and infinities fail this too
    ):
        raise InvalidArgumentError(
            f"RetentionPolicy: `{name}` must be a number of days from 0 to {_MAX_DAYS}, "
            f"got {days!r}",
            expected=f"0 to {_MAX_DAYS}",
            got=days,
        )
    return timedelta(days=days)


@dataclass(frozen=True)
class SweepReport:
    """What a sweep did at `now`: sessions `archived` (to the sink) and `forgotten`, those
    `expiring` (due, inside the grace period), those `kept` because a fork of theirs is open,
    those due but `plain` (not encrypted: nothing to shred; archived if the policy archives,
    and their events leave the store with `truncate_log`), and how many session states it
    `examined`."""

    now: datetime
    examined: int = 0
    archived: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    expiring: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    plain: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Due:
    """A session a sweep retires: its stream version when judged, whether it still needs its
    archive, and whether it has a key to destroy."""

    session_id: str
    version: int
    archive: bool
    forget: bool


def archive_line(envelope: Envelope, record: bytes) -> bytes:
    """One event as a JSON object (no newline): its readable fields, and its stored bytes
    (`record`, base64), which re-verify against the chain. The line of a whole-log export too,
    byte for byte (`replay.export_log`), so an archive of the log is such an export's body."""
    return _encoder.encode(
        {
            "position": envelope.position,
            "stream": envelope.stream,
            "version": envelope.version,
            "type": envelope.type,
            "recorded_at": envelope.recorded_at,
            "meta": envelope.meta,
            "data": envelope.data,
            "hash": envelope.hash.hex(),
            "record": record,
        }
    )


def archive_lines(envelopes: Iterable[tuple[Envelope, bytes]]) -> Iterator[bytes]:
    for envelope, record in envelopes:
        yield archive_line(envelope, record)


def batch_archive_name(session_ids: Sequence[str]) -> str:
    """The sink name of a sweep batch's archive: the same sessions give the same name, so a
    sweep killed after writing it writes it again in place; session ids may hold any character,
    so the name is a digest of them."""
    digest = blake3.blake3("\x00".join(session_ids).encode())
    return f"sessions-{digest.hexdigest()[:32]}"


def due_sessions(
    store: SessionStore, policy: RetentionPolicy, now: datetime, report: SweepReport
) -> list[Due]:
    """Every session `policy` retires at `now`, in id order; fills the report's `examined`,
    `expiring`, `kept` and `plain`. Short read transactions, a page of sessions at a time."""
    due: list[Due] = []
    after: str | None = None
    examined = 0
    while True:
        with store.log.view() as view:
            states = list(pj.iter_states(view, after=after, limit=_PAGE_SESSIONS))
            for state in states:
                examined += 1
                found = _judge(view, state, policy, now, report)
                if found is not None:
                    due.append(found)
        if len(states) < _PAGE_SESSIONS:
            break
        after = states[-1].session_id
    object.__setattr__(report, "examined", examined)
    return due


def _judge(
    view: LogView,
    state: pj.SessionState,
    policy: RetentionPolicy,
    now: datetime,
    report: SweepReport,
) -> Due | None:
    if state.status not in (pj.CLOSED, pj.DELETED) or state.forgotten:
        return None  # open, or nothing left to do
    archive = policy.action == "archive" and state.archive is None
    forget = bool(state.key_slot)
    if state.archive is not None and not forget:
        return None  # archived, and nothing to shred: `truncate_log` does the rest
    transcript = pj.load_transcript(view, state.session_id)
    if transcript is None:
        return None
    last = transcript.last_activity_at or state.last_activity_at
    if state.archive is None:  # once archived, it waits for nothing more
        if now < last + policy.max_age:
            return None
        if now < last + policy.max_age + policy.grace:
            report.expiring.append(state.session_id)
            return None
    if _open_descendant(view, state.session_id):
        report.kept.append(state.session_id)
        return None
    if not forget:
        report.plain.append(state.session_id)
        if not archive:
            return None
    return Due(state.session_id, transcript.version, archive, forget)


def _open_descendant(view: LogView, session_id: str) -> bool:
    seen = {session_id}
    todo = [session_id]
    while todo:
        for child in pj.child_ids(view, todo.pop()):
            if child in seen:
                continue
            seen.add(child)
            state = pj.load_state(view, child)
            if state is not None and state.status == pj.ACTIVE:
                return True
            todo.append(child)
    return False


def stream_records(store: SessionStore, stream: str) -> Iterator[tuple[Envelope, bytes]]:
    """Every event of `stream` still in the log (after its truncated versions), with its bytes."""
    log = store.log
    with log.view() as view:
        after = view.stream_floor(stream)
    while True:
        with log.view() as view:
            page = view.read_stream_records(stream, after=after, limit=limits.read_page_events_max)
        yield from page
        if len(page) < limits.read_page_events_max:
            return
        after = page[-1][0].version


def archive_batch(
    store: SessionStore, batch: Sequence[Due], sink: ArchiveSink
) -> list[tuple[Due, ev.SessionArchived]]:
    """Put the sessions of `batch` that need it in the sink as one archive (durably: one file,
    one sync, for the whole batch): for each, its events as stored, then one line of what a
    reader sees (its state and transcript, opened if encrypted). Returns the event that records
    each session's archive: the archive's name, the session's line count and their digest."""
    wanted = [due for due in batch if due.archive]
    if not wanted:
        return []
    name = batch_archive_name([due.session_id for due in wanted])
    digests: dict[str, _Digested] = {}

    def lines() -> Iterator[bytes]:
        for due in wanted:
            digested = digests[due.session_id] = _Digested(_session_lines(store, due.session_id))
            yield from digested

    sink.put(name, lines())
    return [
        (
            due,
            ev.SessionArchived(
                archive=name,
                events_count=digests[due.session_id].count - 1,
                digest=digests[due.session_id].digest.hexdigest(),
            ),
        )
        for due in wanted
    ]


def _session_lines(store: SessionStore, session_id: str) -> Iterator[bytes]:
    yield from archive_lines(stream_records(store, session_id))
    verb = "sweep"
    with store.log.view() as view:
        state = pj.load_state(view, session_id)
        transcript = pj.load_transcript(view, session_id)
        if state is None or transcript is None:
            return
        opener = store._opener(view, state, verb)
        messages = pj.read_messages(view, transcript, opener=opener)
        readable = {"state": store._opened(state, verb), "transcript": messages}
    yield _encoder.encode({"session_id": session_id, "readable": readable})


class _Digested:
    """Lines passed through, counted and hashed (with their newlines) on the way."""

    def __init__(self, lines: Iterator[bytes]) -> None:
        self._lines = lines
        self.count = 0
        self.digest = blake3.blake3()

    def __iter__(self) -> Iterator[bytes]:
        for line in self._lines:
            self.count += 1
            self.digest.update(line + b"\n")
            yield line


def record_archived(tx: Transaction, session_id: str, version: int, event: ev.Event) -> bool:
    """Append `event` to the session if it is still at `version` (nothing happened to it since
    it was archived); False, writing nothing, if it moved on."""
    try:
        tx.append(session_id, [event], expected_version=version)
    except ConcurrencyError:
        return False
    return True


def first_needed_position(view: LogView) -> tuple[int, str] | None:
    """The lowest log position an open session still reads, and that session: its opening event
    and every message its transcript refers to (a fork's may sit in its ancestors' streams).
    None when no session is open."""
    lowest: tuple[int, str] | None = None
    after: str | None = None
    while True:
        states = list(pj.iter_states(view, after=after, limit=_PAGE_SESSIONS))
        for state in states:
            if state.status != pj.ACTIVE:
                continue
            sid = state.session_id
            opened = view.read_stream(sid, after=state.opened_version - 1, limit=1)
            needed = [opened[0].position] if opened else []
            transcript = pj.load_transcript(view, sid)
            if transcript is not None:
                first = pj.first_referenced_position(view, transcript)
                if first is not None:
                    needed.append(first)
            if needed and (lowest is None or min(needed) < lowest[0]):
                lowest = (min(needed), sid)
        if len(states) < _PAGE_SESSIONS:
            return lowest
        after = states[-1].session_id


def log_archive_name(first: int, last: int) -> str:
    return f"log-{first:012d}-{last:012d}"


def log_records(store: SessionStore, after: int, last: int) -> Iterator[tuple[Envelope, bytes]]:
    """The events at positions after `after` up to `last`, with their stored bytes, a page per
    read transaction."""
    while after < last:
        page = store.log.read_records(
            after=after, limit=min(limits.read_page_events_max, last - after)
        )
        if not page:
            return
        yield from page
        after = page[-1][0].position


def utc_now(now: Any) -> datetime:
    if now is None:
        return datetime.now(UTC)
    if not isinstance(now, datetime) or now.tzinfo is None:
        raise InvalidArgumentError(
            f"sweep: `now` must be a timezone-aware datetime, got {now!r}", got=now
        )
    return now


class RetentionVerbs(SessionHost):
    """The retention verbs of `SessionStore`, mixed into it."""

    if TYPE_CHECKING:

        def forget(
            self,
            session_id: str,
            reason: str | None = None,
            *,
            expected_version: int | None = None,
        ) -> None: ...

    def sweep(self, policy: RetentionPolicy, now: datetime | None = None) -> SweepReport:
        """Retire the closed sessions `policy` says are due at `now` (default: the current
        time); returns what it did. For each batch of `policy.batch_sessions` sessions: with
        action "archive", the batch is written to the sink as one archive (durably, before
        anything changes here) and one commit records each session's `session_archived`; then
        each encrypted one is forgotten (`forget`, a commit of its own). A sweep killed at any
        point leaves each session untouched, archived, or archived and forgotten, each step
        whole; the next sweep does what is left (an archive written but not recorded is
        written again, whole)."""
        self._writable("sweep")
        if not isinstance(policy, RetentionPolicy):
            raise InvalidArgumentError(
                f"sweep: expected a RetentionPolicy, got {type(policy).__name__}"
            )
        at = utc_now(now)
        store: SessionStore = self  # type: ignore[assignment]
        report = SweepReport(now=at)
        due = due_sessions(store, policy, at, report)
        reason = f"retention: closed for over {policy.max_age}"
        for start in range(0, len(due), policy.batch_sessions):
            batch = due[start : start + policy.batch_sessions]
            moved: set[str] = set()
            if policy.sink is not None and policy.action == "archive":
                prepared = archive_batch(store, batch, policy.sink)
                with self.log.transaction() as tx:
                    for item, event in prepared:
                        if record_archived(tx, item.session_id, item.version, event):
                            report.archived.append(item.session_id)
                        else:
                            moved.add(item.session_id)
            for item in batch:
                if item.forget and item.session_id not in moved:
                    _forget_unchanged(self, item, reason, report)
        return report

    def truncate_log(self, before: int, *, sink: ArchiveSink) -> tuple[int, bytes]:
        """Archive the events at positions below `before` to `sink` (durably, as one archive
        named `log-<first>-<last>`), then drop them from the store in one commit; returns the
        log's new anchor (position, chain hash) (see `EventLog.truncate`). Refused, with nothing
        written, while an open session still reads an event there: its opening event, or a
        message of its transcript (a fork's may come from its ancestors). Retire old sessions
        first (`sweep`). Afterwards the projections stay as they are but can no longer be
        rebuilt from the log (`rebuild` and `as_of` before the anchor raise `TruncatedError`);
        `compact_files` then returns the space on LMDB, `VACUUM` on PostgreSQL."""
        self._writable("truncate_log")
        store: SessionStore = self  # type: ignore[assignment]
        with self.log.view() as view:
            cut = view.anchor[0]
            head = view.head
            _check_cut(view, before, head)
        if before - 1 <= cut:
            return self.log.anchor
        if sink is None or not callable(getattr(sink, "put", None)):
            raise InvalidArgumentError("truncate_log: `sink` must be an ArchiveSink")
        sink.put(
            log_archive_name(cut + 1, before - 1),
            archive_lines(log_records(store, cut, before - 1)),
        )
        with self.log.transaction() as tx:
            _check_cut(tx, before, head)  # nothing opened meanwhile reads before the cut
            return tx.truncate(before)


def _forget_unchanged(store: RetentionVerbs, item: Due, reason: str, report: SweepReport) -> None:
    """Forget the session if nothing was appended to it since it was judged closed (and
    archived), checked in forget's own commit: one reopened or written meanwhile keeps its key
    (shredding it would destroy a live session) and is reported as kept."""
    expected = item.version + (1 if item.archive else 0)
    try:
        store.forget(item.session_id, reason, expected_version=expected)
    except ConcurrencyError:
        report.kept.append(item.session_id)
        return
    report.forgotten.append(item.session_id)


def _check_cut(view: LogView, before: int, head: int) -> None:
    if isinstance(before, bool) or not isinstance(before, int) or not 1 <= before <= head + 1:
        raise InvalidArgumentError(
            f"truncate_log: `before` must be a position from 1 to {head + 1}, got {before!r}",
            expected=f"1 to {head + 1}",
            got=before,
        )
    needed = first_needed_position(view)
    if needed is not None and needed[0] < before:
        position, session_id = needed
        raise InvalidArgumentError(
            f"truncate_log: open session `{session_id}` still reads position {position}, before "
            f"{before}; close it (and let a sweep retire it) or cut at {position} at most",
            where="truncate_log",
            expected=f"before <= {position}",
            got=before,
        )
