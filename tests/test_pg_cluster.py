"""Many writers, a killed server and a promoted standby: the PostgreSQL log across machines.

Fault model: writers are separate processes with their own connection pools (as on separate
machines); the server may die at any instant (`pg_ctl stop -m immediate`: no checkpoint, no
goodbye to clients) and come back; a synchronous standby may be promoted after the primary dies.
What must hold: every acknowledged command is in the log exactly once, positions are dense and
follow commit order, the hash chain verifies, and clients carry on once a server answers again.
The kill and replica tests run private servers (see `tests/_pg.py`), never the shared one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventlog import EventLog
from sessions import SessionStore
from tests import _pg
from tests._pg_workers import said

# A hung server must fail the test, not the whole run.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.needs("POSTGRES")]
ROOT = Path(__file__).resolve().parent.parent


def start_workers(
    mode: str, urls: list[str], rounds: int, out_dir: Path
) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests._pg_workers",
                mode,
                url,
                str(index),
                str(rounds),
                str(out_dir / f"w{index}.jsonl"),
            ],
            cwd=ROOT,
        )
        for index, url in enumerate(urls)
    ]


def acks(out_dir: Path, index: int) -> list[dict[str, Any]]:
    path = out_dir / f"w{index}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_all(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes


def texts_by_stream(log: EventLog) -> dict[str, list[tuple[int, str]]]:
    found: dict[str, list[tuple[int, str]]] = {}
    for envelope in log.iter_all():
        message = getattr(envelope.data, "message", None)
        if message is not None:
            found.setdefault(envelope.stream, []).append((envelope.position, message.content))
    return found


def test_eight_processes_on_two_machines_share_one_dense_log(tmp_path: Path) -> None:
    url = _pg.fresh_schema_url("eight")
    machines = [f"{url}&application_name=machine-a", f"{url}&application_name=machine-b"]
    rounds = 25
    procs = start_workers("engine", [machines[i % 2] for i in range(8)], rounds, tmp_path)
    assert wait_all(procs, 240) == [0] * 8
    with SessionStore.open(url) as store:
        log = store.log
        report = log.verify()
        assert report.ok, report
        found = texts_by_stream(log)
        position_of = {(s, t): p for s, items in found.items() for p, t in items}
        assert len(position_of) == sum(map(len, found.values())), "an event was duplicated"
        expected_events = 9  # eight own sessions and one shared, each opened once
        stale = 0
        for index in range(8):
            lines = acks(tmp_path, index)
            assert lines[-1]["kind"] == "done"
            stale += lines[-1]["stale"]
            seen: list[int] = []
            for line in lines[:-1]:
                stream = {"own": f"own-{index}", "shared": "shared", "race": "race"}.get(
                    line["kind"]
                )
                if stream is None:
                    assert (line["kind"], line["text"]) == ("refused", f"{index}:stale")
                    assert ("race", line["text"]) not in position_of
                    continue
                position = position_of[(stream, line["text"])]  # every ack is there
                if "position" in line:
                    assert line["position"] == position
                seen.append(position)
                expected_events += 1
            assert seen == sorted(seen), f"worker {index}: acks out of commit order"
            assert [t for _, t in found[f"own-{index}"]] == [f"{index}:{r}" for r in range(rounds)]
        assert log.head == report.events_checked == expected_events  # nothing unacknowledged
        assert stale >= 8  # each worker's deliberately stale write, and the races it lost
        shared = [m["content"] for m in store.messages("shared")]
        assert sorted(shared) == sorted(f"{i}:{r}" for i in range(8) for r in range(rounds))
        for index in range(8):
            mine = [t for t in shared if t.startswith(f"{index}:")]
            assert mine == [f"{index}:{r}" for r in range(rounds)]


@pytest.fixture
def private_server() -> Iterator[_pg.PrivateServer]:
    server = _pg.PrivateServer("kill").init(fsync="on", synchronous_commit="on")
    try:
        server.start()
        yield server
    finally:
        server.destroy()


def create_database(server: _pg.PrivateServer, name: str) -> str:
    with _pg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    return f"{server.url(name)}?schema=app"


def wait_for_acks(out_dir: Path, workers: int, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(len(acks(out_dir, i)) >= count for i in range(workers)):
            return
        time.sleep(0.05)
    raise AssertionError(f"workers did not acknowledge {count} commands in {timeout_s} s")


def hold_commands_in_flight(server: _pg.PrivateServer, database: str) -> Any:
    """Lock the table of idempotency keys, which every keyed append writes after its `BEGIN`,
    and return the holding connection once a writer is provably stuck on it: its transaction has
    begun, so when the server dies now that command's outcome is unknown to its client, which
    must retry it (a kill between commands would be absorbed by a fresh `BEGIN`)."""
    holder = _pg.connect(server.url(database))
    holder.execute("LOCK TABLE app.idempotency IN EXCLUSIVE MODE")
    deadline = time.monotonic() + 60
    with _pg.connect(server.url(database), autocommit=True) as watcher:
        while time.monotonic() < deadline:
            (waiting,) = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                " AND wait_event_type = 'Lock' AND query ILIKE %s",
                (database, "%idempotency%"),
            ).fetchone()
            if waiting:
                return holder
            time.sleep(0.02)
    holder.close()
    raise AssertionError("no writer reached its idempotency key within 60 s")


def test_server_killed_mid_workload_loses_no_acknowledged_command(
    private_server: _pg.PrivateServer, tmp_path: Path
) -> None:
    url = create_database(private_server, "killed")
    EventLog.open(url).close()
    workers, rounds = 4, 120  # far from done after 10 each, when the lock is taken
    procs = start_workers("keyed", [url] * workers, rounds, tmp_path)
    try:
        wait_for_acks(tmp_path, workers, 10, 60)
        holder = hold_commands_in_flight(private_server, "killed")
        private_server.stop("immediate")
        holder.close()
        time.sleep(1.0)
        private_server.start()
        assert wait_all(procs, 180) == [0] * workers
    finally:
        for proc in procs:
            proc.kill()
    with EventLog.open(url) as log:
        report = log.verify()
        assert report.ok, report
        found = texts_by_stream(log)
        retries = 0
        for index in range(workers):
            lines = acks(tmp_path, index)
            assert lines[-1]["kind"] == "done", lines[-3:]
            retries += sum(line["kind"] == "retry" for line in lines)
            acked = [line for line in lines if line["kind"] == "ack"]
            assert [line["key"] for line in acked] == [f"w{index}-{t}" for t in range(rounds)]
            # Exactly once each, at the position the writer was told, even across retries.
            assert found[f"w{index}"] == [(line["positions"][0], line["key"]) for line in acked]
        assert retries > 0, "a command was in flight when the server died, yet none was retried"
        assert log.head == workers * rounds
    with SessionStore.open(url) as store:  # the engine opens the recovered log and writes
        store.open_session("after")
        store.inject("after", {"role": "user", "content": "still here"})
        assert store.log.verify().ok


def test_a_promoted_synchronous_standby_holds_every_acknowledged_event(tmp_path: Path) -> None:
    primary = _pg.PrivateServer("primary").init()
    standby = _pg.PrivateServer("standby")
    try:
        primary.start()
        url = create_database(primary, "replicated")
        EventLog.open(url).close()
        source = f"host=127.0.0.1 port={primary.port} user=postgres application_name=standby1"
        standby.run(_pg.pg_bin("pg_basebackup"), "-D", str(standby.data), "-d", source,
                    "-X", "stream", "-R", "--no-sync", "-c", "fast")  # fmt: skip
        standby.configure(port=str(standby.port), unix_socket_directories=f"'{standby.base}'",
                          synchronous_standby_names="''")  # fmt: skip
        standby.start()
        # Only now: with a synchronous standby named but absent, every commit would wait for it.
        with _pg.connect(primary.url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
            conn.execute("SELECT pg_reload_conf()")
        wait_for_sync(primary)
        procs = start_workers("keyed-once", [url] * 2, 100_000, tmp_path)
        try:
            wait_for_acks(tmp_path, 2, 20, 60)
            primary.stop("immediate")
            wait_all(procs, 60)
        finally:
            for proc in procs:
                proc.kill()
        standby.run(_pg.pg_bin("pg_ctl"), "-D", str(standby.data), "-w", "promote")
        promoted = url.replace(f":{primary.port}/", f":{standby.port}/")
        with EventLog.open(promoted) as log:
            report = log.verify()
            assert report.ok, report
            found = texts_by_stream(log)
            total = 0
            for index in range(2):
                acked = [line for line in acks(tmp_path, index) if line["kind"] == "ack"]
                assert len(acked) >= 20
                stored = found[f"w{index}"]
                # Every acknowledged event, at its position; at most the one in flight beyond.
                assert stored[: len(acked)] == [(a["positions"][0], a["key"]) for a in acked]
                assert len(stored) - len(acked) in (0, 1)
                total += len(stored)
            assert log.head == total
            assert (
                Counter(t for items in found.values() for _, t in items).most_common(1)[0][1] == 1
            )
            # The promoted server takes writes: the log carries on from its head.
            (position,) = log.append("after", [said("promoted")], expected_version=0)
            assert position == total + 1
    finally:
        standby.destroy()
        primary.destroy()


def wait_for_sync(primary: _pg.PrivateServer, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    with _pg.connect(primary.url(), autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'"
            ).fetchone()
            if row == ("sync",):
                return
            time.sleep(0.1)
    raise AssertionError(f"the standby never became synchronous\n{primary.server_log()}")
