"""Crash safety, demonstrated by killing a real writer process.

Fault model: the writer process is killed with SIGKILL at any instruction: while starting, between
appends, inside `append`, inside LMDB's commit, or between a commit and its acknowledgement. The
kernel, the file system and the disk keep working, so everything the process handed to the kernel
survives it. We do not simulate power loss or a kernel crash (lost or reordered writes of the page
cache); those are LMDB's fsync discipline, which `sync=True` turns on and these tests cannot reach.

What must hold after every kill, on the same store reopened round after round so the log accumulates:
every acknowledged event is present with the same stream, version, payload and hash (so the same
stored bytes, the hash covering them); every event seen in an earlier round is unchanged; every
transaction is all there or all absent; positions are dense; `verify()` passes; and the store still
takes writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import lmdb
import msgspec
import pytest

from eventlog import EventLog
from eventlog.events import Message, MessageInjected
from tests.conftest import PROFILE

ROOT = Path(__file__).resolve().parent.parent
WRITER = Path(__file__).resolve().parent / "_crash_writer.py"
KILLS = {"dev": 8, "ci": 30, "deep": 200}.get(PROFILE, 8)
SEED = 20_240_607
READY_TIMEOUT_S = 60.0


@dataclass
class Acked:
    """One event the writer acknowledged."""

    tx: str
    stream: str
    version: int
    hash: str
    digest: str


@dataclass
class Writer:
    """A running writer process and what it has reported so far."""

    proc: subprocess.Popen[bytes]
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)
    reader: threading.Thread | None = None

    def pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if not raw.endswith(b"\n"):
                break  # cut short by the kill: never acknowledged
            with self.changed:
                self.lines.append(raw.decode())
                self.changed.notify_all()
            if raw.startswith(b"ready "):
                self.ready.set()

    def begins(self) -> int:
        return sum(line.startswith("begin ") for line in self.lines)

    def wait_for_begins(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while self.begins() < count and self.proc.poll() is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.changed.wait(left)


def start_writer(path: Path, round_no: int, seed: int, stderr: Path) -> Writer:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(WRITER), str(path), str(round_no), str(seed)],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
        )
    writer = Writer(proc)
    writer.reader = threading.Thread(target=writer.pump, daemon=True)
    writer.reader.start()
    return writer


def kill_at_random_moment(writer: Writer, rng: random.Random) -> str:
    """SIGKILL the writer at a moment chosen by `rng`; returns how the moment was chosen."""
    mode = rng.choices(["startup", "anytime", "in-call"], weights=[1, 4, 5])[0]
    if mode == "startup":
        time.sleep(rng.uniform(0.0, 0.3))  # may land in the imports, in open(), or in appends
    else:
        assert writer.ready.wait(READY_TIMEOUT_S), "the writer never opened the log"
        if mode == "anytime":
            time.sleep(rng.uniform(0.0, 0.25))
        else:
            writer.wait_for_begins(rng.randint(1, 60), READY_TIMEOUT_S)
            time.sleep(rng.uniform(0.0, 0.004))  # a few ms: mostly inside append or commit
    writer.proc.send_signal(signal.SIGKILL)
    writer.proc.wait(timeout=60)
    assert writer.reader is not None and writer.proc.stdout is not None
    writer.reader.join(timeout=60)
    writer.proc.stdout.close()
    return mode


def parse(lines: list[str]) -> tuple[dict[int, Acked], set[str], str | None]:
    """Acknowledged events by position, acknowledged transactions, and the last one begun."""
    acked: dict[int, Acked] = {}
    acked_txs: set[str] = set()
    last_begun: str | None = None
    for line in lines:
        word, _, rest = line.rstrip("\n").partition(" ")
        if word == "begin":
            last_begun = rest.split()[0]
        elif word == "ack":
            report = json.loads(rest)
            acked_txs.add(report["tx"])
            for position, stream, version, hash_hex, digest in report["events"]:
                assert position not in acked, f"position {position} acknowledged twice"
                acked[position] = Acked(report["tx"], stream, version, hash_hex, digest)
    return acked, acked_txs, last_begun


def check_log(
    log: EventLog, acked: dict[int, Acked], seen: dict[int, bytes], round_no: int
) -> dict[str, list[tuple[int, int, int]]]:
    """The invariants every reopen must satisfy; returns the transactions found in the log."""
    report = log.verify()
    assert report.ok, f"round {round_no}: verify failed: {report}"
    head = log.head
    assert report.events_checked == head
    assert report.head_hash == log.head_hash

    versions: dict[str, int] = {}
    txs: dict[str, list[tuple[int, int, int]]] = {}
    expected_position = 0
    for envelope in log.iter_all(page_events=500):
        expected_position += 1
        position = envelope.position
        assert position == expected_position, f"round {round_no}: positions not dense"
        versions[envelope.stream] = versions.get(envelope.stream, 0) + 1
        assert envelope.version == versions[envelope.stream], f"{envelope.stream} not dense"
        if position in seen:
            assert envelope.hash == seen[position], f"round {round_no}: position {position} changed"
        seen[position] = envelope.hash
        assert isinstance(envelope.data, MessageInjected)
        content = envelope.data.message.content
        assert isinstance(content, str)
        tx, count = envelope.meta["tx"], envelope.meta["n"]
        label, _, _ = content.partition(" ")
        assert label.startswith(f"{tx}#"), (label, tx)
        txs.setdefault(tx, []).append((int(label.split("#")[1]), count, position))
        want = acked.get(position)
        if want is not None:
            assert (envelope.stream, envelope.version, tx) == (want.stream, want.version, want.tx)
            assert envelope.hash.hex() == want.hash, f"position {position}: other bytes"
            got = hashlib.sha256(msgspec.json.encode(envelope.data)).hexdigest()
            assert got == want.digest, f"position {position}: the payload changed"
    assert expected_position == head
    missing = sorted(set(acked) - set(range(1, head + 1)))
    assert not missing, f"round {round_no}: acknowledged positions lost: {missing[:10]}"

    for tx, parts in txs.items():
        indexes = sorted(index for index, _, _ in parts)
        counts = {count for _, count, _ in parts}
        assert counts == {len(parts)}, f"transaction {tx} is partial: {len(parts)} of {counts}"
        assert indexes == list(range(len(parts))), f"transaction {tx}: events {indexes}"
        positions = sorted(position for _, _, position in parts)
        assert positions == list(range(positions[0], positions[0] + len(parts)))
    return txs


@pytest.mark.slow
def test_sigkilled_writer_never_loses_or_tears_acknowledged_appends(tmp_path: Path) -> None:
    path = tmp_path / "log"
    rng = random.Random(SEED)
    acked: dict[int, Acked] = {}
    seen: dict[int, bytes] = {}
    modes: dict[str, int] = {}
    caught_between_commit_and_ack = 0
    in_flight_lost = 0
    started = time.monotonic()
    EventLog.open(path).close()  # a kill inside the very first open is the test below
    for round_no in range(1, KILLS + 1):
        writer = start_writer(path, round_no, rng.randrange(2**32), tmp_path / f"w{round_no}.err")
        mode = kill_at_random_moment(writer, rng)
        modes[mode] = modes.get(mode, 0) + 1
        stderr = (tmp_path / f"w{round_no}.err").read_text()
        assert writer.proc.returncode == -signal.SIGKILL, f"writer died by itself:\n{stderr}"

        round_acked, round_txs, last_begun = parse(writer.lines)
        acked.update(round_acked)
        with EventLog.open(path) as log:
            txs = check_log(log, acked, seen, round_no)
            here = {tx for tx in txs if tx.split(".")[0] == str(round_no)}
            assert round_txs <= here, f"round {round_no}: acknowledged {round_txs - here} lost"
            extra = here - round_txs
            # Only the call in flight at the kill may be there unacknowledged (it committed).
            assert extra <= {last_begun}, f"round {round_no}: unexpected transactions {extra}"
            caught_between_commit_and_ack += bool(extra)
            in_flight_lost += last_begun is not None and last_begun not in here
            # The killed writer held LMDB's write lock or a reader slot: both must be recovered.
            probe = MessageInjected(message=Message(role="user", content=f"p{round_no}#0 probe"))
            [position] = log.append(
                "probe",
                [probe],
                expected_version=log.stream_version("probe"),
                meta={"tx": f"p{round_no}", "n": 1},
            )
            seen[position] = log.read(after=position - 1, limit=1)[0].hash
    assert sum(modes.values()) == KILLS >= 5
    assert len(acked) > KILLS, "the writer hardly wrote anything; the test proves nothing"
    assert in_flight_lost + caught_between_commit_and_ack > 0, modes
    elapsed = time.monotonic() - started
    print(
        f"{KILLS} kills {modes}, {len(acked)} acknowledged events, in flight and rolled back "
        f"{in_flight_lost}, committed but unacknowledged {caught_between_commit_and_ack}, "
        f"{elapsed:.1f}s"
    )


def test_a_store_killed_during_its_first_open_still_opens(tmp_path: Path) -> None:
    # `EventLog.open` on a new path: LMDB creates data.mdb with its meta pages, then our first write
    # transaction creates the sub-databases and the format marker. A kill between the two leaves
    # an empty LMDB environment, which is a log that never held anything, not a foreign store.
    path = tmp_path / "log"
    lmdb.open(str(path), subdir=True, max_dbs=8).close()
    with EventLog.open(path) as log:
        assert log.head == 0
        log.append(
            "s", [MessageInjected(message=Message(role="user", content="x"))], expected_version=0
        )
    with EventLog.open(path) as log:
        assert log.head == 1
        assert log.verify().ok
