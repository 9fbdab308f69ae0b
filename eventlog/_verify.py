"""Verify: walk the whole hash chain and the stream index, and report the first problem.

`verify_here` walks a storage page by page through the chain reader; `walk_isolated` runs such a
walk in a child process (`eventlog/_walk.py`) and turns what it sent, or how it died, into a
report. Verify never raises for damage it finds: that is what the report is for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eventlog import _chain, _codec, _walk, limits
from eventlog._codec import Envelope
from eventlog._storage import Storage, StorageTxn, stream_key
from eventlog.errors import CorruptStoreError, IntegrityError, StorageError


@dataclass(frozen=True)
class VerifyReport:
    """What `EventLog.verify()` found. `ok` is False from the first problem on."""

    ok: bool
    events_checked: int
    streams_checked: int
    head_hash: bytes
    first_bad_position: int | None = None
    problem: str | None = None
    anchor_position: int = 0
    """Where the walk started: the last position truncated away (0 for a log never truncated),
    whose stored chain hash the first kept event must chain to."""
    projection_keys_checked: int | None = None
    """Projection keys found equal to the log's rebuild (`SessionStore.verify(projections=True)`);
    None when the projections were not checked."""

    def as_json(self) -> dict[str, Any]:
        """The fields as JSON-ready data (the hash in hex): what the walking child sends, the
        service answers and the CLI prints."""
        fields = dataclasses.asdict(self)
        fields["head_hash"] = self.head_hash.hex()
        return fields

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> VerifyReport:
        """The report `as_json` gave."""
        return cls(**{**fields, "head_hash": bytes.fromhex(fields["head_hash"])})


def walk_isolated(
    module: str,
    arguments: list[str],
    progress: Callable[[int, int], object] | None,
    description: str,
) -> VerifyReport:
    """Run a verify walk as `python -m module arguments` (see `eventlog/_walk.py`) and turn
    what it sent, or how it died, into a report."""
    fields, done, death = _walk.run_child(module, arguments, progress)
    if fields is not None:
        return VerifyReport.from_json(fields)
    if not death.startswith("killed"):
        raise StorageError(f"verify of {description}: the walk failed: {death}")
    page = limits.read_page_events_max
    return VerifyReport(
        ok=False,
        events_checked=done,
        streams_checked=0,
        head_hash=b"",
        first_bad_position=done + 1,
        problem=(
            f"the data file is damaged: LMDB stopped the walk ({death}) after position "
            f"{done}, reading positions {done + 1} to {done + page}, their stream index "
            f"entries, or (if every event was checked) the other tables' pages"
        ),
    )


def verify_here(storage: Storage, progress: Callable[[int, int], object] | None) -> VerifyReport:
    """The walk itself, in this process: a page at a time through the chain reader, and record by
    record where a page is not right, to name the first problem."""
    versions: dict[str, int] = {}
    with storage.reader() as txn:
        cut, prev = txn.anchor() or (0, _codec.GENESIS_HASH)
    checked = cut
    page = limits.read_page_events_max

    def report(position: int | None, problem: str | None) -> VerifyReport:
        return VerifyReport(
            ok=problem is None,
            events_checked=checked - cut,
            streams_checked=len(versions),
            head_hash=prev,
            first_bad_position=position,
            problem=problem,
            anchor_position=cut,
        )

    keys: dict[str, bytes] = {}  # stream name -> index prefix, encoded once per stream
    try:
        while True:
            with storage.reader() as txn:
                head = txn.last_position()
                envelopes = _chain_fast(txn, prev, checked, page)
                if envelopes is not None:
                    bad = page_indexed(txn, envelopes, versions, keys, cut)
                    for envelope in envelopes:
                        if bad is not None and envelope.position == bad[0]:
                            return report(envelope.position, bad[1])
                        prev = envelope.hash
                        checked = envelope.position
                    if envelopes:
                        if progress is not None:
                            progress(checked, head)
                        continue
                # Empty, or something is wrong in this page: record by record names the problem.
                count = 0
                for position, record in txn.records_after(checked, page):
                    count += 1
                    problem = _verify_one(
                        txn, position, checked + 1, prev, record, versions, keys, cut
                    )
                    if problem is not None:
                        return report(checked + 1, problem)  # a gap is bad where it starts
                    prev = _codec.stored_hash(record)
                    checked = position
                if count == 0:
                    if checked < head:
                        return report(checked + 1, f"position {checked + 1} is missing")
                    indexed = txn.index_size()
                    if head == checked and indexed != checked - cut:
                        return report(
                            None,
                            f"the stream index holds {indexed} entries for {checked - cut} events",
                        )
                    return report(None, None)
            if progress is not None:
                progress(checked, head)
    except CorruptStoreError as exc:  # LMDB itself found a damaged page
        return report(checked + 1, f"reading positions after {checked}: {exc}")


def _chain_fast(txn: StorageTxn, prev: bytes, checked: int, page: int) -> list[Envelope] | None:
    """The next page checked against the chain and decoded in one tight loop, or None when
    anything is off (the caller then walks the page record by record to name it).

    Every key is checked to be the next position: in a damaged B-tree a changed key need not
    break the order, and a record whose key is wrong cannot be found by the reads that look
    it up by position, however well it chains."""
    try:
        envelopes = _chain.check_run(prev, txn.values_after(checked, page), checked + 1)
    except CorruptStoreError:
        raise  # not a bad record but a bad page: the caller reports it as it is
    except IntegrityError:
        return None
    if not txn.keys_dense(checked, len(envelopes)):
        return None
    return envelopes


def _verify_one(
    txn: StorageTxn,
    position: int,
    expected_position: int,
    prev: bytes,
    record: bytes | bytearray | memoryview,
    versions: dict[str, int],
    keys: dict[str, bytes],
    cut: int,
) -> str | None:
    if position != expected_position:
        return f"position {expected_position} is missing"
    try:
        envelope = _chain.check_one(prev, record, position)
    except IntegrityError as exc:
        return str(exc)
    bad = page_indexed(txn, [envelope], versions, keys, cut)
    return None if bad is None else bad[1]


def page_indexed(
    txn: StorageTxn,
    envelopes: list[Envelope],
    versions: dict[str, int],
    keys: dict[str, bytes],
    cut: int = 0,
) -> tuple[int, str] | None:
    """`_verify_indexed` of a page of events with one index lookup for the page (one query on
    a server); the first problem with its position, or None. After a truncation at `cut`, a
    stream's first kept event follows the last version truncated away (its floor)."""
    entries: list[tuple[bytes, int]] = []
    for envelope in envelopes:
        stream = envelope.stream
        seen = versions.get(stream)
        if seen is None:
            key = keys.get(stream)
            if key is None:
                key = keys[stream] = stream_key(stream)
            seen = txn.stream_floor(key) if cut else 0
        version = seen + 1
        if envelope.version != version:
            return envelope.position, (
                f"event at position {envelope.position} has version {envelope.version} of "
                f"stream `{stream}`, expected {version}"
            )
        versions[stream] = version
        key = keys.get(stream)
        if key is None:
            key = keys[stream] = stream_key(stream)
        entries.append((key, version))
    for envelope, indexed in zip(envelopes, txn.stream_positions_of(entries), strict=True):
        if indexed != envelope.position:
            return envelope.position, (
                f"the stream index maps `{envelope.stream}` v{envelope.version} to {indexed}, "
                f"but the event is at position {envelope.position}"
            )
    return None
