"""The chain reader: every stored record the log hands out is checked against the chain here.

A record is trusted only once it carries the hash of the record before it chained with its own
bytes, and the position it sits at. `check_run` is the one loop that checks and decodes: pages
(`read`, `read_records`, `verify`), single events, stream reads, events by position and records
imported from another log all go through it. `RecordChecker` adds what a record arriving from
outside must also satisfy (size, stream name, the next version of its stream). Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import blake3

from eventlog import _codec, limits
from eventlog._codec import BODY_START, DECODE_ERRORS, GENESIS_HASH, Envelope, envelope_decoder
from eventlog._storage import Buffer, StorageTxn
from eventlog.errors import IntegrityError, TruncatedError


def hash_at(txn: StorageTxn, position: int) -> bytes | None:
    """The hash the record after `position` chains to (the genesis hash at 0, the anchor's at
    the anchor); None when there is no record at `position`. `TruncatedError` when the record
    after `position` was truncated away."""
    if position:
        record = txn.record(position)
        if record is not None:
            return _codec.stored_hash(record)
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
    `prev_hash`, and decode them; raises `IntegrityError` naming the first bad position.

    The hot read path: one loop, no per-record function calls beyond hashing and decoding. A
    record in the wrong place is caught by the position it carries, which the hash covers.
    """
    # One hasher, reset per record, fed one buffer: every call into blake3 has a fixed cost
    # (building a hasher, taking a buffer) well above hashing a 300-byte record.
    if hasher is None:
        hasher = blake3.blake3()
    reset, update, digest_of = hasher.reset, hasher.update, hasher.digest
    decode = envelope_decoder.decode
    out: list[Envelope] = []
    prev_hash = bytes(prev_hash)
    position = first
    for record in records:
        try:
            envelope = decode(record)
        except DECODE_ERRORS as exc:
            _codec.check_record(prev_hash, record, position)  # damaged bytes: say so precisely
            raise IntegrityError(
                f"event at position {position}: cannot decode: {exc}", position
            ) from exc
        reset()
        update(prev_hash + record[BODY_START:])
        digest = digest_of()
        if digest != envelope.hash:
            _codec.check_record(prev_hash, record, position)  # raises with the precise reason
        if envelope.position != position:
            raise IntegrityError(f"position {position} is missing from the log", position)
        out.append(envelope)
        prev_hash = digest
        position += 1
    return out


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
    first) and the record itself (`StorageTxn.records_around`). Each run of consecutive positions
    is one `check_run` from the hash stored before it (the `anchor`'s right after it); a missing
    record raises `IntegrityError`, one truncated away `TruncatedError`."""
    hasher = blake3.blake3()
    out: list[Envelope] = []
    run: list[Buffer] = []
    run_prev, run_first, last = GENESIS_HASH, 0, -1
    cut = 0 if anchor is None else anchor[0]
    for position, (before, record) in zip(positions, pairs, strict=True):
        follows = before is None and position == last + 1 and position != 1
        if not follows and run:
            out += check_run(run_prev, run, run_first, hasher)
            run = []
        if record is None:
            if run:
                out += check_run(run_prev, run, run_first, hasher)
            check_kept(position, cut)
            raise IntegrityError(f"position {position} is missing from the log", position)
        if not run:
            if before is not None:
                run_prev = _codec.stored_hash(before)
            elif position == 1:
                run_prev = GENESIS_HASH
            elif anchor is not None and position == cut + 1:
                run_prev = anchor[1]
            else:
                raise IntegrityError(f"position {position - 1} is missing from the log", position)
            run_first = position
        run.append(record)
        last = position
    if run:
        out += check_run(run_prev, run, run_first, hasher)
    return out


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
