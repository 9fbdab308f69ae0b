"""Compressed records, the difference between format 3 and format 2 of the LMDB store.

A record is stored either as it is (its msgpack array, which starts with `_codec.RECORD_PREFIX`) or packed:
`PACKED_PREFIX`, the record's 32-byte hash, then a zstd frame of every byte after the hash. The
hash keeps its offset in both forms, so a reader that needs only the hash a record carries (the
link from the record before a wanted one) reads it without unpacking. What the chain hashes, what
`read_records` hands an export and what an import takes are always the record as it is: packing
is a matter of this store's pages only, and a log moved to PostgreSQL or another format carries
the same bytes and the same chain.

A record is packed only when it is at least `PACK_MIN_BYTES` long and packing saves at least an
eighth of it. A short record (a chat message of a few lines in its envelope) saves a few dozen
bytes at most, for the same fixed cost per call as a long one. Real agent transcripts pack to
about half (0.49 to 0.68 of the records of the agent-log fixtures): their records are batches
and tool outputs, far over the bound.
zstd at a negative (fast) level costs about 2 µs to pack and under 1 µs to unpack a 400-byte
record; zlib at its fastest level costs four times as much both ways, which is why the store
takes zstandard rather than the standard library.

Unpacking never trusts the frame: the size it declares is bounded by `limits.event_bytes_max`
before anything is allocated, and a value that does not unpack is handed on as it is stored, so
the chain reader refuses it as a damaged record at its position (`IntegrityError`), exactly as it
refuses a raw record whose bytes were changed. (Bytes after the frame are not part of the
record; zstd reads one frame and stops. They change nothing a reader sees, and the hash covers
everything it does see.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import zstandard

from eventlog import limits
from eventlog._codec import BODY_START, HASH_START, RECORD_PREFIX
from eventlog._storage import Buffer

PACKED_PREFIX = b"\x00zs"
"""Never the start of a msgpack array, so no raw record can be mistaken for a packed one."""
LEVEL = -1
"""zstd's level: the negative levels trade a little ratio for speed (0.63 of the engine
benchmark's messages at -1, 0.52 at 1, which costs more than twice the time both ways)."""
PACK_MIN_BYTES = 384
"""Records shorter than this are stored as they are without trying. Measured on the peers'
messages (80 to 900 characters, `python -m bench.store_bytes`): 490.3 bytes on disk per message
with a bound of 128, 494.4 with 384, 653.7 packing nothing; appends of 100 records of about 300
bytes (`python -m bench --suite log --only batched_append`) ran at 0.22 of raw py-lmdb with 128
and 0.34 with 384, the difference being zstd's call on every record."""

_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    # zstd contexts are not safe to share between threads; each thread keeps its own.
    try:
        found: zstandard.ZstdCompressor = _local.compressor
    except AttributeError:
        found = _local.compressor = zstandard.ZstdCompressor(
            level=LEVEL, write_content_size=True, write_checksum=False
        )
    return found


def _decompressor() -> zstandard.ZstdDecompressor:
    try:
        found: zstandard.ZstdDecompressor = _local.decompressor
    except AttributeError:
        found = _local.decompressor = zstandard.ZstdDecompressor()
    return found


def pack(record: Buffer) -> Buffer:
    """The stored form of `record`: packed when that saves an eighth of it, else `record`."""
    size = len(record)
    if size < PACK_MIN_BYTES or record[:HASH_START] != RECORD_PREFIX:
        return record  # (packing keeps the hash where a record keeps it, so no other prefix)
    view = memoryview(record)
    frame = _compressor().compress(view[BODY_START:])
    if BODY_START + len(frame) > size - size // 8:
        return record
    return b"".join((PACKED_PREFIX, view[HASH_START:BODY_START], frame))


def unpack(stored: Buffer) -> Buffer:
    """The record stored as `stored`; a value that is not a sound packed record comes back as it
    is stored, for the chain reader to refuse."""
    return unpacker()(stored)


def unpacker() -> Callable[[Buffer], Buffer]:
    """`unpack` as this thread keeps it, bound to its decompressor: a reader of many records
    takes it once, so each record costs a call into zstd and little else around it."""
    try:
        found: Callable[[Buffer], Buffer] = _local.unpack
    except AttributeError:
        found = _local.unpack = _bound_unpack(_decompressor().decompress)
    return found


def _bound_unpack(decompress: Callable[[Buffer], bytes]) -> Callable[[Buffer], Buffer]:
    content_size, join = zstandard.frame_content_size, b"".join

    def unpack_one(stored: Buffer) -> Buffer:
        if not stored or stored[0] != 0 or stored[:HASH_START] != PACKED_PREFIX:
            return stored
        frame = stored[BODY_START:]
        try:
            size = content_size(frame)
            if not 0 <= size <= limits.event_bytes_max:
                return stored
            body = decompress(frame)
        except zstandard.ZstdError:
            return stored
        if len(body) != size:
            return stored
        return join((RECORD_PREFIX, stored[HASH_START:BODY_START], body))

    return unpack_one
