"""The whole event log as JSON lines, out and back in, with its hash chain intact.

Format (``format_version`` 1): a header line ``{"_type": "sessionlog_log_export",
"format_version": 1, "events": N, "head_hash": hex}``, then one line per event in position order:
``position, stream, version, type, recorded_at, meta, data, hash`` (readable) and ``record``, the
base64 of the event's exact stored bytes. The record is the truth: the chain is over those bytes,
so an import writes them unchanged and refuses a line whose readable fields disagree with them.
Import checks the whole source before it writes anything (one streaming pass), then writes in
large transactions (a second pass); an import cut short leaves a prefix, which a rerun completes.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgspec

from eventlog import Envelope, RecordChecker, limits
from sessions import IntegrityError, InvalidArgumentError, SessionStore, archive_line

EXPORT_TYPE = "sessionlog_log_export"
FORMAT_VERSION = 1
_FIELDS = ("position", "stream", "version", "type", "recorded_at", "meta", "data", "hash", "record")
_PAGE_EVENTS = 1_000
# A write transaction per this many events (or bytes of records, whichever comes first): large
# enough that commits cost little next to the writes, small enough to stay far below
# `transaction_bytes_max` with the projection state each batch also writes.
BATCH_EVENTS = 20_000
BATCH_RECORD_BYTES = 32 * 1024 * 1024

_encoder = msgspec.json.Encoder()

Source = str | os.PathLike[str] | IO[bytes] | IO[str]
# `progress(done, total)`: an optional hook for long work (a command line draws a bar with it).
Progress = Callable[[int, int], object]


@dataclass(frozen=True)
class LogExportResult:
    """What `export_log` wrote: `events` lines after the header, ending at `head_hash` (hex)."""

    events: int
    head_hash: str
    bytes_written: int


@dataclass(frozen=True)
class LogImportResult:
    """What `import_log` did. `already_present` events of the source were in the target before
    (all of them when `unchanged`); `written` were added; the target now ends at `head`."""

    source_events: int
    already_present: int
    written: int
    head: int
    head_hash: str

    @property
    def unchanged(self) -> bool:
        return self.written == 0


render_line = archive_line
"""The export line of one event (without its newline): readable fields, then the record."""


# Export


def export_log(
    store: SessionStore,
    out: str | os.PathLike[str] | IO[bytes] | IO[str],
    *,
    progress: Progress | None = None,
) -> LogExportResult:
    """Write every event of `store`, in position order, to `out` (a path, or a binary or text
    file object) as JSON lines; returns what was written.

    The export ends at the head as it was when the export began, and holds one page of events
    in memory at a time. `progress(done, total)` is called after each page of events.
    """
    log = store.log
    with log.view() as view:
        head = view.head
        last = view.read(after=head - 1, limit=1) if head else []
    head_hash = (last[0].hash if last else bytes(32)).hex()
    header = {
        "_type": EXPORT_TYPE,
        "format_version": FORMAT_VERSION,
        "events": head,
        "head_hash": head_hash,
    }
    with _writer(out) as write:
        written = write(_encoder.encode(header) + b"\n")
        after = 0
        while after < head:
            page = log.read_records(after=after, limit=min(_PAGE_EVENTS, head - after))
            if not page:
                raise IntegrityError(f"the log ends at {after}, before its head {head}", after + 1)
            after = page[-1][0].position
            for envelope, record in page:  # a line at a time: the rendered page is never whole
                written += write(render_line(envelope, record) + b"\n")
            del page
            if progress is not None:
                progress(after, head)
    return LogExportResult(events=head, head_hash=head_hash, bytes_written=written)


@contextmanager
def _writer(out: object) -> Iterator[Callable[[bytes], int]]:
    if isinstance(out, (str, os.PathLike)):
        with Path(out).open("wb") as file:
            yield file.write
        return
    if isinstance(out, io.TextIOBase):
        text = out

        def write_text(chunk: bytes) -> int:
            text.write(chunk.decode("utf-8"))
            return len(chunk)

        yield write_text
        return
    write = getattr(out, "write", None)
    if not callable(write):
        raise InvalidArgumentError(
            f"export_log: `out` must be a path or a writable file object, got {type(out).__name__}"
        )

    def write_bytes(chunk: bytes) -> int:
        write(chunk)
        return len(chunk)

    yield write_bytes


# Import


@dataclass
class _Plan:
    """What the checking pass learned: the source's size and end, how much of it the target
    already holds, and the hash expected at the end of each write batch."""

    events: int
    head_hash: bytes
    present: int
    batches: list[tuple[int, bytes]]


def import_log(
    store: SessionStore,
    src: Source,
    *,
    batch_events: int = BATCH_EVENTS,
    batch_record_bytes: int = BATCH_RECORD_BYTES,
    progress: Progress | None = None,
) -> LogImportResult:
    """Import a whole-log export into `store`, reproducing its hash chain and its projections.

    The target must be empty, or hold a prefix of the source (an interrupted import: the rest is
    added), or hold exactly the source (nothing is written). Anything else, and any damage in the
    source, raises `IntegrityError` or `InvalidArgumentError` naming the line, before any write.
    `progress(done, total)` counts events over both passes: `total` is twice the source's events.
    """
    for name, value in (("batch_events", batch_events), ("batch_record_bytes", batch_record_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"import_log: `{name}` must be an int >= 1, got {value!r}")
    if store.readonly_at is not None:
        raise InvalidArgumentError(
            f"import_log: the target is a read-only view as of position {store.readonly_at}"
        )
    with _reader(src) as (open_pass, name):
        with open_pass() as lines:
            plan = _check_source(store, lines, name, batch_events, batch_record_bytes, progress)
        if plan.present < plan.events:
            with open_pass() as lines:
                _write(store, lines, name, plan, progress)
        if progress is not None:
            progress(2 * plan.events, 2 * plan.events)
    head = store.log.head
    return LogImportResult(
        source_events=plan.events,
        already_present=plan.present,
        written=plan.events - plan.present,
        head=head,
        head_hash=plan.head_hash.hex(),
    )


def _target_hash(store: SessionStore, position: int) -> bytes:
    page = store.log.read(after=position - 1, limit=1)
    if not page:
        raise IntegrityError(f"the target has no event at position {position}", position)
    return bytes(page[0].hash)


def _check_source(
    store: SessionStore,
    lines: Iterator[bytes],
    name: str,
    batch_events: int,
    batch_bytes: int,
    progress: Progress | None = None,
) -> _Plan:
    """Check every line of the source against the chain and against the target, streaming."""
    first = next(lines, None)
    events, head_hash = _read_header(first, name)
    target_head = store.log.head
    compare_at = min(target_head, events)
    target_hash = _target_hash(store, compare_at) if compare_at else b""
    checker = store.log.record_checker()
    batches: list[tuple[int, bytes]] = []
    count = size = 0
    lineno = 1
    for lineno, line in enumerate(lines, 2):
        position = lineno - 1
        if position > events:
            raise IntegrityError(
                f"{name}:{lineno}: the header promises {events} events; this line is one more",
                position,
            )
        envelope, record = _check_line(line, f"{name}:{lineno}", checker, position)
        if position == compare_at and envelope.hash != target_hash:
            raise InvalidArgumentError(
                f"{name}:{lineno}: the target holds a different log: its event {position} has "
                f"hash {target_hash.hex()}, the source's has {envelope.hash.hex()}"
            )
        if progress is not None and position % _PAGE_EVENTS == 0:
            progress(position, 2 * events)
        if position > target_head:
            count, size = count + 1, size + len(record)
            if count >= batch_events or size >= batch_bytes:
                batches.append((position, bytes(envelope.hash)))
                count = size = 0
    if checker.head != events:
        raise IntegrityError(
            f"{name}:{lineno}: the file ends after {checker.head} events, but the header "
            f"promises {events}: it was cut short",
            checker.head + 1,
        )
    if checker.head_hash != head_hash:
        raise IntegrityError(
            f"{name}:1: the header says the log ends at hash {head_hash.hex()}, but its events "
            f"end at {checker.head_hash.hex()}"
        )
    if target_head > events:
        raise InvalidArgumentError(
            f"{name}: the target holds {target_head} events, more than the source's {events}; "
            "it is not this log"
        )
    if count:
        batches.append((events, head_hash))
    return _Plan(events=events, head_hash=head_hash, present=target_head, batches=batches)


def _read_header(line: bytes | None, name: str) -> tuple[int, bytes]:
    where = f"{name}:1"
    if line is None:
        raise InvalidArgumentError(f"{where}: the file is empty; expected a {EXPORT_TYPE} header")
    header = _parse(line, where)
    if header.get("_type") != EXPORT_TYPE:
        raise InvalidArgumentError(
            f"{where}: expected `_type` {EXPORT_TYPE!r}, got {header.get('_type')!r}"
        )
    version = header.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise InvalidArgumentError(
            f"{where}: expected `format_version` {FORMAT_VERSION}, got {version!r}"
        )
    events = header.get("events")
    if type(events) is not int or events < 0:
        raise InvalidArgumentError(f"{where}: `events` must be an int >= 0, got {events!r}")
    head_hash = header.get("head_hash")
    try:
        digest = bytes.fromhex(head_hash) if isinstance(head_hash, str) else b""
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise InvalidArgumentError(
            f"{where}: `head_hash` must be 64 hex digits, got {str(head_hash)[:80]!r}"
        )
    unknown = sorted(set(header) - {"_type", "format_version", "events", "head_hash"})
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown header fields {unknown}")
    return events, digest


def _parse(line: bytes, where: str) -> dict[str, Any]:
    if not line.endswith(b"\n") and len(line) >= limits.export_line_bytes_max:
        raise InvalidArgumentError(
            f"{where}: line longer than export_line_bytes_max = {limits.export_line_bytes_max}"
        )
    if not line.strip():
        raise InvalidArgumentError(f"{where}: blank line; expected a JSON object")
    try:
        value = json.loads(line)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise InvalidArgumentError(f"{where}: malformed JSON: {exc}") from exc
    except RecursionError:  # no export line nests this deep: what it carries is plain data
        raise InvalidArgumentError(
            f"{where}: nested deeper than an export line can be (value_depth_max = "
            f"{limits.value_depth_max} inside an event)"
        ) from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _record_of(line: dict[str, Any], where: str) -> bytes:
    raw = line.get("record")
    if not isinstance(raw, str):
        raise InvalidArgumentError(
            f"{where}: `record` must be the base64 of the stored bytes, got {type(raw).__name__}"
        )
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError as exc:  # binascii.Error
        raise InvalidArgumentError(f"{where}: `record` is not valid base64: {exc}") from exc


def _check_line(
    line: bytes, where: str, checker: RecordChecker, position: int
) -> tuple[Envelope, bytes]:
    """The envelope and stored bytes of one event line, checked against the chain so far and
    against its own readable fields."""
    value = _parse(line, where)
    got = value.get("position")
    if type(got) is not int or got != position:
        raise IntegrityError(
            f"{where}: expected the event at position {position}, got position {got!r}: a line "
            "is missing, repeated or out of order",
            position,
        )
    record = _record_of(value, where)
    try:
        envelope = checker.check(record)
    except IntegrityError as exc:
        raise IntegrityError(f"{where}: {exc}", position) from exc
    if render_line(envelope, record) != line.rstrip(b"\r\n"):
        _compare_fields(value, envelope, record, where)
    return envelope, record


def _compare_fields(value: dict[str, Any], envelope: Envelope, record: bytes, where: str) -> None:
    """A line that is not byte for byte what export writes may still be the same JSON (reformatted
    by a tool); otherwise name the first readable field that disagrees with the stored bytes."""
    expected = json.loads(render_line(envelope, record))
    unknown = sorted(set(value) - set(_FIELDS))
    if unknown:
        raise InvalidArgumentError(f"{where}: unknown fields {unknown}")
    for field in _FIELDS:
        if field not in value:
            raise InvalidArgumentError(f"{where}: the field `{field}` is missing")
        want = json.dumps(expected[field], sort_keys=True)
        got = json.dumps(value[field], sort_keys=True)
        if want != got:
            raise IntegrityError(
                f"{where}: `{field}` is {got[:120]}, but the stored bytes say {want[:120]}",
                envelope.position,
            )


def _write(
    store: SessionStore,
    lines: Iterator[bytes],
    name: str,
    plan: _Plan,
    progress: Progress | None = None,
) -> None:
    """Write the events the target lacks, a batch per transaction. Each batch must end at the
    hash the checking pass saw there, so a file changed in between is caught before it commits."""
    next(lines, None)  # the header, checked already
    batches = iter(plan.batches)
    end, end_hash = next(batches)
    batch: list[bytes] = []
    for position, line in enumerate(lines, 1):
        if position <= plan.present:
            continue
        where = f"{name}:{position + 1}"
        batch.append(_quick_record(line) or _record_of(_parse(line, where), where))
        if position == end:
            _commit(store, batch, end, end_hash, where)
            if progress is not None:
                progress(plan.events + end, 2 * plan.events)
            if end == plan.events:
                return
            batch = []
            end, end_hash = next(batches)
    raise IntegrityError(f"{name}: the file changed while it was imported: it is shorter now")


_RECORD_KEY = b',"record":"'


def _quick_record(line: bytes) -> bytes | None:
    """The record of a line laid out as export writes it, without parsing the rest; None for any
    other layout. Safe because the batch's final hash is checked before it commits."""
    start = line.rfind(_RECORD_KEY)
    end = len(line.rstrip(b"\r\n")) - 2
    if start < 0 or line[end:].rstrip(b"\r\n") != b'"}':
        return None
    try:
        return base64.b64decode(line[start + len(_RECORD_KEY) : end], validate=True)
    except ValueError:  # binascii.Error: not what export writes; the full parse names the fault
        return None


