"""The runtime suite's rows for the MCP bridge and the tool loop, each beside a baseline of the
same work done through `Runtime.prompt` directly, in the same run (see `runtime_bench.py`).

- ``mcp_prompt``: `sessions_prompt` calls through the MCP bridge (the SDK's client over
  streamable HTTP on loopback, bearer-authenticated, to the bridge on uvicorn), one after another
  on one session with the `MockProvider`, in prompts/s. Baseline: the same prompts through
  `Runtime.prompt` on the same kind of store. The note `overhead_us` is what the bridge adds
  per call (1/ours - 1/baseline); `http_post_us` is the floor under it, a plain JSON POST to a
  one-route app on the same server and client libraries, measured in the same run.
- ``tool_loop_10``: one prompt whose model calls a tool nine times, one step after another,
  then answers: ten model calls and nine tool runs, every step durable, in model steps/s.
  Baseline: ten plain prompts (ten model calls, no tools) on one session.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench._timing import Result, Sample, Stopwatch, compare
from sessions import SessionStore
from sessions.runtime import Completion, MockProvider, Runtime, Tool

if TYPE_CHECKING:
    from bench.runtime_bench import Context

PROMPT = "Summarize the open issues in the tracker and propose an order to fix them."


def _direct_round(ctx: Context, path: Path, prompts: int) -> Callable[[], Sample]:
    def run() -> Sample:
        async def body() -> Sample:
            with SessionStore.open(path) as store:
                async with Runtime(store, providers=[MockProvider("helper:mock")],
                                   default_provider="helper:mock") as runtime:  # fmt: skip
                    sid = (await runtime.create("helper"))["session_id"]
                    with Stopwatch() as watch:
                        for _ in range(prompts):
                            await runtime.prompt(sid, PROMPT)
                    await runtime.close(sid)
            return watch.sample(prompts)

        return asyncio.run(body())

    return run


def _mcp_round(ctx: Context, path: Path, prompts: int) -> Callable[[], Sample]:
    import httpx2
    import uvicorn
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from service.mcp import Agent, BridgeConfig, http_app, running_bridge

    agent = Agent(id="helper", providers={"mock": MockProvider("helper:mock")},
                  default_provider="mock")  # fmt: skip
    config = BridgeConfig(agents={"helper": agent})

    def run() -> Sample:
        async def body() -> Sample:
            with SessionStore.open(path) as store:
                expires = datetime.now(UTC) + timedelta(hours=1)
                token = store.tokens.create("bench", expires).token
                async with running_bridge(store, config) as bridge:
                    sock = socket.socket()
                    sock.bind(("127.0.0.1", 0))
                    server = uvicorn.Server(uvicorn.Config(http_app(bridge), log_level="warning"))
                    task = asyncio.create_task(server.serve(sockets=[sock]))
                    while not server.started:
                        await asyncio.sleep(0.01)
                    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
                    headers = {"authorization": f"Bearer {token}"}
                    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
                        transport = streamable_http_client(url, http_client=http)
                        async with Client(transport) as client:  # type: ignore[arg-type]
                            created = await client.call_tool(
                                "sessions_create", {"agentId": "helper"}
                            )
                            sid = created.structured_content["sessionId"]
                            with Stopwatch() as watch:
                                for _ in range(prompts):
                                    done = await client.call_tool(
                                        "sessions_prompt", {"sessionId": sid, "prompt": PROMPT}
                                    )
                                    assert not done.is_error, done
                            await client.call_tool("sessions_close", {"sessionId": sid})
                    server.should_exit = True
                    await task
                    sock.close()
            return watch.sample(prompts)

        return asyncio.run(body())

    return run


def mcp_prompt(ctx: Context) -> list[Result]:
    prompts = ctx.sizes.mcp_prompts
    result = compare(
        name="mcp_prompt",
        description=(
            f"{prompts} sessions_prompt calls through the MCP bridge (SDK client, streamable "
            "HTTP on loopback, bearer auth), MockProvider, durable"
        ),
        unit="prompts/s",
        baseline=_direct_round(ctx, ctx.tmp / "mcp-direct", prompts),
        subject=_mcp_round(ctx, ctx.tmp / "mcp-bridge", prompts),
        baseline_description="the same prompts through Runtime.prompt directly",
        rounds=ctx.sizes.rounds,
        target=None,
        budget_s=ctx.sizes.budget_s,
        progress=ctx.progress,
    )
    result.notes["overhead_us"] = round((1 / result.ours - 1 / result.baseline) * 1e6)
    result.notes["http_post_us"] = round(asyncio.run(_plain_post_s()) * 1e6)
    return [result]


async def _plain_post_s(posts: int = 30) -> float:
    """The floor under any call over HTTP here: the median time of a plain JSON POST to a
    one-route Starlette app on the same uvicorn setup, with the same client library."""
    import statistics

    import httpx2
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"echo": len(await request.body())})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = Starlette(routes=[Route("/echo", echo, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/echo"
    times = []
    async with httpx2.AsyncClient() as http:
        for _ in range(posts):
            started = time.perf_counter()
            await http.post(url, json={"prompt": PROMPT})
            times.append(time.perf_counter() - started)
    server.should_exit = True
    await task
    sock.close()
    return statistics.median(times)


class _LoopingModel:
    """Asks for one `lookup` call per step until `steps - 1` calls were made since the prompt,
    then answers."""

    name = "looping"

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.defaults: dict[str, Any] = {}

    async def complete(
        self, messages: list[dict[str, Any]], params: dict[str, Any], *, tools: Any = None
    ) -> Completion:
        asked = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        made = sum(1 for m in messages[asked:] if m.get("role") == "tool")
        usage = {"input_tokens": len(messages), "output_tokens": 1}
        if tools is None or made >= self.steps - 1:
            return Completion(text="done", usage=usage)
        call = {"id": f"call-{made}", "name": "lookup", "arguments": {"key": made}}
        return Completion(text="", stop_reason="tool_use", tool_calls=[call], usage=usage)


def _loop_round(ctx: Context, path: Path, *, tools: bool) -> Callable[[], Sample]:
    steps, tasks = 10, ctx.sizes.loop_tasks
    lookup = Tool("lookup", lambda key: {"key": key, "value": key * 2},
                  {"type": "object", "properties": {"key": {"type": "integer"}}})  # fmt: skip

    def run() -> Sample:
        async def body() -> Sample:
            with SessionStore.open(path) as store:
                model = _LoopingModel(steps)
                async with Runtime(store, providers=[model], default_provider="looping",
                                   maintain_context=False) as runtime:  # fmt: skip
                    sid = (await runtime.create("bench"))["session_id"]
                    with Stopwatch() as watch:
                        for _ in range(tasks):
                            if tools:
                                done = await runtime.prompt(sid, PROMPT, tools=[lookup])
                                assert done["steps"] == steps, done
                            else:
                                for _ in range(steps):
                                    await runtime.prompt(sid, PROMPT)
                    await runtime.close(sid)
            return watch.sample(tasks * steps)

        return asyncio.run(body())

    return run


def tool_loop_10(ctx: Context) -> list[Result]:
    result = compare(
        name="tool_loop_10",
        description=(
            f"{ctx.sizes.loop_tasks} prompts, each a 10-step tool loop (9 tool calls, each step "
            "durable)"
        ),
        unit="model steps/s",
        baseline=_loop_round(ctx, ctx.tmp / "loop-plain", tools=False),
        subject=_loop_round(ctx, ctx.tmp / "loop-tools", tools=True),
        baseline_description="10 plain prompts (one model call each) per task, no tools",
        rounds=ctx.sizes.rounds,
        target=None,
        budget_s=ctx.sizes.budget_s,
        progress=ctx.progress,
    )
    return [result]
