"""Context-view benchmarks (`python -m bench --suite context`), each against a baseline in the
same run on the same session.

- ``context_current``: `store.context(sid)` of a 10,000-message session with large tool outputs
  and no checkpoint (the view is the whole transcript, the worst case), when the cached view is
  current, vs `store.snapshot(sid)` of the same session (also served from the engine's hot
  transcript cache). Target: under 20 ms per view.
- ``context_cold``: `context` on a store with no cache, of a 10,000-message session whose latest
  checkpoint is about 40 messages from the end, vs `messages(sid)` of the same store: reading only
  the tail against reading the whole transcript.
- ``context_after_append``: one `inject` then `context`, the view extended by the new message
  only, vs one `inject` then `messages` (the hot transcript cache extended the same way).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench import _scaffold
from bench._timing import Result, Sample, Stopwatch, Target, compare
from sessions import ContextPolicy, SessionStore


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    messages: int  # messages in the benchmarked session
    big_chars: int  # every fifth tool output has this many characters, the others 2,000
    calls: int  # views per round


FULL = Sizes(rounds=9, messages=10_000, big_chars=60_000, calls=50, budget_s=60)
QUICK = Sizes(rounds=3, messages=1_000, big_chars=20_000, calls=10, budget_s=15)


Context = _scaffold.Context[Sizes]


def _build(store: SessionStore, sizes: Sizes, *, maintain: bool) -> str:
    """A session of `sizes.messages` messages in turns of a prompt, one to three tool calls with
    their outputs and an answer; with `maintain`, the context policy runs before each call."""
    sid = store.open_session()
    count = turn = 0
    while count < sizes.messages:
        batch: list[dict[str, Any]] = [{"role": "user", "content": f"turn {turn} " + "p" * 200}]
        for step in range(1 + turn % 3):
            size = sizes.big_chars if (turn + step) % 5 == 0 else 2_000
            call = {"id": f"t{turn}s{step}", "name": "read", "arguments": {"n": count}}
            batch.append({"role": "assistant", "content": "", "tool_calls": [call]})
            batch.append({"role": "tool", "tool_call_id": call["id"], "content": "x" * size})
        batch.append({"role": "assistant", "content": f"done with turn {turn}"})
        store.inject_many(sid, batch)
        if maintain:
            store.maintain_context(sid)
        count += len(batch)
        turn += 1
    return sid


def _timed(call: Callable[[], object], count: int) -> Sample:
    with Stopwatch() as watch:
        for _ in range(count):
            call()
    return watch.sample(count)


def context_current(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    with SessionStore.open(ctx.tmp / "current", sync=False) as store:
        sid = _build(store, sizes, maintain=False)
        assert len(store.context(sid)) == store.length(sid)  # no checkpoint: the worst case
        result = compare(
            name="context_current",
            description=f"store.context(sid), cached view current, {store.length(sid):,} messages",
            unit="views/s",
            baseline=lambda: _timed(lambda: store.snapshot(sid), sizes.calls),
            subject=lambda: _timed(lambda: store.context(sid), sizes.calls),
            baseline_description="store.snapshot(sid) of the same session, hot cache current",
            rounds=sizes.rounds,
            target=Target("absolute", 1 / 0.020),
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )
        result.per = "view"
        result.notes = {"messages": store.length(sid), "view_messages": store.length(sid)}
    shutil.rmtree(ctx.tmp / "current", ignore_errors=True)
    return [result]


def context_cold(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    policy = ContextPolicy(
        window_tokens=64_000, summarizer=lambda messages, **_: f"{len(messages)} messages"
    )
    path = ctx.tmp / "cold"
    with SessionStore.open(path, sync=False, context_policy=policy) as store:
        sid = _build(store, sizes, maintain=True)
    with SessionStore.open(path, sync=False, hot_sessions=0) as store:
        view = len(store.context(sid))
        result = compare(
            name="context_cold",
            description=f"store.context(sid), no cache, {store.length(sid):,} messages",
            unit="views/s",
            baseline=lambda: _timed(lambda: store.messages(sid), sizes.calls),
            subject=lambda: _timed(lambda: store.context(sid), sizes.calls),
            baseline_description="store.messages(sid) of the same store: the whole transcript",
            rounds=sizes.rounds,
            target=None,
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )
        result.per = "view"
        result.notes = {"messages": store.length(sid), "view_messages": view}
    shutil.rmtree(path, ignore_errors=True)
    return [result]


def context_after_append(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    with SessionStore.open(ctx.tmp / "append", sync=False) as store:
        sid = _build(store, sizes, maintain=False)
        message = {"role": "user", "content": "one more"}

        def ours() -> None:
            store.inject(sid, message)
            store.context(sid)

        def theirs() -> None:
            store.inject(sid, message)
            store.messages(sid)

        result = compare(
            name="context_after_append",
            description=f"inject then store.context(sid), {sizes.messages:,}+ messages",
            unit="views/s",
            baseline=lambda: _timed(theirs, sizes.calls),
            subject=lambda: _timed(ours, sizes.calls),
            baseline_description="inject then store.messages(sid): the hot cache extended",
            rounds=sizes.rounds,
            target=None,
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )
        result.per = "view"
    shutil.rmtree(ctx.tmp / "append", ignore_errors=True)
    return [result]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "context_current": context_current,
    "context_cold": context_cold,
    "context_after_append": context_after_append,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    return _scaffold.run(BENCHMARKS, ctx, names)
