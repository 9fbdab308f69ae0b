"""The projections' key-value doorway (`projections/_kv.py`): the cache and the deferred writes the
projector keeps for one transaction, on every backend. The log itself only carries them."""

from __future__ import annotations

import pytest

from eventlog import EventLog, LimitExceededError, cluster_key, limits
from projections import _kv


def kv_all(log: EventLog) -> list[tuple[bytes, bytes]]:
    with log.view() as view:
        return view.kv_scan()


def one_byte(value: int) -> bytes:
    return bytes([value])


def test_put_many_writes_every_pair_over_pending_state(log: EventLog) -> None:
    with log.transaction() as tx:
        _kv.put(tx, b"a", b"old")
        _kv.defer(tx, b"b", 7, one_byte)
        _kv.remember(tx, b"a", "decoded old", 3)
        _kv.put_many(tx, [(b"c", b"3"), (b"a", bytearray(b"1")), (b"b", memoryview(b"2"))])
        state = _kv.pending(tx)
        assert state is not None
        assert b"a" not in state.cache  # a cached decoding of the old value must not survive
        assert not state.deferred  # the later write wins over the deferred one
        assert _kv.scan(tx) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
        _kv.put_many(tx, [])
    assert kv_all(log) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]


def test_a_deferred_value_is_read_back_then_written_once_at_commit(log: EventLog) -> None:
    with log.transaction() as tx:
        _kv.defer(tx, b"k", 1, one_byte)
        _kv.defer(tx, b"k", 2, one_byte)
        assert tx.kv_get(b"k") is None  # not in storage yet
        assert _kv.get(tx, b"k") == b"\x02"
        assert _kv.cached(tx, b"k", lambda data: data[0]) == 2  # the decoded value, kept
    assert kv_all(log) == [(b"k", b"\x02")]
    with log.view() as view:
        assert _kv.pending(view) is None
        assert _kv.cached(view, b"k", lambda data: data[0]) == 2


def test_a_scan_sees_deferred_values(log: EventLog) -> None:
    with log.transaction() as tx:
        _kv.put(tx, b"p/1", b"a")
        _kv.defer(tx, b"p/2", 5, one_byte)
        assert _kv.scan(tx, b"p/") == [(b"p/1", b"a"), (b"p/2", b"\x05")]
        _kv.defer(tx, b"p/2", 6, one_byte)
    assert kv_all(log) == [(b"p/1", b"a"), (b"p/2", b"\x06")]


def test_a_failed_nested_transaction_drops_only_its_own_deferred_values(log: EventLog) -> None:
    with log.transaction() as tx:
        _kv.defer(tx, b"kept", 1, one_byte)
        with pytest.raises(RuntimeError), log.transaction() as inner:
            _kv.defer(inner, b"kept", 9, one_byte)
            _kv.defer(inner, b"dropped", 9, one_byte)
            raise RuntimeError("undo the inner block")
        assert _kv.get(tx, b"kept") == b"\x01"
        assert _kv.get(tx, b"dropped") is None
        with log.transaction() as inner:
            _kv.defer(inner, b"later", 3, one_byte)
        assert _kv.get(tx, b"later") == b"\x03"
    assert kv_all(log) == [(b"kept", b"\x01"), (b"later", b"\x03")]


def test_delete_and_clear_drop_deferred_values(log: EventLog) -> None:
    with log.transaction() as tx:
        _kv.defer(tx, b"a", 1, one_byte)
        assert _kv.delete(tx, b"a") is True  # it was there, if only deferred
        assert _kv.get(tx, b"a") is None
        _kv.put(tx, b"b", b"x")
        _kv.defer(tx, b"c", 2, one_byte)
        _kv.clear(tx)
        assert _kv.pending(tx) is None
        assert _kv.scan(tx) == []
    assert kv_all(log) == []


def test_a_refused_flush_inside_a_transaction_keeps_every_deferred_value(log: EventLog) -> None:
    # A scan writes the deferred values first; when that write is refused and the caller goes on,
    # the values must still be deferred: the commit then writes them, or is refused itself.
    small, big = cluster_key("a", b"t"), cluster_key("b", b"t")
    with pytest.raises(LimitExceededError), log.transaction() as tx:
        _kv.defer(tx, small, b"small", bytes)
        _kv.defer(tx, big, b"x" * (limits.kv_value_bytes_max + 1), bytes)
        with pytest.raises(LimitExceededError):
            _kv.cluster_values(tx, "", b"t")
        state = _kv.pending(tx)
        assert state is not None and set(state.deferred) == {small, big}
    assert kv_all(log) == []  # nothing committed without the values its events folded into
    with log.transaction() as tx:
        _kv.defer(tx, small, b"small", bytes)
        assert _kv.cluster_values(tx, "", b"t") == [("a", b"small")]
    assert kv_all(log) == [(small, b"small")]
