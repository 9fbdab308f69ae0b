"""The LMDB map grows by itself: from a tiny map to tens of megabytes without the caller noticing.

`append` grows the map before each write so `headroom_bytes` stay free, and when a write still runs
out of room (LMDB's MapFullError) it grows the map for what that write needed and retries once.
An explicit `transaction()` is not retried for the caller: it raises `StoreFullError`, writes
nothing, and the map is grown, so retrying the transaction fits. Another process reading while
the map grows adopts the new size (LMDB's MapResizedError) and keeps reading.
"""

from __future__ import annotations

import json
import multiprocessing
import random
from pathlib import Path
from typing import Any

import pytest

from eventlog import (
    ANY,
    NO_STREAM,
    EventLog,
    StorageError,
    StoreFullError,
)
from eventlog.events import Message, MessageInjected
from tests._log_workers import content_for, size_for, tail_reader

TINY_MAP = 64 * 1024
TARGET_BYTES = 50 * 1024 * 1024
SEED = 99
UNPACKED = 2
"""These tests need their megabytes on disk as written, and text always packs in format 3 (no byte
of UTF-8 text carries 8 bits): they run on format 2, the same tree and the same growth path, whose
records are stored as they are. `test_growth_counts_what_a_packed_store_writes` covers format 3."""


def event_at(position: int) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content=content_for(position, SEED)))


def big_event(position: int) -> MessageInjected:
    """An event of about 900 KB, far bigger than the 64 KiB headroom of the tests below."""
    return MessageInjected(message=Message(role="user", content=f"{position:09d}:" + "z" * 900_000))


def check_big(log: EventLog, head: int) -> None:
    report = log.verify()
    assert report.ok, report
    assert report.events_checked == head == log.head
    for envelope in log.iter_all():
        assert envelope.data == big_event(envelope.position)


def grow(log: EventLog, target_bytes: int) -> int:
    """Appends varied events (single and batched, some near 1 MB) until `target_bytes` are in."""
    rng = random.Random(SEED)
    written = 0
    while written < target_bytes:
        head = log.head
        count = 1 if rng.random() < 0.6 else rng.randint(2, 5)
        positions = list(range(head + 1, head + count + 1))
        log.append(
            f"grow-{rng.randrange(4)}", [event_at(p) for p in positions], expected_version=ANY
        )
        written += sum(size_for(p, SEED) for p in positions)
    return log.head


def check_contents(log: EventLog, head: int) -> None:
    report = log.verify()
    assert report.ok, report
    assert report.events_checked == head == log.head
    for envelope in log.iter_all(page_events=32):
        assert isinstance(envelope.data, MessageInjected)
        assert envelope.data.message.content == content_for(envelope.position, SEED)


def count_write_attempts(monkeypatch: pytest.MonkeyPatch, log: EventLog) -> list[int]:
    """Record the map size at the start of every write transaction the log begins."""
    storage: Any = log._storage
    attempts: list[int] = []
    begin_write = storage.begin_write

    def counting() -> Any:
        attempts.append(storage.map_size())
        return begin_write()

    monkeypatch.setattr(storage, "begin_write", counting)
    return attempts


@pytest.mark.slow
@pytest.mark.parametrize("headroom", [1 << 20, None], ids=["1MiB-headroom", "default-headroom"])
def test_fifty_megabytes_from_a_tiny_map_need_no_user_action(
    tmp_path: Path, headroom: int | None
) -> None:
    path = tmp_path / "log"
    options: dict[str, Any] = {"map_size": TINY_MAP, "format_version": UNPACKED}
    if headroom is not None:
        options["headroom_bytes"] = headroom
    with EventLog.open(path, **options) as log:
        head = grow(log, TARGET_BYTES)
        assert log.size_bytes() >= TARGET_BYTES
        assert log._storage.map_size() >= TARGET_BYTES  # type: ignore[attr-defined]
    assert any(size_for(p, SEED) > 900_000 for p in range(1, head + 1))
    with EventLog.open(path, map_size=TINY_MAP) as log:  # smaller than the data: LMDB adopts it
        check_contents(log, head)


