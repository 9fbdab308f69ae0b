"""Damage done underneath the API is found, named, and never mistaken for an empty or valid log.

Bytes are changed with the `lmdb` package directly (the log's own environment is closed first: one
environment per path per process), or by rewriting `data.mdb` on disk. A flipped byte breaks the
hash chain at its position; a broken stream index is caught by `verify()`; a truncated, garbage or
foreign store is refused at open with `CorruptStoreError` and left as it was.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest

from eventlog import (
    ANY,
    CorruptStoreError,
    Envelope,
    EventLog,
    IntegrityError,
    SessionLogError,
    StoreFormatError,
    limits,
)
from eventlog._codec import BODY_START, HASH_START, chain_hash
from eventlog.events import Message, MessageInjected
from tests._raw_lmdb import noise, raw_log

EVENTS = 600
STREAMS = 5
PAGE = 4096


def build(path: Path) -> list[Envelope]:
    """A log of `EVENTS` events over `STREAMS` streams, spanning well over a hundred pages."""
    rng = random.Random(7)
    with EventLog.open(path) as log:
        for batch in range(EVENTS // 10):
            with log.transaction() as tx:
                for part in range(2):
                    events = [
                        MessageInjected(
                            message=Message(
                                role="user",
                                content=f"{batch}.{part}.{k} " + noise(rng, rng.randint(300, 1500)),
                            )
                        )
                        for k in range(5)
                    ]
                    tx.append(f"s-{(batch + part) % STREAMS}", events, expected_version=ANY)
        envelopes = list(log.iter_all())
        assert log.verify().ok
    assert len(envelopes) == EVENTS
    assert (path / "data.mdb").stat().st_size > 100 * PAGE
    return envelopes


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Envelope]]:
    path = tmp_path_factory.mktemp("pristine") / "log"
    return path, build(path)


@pytest.fixture
def store(pristine: tuple[Path, list[Envelope]], tmp_path: Path) -> tuple[Path, list[Envelope]]:
    """A private copy of the pristine log, free to damage."""
    source, envelopes = pristine
    path = tmp_path / "log"
    path.mkdir()
    (path / "data.mdb").write_bytes((source / "data.mdb").read_bytes())
    return path, envelopes


@contextmanager
def raw(path: Path) -> Iterator[lmdb.Environment]:
    env = lmdb.open(str(path), subdir=True, max_dbs=8)
    try:
        yield env
    finally:
        env.close()


def rewrite_record(path: Path, position: int, change: Callable[[bytearray], None]) -> None:
    with raw_log(path) as store:
        record = bytearray(store.record(position) or b"")
        change(record)
        assert store.put_record(position, bytes(record))


def flip(offset: Callable[[bytearray], int]) -> Callable[[bytearray], None]:
    def change(record: bytearray) -> None:
        record[offset(record)] ^= 0x40

    return change


WHERE = {
    "hash": lambda record: HASH_START + 11,
    "first body byte": lambda record: BODY_START,
    "middle of the body": lambda record: (BODY_START + len(record)) // 2,
    "last body byte": lambda record: len(record) - 1,
    "record prefix": lambda record: 1,
}


# (a) a changed byte in a stored event


@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize("position", [1, 257, EVENTS - 2])
def test_a_flipped_byte_breaks_the_chain_at_its_position(
    store: tuple[Path, list[Envelope]], where: str, position: int
) -> None:
    path, envelopes = store
    rewrite_record(path, position, flip(WHERE[where]))
    with EventLog.open(path) as log:
        report = log.verify()
        assert not report.ok
        assert report.first_bad_position == position
        assert report.events_checked == position - 1
        assert report.problem is not None and f"position {position}" in report.problem

        with pytest.raises(IntegrityError) as raised:
            log.read(after=0, limit=EVENTS)
        assert raised.value.position == position
        with pytest.raises(IntegrityError) as raised:
            log.read(after=position - 1, limit=1)
        assert raised.value.position == position
        with pytest.raises(IntegrityError) as raised:
            list(log.iter_all())
        assert raised.value.position == position
        with pytest.raises(IntegrityError) as raised:
            log.read_stream(envelopes[position - 1].stream, limit=EVENTS)
        assert raised.value.position == position
        # What comes before the damage still reads, unchanged.
        if position > 1:
            assert log.read(after=0, limit=position - 1) == envelopes[: position - 1]


def test_a_rehashed_edit_is_caught_by_the_next_event(store: tuple[Path, list[Envelope]]) -> None:
    # Whoever recomputes the edited event's own hash still breaks the link the next event holds.
    path, envelopes = store
    position = 300
    prev = envelopes[position - 2].hash

    def forge(record: bytearray) -> None:
        record[len(record) - 1] ^= 0x01
        record[HASH_START:BODY_START] = chain_hash(prev, record)

    rewrite_record(path, position, forge)
    with EventLog.open(path) as log:
        report = log.verify()
        assert not report.ok and report.first_bad_position == position + 1
        with pytest.raises(IntegrityError) as raised:
            log.read(after=0, limit=EVENTS)
        assert raised.value.position == position + 1
        assert log.read(after=position - 1, limit=1)[0].hash != envelopes[position - 1].hash


# A stream read by position, as a transcript reads it: runs of five among other streams' events.
# 256 opens a run (it links to the hash stored in 255, another stream's); 257 follows it.
SCATTERED = 256


def scattered(envelopes: list[Envelope]) -> list[int]:
    stream = envelopes[SCATTERED - 1].stream
    assert envelopes[SCATTERED - 2].stream != stream == envelopes[SCATTERED].stream
    return [envelope.position for envelope in envelopes if envelope.stream == stream]


@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize("position", [SCATTERED, SCATTERED + 1])
def test_a_scattered_read_names_a_changed_event(
    store: tuple[Path, list[Envelope]], where: str, position: int
) -> None:
    path, envelopes = store
    wanted = scattered(envelopes)
    rewrite_record(path, position, flip(WHERE[where]))
    with EventLog.open(path) as log, log.view() as view:
        with pytest.raises(IntegrityError) as raised:
            view.events_at(wanted)
        assert raised.value.position == position
        sound = [p for p in wanted if p < position]
        assert view.events_at(sound) == [envelopes[p - 1] for p in sound]


def test_a_scattered_read_names_the_event_after_a_changed_link(
    store: tuple[Path, list[Envelope]],
) -> None:
    # Only the hash of the other stream's event before a run is read: changing it breaks the run.
    path, envelopes = store
    wanted = scattered(envelopes)
    rewrite_record(path, SCATTERED - 1, flip(WHERE["hash"]))
    with EventLog.open(path) as log, log.view() as view:
        with pytest.raises(IntegrityError) as raised:
            view.events_at(wanted)
        assert raised.value.position == SCATTERED


@pytest.mark.parametrize("deleted", [SCATTERED - 1, SCATTERED, SCATTERED + 1])
def test_a_scattered_read_names_a_deleted_event(
    store: tuple[Path, list[Envelope]], deleted: int
) -> None:
    path, envelopes = store
    wanted = scattered(envelopes)
    with raw_log(path) as raw_store:
        assert raw_store.delete_record(deleted)
    with EventLog.open(path) as log, log.view() as view:
        # The record met past the hole carries another position, and chains to another hash.
        with pytest.raises(IntegrityError) as raised:
            view.events_at(wanted)
        assert raised.value.position == max(deleted, SCATTERED)
        if deleted < SCATTERED:  # the run's link is gone: said as it is
            assert f"position {deleted} is missing" in str(raised.value)


def test_a_damaged_newest_event_is_refused_at_open(store: tuple[Path, list[Envelope]]) -> None:
    # Open checks the newest record, so a damaged tail fails at open instead of at a later append.
    path, _ = store
    rewrite_record(path, EVENTS, flip(WHERE["middle of the body"]))
    with pytest.raises(IntegrityError) as raised:
        EventLog.open(path)
    assert raised.value.position == EVENTS


def test_a_deleted_event_is_a_gap_verify_and_read_name(store: tuple[Path, list[Envelope]]) -> None:
    path, _ = store
    with raw_log(path) as store:
        assert store.delete_record(123)
    with EventLog.open(path) as log:
        report = log.verify()
        assert not report.ok and report.first_bad_position == 123
        assert "missing" in (report.problem or "")
        with pytest.raises(IntegrityError) as raised:
            log.read(after=100, limit=50)
        assert raised.value.position == 123


def test_a_deleted_newest_event_is_caught_by_the_index(store: tuple[Path, list[Envelope]]) -> None:
    # Cutting the tail leaves a valid, shorter chain; the stream index still counts the lost event.
    path, _ = store
    with raw_log(path) as store:
        assert store.delete_record(EVENTS)
    with EventLog.open(path) as log:
        assert log.head == EVENTS - 1
        report = log.verify()
        assert not report.ok
        assert report.events_checked == EVENTS - 1
        assert "index" in (report.problem or "")


# (b) a damaged stream index


def test_a_deleted_index_entry_is_reported(store: tuple[Path, list[Envelope]]) -> None:
    path, envelopes = store
    victim = envelopes[200]
    assert victim.version < sum(e.stream == victim.stream for e in envelopes)  # not the last one
    with raw_log(path) as store:
        store.drop_index(victim.stream, victim.version)
    with EventLog.open(path) as log:
        report = log.verify()
        assert not report.ok
        assert report.first_bad_position == victim.position
        assert "index" in (report.problem or "")
        with pytest.raises(IntegrityError):
            log.read_stream(victim.stream, limit=EVENTS)


def test_an_index_entry_pointing_elsewhere_is_reported(store: tuple[Path, list[Envelope]]) -> None:
    path, envelopes = store
    victim = envelopes[400]
    elsewhere = next(e for e in envelopes if e.stream != victim.stream)
    with raw_log(path) as store:
        store.set_index(victim.stream, victim.version, elsewhere.position)
    with EventLog.open(path) as log:
        report = log.verify()
        assert not report.ok
        assert report.first_bad_position == victim.position
        assert str(elsewhere.position) in (report.problem or "")
        with pytest.raises(IntegrityError) as raised:
            log.read_stream(victim.stream, limit=EVENTS)
        assert raised.value.position == elsewhere.position


def test_an_extra_index_entry_is_reported(store: tuple[Path, list[Envelope]]) -> None:
    path, _ = store
    with raw_log(path) as store:
        store.set_index("ghost", 1, 1)
    with EventLog.open(path) as log:
        report = log.verify()
        assert not report.ok
        assert report.events_checked == EVENTS
        assert f"{EVENTS + 1} entries" in (report.problem or "")


# (c) a truncated or garbage data file


def refused(path: Path) -> CorruptStoreError:
    data = path / "data.mdb"
    before = data.read_bytes()
    for readonly in (False, True):
        with pytest.raises(CorruptStoreError) as raised:
            EventLog.open(path, readonly=readonly)
        assert isinstance(raised.value, IntegrityError)
        assert isinstance(raised.value, SessionLogError)
        assert str(path) in str(raised.value)
        assert data.read_bytes() == before, "a refused store was written to"
    return raised.value


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(lambda full: full // 2, id="half"),
        pytest.param(lambda full: full - PAGE, id="one page short"),
        pytest.param(lambda full: 2 * PAGE, id="meta pages only"),
        pytest.param(lambda full: 100, id="100 bytes"),
        # An empty file is not here: it is LMDB's own state while it creates a store, so it is
        # opened as a new store (tests/test_log_open.py).
    ],
)
def test_a_truncated_data_file_is_refused(
    store: tuple[Path, list[Envelope]], size: Callable[[int], int]
) -> None:
    path, _ = store
    data = path / "data.mdb"
    full = data.stat().st_size
    with data.open("r+b") as handle:
        handle.truncate(size(full))
    error = refused(path)
    assert "truncated" in str(error)


@pytest.mark.parametrize("fresh_dir", [False, True], ids=["beside its lock file", "alone"])
def test_a_garbage_data_file_is_refused(
    store: tuple[Path, list[Envelope]], tmp_path: Path, fresh_dir: bool
) -> None:
    path, _ = store
    size = (path / "data.mdb").stat().st_size
    if fresh_dir:
        path = tmp_path / "garbage"
        path.mkdir()
    else:
        EventLog.open(path).close()  # leaves a lock file behind, as a real store has
    (path / "data.mdb").write_bytes(random.Random(3).randbytes(size))
    error = refused(path)
    assert "damaged" in str(error) or "not an LMDB" in str(error)


# (d) an LMDB store that is not a sessionlog log


def make_foreign(path: Path, fill: Callable[[lmdb.Environment, lmdb.Transaction], None]) -> None:
    with raw(path) as env, env.begin(write=True) as txn:
        fill(env, txn)


def named_db(env: lmdb.Environment, txn: lmdb.Transaction) -> None:
    users = env.open_db(b"users", txn=txn)
    for k in range(500):
        txn.put(f"user-{k}".encode(), b"y" * 300, db=users)


def main_db_only(env: lmdb.Environment, txn: lmdb.Transaction) -> None:
    for k in range(50):
        txn.put(f"key-{k}".encode(), b"value")


def other_format(env: lmdb.Environment, txn: lmdb.Transaction) -> None:
    txn.put(b"format", b"other-log/1", db=env.open_db(b"meta", txn=txn))


def newer_format(env: lmdb.Environment, txn: lmdb.Transaction) -> None:
    txn.put(b"format", b"sessionlog-log/999", db=env.open_db(b"meta", txn=txn))


@pytest.mark.parametrize(
    ("fill", "says"),
    [
        (named_db, "not a sessionlog log"),
        (main_db_only, "not a sessionlog log"),
        (other_format, "other-log/1"),
    ],
    ids=["named sub-database", "main database only", "another format"],
)
def test_a_foreign_lmdb_store_is_refused_and_left_alone(
    tmp_path: Path, fill: Callable[[lmdb.Environment, lmdb.Transaction], None], says: str
) -> None:
    path = tmp_path / "foreign"
    make_foreign(path, fill)
    with raw(path) as env, env.begin() as txn:
        before = (env.dbs(txn), list(txn.cursor()))
    for readonly in (False, True):
        with pytest.raises(CorruptStoreError) as raised:
            EventLog.open(path, readonly=readonly)
        assert says in str(raised.value)
        assert str(path) in str(raised.value)
    with raw(path) as env, env.begin() as txn:
        assert (env.dbs(txn), list(txn.cursor())) == before, "the foreign store was changed"


@pytest.mark.parametrize("readonly", [False, True])
def test_a_store_of_a_newer_format_is_refused_as_such_and_left_alone(
    tmp_path: Path, readonly: bool
) -> None:
    path = tmp_path / "newer"
    make_foreign(path, newer_format)
    before = (path / "data.mdb").read_bytes()
    with pytest.raises(StoreFormatError, match="newer version of sessionlog") as raised:
        EventLog.open(path, readonly=readonly)
    assert not isinstance(raised.value, IntegrityError)  # nothing in it is damaged
    assert raised.value.got == b"sessionlog-log/999"
    assert b"sessionlog-log/4" in raised.value.expected  # type: ignore[operator]
    assert (path / "data.mdb").read_bytes() == before


# (d) the last event of a verify page, and the newest event, are index-checked like the rest

WALK_PAGE = limits.read_page_events_max  # the events `verify` checks per read transaction


@pytest.fixture(scope="module")
def paged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Envelope]]:
    """A log one full verify page and a few events long, over three streams."""
    path = tmp_path_factory.mktemp("paged") / "log"
    with EventLog.open(path, sync=False) as log:
        for start in range(0, WALK_PAGE + 3, 2_000):
            with log.transaction() as tx:
                for k in range(start, min(start + 2_000, WALK_PAGE + 3)):
                    message = Message(role="user", content=str(k))
                    tx.append(
                        f"s-{k % 3}", [MessageInjected(message=message)], expected_version=ANY
                    )
        envelopes = list(log.iter_all())
    assert len(envelopes) == WALK_PAGE + 3
    return path, envelopes


@pytest.mark.parametrize(
    "victim_at",
    [WALK_PAGE, WALK_PAGE + 3, 1],
    ids=["last of a full page", "newest event", "first event"],
)
def test_an_index_entry_at_the_edge_of_a_page_pointing_elsewhere_is_reported(
    paged: tuple[Path, list[Envelope]], tmp_path: Path, victim_at: int
) -> None:
    source, envelopes = paged
    path = tmp_path / "log"
    path.mkdir()
    (path / "data.mdb").write_bytes((source / "data.mdb").read_bytes())
    victim = envelopes[victim_at - 1]
    elsewhere = next(e for e in envelopes if e.stream != victim.stream)
    with raw_log(path) as store:
        store.set_index(victim.stream, victim.version, elsewhere.position)
    with EventLog.open(path) as log:
        report = log.verify()
    assert not report.ok
    assert report.first_bad_position == victim.position
    assert f"is at position {victim.position}" in (report.problem or "")
