"""The chain reader: every stored record the log hands out is checked against the chain here.

A record is trusted only once it carries the hash of the record before it chained with its own
bytes, and the position it sits at. `check_run` is the one loop that checks and decodes: pages
(`read`, `read_records`, `verify`), single events, stream reads, events by position and records
imported from another log all go through it. `RecordChecker` adds what a record arriving from
outside must also satisfy (size, stream name, the next version of its stream). Nothing here writes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import blake3

from eventlog import _codec, limits
from eventlog._codec import (
    BODY_START,
    DECODE_ERRORS,
    GENESIS_HASH,
    HASH_START,
    RECORD_PREFIX,
    Envelope,
    envelope_decoder,
)
from eventlog._storage import Buffer, StorageTxn
from eventlog.errors import IntegrityError, TruncatedError


def hash_at(txn: StorageTxn, position: int) -> bytes | None:
    """The hash the record after `position` chains to (the genesis hash at 0, the anchor's at
    the anchor); None when there is no record at `position`. `TruncatedError` when the record
    after `position` was truncated away."""
    if position:
        found = txn.record_hash(position)
        if found is not None:
            return found
    anchor = txn.anchor()
    if anchor is None:
        return None if position else GENESIS_HASH
    cut, anchor_hash = anchor
    if position == cut:
        return anchor_hash
    check_kept(position + 1, cut)
    return None


def check_kept(position: int, cut: int, doing: str = "reading") -> None:
    """`TruncatedError` when `position` is at or before the anchor `cut`."""
    if position <= cut:
        raise TruncatedError(f"{doing} position {position}", position, cut)


def check_run(
    prev_hash: bytes | memoryview,
    records: Iterable[Buffer],
    first: int,
    hasher: blake3.blake3 | None = None,
) -> list[Envelope]:
    """Check records stored at consecutive positions from `first`, the first chained to
    `prev_hash`, and decode them; raises `IntegrityError` naming the first bad position."""
    items = zip(itertools.count(first), zip(itertools.repeat(None), records))
    return _checked(items, prev_hash, first - 1, None, hasher or blake3.blake3())


def check_one(prev_hash: bytes | memoryview, record: Buffer, position: int) -> Envelope:
    """`check_run` of the one record at `position`."""
    return check_run(prev_hash, (record,), position)[0]


def check_at(
    positions: list[int],
    pairs: Iterable[tuple[Buffer | None, Buffer | None]],
    anchor: tuple[int, bytes] | None = None,
) -> list[Envelope]:
    """Check and decode the records at `positions` (any order, gaps allowed), given for each the
    record before it (None when it directly follows the one before in `positions`, or is the
    first) and the record itself (`StorageTxn.records_around`). A record that follows the one
    before it in `positions` chains to that one's hash, any other to the hash stored in the
    record before it (the genesis hash at position 1, the `anchor`'s right after it); a missing
    record raises `IntegrityError`, one truncated away `TruncatedError`.

    One pass of `_checked`: a session's messages are mostly scattered among other sessions'
    events, so a call per run of consecutive positions would be a call per record."""
    items = zip(positions, pairs, strict=True)
    return _checked(items, GENESIS_HASH, -2, anchor, blake3.blake3())


def _checked(
    items: Iterable[tuple[int, tuple[Buffer | None, Buffer | None]]],
    digest: bytes | memoryview,
    last: int,
    anchor: tuple[int, bytes] | None,
    hasher: blake3.blake3,
) -> list[Envelope]:
    """The one loop that checks and decodes. Each item is a position and, for it, the record
    before it (or None) and the record itself (None: missing). A record chains to the hash
    stored in the record before it when that is given, else to `digest` (the hash of the last
    record checked) when it follows `last`, else to the genesis or the anchor's hash where those
    apply. Raises `IntegrityError` naming the first bad position.

    The hot read path: nothing per record is allocated that outlives it but the envelope, and
    nothing is called beyond hashing and decoding. A record in the wrong place is caught by the
    position it carries, which the hash covers.
    """
    # One hasher, reset per record: every call into blake3 has a fixed cost (building a
    # hasher, taking a buffer) well above hashing a 300-byte record.
    reset, update, digest_of = hasher.reset, hasher.update, hasher.digest
    decode = envelope_decoder.decode
    out: list[Envelope] = []
    add = out.append
    for position, (before, record) in items:
        if record is None:
            check_kept(position, 0 if anchor is None else anchor[0])
            raise IntegrityError(f"position {position} is missing from the log", position)
        if before is not None:
            link = before[HASH_START:BODY_START]
        elif position == last + 1:
            link = digest
        else:
            link = _first_link(position, anchor)
        try:
            envelope = decode(record)
        except DECODE_ERRORS as exc:
            _codec.check_record(link, record, position)  # damaged bytes: say so precisely
            raise IntegrityError(
                f"event at position {position}: cannot decode: {exc}", position
            ) from exc
        reset()
        update(link)
        update(record[BODY_START:])
        digest = digest_of()
        if digest != envelope.hash:
            _codec.check_record(link, record, position)  # raises with the precise reason
        if envelope.position != position:
            raise IntegrityError(f"position {position} is missing from the log", position)
        add(envelope)
        last = position
    return out


def _first_link(position: int, anchor: tuple[int, bytes] | None) -> bytes:
    """The hash a record chains to when neither the record before it nor its hash is at hand:
    the genesis hash at position 1, the anchor's right after the anchor; else the record before
    it is missing."""
    if position == 1:
        return GENESIS_HASH
    if anchor is not None and position == anchor[0] + 1:
        return anchor[1]
    raise IntegrityError(f"position {position - 1} is missing from the log", position)


def _no_streams(stream: str) -> int:
    return 0


class RecordChecker:
    """Checks records arriving from outside the log (an export being imported) one after
    another, as the positions after `head` of a log whose last hash is `head_hash`;
    `stream_version(stream)` gives the version of a stream not yet seen here.

    It is pure (no storage): the importer runs it over a whole source before anything is written,
    and `Transaction.import_records` runs it again against the real head while writing."""

    def __init__(
        self,
        head: int = 0,
        head_hash: bytes = GENESIS_HASH,
        stream_version: Callable[[str], int] = _no_streams,
    ) -> None:
        self.head = head
        self.head_hash = head_hash
        self.versions: dict[str, int] = {}
        self._stream_version = stream_version

    def check(self, record: object) -> Envelope:
        """The decoded envelope of `record`, the next record of the log; raises `IntegrityError`
        naming the position when it is not one. On success the checker moves past it."""
        position = self.head + 1
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise IntegrityError(
                f"event at position {position}: expected the stored bytes of a record, "
                f"got {type(record).__name__}",
                position,
            )
        if len(record) > limits.event_bytes_max:
            raise IntegrityError(
                f"event at position {position}: {len(record)} bytes, over event_bytes_max = "
                f"{limits.event_bytes_max}",
                position,
            )
        if record[:HASH_START] != RECORD_PREFIX:
            # msgpack may spell the array and the hash field other ways that decode alike (a
            # bin16 hash, say), and a crafted record can chain that way; but the hash must sit
            # at the offset every reader takes it from, and format 3 packs around it there.
            raise IntegrityError(
                f"event at position {position}: not a sessionlog record (it starts with "
                f"{bytes(record[:HASH_START]).hex()}, not {RECORD_PREFIX.hex()})",
                position,
            )
        envelope = check_one(self.head_hash, record, position)
        stream = envelope.stream
        _check_stream_name(stream, position)
        version = self.versions.get(stream)
        if version is None:
            version = self._stream_version(stream)
        if envelope.version != version + 1:
            raise IntegrityError(
                f"event at position {position} is version {envelope.version} of stream "
                f"`{stream}`, expected version {version + 1}",
                position,
            )
        self.versions[stream] = envelope.version
        self.head = position
        self.head_hash = envelope.hash
        return envelope


def _check_stream_name(stream: str, position: int) -> None:
    """The stream index cannot hold an empty name, a NUL or an over-long name: a record carrying
    one was never written by a log, whatever its hash says."""
    size = len(stream.encode("utf-8", "surrogatepass"))
    if not stream or "\x00" in stream or size > limits.stream_name_bytes_max:
        raise IntegrityError(
            f"event at position {position}: stream name {stream[:80]!r} ({size} bytes) cannot "
            f"be stored (empty, a NUL, or over stream_name_bytes_max = "
            f"{limits.stream_name_bytes_max})",
            position,
        )