def test_growth_counts_what_a_packed_store_writes(tmp_path: Path) -> None:
    # Format 3 packs the repetitive payloads to a small part of their size: the map grows by what
    # the packed records need, from a map far smaller than them, and every payload reads back.
    path = tmp_path / "log"
    with EventLog.open(path, map_size=TINY_MAP, headroom_bytes=TINY_MAP) as log:
        head = grow(log, TARGET_BYTES // 5)
        written = sum(size_for(p, SEED) for p in range(1, head + 1))
        assert log.size_bytes() < written // 4
        assert log._storage.map_size() > TINY_MAP  # type: ignore[attr-defined]
    with EventLog.open(path, map_size=TINY_MAP) as log:
        check_contents(log, head)


def test_an_append_bigger_than_the_headroom_is_retried_by_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log"
    with EventLog.open(
        path, map_size=TINY_MAP, headroom_bytes=TINY_MAP, format_version=UNPACKED
    ) as log:
        attempts = count_write_attempts(monkeypatch, log)
        big = [big_event(p) for p in range(1, 5)]
        assert log.append("big", big, expected_version=NO_STREAM) == [1, 2, 3, 4]
        # The first attempt ran out of map (MapFullError), the automatic retry fitted.
        assert len(attempts) == 2, attempts
        assert attempts[1] > attempts[0]
    with EventLog.open(path) as log:
        check_big(log, 4)


def test_a_transaction_bigger_than_the_headroom_raises_store_full_and_a_retry_fits(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log"
    with EventLog.open(
        path, map_size=TINY_MAP, headroom_bytes=TINY_MAP, format_version=UNPACKED
    ) as log:
        log.append("first", [big_event(1)], expected_version=NO_STREAM)
        before = log.head_hash

        def big_transaction() -> None:
            with log.transaction() as tx:
                tx.append("small", [event_at(2)], expected_version=NO_STREAM)
                tx.append("big", [big_event(3), big_event(4)], expected_version=NO_STREAM)

        with pytest.raises(StoreFullError) as raised:
            big_transaction()  # an explicit transaction is not retried for the caller
        assert isinstance(raised.value, StorageError) and isinstance(raised.value, OSError)
        assert "retry" in str(raised.value)
        # Nothing of the failed transaction was written, and the log is intact.
        assert (log.head, log.head_hash) == (1, before)
        assert (log.stream_version("small"), log.stream_version("big")) == (0, 0)
        assert log.verify().ok

        big_transaction()  # it ran out in its last append, so one retry fits (StoreFullError doc)
        assert log.head == 4
        assert (log.stream_version("small"), log.stream_version("big")) == (1, 2)
    with EventLog.open(path) as log:
        assert log.verify().ok
        assert [e.data for e in log.read_stream("big")] == [big_event(3), big_event(4)]


@pytest.mark.parametrize("many", [False, True], ids=["kv_put", "kv_put_many"])
def test_a_projection_value_bigger_than_the_map_raises_store_full_and_a_retry_fits(
    tmp_path: Path, many: bool
) -> None:
    # One projection key is written straight in (`kv_put`), several through a cursor
    # (`kv_put_many`): both meet a full map as an append does, and leave the map grown.
    value = bytes(range(256)) * (4 * TINY_MAP // 256)
    with EventLog.open(tmp_path / "log", map_size=TINY_MAP, headroom_bytes=TINY_MAP) as log:
        log.append("first", [event_at(1)], expected_version=NO_STREAM)

        def put() -> None:
            with log.transaction() as tx:
                tx.append("s", [event_at(2)], expected_version=NO_STREAM)
                if many:
                    tx.kv_put_many([(b"small", b"1"), (b"big", value)])
                else:
                    tx.kv_put(b"big", value)

        with pytest.raises(StoreFullError):
            put()
        with log.view() as view:
            assert (view.head, view.kv_get(b"big")) == (1, None)
        put()  # the map was grown by what the failed transaction had written
        with log.view() as view:
            assert (view.head, view.kv_get(b"big")) == (2, value)


def test_a_transaction_that_keeps_outgrowing_the_map_fits_after_a_few_retries(
    tmp_path: Path,
) -> None:
    # Ten appends of ~1.8 MB: the map grown after each failure is sized by what the transaction
    # had written by then, so it can run out again further on, but each retry at least doubles it.
    path = tmp_path / "log"
    parts = 10
    with EventLog.open(
        path, map_size=TINY_MAP, headroom_bytes=TINY_MAP, format_version=UNPACKED
    ) as log:

        def many_parts() -> None:
            with log.transaction() as tx:
                for part in range(parts):
                    first = 2 * part + 1
                    tx.append(
                        f"part-{part}",
                        [big_event(first), big_event(first + 1)],
                        expected_version=NO_STREAM,
                    )

        failures = 0
        while True:
            try:
                many_parts()
                break
            except StoreFullError:
                failures += 1
                assert log.head == 0 and log.verify().ok
                assert failures <= 6, "the map does not grow fast enough"
        assert failures >= 1
        check_big(log, 2 * parts)


@pytest.mark.slow
def test_a_reader_process_keeps_reading_while_the_writer_grows_the_map(tmp_path: Path) -> None:
    path = tmp_path / "log"
    total_bytes = 20 * 1024 * 1024
    with EventLog.open(
        path, map_size=TINY_MAP, headroom_bytes=1 << 20, format_version=UNPACKED
    ) as log:
        log.append("grow-0", [event_at(1)], expected_version=0)
        # How many events the writer will append is fixed by the seed; the reader needs it.
        rng_total = plan_total(total_bytes)
        ctx = multiprocessing.get_context("spawn")
        out = tmp_path / "reader.json"
        opened = ctx.Event()
        reader = ctx.Process(
            target=tail_reader, args=(str(path), rng_total, SEED, str(out), opened)
        )
        reader.start()
        try:
            assert opened.wait(120), "the reader never opened the log"
            head = grow_to(log, rng_total)
        finally:
            reader.join(300)
        assert reader.exitcode == 0
        assert head == rng_total
    result = json.loads(out.read_text())
    assert result["seen"] == rng_total
    assert result["wrong"] == []
    assert result["ok"]
    # The reader started with a map far smaller than the data it ended up reading: it adopted the
    # writer's larger map when LMDB told it the map had been resized.
    assert result["first_map"] < total_bytes <= result["last_map"]


def plan_total(total_bytes: int) -> int:
    """The number of events whose payloads first add up to `total_bytes`."""
    position, written = 0, 0
    while written < total_bytes:
        position += 1
        written += size_for(position, SEED)
    return position


def grow_to(log: EventLog, total: int) -> int:
    rng = random.Random(SEED)
    while log.head < total:
        head = log.head
        count = min(total - head, 1 if rng.random() < 0.6 else rng.randint(2, 5))
        events = [event_at(p) for p in range(head + 1, head + count + 1)]
        log.append(f"grow-{rng.randrange(4)}", events, expected_version=ANY)
    return log.head
