"""Crash safety of the delegation runtime, shown by killing a real process with prompts in flight.

Fault model: the runtime's process (`_runtime_crash_writer.py`) is killed with SIGKILL while
several sessions are being prompted at once from one event loop: inside a provider call, inside a
group commit, between a commit and the line acknowledging it. The kernel and
the disk keep working (power loss is LMDB's fsync discipline, out of a test's reach).

What must hold after every kill, with the store reopened and a new `Runtime` started on it:
- no session is busy: every prompt left in flight is recorded as failed with kind `interrupted`
  (or, if its `prompt_completed` reached the disk before the kill, as completed);
- every acknowledged prompt is there, completed, with the usage the provider reported;
- every prompt that reached its provider has a loop record, and no loop is left running;
- the projection equals a rebuild from the log, and `verify()` passes.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from projections import _runtime as rt
from sessions import SessionStore
from sessions.runtime import Runtime
from tests._killer import start_writer
from tests._runtime_crash_writer import JitteryProvider, usage_for
from tests.conftest import PROFILE, assert_rebuild_changes_nothing

WRITER = Path(__file__).resolve().parent / "_runtime_crash_writer.py"
KILLS = {"dev": 3, "ci": 8, "deep": 40}.get(PROFILE, 3)
SEED = 20_261_122


def parse(lines: list[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        word, _, body = line.partition(" ")
        out.setdefault(word, []).append(json.loads(body))
    return out


async def check_after_kill(
    store: SessionStore, reported: dict[str, list[dict[str, Any]]]
) -> dict[str, int]:
    """Start a runtime on the reopened store and check every session the killed one created."""
    tally = {"interrupted": 0, "committed_unacked": 0, "acked": 0}
    provider = JitteryProvider(random.Random(0))
    acked = {ack["rid"]: ack for ack in reported.get("ack", [])}
    reached = {(line["sid"], line["rid"]) for line in reported.get("inflight", [])}
    async with Runtime(store, providers=[provider], default_provider="jittery") as runtime:
        for created in reported.get("created", []):
            sid = created["sid"]
            status = (await runtime.status(sid))["status"]
            assert status in ("active", "idle", "failed"), f"{sid} is {status} after restart"
            record = await runtime.record(sid)
            loops = {loop["request_id"]: loop for loop in record.loops}
            for rid, loop in loops.items():
                assert loop["status"] in ("completed", "failed"), loop
                if rid in acked:
                    tally["acked"] += 1
                    assert loop["status"] == "completed"
                    assert loop["usage"]["input_tokens"] == acked[rid]["usage"]["input_tokens"]
                elif loop["status"] == "completed":
                    tally["committed_unacked"] += 1
                else:
                    assert loop["error_kind"] == "interrupted", loop
                    tally["interrupted"] += 1
                if loop["status"] == "completed":
                    prompt = f"{sid} {rid} turn {rid.rsplit('.', 1)[1]}"
                    assert loop["usage"]["input_tokens"] == usage_for(prompt)["input_tokens"]
            for owner, rid in reached:  # every prompt that reached its provider was recorded
                if owner == sid:
                    assert rid in loops, f"{rid} reached the provider but has no loop record"
            assert status != "failed" or record.loops[-1]["error_kind"] == "interrupted"
    with store.log.view() as view:
        assert list(rt.busy_ids(view)) == []
    return tally


def check_projection(store: SessionStore) -> None:
    assert store.log.verify().ok
    assert_rebuild_changes_nothing(store)


@pytest.mark.slow
def test_sigkill_with_prompts_in_flight_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store"
    rng = random.Random(SEED)
    totals = {"interrupted": 0, "committed_unacked": 0, "acked": 0}
    started = time.monotonic()
    for round_no in range(1, KILLS + 1):
        err = tmp_path / f"w{round_no}.err"
        writer = start_writer(
            WRITER, "inflight", [str(path), str(round_no), str(rng.randrange(2**32))], err
        )
        assert writer.ready.wait(60), f"round {round_no}: the writer never started"
        writer.wait_for_steps(rng.randint(4, 40), 60)
        time.sleep(rng.uniform(0.0, 0.01))  # mostly inside a provider call or a commit
        writer.proc.send_signal(signal.SIGKILL)
        writer.proc.wait(timeout=60)
        assert writer.reader is not None and writer.proc.stdout is not None
        writer.reader.join(timeout=60)
        writer.proc.stdout.close()
        assert writer.proc.returncode == -signal.SIGKILL, err.read_text()
        reported = parse(writer.lines)
        with SessionStore.open(path) as store:
            tally = asyncio.run(check_after_kill(store, reported))
            check_projection(store)
        for name, count in tally.items():
            totals[name] += count
    print(f"{KILLS} kills: {totals}; {time.monotonic() - started:.1f}s")
    assert totals["acked"] > KILLS, f"the writer hardly acknowledged anything: {totals}"
    assert totals["interrupted"] > 0, f"no kill left a prompt in flight: {totals}"