def _commit(store: SessionStore, batch: list[bytes], end: int, end_hash: bytes, where: str) -> None:
    with store.log.transaction() as tx:
        if tx.head != end - len(batch):
            raise IntegrityError(
                f"{where}: the target changed during the import: it ends at {tx.head}, "
                f"expected {end - len(batch)}; nothing more was written"
            )
        envelopes = tx.import_records(batch)
        if envelopes[-1].hash != end_hash:
            raise IntegrityError(
                f"{where}: the file changed while it was imported: event {end} now has hash "
                f"{envelopes[-1].hash.hex()}, the check saw {end_hash.hex()}",
                end,
            )


@contextmanager
def _reader(
    src: object,
) -> Iterator[tuple[Callable[[], AbstractContextManager[Iterator[bytes]]], str]]:
    """A way to read the source twice (check, then write), and its name for messages. A file
    object that cannot seek is copied to a temporary file first."""
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)

        @contextmanager
        def open_path() -> Iterator[Iterator[bytes]]:
            with path.open("rb") as file:
                yield _lines(file)

        yield open_path, str(path)
        return
    if not callable(getattr(src, "readline", None)):
        raise InvalidArgumentError(
            f"import_log: `src` must be a path or a readable file object, got {type(src).__name__}"
        )
    name = str(getattr(src, "name", "<log export>"))
    file: Any = src
    seekable = getattr(file, "seekable", None)
    if callable(seekable) and seekable():
        start = file.tell()

        @contextmanager
        def rewind() -> Iterator[Iterator[bytes]]:
            file.seek(start)
            yield _lines(file)

        yield rewind, name
        return
    with tempfile.TemporaryFile() as spool:
        _copy(file, spool)
        spool.seek(0)
        with _reader(spool) as (open_pass, _):
            yield open_pass, name


def _copy(file: Any, spool: IO[bytes]) -> None:
    if isinstance(file, io.TextIOBase):
        for line in _lines(file):
            spool.write(line)
    else:
        shutil.copyfileobj(file, spool)


def _lines(file: Any) -> Iterator[bytes]:
    """The file's lines as bytes, none longer than `export_line_bytes_max`."""
    text = isinstance(file, io.TextIOBase)
    while True:
        line = file.readline(limits.export_line_bytes_max)
        if not line:
            return
        yield line.encode("utf-8") if text else line
