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
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import lmdb
import msgspec
import pytest

from eventlog import EventLog
from eventlog.events import Message, MessageInjected
from tests._killer import KillPlan, kill_at_random_moment, start_writer
from tests.conftest import PROFILE

WRITER = Path(__file__).resolve().parent / "_crash_writer.py"
KILLS = {"dev": 8, "ci": 30, "deep": 200}.get(PROFILE, 8)
SEED = 20_240_607


@dataclass
class Acked:
    """One event the writer acknowledged."""

    tx: str
    stream: str
    version: int
    hash: str
    digest: str


PLAN = KillPlan(
    weights=(1, 4, 5), startup_max_s=0.3, anytime_max_s=0.25, steps=(1, 60), in_step_max_s=0.004
)


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
        writer = start_writer(
            WRITER,
            "begin",
            [str(path), str(round_no), str(rng.randrange(2**32))],
            tmp_path / f"w{round_no}.err",
        )
        mode = kill_at_random_moment(writer, rng, PLAN)
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
