"""Format 4 of the LMDB store (`sessionlog-log/4`): format 3, with each stream's projection keys
stored beside its index, so a commit that appends to a stream and updates that stream's keys
dirties one leaf page there instead of one among the index chunks and one among the projection keys.

The projection key `@` + stream name + NUL + suffix (`eventlog.cluster_key`) is stored as
`i` + stream name + NUL + `ff ff ff ff` + suffix: after every index chunk of the stream (no chunk
has that number, `VERSIONS_MAX`) and before the next stream's. Every other key stays under `k`,
and one that starts with `@` without a name and a NUL is refused. This module owns the translation
between the stored order and the logical one; every answer it gives must be exactly the one
format 3 and the other backends give for the same keys, scans in logical key order.
"""

from __future__ import annotations

from collections.abc import Sequence

import lmdb

from eventlog._lmdb_base import ENTRY_OVERHEAD_BYTES, LmdbTxnBase
from eventlog._lmdb_errors import reads, translate
from eventlog._lmdb_tree import CLUSTER_CHUNK, INDEX, KV, PackedTreeTxn
from eventlog._storage import CLUSTER_PREFIX, Buffer
from eventlog.errors import InvalidArgumentError

FORMAT_4 = b"sessionlog-log/4"
_INDEX_END = bytes([INDEX[0] + 1])
_CLUSTERS_END = bytes([CLUSTER_PREFIX[0] + 1])
"""The first logical key after every cluster key (`A`): cluster keys are those from `@` to it."""


def _stored_or_none(key: bytes) -> bytes | None:
    """Where format 4 keeps `key`, a key that starts with `@`; None when it is no cluster key."""
    end = key.find(b"\x00", 1)
    if end < 2:
        return None
    return INDEX + key[1 : end + 1] + CLUSTER_CHUNK + key[end + 1 :]


def stored_key(key: bytes) -> bytes:
    """Where format 4 keeps the projection key `key`; `InvalidArgumentError` for a key that
    starts with `@` and is not `@` + stream name + NUL + suffix."""
    if key[:1] != CLUSTER_PREFIX:
        return KV + key
    stored = _stored_or_none(key)
    if stored is None:
        raise InvalidArgumentError(
            f"projection key {key!r}: a key that starts with {CLUSTER_PREFIX!r} must be "
            f"{CLUSTER_PREFIX!r} + stream name + NUL + suffix (`eventlog.cluster_key`)",
            got=key,
        )
    return stored


def logical_key(stored: bytes) -> bytes | None:
    """The projection key a key of the index region holds (`stored_key`'s inverse); None for
    an index chunk."""
    end = stored.find(b"\x00", 1)
    if end < 0 or stored[end + 1 : end + 5] != CLUSTER_CHUNK:
        return None
    return CLUSTER_PREFIX + stored[1 : end + 1] + stored[end + 5 :]


def _bound(logical: bytes | None) -> bytes:
    """Where a logical bound from `@` up to `A` (None: `A`) falls among the stored keys: every
    cluster key below it logically is stored below the result, every other one at or above."""
    if logical is None or logical >= _CLUSTERS_END:
        return _INDEX_END
    end = logical.find(b"\x00", 1)
    if end < 0:  # `@` + the start of a name: a name sorts by its bytes, stored or not
        return INDEX + logical[1:]
    if end == 1:  # `@` + NUL...: below every cluster key, whose name is never empty
        return INDEX
    return INDEX + logical[1 : end + 1] + CLUSTER_CHUNK + logical[end + 1 :]


