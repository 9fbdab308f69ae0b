"""SIGKILL in the middle of a tool loop: on restart the prompt is failed (`interrupted`), every
tool call left open gets a result, so the transcript is valid for the providers' APIs, and the
projection equals a rebuild from the log."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

from projections import _runtime as rt
from sessions import SessionStore
from sessions.runtime import Runtime
from tests._killer import start_writer
from tests._runtime_providers import FINAL_ANSWER, ScriptedProvider
from tests.conftest import assert_rebuild_changes_nothing
from tests.test_runtime_tools import assert_answered

SCRIPT = Path(__file__).resolve().parent / "_runtime_tool_crash.py"


def test_sigkill_mid_loop_fails_the_prompt_with_every_call_answered(tmp_path: Path) -> None:
    path = tmp_path / "store"
    writer = start_writer(SCRIPT, "blocked", [str(path)], tmp_path / "err.txt")
    assert writer.ready.wait(60), (tmp_path / "err.txt").read_text()
    writer.wait_for_steps(1, 60)
    assert writer.steps() == 1, (tmp_path / "err.txt").read_text()
    writer.proc.send_signal(signal.SIGKILL)
    writer.proc.wait(timeout=60)
    assert writer.reader is not None and writer.proc.stdout is not None
    writer.reader.join(timeout=60)
    writer.proc.stdout.close()
    assert writer.proc.returncode == -signal.SIGKILL
    sid = json.loads(writer.lines[-1].partition(" ")[2])["sid"]

    with SessionStore.open(path) as store:
        before = [envelope.type for envelope in store.log.read_stream(sid)]
        assert before[-3:] == ["tool_call_started", "tool_call_started", "tool_call_finished"]

        async def body() -> None:
            provider = ScriptedProvider([FINAL_ANSWER])
            async with Runtime(store, providers=[provider], default_provider="scripted") as runtime:
                assert runtime.recovered == [sid]
                record = await runtime.record(sid)
                root, *children = record.loops
                assert root["status"] == "failed" and root["error_kind"] == "interrupted"
                by_tool = {child["config"]["tool"]: child for child in children}
                assert by_tool["fast"]["status"] == "completed"
                assert by_tool["block"]["status"] == "failed"
                assert by_tool["block"]["error_kind"] == "interrupted"
                assert (await runtime.status(sid))["status"] == "failed"

        asyncio.run(body())
        after = [envelope.type for envelope in store.log.read_stream(sid)]
        assert after[len(before) :] == ["tool_call_finished", "prompt_failed"]
        messages = store.messages(sid)
        assert_answered(messages)
        assert messages[-1]["role"] == "tool" and messages[-1]["synthetic"] is True
        with store.log.view() as view:
            assert list(rt.busy_ids(view)) == []
        assert_rebuild_changes_nothing(store)
        assert store.log.verify().ok
