"""A process that runs (or tries to start) a `Runtime` for `test_runtime_lease.py`.

Usage: `python tests/_runtime_lease_holder.py STORE MODE`, STORE a directory or a PostgreSQL URL.

- `hold`: start a runtime, create a session and prompt it through a provider that answers only
  when a `go` line arrives on stdin; stop the runtime and exit when stdin says `stop` (or closes).
  Reports `ready {"recovered": [...], "pid": ...}`, `inflight {"sid": ..., "rid": ...}` from inside
  the provider (so `prompt_started` is durable), then `ack {"text": ...}` once `prompt` returned.
- `try`: start a runtime and report `started {"recovered": [...]}`, or `refused {"type": ...,
  "message": ...}` when starting raised; then stop and exit.

Every line is flushed as it is written.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eventlog import SessionLogError
from sessions import SessionStore
from sessions.runtime import Completion, Runtime


def emit(word: str, body: dict[str, Any]) -> None:
    print(f"{word} {json.dumps(body, separators=(',', ':'))}", flush=True)


async def stdin_line() -> str:
    return (await asyncio.to_thread(sys.stdin.readline)).strip()


class GatedProvider:
    """Answers each prompt only once the test writes `go` on stdin."""

    name = "gated"
    defaults: Mapping[str, Any] = {}

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Completion:
        sid, rid = str(messages[-1]["content"]).split(" ")[:2]
        emit("inflight", {"sid": sid, "rid": rid})
        while await stdin_line() != "go":
            pass
        return Completion(text=f"answer to {rid}", usage={"input_tokens": 1, "output_tokens": 1})


async def hold(store: SessionStore) -> None:
    async with Runtime(store, providers=[GatedProvider()], default_provider="gated") as runtime:
        emit("ready", {"recovered": runtime.recovered, "pid": os.getpid()})
        sid = (await runtime.create("lease-agent"))["session_id"]
        result = await runtime.prompt(sid, f"{sid} r1 hello", request_id="r1")
        emit("ack", {"text": result["text"]})
        while await stdin_line() not in ("stop", ""):
            pass


async def attempt(store: SessionStore) -> None:
    runtime = Runtime(store, providers=[GatedProvider()], default_provider="gated")
    try:
        await runtime.start()
    except SessionLogError as exc:
        emit("refused", {"type": type(exc).__name__, "message": str(exc)})
        return
    emit("started", {"recovered": runtime.recovered})
    await runtime.stop()


def main() -> None:
    target, mode = sys.argv[1], sys.argv[2]
    with SessionStore.open(target) as store:
        asyncio.run(hold(store) if mode == "hold" else attempt(store))


if __name__ == "__main__":
    main()
