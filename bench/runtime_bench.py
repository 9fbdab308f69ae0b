"""Benchmarks of the delegation runtime (`sessions.runtime.Runtime`), each beside a baseline in
the same run. Every prompt is durable: `prompt_started` and `prompt_completed` each reach the disk
(LMDB `sync=True`) before `prompt` returns.

- ``prompt_sequential``: `await runtime.prompt(...)` round-trips with the `MockProvider`, one
  after the other on one session, in round-trips/s. Baseline: raw py-lmdb doing the floor of any
  durable round-trip, two durable write transactions each putting one value of the size of our
  stored prompt records.
- ``prompt_concurrent``: `SESSIONS` sessions prompted at once from one event loop (each session
  one prompt after another), in round-trips/s, against the same baseline. The store's group
  commit puts the writes that queue up during a commit into the next one, so the ratio can
  exceed 1.
- ``mcp_prompt`` and ``tool_loop_10``: the MCP bridge and the tool loop (`runtime_loop_bench.py`).

After the timed rounds an untimed, instrumented run of the sequential case splits a round-trip
into the provider's time (inside `complete`), the store's time (the group commit running the
writes and committing, fsync included) and the rest (the runtime's own Python and the event loop's
hand-offs between threads); the engine's share is everything but the provider.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench import _scaffold, runtime_loop_bench
from bench._timing import Result, Sample, Stopwatch, compare
from bench.log_bench import _position_key, _raw_env
from sessions import SessionStore
from sessions.runtime import Completion, MockProvider, Runtime

PROMPT = "Summarize the open issues in the tracker and propose an order to fix them."


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    prompts: int  # sequential round-trips per round
    sessions: int  # concurrent sessions
    turns: int  # prompts per concurrent session per round
    mcp_prompts: int = 200  # sessions_prompt calls per round (mcp_prompt)
    loop_tasks: int = 20  # 10-step tool loops per round (tool_loop_10)


FULL = Sizes(rounds=7, prompts=300, sessions=64, turns=10, budget_s=120.0)
QUICK = Sizes(
    rounds=3, prompts=60, sessions=16, turns=4, budget_s=20.0, mcp_prompts=40, loop_tasks=4
)


Context = _scaffold.Context[Sizes]


def _raw_round(ctx: Context, name: str, value_bytes: int) -> Callable[[int], Sample]:
    env = _raw_env(ctx.tmp / f"{name}-raw", sync=True)
    value = b"x" * value_bytes
    state = {"next": 1}

    def run(trips: int) -> Sample:
        with Stopwatch() as watch:
            for _ in range(trips):
                for _ in range(2):  # prompt_started, then prompt_completed: two durable commits
                    with env.begin(write=True) as txn:
                        txn.put(_position_key(state["next"]), value, append=True)
                    state["next"] += 1
        return watch.sample(trips)

    return run


def _record_bytes(store: SessionStore) -> int:
    """The mean stored size of the prompt records a run wrote (for the baseline's values)."""
    sizes = [
        len(record)
        for envelope, record in store.log.read_records(limit=200)
        if envelope.type in ("prompt_started", "prompt_completed")
    ]
    return round(statistics.mean(sizes)) if sizes else 300


def _sequential_round(ctx: Context, store: SessionStore) -> Callable[[], Sample]:
    def run() -> Sample:
        async def body() -> Sample:
            async with Runtime(store) as runtime:
                sid = (await runtime.create("bench"))["session_id"]
                with Stopwatch() as watch:
                    for _ in range(ctx.sizes.prompts):
                        await runtime.prompt(sid, PROMPT)
                await runtime.close(sid)
            return watch.sample(ctx.sizes.prompts)

        return asyncio.run(body())

    return run


def _concurrent_round(ctx: Context, store: SessionStore) -> Callable[[], Sample]:
    sessions, turns = ctx.sizes.sessions, ctx.sizes.turns

    def run() -> Sample:
        async def body() -> Sample:
            async with Runtime(store) as runtime:
                ids = [(await runtime.create("bench"))["session_id"] for _ in range(sessions)]

                async def drive(sid: str) -> None:
                    for _ in range(turns):
                        await runtime.prompt(sid, PROMPT)

                with Stopwatch() as watch:
                    await asyncio.gather(*(drive(sid) for sid in ids))
                group = store._group
                ctx.cache["jobs_per_commit"] = group.shared / max(group.commits, 1)
                for sid in ids:
                    await runtime.close(sid)
            return watch.sample(sessions * turns)

        return asyncio.run(body())

    return run


def _compare(
    ctx: Context, name: str, description: str, ours: Callable[[], Sample], trips: int
) -> Result:
    store_bytes = ctx.cache.get("record_bytes", 300)
    raw = _raw_round(ctx, name, store_bytes)
    return compare(
        name=name,
        description=description,
        unit="round-trips/s",
        baseline=lambda: raw(trips),
        subject=ours,
        baseline_description=(
            f"raw py-lmdb: 2 durable write transactions per round-trip, one {store_bytes}-byte put "
            "each"
        ),
        rounds=ctx.sizes.rounds,
        target=None,
        budget_s=ctx.sizes.budget_s,
        progress=ctx.progress,
    )


def prompt_sequential(ctx: Context) -> list[Result]:
    with SessionStore.open(ctx.tmp / "sequential") as store:
        _sequential_round(ctx, store)()  # also gives the record sizes for the baseline
        ctx.cache["record_bytes"] = _record_bytes(store)
        result = _compare(
            ctx,
            "prompt_sequential",
            "await runtime.prompt() one after another on one session, MockProvider, durable",
            _sequential_round(ctx, store),
            ctx.sizes.prompts,
        )
        result.notes.update(_breakdown(ctx, store))
    return [result]


def prompt_concurrent(ctx: Context) -> list[Result]:
    with SessionStore.open(ctx.tmp / "concurrent") as store:
        result = _compare(
            ctx,
            "prompt_concurrent",
            f"{ctx.sizes.sessions} sessions prompted at once from one event loop, MockProvider, "
            "durable",
            _concurrent_round(ctx, store),
            ctx.sizes.sessions * ctx.sizes.turns,
        )
        result.notes["jobs_per_commit"] = round(ctx.cache.get("jobs_per_commit", 0.0), 1)
    return [result]


class _TimedMock(MockProvider):
    def __init__(self) -> None:
        super().__init__()
        self.spent_s = 0.0

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Completion:
        started = time.perf_counter()
        try:
            return await super().complete(messages, params)
        finally:
            self.spent_s += time.perf_counter() - started


def _breakdown(ctx: Context, store: SessionStore) -> dict[str, Any]:
    """One instrumented sequential round: provider, store (group commit) and runtime time."""
    provider = _TimedMock()

    async def body() -> tuple[float, float]:
        async with Runtime(store, providers=[provider]) as runtime:
            sid = (await runtime.create("bench"))["session_id"]
            group = store._group
            busy = group.busy_s
            started = time.perf_counter()
            for _ in range(ctx.sizes.prompts):
                await runtime.prompt(sid, PROMPT)
            elapsed = time.perf_counter() - started
            busy = group.busy_s - busy
            await runtime.close(sid)
        return elapsed, busy

    total, store_s = asyncio.run(body())
    trips = ctx.sizes.prompts
    provider_s = provider.spent_s
    return {
        "roundtrip_us": total / trips * 1e6,
        "provider_us": provider_s / trips * 1e6,
        "store_us": store_s / trips * 1e6,
        "runtime_us": (total - provider_s - store_s) / trips * 1e6,
        "engine_share": (total - provider_s) / total,
    }


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "prompt_sequential": prompt_sequential,
    "prompt_concurrent": prompt_concurrent,
    "mcp_prompt": runtime_loop_bench.mcp_prompt,
    "tool_loop_10": runtime_loop_bench.tool_loop_10,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    return _scaffold.run(BENCHMARKS, ctx, names)


def summary(results: Sequence[Result]) -> str:
    lines = []
    for row in results:
        n = row.notes
        if "roundtrip_us" in n:
            lines.append(
                f"one sequential round-trip (instrumented run): {n['roundtrip_us']:.0f} µs = "
                f"provider {n['provider_us']:.0f} µs + store (group commit: writes, commits, "
                f"fsync) {n['store_us']:.0f} µs + runtime and event loop {n['runtime_us']:.0f} µs;"
                f" the engine's share is {n['engine_share']:.1%}"
            )
        if "overhead_us" in n:
            lines.append(
                f"the MCP bridge adds {n['overhead_us']} µs per sessions_prompt call (streamable "
                "HTTP on loopback, bearer auth, JSON-RPC) over Runtime.prompt; a plain JSON POST "
                f"on the same HTTP stack takes {n['http_post_us']} µs"
            )
        if "jobs_per_commit" in n:
            lines.append(
                f"concurrent: {n['jobs_per_commit']} store writes per shared durable commit"
            )
    return "\n".join(lines)
