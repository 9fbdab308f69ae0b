"""Several processes appending to one LMDB log at once, each through its own `EventLog`.

LMDB serialises writers across processes; the log must turn that into dense, unique positions,
dense stream versions, and optimistic concurrency that fails only when another writer really got
in between a process's read of a stream's version and its append.
"""

from __future__ import annotations

import json
import multiprocessing
import random
from pathlib import Path

import lmdb
import pytest

from eventlog import Envelope, EventLog
from eventlog.events import MessageInjected
from tests._log_workers import SHARED_STREAMS, append_worker, open_worker, own_stream
from tests.conftest import PROFILE, run_processes

WORKERS = 4
OPS = {"dev": 200, "ci": 1_500, "deep": 10_000}.get(PROFILE, 150)
SEED = 4_242


def label(envelope: Envelope) -> str:
    assert isinstance(envelope.data, MessageInjected)
    content = envelope.data.message.content
    assert isinstance(content, str)
    return content


@pytest.mark.slow
def test_four_processes_append_at_once(tmp_path: Path) -> None:
    path = tmp_path / "log"
    EventLog.open(path).close()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    rng = random.Random(SEED)
    outs = [tmp_path / f"worker-{worker}.json" for worker in range(WORKERS)]
    run_processes(
        append_worker,
        [
            (str(path), worker, rng.randrange(2**32), OPS, barrier, str(outs[worker]))
            for worker in range(WORKERS)
        ],
    )
    results = [json.loads(out.read_text()) for out in outs]

    with EventLog.open(path) as log:
        report = log.verify()
        assert report.ok, report
        head = log.head
        envelopes = list(log.iter_all())
        final_versions = {stream: log.stream_version(stream) for stream in SHARED_STREAMS}
    assert report.events_checked == head
    assert [envelope.position for envelope in envelopes] == list(range(1, head + 1))

    by_stream: dict[str, list[Envelope]] = {}
    by_label: dict[str, Envelope] = {}
    for envelope in envelopes:
        by_stream.setdefault(envelope.stream, []).append(envelope)
        assert label(envelope) not in by_label, f"{label(envelope)} is in the log twice"
        by_label[label(envelope)] = envelope
    for stream, items in by_stream.items():
        assert [item.version for item in items] == list(range(1, len(items) + 1)), stream
    assert {stream: len(by_stream.get(stream, [])) for stream in SHARED_STREAMS} == final_versions

    acknowledged: set[str] = set()
    for worker, result in enumerate(results):
        for ack in result["acked"]:
            for index, position in enumerate(ack["positions"]):
                name = f"w{worker}:{ack['seq']}:{index}"
                envelope = by_label.get(name)
                assert envelope is not None, f"acknowledged {name} is missing"
                assert envelope.position == position
                assert (envelope.stream, envelope.version) == (ack["stream"], ack["first"] + index)
                assert envelope.meta == {"w": worker, "seq": ack["seq"]}
                acknowledged.add(name)
    # Every worker exited normally, so nothing unacknowledged may be in the log either.
    assert acknowledged == set(by_label)
    for worker in range(WORKERS):
        own = by_stream.get(own_stream(worker), [])
        assert own and all(envelope.meta["w"] == worker for envelope in own)

    conflicts = 0
    for worker, result in enumerate(results):
        assert result["own_conflicts"] == [], f"worker {worker} conflicted on its own stream"
        for conflict in result["conflicts"]:
            conflicts += 1
            stream, expected = conflict["asked"]
            assert stream in SHARED_STREAMS
            assert (conflict["stream"], conflict["expected"]) == (stream, expected)
            actual = conflict["actual"]
            assert expected < actual <= final_versions[stream], conflict
            # The versions between what the worker read and what the append found were written
            # by other workers, after the snapshot the worker read its version from.
            between = by_stream[stream][expected:actual]
            assert len(between) == actual - expected
            assert all(envelope.meta["w"] != worker for envelope in between), conflict
            assert all(envelope.position > conflict["head_seen"] for envelope in between), conflict
    assert conflicts > 0, "no process ever raced another: the test exercised nothing"
    shared_acks = sum(ack["stream"] in SHARED_STREAMS for r in results for ack in r["acked"])
    assert shared_acks > 0
    print(f"{head} events, {shared_acks} shared appends, {conflicts} genuine conflicts")


@pytest.mark.slow
def test_processes_opening_a_blank_log_at_once_all_succeed(tmp_path: Path) -> None:
    # A blank LMDB environment is what a first `EventLog.open` leaves when it is killed before its
    # first commit, or what a concurrent first opener sees; every opener must initialise or adopt it.
    ctx = multiprocessing.get_context("spawn")
    for trial in range(3):
        path = tmp_path / f"log-{trial}"
        lmdb.open(str(path), subdir=True, max_dbs=8).close()
        barrier = ctx.Barrier(WORKERS)
        outs = [tmp_path / f"open-{trial}-{worker}" for worker in range(WORKERS)]
        run_processes(open_worker, [(str(path), barrier, str(out)) for out in outs])
        assert all(out.read_text() == "ok" for out in outs)
        with EventLog.open(path) as log:
            assert log.head == WORKERS
            assert log.stream_version("opened") == WORKERS
            assert log.verify().ok
