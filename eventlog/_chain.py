"""Checking stored records that arrive from outside the log (an export being imported).

`RecordChecker` follows a run of pre-encoded records as they would sit in a log: each must carry
the next position, chain to the hash before it, decode, and carry the next version of its stream.
It is pure (no storage): the importer runs it over a whole source before anything is written, and
`Transaction.import_records` runs it again against the real head while writing.
"""

from __future__ import annotations

from collections.abc import Callable

from eventlog import _codec, limits
from eventlog._codec import Envelope
from eventlog.errors import IntegrityError


def _no_streams(stream: str) -> int:
    return 0


class RecordChecker:
    """Checks records one after another, as the positions after `head` of a log whose last hash
    is `head_hash`; `stream_version(stream)` gives the version of a stream not yet seen here."""

    def __init__(
        self,
        head: int = 0,
        head_hash: bytes = _codec.GENESIS_HASH,
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
        digest = _codec.check_record(self.head_hash, record, position)
        envelope = _codec.decode_record(record, position)
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
        self.head_hash = digest
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
