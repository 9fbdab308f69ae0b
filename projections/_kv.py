"""The projections' own key-value doorway: decoded values cached, hot keys written once per commit.

Every projection read and write goes through here, never straight to the log's view. Inside a
transaction the projector keeps a `Pending` (the log carries it as `Transaction.projector_state`
and never looks inside): decoded values read or written in this transaction (`cache`), and the
values of keys rewritten by every event (a transcript, its last chunk of references, the projected
position), which `defer` keeps decoded and writes once, just before the commit. Reads of a
deferred key see it; a scan writes every deferred value first, so it sees them too. Once the
transaction has committed, the log hands the same `Pending` to this process's next write
transaction when no other commit came between (`Transaction.resume`): the values of the
sessions a process keeps writing to are decoded once, not once per commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from eventlog import InvalidArgumentError, LogView, Transaction, limits

Buffer = bytes | bytearray | memoryview


class Pending:
    """What the projector keeps for the life of one transaction (see the module's text)."""

    __slots__ = ("cache", "decoded_bytes", "deferred")

    def __init__(
        self,
        cache: dict[bytes, Any] | None = None,
        deferred: dict[bytes, tuple[Any, Callable[[Any], bytes]]] | None = None,
        decoded_bytes: int = 0,
    ) -> None:
        self.cache: dict[bytes, Any] = {} if cache is None else cache
        self.deferred: dict[bytes, tuple[Any, Callable[[Any], bytes]]] = (
            {} if deferred is None else deferred
        )
        self.decoded_bytes = decoded_bytes
        """Bytes of stored values this cache has decoded or written since it was made (never
        less when an entry is replaced): what bounds how long it is carried."""

    def nested(self) -> Pending:
        """A copy for a nested transaction: kept by the parent if it commits, dropped if not."""
        return Pending(dict(self.cache), dict(self.deferred), self.decoded_bytes)

    def before_commit(self, tx: Transaction) -> None:
        """Write every deferred value (the log calls this just before the outermost commit)."""
        if not self.deferred:
            return
        # Kept deferred until written: a refused write (a value past its limit, the transaction
        # past its bytes) that a caller catches inside the transaction must not drop them.
        deferred = list(self.deferred.items())
        items = [(key, encode(value)) for key, (value, encode) in deferred]
        tx.kv_put_many(items)  # one storage call: a shared commit defers two keys a command
        self.deferred = {}
        cache = self.cache
        for key, (value, _) in deferred:
            cache[key] = value
        self.decoded_bytes += sum(len(data) for _, data in items)

    def forget(self, key: bytes) -> None:
        """Drop the decoded value and any deferred write of `key`: the transaction wrote it."""
        self.cache.pop(key, None)
        self.deferred.pop(key, None)

    def after_commit(self) -> Pending | None:
        """Itself, as committed, for the next write transaction (its reads then start from what
        this one read and wrote), unless it has grown past `CARRIED_KEYS_MAX` keys or
        `CARRIED_BYTES_MAX` bytes decoded."""
        if len(self.cache) > CARRIED_KEYS_MAX or self.decoded_bytes > CARRIED_BYTES_MAX:
            return None
        return None if self.deferred else self


CARRIED_KEYS_MAX = 4096
"""Decoded values a `Pending` carries from one commit to the next at most: the keys of the
sessions a process is writing to; past it the next transaction starts with an empty cache."""
CARRIED_BYTES_MAX = 4 * 1024 * 1024
"""Bytes of values a carried `Pending` may have decoded or written over its life before the next
transaction starts afresh: a bound on the memory it holds (large scratchpads, metadata) that a
process writing to a few sessions reaches only after thousands of commits."""


def pending(view: LogView) -> Pending | None:
    """The projector's `Pending` of `view` when it is a transaction that has one."""
    return view.projector_state  # type: ignore[return-value]


def pending_for_write(tx: Transaction) -> Pending:
    """The projector's `Pending` of `tx`, made when it has none yet."""
    state = cast("Pending | None", tx.projector_state)
    if state is None:
        state = Pending()
        tx.projector_state = state
    return state


def cached(view: LogView, key: bytes, decode: Callable[[bytes], Any]) -> Any:
    """The value of `key` decoded, or None: from this transaction's cache when it has it."""
    state: Pending | None = view.projector_state  # type: ignore[assignment]
    if state is None:
        if not view.writable:
            data = view.kv_get(key)
            return None if data is None else decode(data)
        state = pending_for_write(cast(Transaction, view))
    cache = state.cache
    if key in cache:
        return cache[key]
    data = get(view, key)
    if data is None:
        value = None
    else:
        value = decode(data)
        state.decoded_bytes += len(data)
    cache[key] = value
    return value


def remember(tx: Transaction, key: bytes, value: Any, size: int) -> None:
    """Cache `value` as the decoding of the `size` bytes `key` now holds (after writing them)."""
    state = pending_for_write(tx)
    state.cache[key] = value
    state.decoded_bytes += size


def get(view: LogView, key: bytes) -> bytes | None:
    state: Pending | None = view.projector_state  # type: ignore[assignment]
    if state is not None:
        deferred = state.deferred.get(key)
        if deferred is not None:
            return deferred[1](deferred[0])
    return view.kv_get(key)


def scan(
    view: LogView,
    prefix: bytes = b"",
    *,
    start: bytes | None = None,
    stop: bytes | None = None,
    limit: int | None = None,
) -> list[tuple[bytes, bytes]]:
    """`LogView.kv_scan` in key order, after writing what this transaction deferred."""
    flush(view)
    return view.kv_scan(prefix, start=start, stop=stop, limit=limit)


def cluster_values(view: LogView, prefix: str, suffix: bytes) -> list[tuple[str, bytes]]:
    """`LogView.kv_cluster_values`, after writing what this transaction deferred."""
    flush(view)
    return view.kv_cluster_values(prefix, suffix)


def flush(view: LogView) -> None:
    """Write what this transaction has deferred so far (nothing in a read view)."""
    state = pending(view)
    if state is not None and state.deferred:
        state.before_commit(cast(Transaction, view))  # only a transaction has a `Pending`


def put(tx: Transaction, key: bytes, value: Buffer) -> None:
    tx.kv_put(key, value)  # which has the `Pending` forget what it held of `key`


def put_many(tx: Transaction, items: Sequence[tuple[bytes, Buffer]]) -> None:
    """`put` of each (key, value) pair, handed to storage in one call."""
    tx.kv_put_many(items)


def delete(tx: Transaction, key: bytes) -> bool:
    state = pending(tx)
    deferred = state is not None and _forget(state, key)
    return tx.kv_delete(key) or deferred


def clear(tx: Transaction) -> None:
    """Delete every projection key (for `rebuild`)."""
    tx.kv_clear()
    tx.projector_state = None


_KEY_BYTES_MAX = limits.kv_key_bytes_max
"""`limits.kv_key_bytes_max`, read once: `defer` checks it for every message."""


def defer(tx: Transaction, key: bytes, value: Any, encode: Callable[[Any], bytes]) -> None:
    """Set `key` to `encode(value)`, written once just before the commit; `value` stays decoded
    in the cache meanwhile (see the module's text)."""
    if type(key) is not bytes or not key or len(key) > _KEY_BYTES_MAX:
        raise InvalidArgumentError(
            f"projection key must be 1 to {_KEY_BYTES_MAX} bytes, got {key!r}"
        )
    state: Pending | None = tx.projector_state  # type: ignore[assignment]
    if state is None:
        state = tx.projector_state = Pending()
    state.cache[key] = value
    state.deferred[key] = (value, encode)


def _forget(state: Pending, key: bytes) -> bool:
    """Drop the cached decoding and any deferred value of `key`; whether one was deferred."""
    state.cache.pop(key, None)
    return state.deferred.pop(key, None) is not None
