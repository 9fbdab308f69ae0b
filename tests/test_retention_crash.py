"""Crash safety of retention, demonstrated by killing a real process during `sweep` and
`truncate_log`.

Fault model: the process is killed with SIGKILL at any instruction: while opening the store,
while writing an archive to the sink (its temporary file, the sync, the rename), while reading
the sessions or the log, inside the commit that records and retires a batch, or inside the
commit that drops the log's prefix. The kernel and the disk keep working (power loss is LMDB's
fsync discipline, which `sync=True` turns on). What must hold after every kill, on the store
reopened:

- `verify()` passes, from the log's anchor;
- a sweep's batch is archived whole or not at all: the sessions marked archived are exactly the
  first k batches of the due sessions, for some k, and each has a whole archive in the sink
  holding every one of its events (an archive may also exist for a batch that did not commit:
  the next sweep writes it again); the forgotten ones (the store is encrypted, so a sweep also
  destroys keys, one commit each) are a prefix of the archived ones, at most a batch behind;
- a truncation happened wholly or not at all: the anchor is 0 and every event is still there, or
  the anchor is the cut and every event after it is unchanged; and if it happened, the archive of
  the dropped prefix is whole and chains from the genesis hash to the anchor's hash;
- the open sessions read exactly as before, and a second run of the operation completes.
"""

from __future__ import annotations

import json
import random
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import projections as pj
from eventlog import GENESIS_HASH
from eventlog._chain import check_run
from sessions import DirectorySink, LocalKeyProvider, RetentionPolicy, SessionStore
from sessions._retention import first_needed_position
from tests._killer import KillPlan, kill_at_random_moment, start_writer
from tests.conftest import PROFILE

KEY = LocalKeyProvider(bytes(range(32)))
WRITER = Path(__file__).resolve().parent / "_retention_crash_writer.py"
KILLS = {"dev": 5, "ci": 25, "deep": 100}.get(PROFILE, 5)
SEED = 20_261_125
CLOSED, OPEN, BATCH = 120, 4, 10
PLAN = KillPlan(
    weights=(1, 2, 7), startup_max_s=0.3, anytime_max_s=0.5, steps=(1, 1), in_step_max_s=0.4
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Closed sessions with a few messages each, then a few open ones."""
    path = tmp_path_factory.mktemp("retention") / "store"
    with SessionStore.open(path, keys=KEY) as store:
        for i in range(CLOSED):
            with store.transaction():
                sid = store.open_session(f"old-{i:03d}")
                for k in range(3):
                    store.inject(sid, {"role": "user", "content": f"{i}.{k} " + "w" * 400})
                store.close_session(sid)
        for i in range(OPEN):
            sid = store.open_session(f"live-{i}")
            store.inject(sid, {"role": "user", "content": f"still here {i}"})
    return path


def snapshots(store: SessionStore) -> dict[str, object]:
    return {f"live-{i}": store.snapshot(f"live-{i}") for i in range(OPEN)}


def run_killed(tmp_path: Path, pristine: Path, op: str, arg: int, round_: int) -> tuple[Path, Path]:
    path, sink = tmp_path / f"store-{round_}", tmp_path / f"sink-{round_}"
    shutil.copytree(pristine, path)
    writer = start_writer(
        WRITER, "started", [str(path), str(sink), op, str(arg)], tmp_path / f"err-{round_}"
    )
    kill_at_random_moment(writer, random.Random(SEED + round_), PLAN)
    return path, sink


def archive_records(sink: DirectorySink, name: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in sink.read(name)]


def test_a_sweep_killed_anywhere_retires_whole_batches(tmp_path: Path, pristine: Path) -> None:
    with SessionStore.open(pristine, keys=KEY) as store:
        before = snapshots(store)
    due = [f"old-{i:03d}" for i in range(CLOSED)]  # the order a sweep walks them: by id
    for round_ in range(KILLS):
        path, sink_path = run_killed(tmp_path, pristine, "sweep", BATCH, round_)
        sink = DirectorySink(sink_path)
        with SessionStore.open(path, keys=KEY) as store:
            assert store.log.verify().ok
            with store.log.view() as view:
                archived = [
                    sid for sid in due if (state := pj.load_state(view, sid)) and state.archive
                ]
                forgotten = [
                    sid for sid in due if (state := pj.load_state(view, sid)) and state.forgotten
                ]
                names = {sid: pj.load_state(view, sid).archive for sid in archived}  # type: ignore[union-attr]
            assert forgotten == archived[: len(forgotten)]
            assert len(archived) - len(forgotten) <= BATCH
            assert archived == due[: len(archived)] and len(archived) % BATCH == 0, archived
            for sid in archived:
                lines = [
                    line
                    for line in archive_records(sink, str(names[sid]))
                    if sid in (line.get("stream"), line.get("session_id"))
                ]
                assert [line.get("version") for line in lines] == [1, 2, 3, 4, 5, None]
                assert {line["stream"] for line in lines[:-1]} == {sid}
                assert len(lines[-1]["readable"]["transcript"]) == 3
            assert snapshots(store) == before
            policy = RetentionPolicy(max_age=timedelta(days=1), action="archive", sink=sink)
            report = store.sweep(policy, now=datetime.now(UTC) + timedelta(days=30))
            assert report.archived == due[len(archived) :]
            assert report.forgotten == due[len(forgotten) :]
            assert store.verify(projections=True).ok


def test_a_truncation_killed_anywhere_is_whole_or_absent(tmp_path: Path, pristine: Path) -> None:
    with SessionStore.open(pristine, keys=KEY) as store:
        before = snapshots(store)
        head = store.log.head
        records = store.log.read_records(after=0, limit=head)
        with store.log.view() as view:
            needed = first_needed_position(view)
    assert needed is not None and needed[1] == "live-0"
    cut = needed[0]  # its opening event: the first position an open session reads
    assert cut == CLOSED * 5 + 1
    for round_ in range(KILLS):
        path, sink_path = run_killed(tmp_path, pristine, "truncate", cut, round_)
        sink = DirectorySink(sink_path)
        with SessionStore.open(path, keys=KEY) as store:
            assert store.log.verify().ok
            anchor, anchor_hash = store.log.anchor
            assert anchor in (0, cut - 1)
            kept = store.log.read_records(after=anchor, limit=head)
            assert kept == records[anchor:]
            if anchor:
                lines = archive_records(sink, f"log-{1:012d}-{cut - 1:012d}")
                raw = [bytes(records[i][1]) for i in range(cut - 1)]
                assert [line["position"] for line in lines] == list(range(1, cut))
                assert check_run(GENESIS_HASH, raw, 1)[-1].hash == anchor_hash
            assert snapshots(store) == before
            assert store.truncate_log(cut, sink=sink)[0] == cut - 1
            assert store.log.verify().ok and snapshots(store) == before
