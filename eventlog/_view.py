"""A consistent read of the log and of projection state, inside one storage transaction.

Every record a view hands out has been checked against the chain (`eventlog/_chain.py`); a view
never writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from eventlog import _chain, limits
from eventlog._checks import check_key, check_page, check_stream
from eventlog._codec import GENESIS_HASH, Envelope
from eventlog._storage import StorageTxn, prefix_end
from eventlog.errors import IntegrityError, InvalidArgumentError, TruncatedError

if TYPE_CHECKING:
    from eventlog._transaction import Transaction


class ProjectorState(Protocol):
    """What a projector keeps for the life of one transaction (its cache, its deferred writes).
    The log only carries it: a nested transaction gets `nested()`, which replaces the parent's
    when the nested one commits, and the outermost calls `before_commit(tx)` just before its
    commit, where a failure aborts the transaction. After the commit, `after_commit()` says what
    the next write transaction may start from if no other commit comes between (None: nothing).
    Every key the transaction writes or deletes is first handed to `forget(key)`, so what it
    keeps never outlives what the store holds."""

    def nested(self) -> ProjectorState: ...

    def before_commit(self, tx: Transaction) -> None: ...

    def after_commit(self) -> ProjectorState | None: ...

    def forget(self, key: bytes) -> None: ...


class LogView:
    """A consistent read of the log and of projection state, inside one storage transaction."""

    writable = False
    """Whether this is a transaction, which may write."""
    projector_state: ProjectorState | None = None
    """Set by the projector inside a transaction (see `ProjectorState`); None in a plain view."""

    def __init__(self, txn: StorageTxn) -> None:
        self._txn = txn

    @property
    def head(self) -> int:
        return self._txn.last_position()

    def stream_version(self, stream: str) -> int:
        return self._txn.stream_version(check_stream(stream))

    def read(
        self, *, after: int = 0, limit: int = limits.read_page_events_default
    ) -> list[Envelope]:
        after, limit = check_page(after, limit, "read")
        prev = _chain.hash_at(self._txn, after)
        if prev is None:
            return []
        return _chain.check_run(prev, self._txn.values_after(after, limit), after + 1)

    def appended_with(self, idempotency_key: str) -> tuple[str, int, int] | None:
        """``(stream, first, last)`` positions of the append that carried `idempotency_key` in
        its meta, or None when none did: how a caller finds the answer to a retried request."""
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise InvalidArgumentError(
                f"appended_with: the key must be a non-empty str, got {idempotency_key!r}"
            )
        return self._txn.idempotent_positions(idempotency_key)

    def read_records(
        self, *, after: int = 0, limit: int = limits.read_page_events_default
    ) -> list[tuple[Envelope, bytes]]:
        """Like `read`, with each event's stored bytes beside it: what an export must carry to
        reproduce the hash chain elsewhere."""
        after, limit = check_page(after, limit, "read_records")
        prev = _chain.hash_at(self._txn, after)
        if prev is None:
            return []
        # Each record is copied as the chain reader reaches it, not the page first: in a packed
        # store a few damaged bytes may unpack to megabytes, and a page of them is refused at
        # the first, not held whole.
        raw: list[bytes] = []
        keep = raw.append

        def copied() -> Iterator[bytes]:
            for value in self._txn.values_after(after, limit):
                record = bytes(value)
                keep(record)
                yield record

        return list(zip(_chain.check_run(prev, copied(), after + 1), raw, strict=True))

    def events_at(self, positions: Iterable[int]) -> list[Envelope]:
        """The events at `positions`, each hash-checked against its predecessor; raises
        `IntegrityError` if one is missing. Cheapest when runs of positions are consecutive."""
        wanted = list(positions)
        try:
            return _chain.check_at(wanted, self._txn.records_around(wanted))
        except IntegrityError:
            anchor = self._txn.anchor()
            if anchor is None:
                raise
        # A truncated log: a run may start right after the anchor, or reach before it.
        around = StorageTxn.records_around(self._txn, wanted)
        return _chain.check_at(wanted, around, anchor)

    def event_at(self, position: int) -> Envelope | None:
        """The event at `position`, hash-checked against its predecessor; None past the head,
        `TruncatedError` for a position truncated away."""
        record = self._txn.record(position) if position >= 1 else None
        if record is None:
            anchor = self._txn.anchor()
            if anchor is not None:
                _chain.check_kept(position, anchor[0])
            return None
        return _chain.check_one(self._hash_before(position), record, position)

    def record_at(self, position: int) -> bytes | None:
        """The stored bytes of the event at `position` as they are (check them with `event_at`,
        or take them from a read that did); None when there is none."""
        record = self._txn.record(position) if position >= 1 else None
        return None if record is None else bytes(record)

    def stream_floor(self, stream: str) -> int:
        """The last version of `stream` truncated away with a prefix of the log (0 when none)."""
        return self._txn.stream_floor(check_stream(stream))

    @property
    def anchor(self) -> tuple[int, bytes]:
        """The last position truncated away and the chain hash there, from which the log
        verifies: (0, the genesis hash) when the log was never truncated."""
        return self._txn.anchor() or (0, GENESIS_HASH)

    def _hash_before(self, position: int) -> bytes:
        """The hash the record at `position` must chain to; `IntegrityError` when the record
        before it is missing."""
        prev = _chain.hash_at(self._txn, position - 1)
        if prev is None:
            raise IntegrityError(f"position {position - 1} is missing from the log", position)
        return prev

    def read_stream(
        self, stream: str, *, after: int = 0, limit: int = limits.read_page_events_default
    ) -> list[Envelope]:
        return self._read_stream(stream, after, limit, "read_stream", None)

    def read_stream_records(
        self, stream: str, *, after: int = 0, limit: int = limits.read_page_events_default
    ) -> list[tuple[Envelope, bytes]]:
        """Like `read_stream`, with each event's stored bytes beside it (as `read_records`): each
        record is read and unpacked once, for the check and for the caller."""
        raw: list[bytes] = []
        page = self._read_stream(stream, after, limit, "read_stream_records", raw)
        return list(zip(page, raw, strict=True))

    def _read_stream(
        self, stream: str, after: int, limit: int, doing: str, keep: list[bytes] | None
    ) -> list[Envelope]:
        key = check_stream(stream)
        after, limit = check_page(after, limit, doing)
        txn = self._txn
        out: list[Envelope] = []
        floor = txn.stream_floor(key)
        if after < floor:
            raise TruncatedError(
                f"reading stream `{stream}` from version {after + 1}: versions 1 to {floor} of it "
                "are gone",
                None,
                self.anchor[0],
            )
        for version, position in enumerate(txn.stream_positions(key, after, limit), after + 1):
            record = txn.record(position)
            if record is None:
                raise IntegrityError(
                    f"stream `{stream}` version {version} points at missing position {position}",
                    position,
                )
            envelope = _chain.check_one(self._hash_before(position), record, position)
            if envelope.stream != stream or envelope.version != version:
                raise IntegrityError(
                    f"stream index says `{stream}` v{version} is at position {position}, which "
                    f"holds `{envelope.stream}` v{envelope.version}",
                    position,
                )
            out.append(envelope)
            if keep is not None:
                keep.append(bytes(record))
        return out

    def kv_get(self, key: bytes) -> bytes | None:
        return self._txn.kv_get(check_key(key))

    def kv_scan(
        self,
        prefix: bytes = b"",
        *,
        start: bytes | None = None,
        stop: bytes | None = None,
        reverse: bool = False,
        limit: int | None = None,
    ) -> list[tuple[bytes, bytes]]:
        """Keys in ``[start, stop)`` within `prefix`, in key order (or reversed)."""
        for name, bound in (("prefix", prefix), ("start", start), ("stop", stop)):
            if not isinstance(bound, bytes) and (bound is not None or name == "prefix"):
                raise InvalidArgumentError(
                    f"kv_scan: `{name}` must be bytes, got {type(bound).__name__}"
                )
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 0
        ):
            raise InvalidArgumentError(
                f"kv_scan: `limit` must be an int >= 0 or None, got {limit!r}"
            )
        lo = prefix if start is None or start < prefix else start
        hi = prefix_end(prefix) if prefix else None
        if stop is not None and (hi is None or stop < hi):
            hi = stop
        return self._txn.kv_scan(lo, hi, reverse, limit)

    def kv_cluster_values(self, prefix: str, suffix: bytes) -> list[tuple[str, bytes]]:
        """For each stream whose name starts with `prefix` and has the projection key
        `cluster_key(name, suffix)`, in name order: the name and the key's value (one key of
        each stream's cluster read, where a scan of `cluster_key(prefix...)` reads them all)."""
        if not isinstance(prefix, str) or "\x00" in prefix:
            raise InvalidArgumentError(
                f"kv_cluster_values: `prefix` must be a str without NUL, got {prefix!r}"
            )
        if not isinstance(suffix, bytes):
            raise InvalidArgumentError(
                f"kv_cluster_values: `suffix` must be bytes, got {type(suffix).__name__}"
            )
        try:
            encoded = prefix.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(
                f"kv_cluster_values: `prefix` {prefix!r} is not valid UTF-8: {exc}"
            ) from exc
        out: list[tuple[str, bytes]] = []
        for name, value in self._txn.kv_cluster_values(encoded, suffix):
            try:
                out.append((name.decode("utf-8"), value))
            except UnicodeDecodeError:
                continue  # `kv_put` took a key whose "name" is no UTF-8: no stream's key
        return out
