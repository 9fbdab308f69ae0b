"""The engine on PostgreSQL: seeding, and what only a server backend has (schema migration,
idempotency keys, a down server, wake-ups). Histories against the in-memory reference run on every
backend in `test_sessions_statemachine.py`.

Every test here runs against a real server (see `tests/_pg.py`) in a schema of its own.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from eventlog import (
    NO_STREAM,
    CorruptStoreError,
    EventLog,
    StorageError,
    StoreFormatError,
    _postgres,
)
from eventlog.events import Message, MessageInjected
from tests import _pg

pytestmark = pytest.mark.needs("POSTGRES")


def said(text: str) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content=text))


# Schema: created, versioned, migrated, and refused when it is not ours


def test_a_new_schema_records_its_version_and_a_v1_schema_is_migrated() -> None:
    url = _pg.fresh_schema_url()
    schema = url.rsplit("schema=", 1)[1]
    with EventLog.open(url) as log:
        log.append("s", [said("one")], expected_version=NO_STREAM)
    with _pg.connect(_pg.database_url(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(_postgres.SCHEMA_VERSION),
        )
        # Make it look like a store written by the first version of the schema.
        conn.execute("DROP TABLE idempotency")
        conn.execute("DROP TABLE stream_floors")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    with pytest.raises(StoreFormatError, match="version 1") as raised:
        EventLog.open(url, readonly=True)
    assert (raised.value.got, raised.value.expected) == (1, _postgres.SCHEMA_VERSION)
    with EventLog.open(url) as log:
        assert log.read()[0].data == said("one")
        assert log.append("s", [said("two")], expected_version=1, meta={"idempotency_key": "k"})
    with _pg.connect(_pg.database_url(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(_postgres.SCHEMA_VERSION),
        )


def test_a_schema_from_a_newer_version_or_of_other_tables_is_refused_untouched() -> None:
    url = _pg.fresh_schema_url()
    schema = url.rsplit("schema=", 1)[1]
    EventLog.open(url).close()
    with _pg.connect(_pg.database_url(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreFormatError, match="version 99, written by a newer version"):
        EventLog.open(url)
    with _pg.connect(_pg.database_url(), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        conn.execute("UPDATE meta SET value = 'x9' WHERE key = 'schema_version'")
    with pytest.raises(CorruptStoreError, match="states schema version 'x9', not a number"):
        EventLog.open(url)
    for stated in ("\u00b2", "\u0663", "0"):  # superscript two, Arabic-Indic three; no version 0
        with _pg.connect(_pg.database_url(), autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"'.encode())
            conn.execute("UPDATE meta SET value = %s WHERE key = 'schema_version'", (stated,))
        for readonly in (False, True):
            with pytest.raises(CorruptStoreError, match="states schema version"):
                EventLog.open(url, readonly=readonly)
    missing = _pg.fresh_schema_url()  # no schema at all, opened read-only: no store, no format
    with pytest.raises(StorageError, match="holds no sessionlog log") as raised:
        EventLog.open(missing, readonly=True)
    assert not isinstance(raised.value, StoreFormatError)
    other = _pg.fresh_schema_url()
    other_schema = other.rsplit("schema=", 1)[1]
    with _pg.connect(_pg.database_url(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{other_schema}"'.encode())
        conn.execute(f'CREATE TABLE "{other_schema}".events (id int)'.encode())
    with pytest.raises(CorruptStoreError, match="not a sessionlog log"):
        EventLog.open(other)
    with _pg.connect(_pg.database_url(), autocommit=True) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (other_schema,)
        ).fetchall()
    assert tables == [("events",)]


def test_a_read_only_log_reads_and_refuses_writes() -> None:
    url = _pg.fresh_schema_url()
    with EventLog.open(url) as log:
        log.append("s", [said("one")], expected_version=NO_STREAM)
    with EventLog.open(url, readonly=True) as reader:
        assert reader.head == 1
        with pytest.raises(StorageError, match="read-only"):
            reader.append("s", [said("two")], expected_version=1)


def test_bad_urls_are_refused_with_their_reason() -> None:
    base = _pg.database_url()
    with pytest.raises(StorageError, match="pool_max must be an int"):
        EventLog.open(f"{base}?pool_max=zero")
    with pytest.raises(StorageError, match="schema must be 1 to 63 bytes"):
        EventLog.open(f"{base}?schema={'x' * 64}")


# Idempotency keys: a retried command writes once


def test_a_commit_whose_connection_dies_is_reported_as_unknown_and_retried_safely() -> None:
    """The connection is killed by the server while the writer holds its transaction open; the
    client cannot know whether the commit happened, says so, and the keyed retry writes once."""
    from eventlog import OutcomeUnknownError

    with EventLog.open(_pg.fresh_schema_url()) as log:
        log.append("s", [said("warm")], expected_version=NO_STREAM)
        meta = {"idempotency_key": "r1"}
        with pytest.raises(OutcomeUnknownError, match="may or may not"), log.transaction() as tx:
            tx.append("s", [said("x")], expected_version=1, meta=meta)
            pid = tx._txn.conn.info.backend_pid  # type: ignore[attr-defined]
            with _pg.connect(_pg.database_url(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert log.head == 1  # this time the commit did not happen
        assert log.append("s", [said("x")], expected_version=1, meta=meta) == [2]
        assert log.append("s", [said("x")], expected_version=1, meta=meta) == [2]
        assert log.verify().ok


# A down server, and cross-process wake-ups


def test_a_server_that_is_not_there_is_a_clear_error_not_a_hang() -> None:
    port = _pg.free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(StorageError, match="cannot be reached"):
        EventLog.open(f"postgresql://postgres@127.0.0.1:{port}/test")
    assert time.monotonic() - started < _postgres.CONNECT_TIMEOUT_S + 5


TAILER = """
import sys, time
from eventlog import EventLog
with EventLog.open(sys.argv[1]) as log:
    started = time.monotonic()
    for envelope in log.tail(follow=True, poll_interval_s=30.0,
                             stop=lambda: time.monotonic() - started > 60):
        print(envelope.position, flush=True)
        break
"""


def test_tail_follow_wakes_on_another_process_commit_without_waiting_the_poll() -> None:
    url = _pg.fresh_schema_url()
    EventLog.open(url).close()
    tailer = subprocess.Popen([sys.executable, "-c", TAILER, url], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        time.sleep(1.5)  # the tailer is listening (or still starting: it then reads the event)
        with EventLog.open(url) as log:
            log.append("s", [said("wake")], expected_version=NO_STREAM)
        started = time.monotonic()
        out, _ = tailer.communicate(timeout=20)
        # The poll interval is 30 s: only the notification can have woken it this early.
        assert time.monotonic() - started < 10
        assert out.strip() == "1"
    finally:
        tailer.kill()
        tailer.wait()


def test_open_creates_one_schema_when_many_processes_race() -> None:
    url = _pg.fresh_schema_url()
    code = (
        "import sys\nfrom eventlog import EventLog\n"
        "with EventLog.open(sys.argv[1]) as log: print(log.head)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    assert outs == ["0"] * 4


def test_schemas_are_separate_logs() -> None:
    a_url, b_url = _pg.fresh_schema_url(), _pg.fresh_schema_url()
    with EventLog.open(a_url) as a, EventLog.open(b_url) as b:
        a.append("s", [said("in a")], expected_version=NO_STREAM)
        assert b.head == 0
        b.append("s", [said(f"in b {uuid.uuid4()}")], expected_version=NO_STREAM)
        assert a.head == b.head == 1
        assert a.head_hash != b.head_hash