class ClusteredTreeTxn(PackedTreeTxn):
    """A transaction over a format-4 store: format 3's, with cluster keys in the index region.
    Only the projection space differs; a key that does not start with `@` costs one byte's
    comparison more than in format 3."""

    __slots__ = ()

    @reads
    def kv_get(self, key: bytes) -> bytes | None:
        if key[:1] == CLUSTER_PREFIX:  # `_stored_or_none`, inlined: a call shows here
            end = key.find(b"\x00", 1)
            if end < 2:
                return None  # never written: format 4 refuses such a key
            value = self._txn.get(INDEX + key[1 : end + 1] + CLUSTER_CHUNK + key[end + 1 :])
        else:
            value = self._txn.get(KV + key)
        return None if value is None else bytes(value)

    def kv_put(self, key: bytes, value: Buffer) -> None:
        # One put, as format 3's, with no call between: this is the path of every projection.
        stored = KV + key if key[:1] != CLUSTER_PREFIX else stored_key(key)
        self._store.write_bytes += len(stored) + len(value) + ENTRY_OVERHEAD_BYTES
        try:
            self._txn.put(stored, value)
        except lmdb.Error as exc:
            self._store.note_failure(exc)
            raise self._store.write_failure(exc, "writing projection state") from exc

    def kv_put_many(self, items: Sequence[tuple[bytes, Buffer]]) -> None:
        for key, _ in items:
            if key[:1] == CLUSTER_PREFIX:
                break
        else:
            LmdbTxnBase.kv_put_many(self, items)  # every key under `k`, as format 3 puts them
            return
        self._put_stored([(stored_key(key), value) for key, value in items])  # refused first

    @reads
    def kv_delete(self, key: bytes) -> bool:
        return bool(self._txn.delete(stored_key(key) if key[:1] == CLUSTER_PREFIX else KV + key))

    @reads
    def kv_scan(
        self, start: bytes, stop: bytes | None, reverse: bool, limit: int | None
    ) -> list[tuple[bytes, bytes]]:
        if (stop is not None and stop <= CLUSTER_PREFIX) or start >= _CLUSTERS_END:
            return super().kv_scan(start, stop, reverse, limit)  # no cluster key in range
        if start[:1] == CLUSTER_PREFIX and stop is not None and stop <= _CLUSTERS_END:
            return self._clusters(start, stop, reverse, limit)  # cluster keys alone
        # The logical range in three parts: under `k` below `@`, the cluster keys, under `k`
        # from `A`; in reverse, the other way round.
        parts: list[tuple[bool, bytes, bytes | None]] = []
        if start < CLUSTER_PREFIX:
            parts.append((False, start, CLUSTER_PREFIX))
        parts.append((True, max(start, CLUSTER_PREFIX), _lower(stop, _CLUSTERS_END)))
        if stop is None or stop > _CLUSTERS_END:
            parts.append((False, max(start, _CLUSTERS_END), stop))
        if reverse:
            parts.reverse()
        out: list[tuple[bytes, bytes]] = []
        for clustered, low, high in parts:
            left = None if limit is None else limit - len(out)
            if left is not None and left <= 0:
                break
            if high is not None and low >= high:
                continue
            if clustered:
                out += self._clusters(low, high, reverse, left)
            else:
                out += super().kv_scan(low, high, reverse, left)
        return out

    def _clusters(
        self, low: bytes, high: bytes | None, reverse: bool, limit: int | None
    ) -> list[tuple[bytes, bytes]]:
        """The cluster keys from `low` up to `high`, both from `@` to `A`, in logical order."""
        stored_low, stored_high = _bound(low), _bound(high)
        end = low.find(b"\x00", 1)
        if end > 1 and stored_high <= INDEX + low[1:end] + b"\x01":
            # Within one stream's keys (a scan of `cluster_key(stream, prefix)`): every stored
            # key in range is one of them, with no index chunk between.
            head, cut = low[: end + 1], end + 5
            return self._scan_stored(stored_low, stored_high, reverse, limit, head, cut)
        return self._walk_clusters(stored_low, stored_high, reverse, limit)

    def _walk_clusters(
        self, low: bytes, high: bytes, reverse: bool, limit: int | None
    ) -> list[tuple[bytes, bytes]]:
        """The cluster keys stored from `low` up to `high`, stepping over each stream's index
        chunks with one seek."""
        cursor = self._txn.cursor()
        out: list[tuple[bytes, bytes]] = []
        if reverse:
            found = cursor.prev() if cursor.set_range(high) else cursor.last()
        else:
            found = cursor.set_range(low)
        while found and (limit is None or len(out) < limit):
            key = bytes(cursor.key())
            if key < low or key >= high:
                break
            logical = logical_key(key)
            if logical is not None:
                out.append((logical, bytes(cursor.value())))
                found = cursor.prev() if reverse else cursor.next()
                continue
            end = key.find(b"\x00", 1)
            if end < 0:  # no index key has no NUL: step over it
                found = cursor.prev() if reverse else cursor.next()
            elif reverse:  # an index chunk: the stream's keys below it are all chunks
                found = cursor.prev() if cursor.set_range(key[: end + 1]) else cursor.last()
            else:  # an index chunk: its stream's cluster keys follow its last chunk
                found = cursor.set_range(key[: end + 1] + CLUSTER_CHUNK)
        return out

    @reads
    def kv_cluster_values(self, prefix: bytes, suffix: bytes) -> list[tuple[bytes, bytes]]:
        # Per stream: a seek to the wanted key past the stream's index chunks, and a step on to
        # the next stream's first key (`_walk_clusters` reads every key of every cluster).
        low = INDEX + prefix
        tail = CLUSTER_CHUNK + suffix
        cursor = self._txn.cursor()
        out: list[tuple[bytes, bytes]] = []
        found = cursor.set_range(low)
        while found:
            key = bytes(cursor.key())
            if not key.startswith(low):
                break
            end = key.find(b"\x00", 1)
            if end < 0:  # no index key has no NUL: step over it
                found = cursor.next()
                continue
            stream = key[: end + 1]
            wanted = stream + tail
            if key < wanted:
                if not cursor.set_range(wanted):
                    break
                key = bytes(cursor.key())
            if key == wanted:
                out.append((key[1:end], bytes(cursor.value())))
                found = cursor.next()
            elif key.startswith(stream):  # past the wanted key: on to the next stream
                found = cursor.set_range(stream[:-1] + b"\x01")
            # else: already on the next stream's first key
        return out

    def kv_clear(self) -> None:
        super().kv_clear()
        try:
            for key, _ in self._walk_clusters(INDEX, _INDEX_END, False, None):
                self._txn.delete(stored_key(key))
        except lmdb.Error as exc:
            raise translate(exc, "clearing projection state") from exc


def _lower(bound: bytes | None, other: bytes) -> bytes:
    return other if bound is None or bound > other else bound
