"""The process `test_runtime_crash.py` kills with SIGKILL while prompts are in flight.

Usage: `python tests/_runtime_crash_writer.py STORE_PATH ROUND SEED`. It starts a `Runtime` on
`SessionStore.open(STORE_PATH)` (which fails the prompts an earlier kill left in flight), creates
`SESSIONS` new sessions and prompts each of them over and over, all at once from one event loop,
through a provider that takes a random few milliseconds. It reports on stdout, one flushed line each:

- `ready {"recovered": [...]}` once the runtime has started;
- `created {"sid": ...}` after a session's creation returned;
- `inflight {"sid": ..., "rid": ...}` from inside the provider: `prompt_started` is durable;
- `ack {"sid": ..., "rid": ..., "usage": {...}}` after `prompt` returned.

It never exits on its own.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sessions import SessionStore
from sessions.runtime import Completion, Runtime

SESSIONS = 4


def emit(word: str, body: dict[str, Any]) -> None:
    print(f"{word} {json.dumps(body, separators=(',', ':'))}", flush=True)


def usage_for(prompt: str) -> dict[str, int]:
    """What the provider reports for `prompt`; the test checks the recorded usage against it."""
    return {"input_tokens": len(prompt), "output_tokens": 3, "reasoning_tokens": 1}


class JitteryProvider:
    name = "jittery"
    defaults: Mapping[str, Any] = {}

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Completion:
        prompt = str(messages[-1]["content"])
        sid, rid = prompt.split(" ")[:2]
        emit("inflight", {"sid": sid, "rid": rid})
        await asyncio.sleep(self._rng.uniform(0.0, 0.02))
        return Completion(text=f"done {rid}", usage=usage_for(prompt))


async def drive(runtime: Runtime, sid: str, round_no: str) -> None:
    turn = 0
    while True:
        turn += 1
        rid = f"{round_no}.{sid[-6:]}.{turn}"
        prompt = f"{sid} {rid} turn {turn}"
        result = await runtime.prompt(sid, prompt, request_id=rid)
        emit("ack", {"sid": sid, "rid": rid, "usage": result["usage"]})


async def main() -> None:
    path, round_no, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = SessionStore.open(path)
    provider = JitteryProvider(random.Random(seed))
    async with Runtime(store, providers=[provider], default_provider="jittery") as runtime:
        emit("ready", {"recovered": runtime.recovered})
        ids = []
        for _ in range(SESSIONS):
            sid = (await runtime.create("crash-agent"))["session_id"]
            emit("created", {"sid": sid})
            ids.append(sid)
        await asyncio.gather(*(drive(runtime, sid, round_no) for sid in ids))


if __name__ == "__main__":
    asyncio.run(main())
