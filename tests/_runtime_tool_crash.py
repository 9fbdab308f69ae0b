"""The process `test_runtime_tools_crash.py` kills with SIGKILL in the middle of a tool loop.

Usage: `python tests/_runtime_tool_crash.py STORE_PATH`. It starts a `Runtime`, creates a session
and prompts it with two tools the model calls together: `fast` answers at once, `block` never
does. It prints `ready {...}` once started and `blocked {"sid": ...}` from inside `block`, when
`step_completed`, both `tool_call_started` and maybe `fast`'s `tool_call_finished` are durable.
It never exits on its own.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sessions import SessionStore
from sessions.runtime import Runtime, Tool
from tests._runtime_providers import FINAL_ANSWER, ScriptedProvider, calls


def emit(word: str, body: dict[str, object]) -> None:
    print(f"{word} {json.dumps(body)}", flush=True)


async def main() -> None:
    store = SessionStore.open(sys.argv[1])
    provider = ScriptedProvider([calls(("fast", {}), ("block", {})), FINAL_ANSWER])
    async with Runtime(store, providers=[provider], default_provider="scripted") as runtime:
        emit("ready", {"recovered": runtime.recovered})
        sid = (await runtime.create("crash-agent"))["session_id"]

        async def block() -> str:
            await asyncio.sleep(0.05)  # let `fast` record its result first
            emit("blocked", {"sid": sid})
            await asyncio.sleep(3600)
            return "never"

        tools = [Tool("fast", lambda: "fast result"), Tool("block", block)]
        await runtime.prompt(sid, "do both", tools=tools)


if __name__ == "__main__":
    asyncio.run(main())
