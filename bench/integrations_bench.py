"""Framework integration benchmarks (`python -m bench --suite integrations`), each against that
framework's own default durable store in the same run, on the same items.

OpenAI Agents SDK: `SessionlogSession` vs the SDK's `SQLiteSession` on a file.
- ``oa_append``: durable `add_items` of one turn (4 items: a user message, a function call, its
  output, the answer), items per second.
- ``oa_last20``: `get_items(20)` of a 10,000-item session.
- ``oa_fork``: branching a 2,000-item session: our `fork()` (O(1)) vs copying the items into a
  new `SQLiteSession`, the only way to branch there. Target: 50 times faster.
- ``oa_bytes``: bytes on disk after 2,000 items, shown as items per MB (higher is better).

Google ADK: `SessionlogSessionService` vs ADK's `SqliteSessionService` on a file.
- ``adk_append``: durable `append_event` of one model event with a session-state delta.
- ``adk_last20``: `get_session` with `num_recent_events=20` of a 10,000-event session.
- ``adk_fork``: our `fork_session` of a 2,000-event session vs what ADK offers for it (it has no
  fork): a new session and one `append_event` per event.
- ``adk_bytes``: bytes on disk after 2,000 events, as events per MB.
- ``adk_list``: `list_sessions` of an app with 10,000 sessions. Target: under 100 ms.

LangGraph: `SessionlogSaver` vs LangGraph's `SqliteSaver` on a file, both fed the same `put`s of a
thread whose messages channel grows by one message (about 250 bytes) per checkpoint.
- ``lg_put``: durable `put` on a thread already holding `lg_steps` checkpoints.
- ``lg_latest``: `get_tuple` of that thread's latest checkpoint (the whole message list).
- ``lg_copy``: `copy_thread` of that thread: our fork vs reading every checkpoint and putting it
  into a new thread (`SqliteSaver` has no copy). Target: 50 times faster.
- ``lg_bytes``: bytes on disk after `lg_steps` checkpoints, as checkpoints per MB; the notes give
  our bytes per checkpoint over the last 100 against the new message's own size (target: at most
  twice, flat in the thread's length).

Targets: ahead of the framework's store on every row (ratio >= 1), the fork at least 50 times.
The framework is imported when its rows run, so the suite needs its extra installed.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _scaffold
from bench._timing import Result, Sample, Stopwatch, Target, compare


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    turns: int  # turns appended per round of the append rows
    big: int  # items of the session the last-20 rows read
    fork_items: int  # items of the forked session, and of the on-disk size rows
    calls: int  # reads or forks per round
    lg_steps: int = 2_000  # checkpoints of the LangGraph thread


FULL = Sizes(rounds=9, turns=40, big=10_000, fork_items=2_000, calls=50, budget_s=90)
QUICK = Sizes(rounds=3, turns=10, big=1_000, fork_items=400, calls=10, budget_s=20, lg_steps=300)

AHEAD = Target("ratio", 1.0)
FORK_TARGET = Target("ratio", 50.0)

Context = _scaffold.Context[Sizes]


def turn_items(turn: int) -> list[dict[str, Any]]:
    """One agent turn as Responses-API input items, about 600 bytes of JSON in all."""
    call_id = f"call-{turn}"
    return [
        {"role": "user", "content": f"turn {turn}: what is the weather in Oslo and why? " * 2},
        {
            "type": "function_call",
            "call_id": call_id,
            "name": "weather",
            "arguments": '{"city": "Oslo", "units": "metric"}',
            "id": f"fc-{turn}",
        },
        {
            "type": "function_call_output",
            "call_id": call_id,
            "output": "sunny, 21 degrees, light wind from the west " * 2,
        },
        {
            "id": f"msg-{turn}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "It is sunny in Oslo. " * 3, "annotations": []}
            ],
        },
    ]


def items(count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    turn = 0
    while len(out) < count:
        out.extend(turn_items(turn))
        turn += 1
    return out[:count]


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk under `path` (a file or a directory), sparse holes not counted."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_blocks * 512 for p in files)


class _Loop:
    """One event loop for a whole benchmark, so each timed call is the call, not loop setup."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        self.loop.close()


@dataclass
class _Pair:
    """Our store and the framework's, side by side under `root`, and one event loop. `close()`
    closes both stores (once); the directory goes when the row ends."""

    root: Path
    loop: _Loop
    ours: Any
    theirs: Any
    closers: list[Callable[[], object]]
    closed: bool = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for closer in self.closers:
                closer()

    def disk_bytes(self) -> tuple[int, int]:
        """Bytes on disk of ours (under root/sessionlog) and of theirs (everything else), once
        both are closed (a WAL folded back, an LMDB lock file kept: what a user's disk holds)."""
        self.close()
        ours = disk_bytes(self.root / "sessionlog")
        return ours, disk_bytes(self.root) - ours


@contextmanager
def _paired(ctx: Context, name: str, make: Callable[[Path, _Loop], _Pair]) -> Iterator[_Pair]:
    root = ctx.tmp / name
    root.mkdir(parents=True, exist_ok=True)
    loop = _Loop()
    pair = make(root, loop)
    try:
        yield pair
    finally:
        pair.close()
        loop.close()
        shutil.rmtree(root, ignore_errors=True)


def _timed(loop: _Loop, call: Callable[[], Any], count: int, units: float | None = None) -> Sample:
    async def many() -> None:
        for _ in range(count):
            await call()

    with Stopwatch() as watch:
        loop.run(many())
    return watch.sample(count if units is None else units)


def _plain(call: Callable[[], Any], count: int) -> Sample:
    with Stopwatch() as watch:
        for _ in range(count):
            call()
    return watch.sample(count)


def _compare(
    ctx: Context,
    name: str,
    description: str,
    unit: str,
    *,
    baseline: Callable[[], Sample],
    subject: Callable[[], Sample],
    baseline_description: str,
    target: Target = AHEAD,
    per: str | None = None,
    warmup: int = 1,
    rounds: int | None = None,
) -> list[Result]:
    """One row: `compare` with the suite's rounds, budget and progress."""
    result = compare(
        name=name,
        description=description,
        unit=unit,
        baseline=baseline,
        subject=subject,
        baseline_description=baseline_description,
        rounds=ctx.sizes.rounds if rounds is None else rounds,
        target=target,
        warmup=warmup,
        budget_s=ctx.sizes.budget_s,
        progress=ctx.progress,
    )
    if per is not None:
        result.per = per
    return [result]


def _bytes_result(
    name: str, framework: str, count: int, ours: int, theirs: int, baseline: str
) -> list[Result]:
    """On-disk size as items per MB, a rate like every other row (higher is better)."""
    ours_rate, theirs_rate = count / (ours / 1e6), count / (theirs / 1e6)
    result = Result(
        name=name,
        description=f"{framework}: bytes on disk after {count:,} items",
        unit="items/MB",
        ours=ours_rate,
        baseline=theirs_rate,
        baseline_description=baseline,
        target=AHEAD,
        rounds=1,
        ours_cpu=ours_rate,
        baseline_cpu=theirs_rate,
        ours_rounds=[ours_rate],
        baseline_rounds=[theirs_rate],
        notes={"ours_bytes": ours, "baseline_bytes": theirs, "items": count},
    )
    return [result]


# OpenAI Agents SDK


def _oa(root: Path, loop: _Loop) -> _Pair:
    from agents import SQLiteSession

    from integrations.openai_agents import SessionlogSession

    ours = SessionlogSession("bench", store=root / "sessionlog")
    theirs = SQLiteSession("bench", root / "sqlite.db")
    return _Pair(root, loop, ours, theirs, [lambda: loop.run(ours.store.aclose()), theirs.close])


def oa_append(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    turns = [turn_items(t) for t in range(sizes.turns)]
    with _paired(ctx, "oa_append", _oa) as pair:

        def rounds(session: Any) -> Callable[[], Sample]:
            def one() -> Sample:
                batches = iter(turns)
                add = lambda: session.add_items(next(batches))  # noqa: E731
                return _timed(pair.loop, add, len(turns), units=4 * len(turns))

            return one

        return _compare(
            ctx,
            "oa_append",
            f"OpenAI Agents add_items of one 4-item turn, durable, {sizes.turns} turns",
            "items/s",
            baseline=rounds(pair.theirs),
            subject=rounds(pair.ours),
            baseline_description="the SDK's SQLiteSession on a file (WAL, its defaults)",
        )


def oa_last20(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    data = items(sizes.big)
    with _paired(ctx, "oa_last20", _oa) as pair:
        ours, theirs, loop = pair.ours, pair.theirs, pair.loop
        # Stored as a run stores them, one add_items (one event, one row each) per 4-item turn;
        # built in one commit per side so the set-up does not take thousands of fsyncs.
        store = ours.store.store
        store.open_session(ours.session_id)
        with store.transaction():
            for first in range(0, len(data), 4):
                turn = [{"item": item} for item in data[first : first + 4]]
                store.inject_many(ours.session_id, turn)
        for first in range(0, len(data), 1_000):
            loop.run(theirs.add_items(data[first : first + 1_000]))
        assert loop.run(ours.get_items(20)) == loop.run(theirs.get_items(20)) == data[-20:]
        return _compare(
            ctx,
            "oa_last20",
            f"OpenAI Agents get_items(20) of a {sizes.big:,}-item session",
            "reads/s",
            baseline=lambda: _timed(loop, lambda: theirs.get_items(20), sizes.calls),
            subject=lambda: _timed(loop, lambda: ours.get_items(20), sizes.calls),
            baseline_description="the SDK's SQLiteSession (an index on session and id)",
            per="read",
        )


def oa_fork(ctx: Context) -> list[Result]:
    from agents import SQLiteSession

    sizes = ctx.sizes
    data = items(sizes.fork_items)
    with _paired(ctx, "oa_fork", _oa) as pair:
        ours, theirs, loop = pair.ours, pair.theirs, pair.loop
        loop.run(ours.add_items(data))
        loop.run(theirs.add_items(data))
        copies = [0]

        async def copy() -> None:  # SQLiteSession cannot branch: read the history, write anew
            copies[0] += 1
            branch = SQLiteSession(f"branch-{copies[0]}", theirs.db_path)
            await branch.add_items(await theirs.get_items())
            branch.close()

        return _compare(
            ctx,
            "oa_fork",
            f"OpenAI Agents branch of a {sizes.fork_items:,}-item session",
            "forks/s",
            baseline=lambda: _timed(loop, copy, max(sizes.calls // 10, 2)),
            subject=lambda: _timed(loop, ours.fork, sizes.calls),
            baseline_description="copying its items into a new SQLiteSession",
            target=FORK_TARGET,
            per="fork",
        )


def oa_bytes(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    with _paired(ctx, "oa_bytes", _oa) as pair:
        for turn in range(sizes.fork_items // 4):  # one commit per turn, as a run writes them
            batch = turn_items(turn)
            pair.loop.run(pair.ours.add_items(batch))
            pair.loop.run(pair.theirs.add_items(batch))
        ours_bytes, theirs_bytes = pair.disk_bytes()
    return _bytes_result(
        "oa_bytes",
        "OpenAI Agents",
        sizes.fork_items,
        ours_bytes,
        theirs_bytes,
        "the SDK's SQLiteSession file (and its WAL)",
    )


# Google ADK

ADK_APP, ADK_USER = "bench-app", "bench-user"


def adk_event(index: int, *, delta: bool = True) -> Any:
    from google.adk.events import Event, EventActions
    from google.genai import types

    text = f"event {index}: it is sunny in Oslo, 21 degrees, light wind from the west. " * 3
    return Event(
        invocation_id=f"inv-{index // 4}",
        author="forecaster" if index % 2 else "user",
        content=types.Content(role="model" if index % 2 else "user", parts=[types.Part(text=text)]),
        actions=EventActions(state_delta={"turn": index} if delta else {}),
    )


def _adk(root: Path, loop: _Loop) -> _Pair:
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    from integrations.adk import SessionlogSessionService

    ours = SessionlogSessionService(root / "sessionlog")
    theirs = SqliteSessionService(str(root / "adk.db"))
    closers = [lambda: loop.run(ours.store.aclose()), lambda: loop.run(theirs.close())]
    return _Pair(root, loop, ours, theirs, closers)


def _adk_session(pair: _Pair, service: Any, session_id: str | None = None) -> Any:
    create = service.create_session(app_name=ADK_APP, user_id=ADK_USER, session_id=session_id)
    return pair.loop.run(create)


def adk_append(ctx: Context) -> list[Result]:
    with _paired(ctx, "adk_append", _adk) as pair:
        counter = [0]

        def rounds(service: Any) -> Callable[[], Sample]:
            session = _adk_session(pair, service)

            async def one() -> None:
                counter[0] += 1
                await service.append_event(session, adk_event(counter[0]))

            return lambda: _timed(pair.loop, one, ctx.sizes.turns)

        return _compare(
            ctx,
            "adk_append",
            "ADK append_event with a state delta, durable",
            "events/s",
            baseline=rounds(pair.theirs),
            subject=rounds(pair.ours),
            baseline_description="ADK's SqliteSessionService on a file (its defaults)",
        )


def _adk_fill(pair: _Pair, count: int) -> None:
    """Session "s" of `count` events on each side, as `append_event` stores them, in one commit
    per side (set-up, not measured)."""
    import sqlite3

    ours, theirs = pair.ours, pair.theirs
    mine = _adk_session(pair, ours, "s")
    mine._storage_update_marker = None
    mine.last_update_time = float("inf")  # the stale check passes on a marker-less copy
    with ours.store.store.transaction():
        for index in range(count):
            event = adk_event(index, delta=False)
            ours._append(mine, event, event.model_dump(mode="python", exclude_none=True))
    _adk_session(pair, theirs, "s")
    rows = []
    for index in range(count):
        event = adk_event(index, delta=False)
        event.timestamp = 1_000_000.0 + index
        fields = (event.id, ADK_APP, ADK_USER, "s", event.invocation_id, event.timestamp)
        rows.append((*fields, event.model_dump_json(exclude_none=True)))
    with sqlite3.connect(theirs._db_path) as db:
        db.executemany(
            "INSERT INTO events (id, app_name, user_id, session_id, invocation_id, timestamp,"
            " event_data) VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )


def adk_last20(ctx: Context) -> list[Result]:
    from google.adk.sessions.base_session_service import GetSessionConfig

    sizes = ctx.sizes
    config = GetSessionConfig(num_recent_events=20)
    with _paired(ctx, "adk_last20", _adk) as pair:
        _adk_fill(pair, sizes.big)

        def read(service: Any) -> Callable[[], Any]:
            return lambda: service.get_session(
                app_name=ADK_APP, user_id=ADK_USER, session_id="s", config=config
            )

        got = [pair.loop.run(read(service)()) for service in (pair.ours, pair.theirs)]
        assert [len(g.events) for g in got] == [20, 20]
        return _compare(
            ctx,
            "adk_last20",
            f"ADK get_session(num_recent_events=20), {sizes.big:,} events",
            "reads/s",
            baseline=lambda: _timed(pair.loop, read(pair.theirs), sizes.calls),
            subject=lambda: _timed(pair.loop, read(pair.ours), sizes.calls),
            baseline_description="ADK's SqliteSessionService (ORDER BY timestamp DESC LIMIT 20)",
            per="read",
        )


def adk_fork(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    with _paired(ctx, "adk_fork", _adk) as pair:
        ours, theirs = pair.ours, pair.theirs
        _adk_fill(pair, sizes.fork_items)
        get = theirs.get_session(app_name=ADK_APP, user_id=ADK_USER, session_id="s")
        source = pair.loop.run(get)
        copies = [0]

        async def copy() -> None:  # ADK cannot fork: a new session, every event appended
            copies[0] += 1
            branch = await theirs.create_session(app_name=ADK_APP, user_id=ADK_USER)
            for event in source.events:
                await theirs.append_event(
                    branch, event.model_copy(update={"id": f"{event.id}-{copies[0]}"})
                )

        async def fork() -> None:
            await ours.fork_session(app_name=ADK_APP, user_id=ADK_USER, session_id="s")

        return _compare(
            ctx,
            "adk_fork",
            f"ADK branch of a {sizes.fork_items:,}-event session",
            "forks/s",
            baseline=lambda: _timed(pair.loop, copy, 1),
            subject=lambda: _timed(pair.loop, fork, sizes.calls // 5 or 1),
            baseline_description="a new SqliteSessionService session, one append_event per event",
            target=FORK_TARGET,
            per="fork",
            warmup=0,
        )


def adk_bytes(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    with _paired(ctx, "adk_bytes", _adk) as pair:
        for service in (pair.ours, pair.theirs):
            session = _adk_session(pair, service)
            for index in range(sizes.fork_items):
                pair.loop.run(service.append_event(session, adk_event(index, delta=False)))
        ours_bytes, theirs_bytes = pair.disk_bytes()
    return _bytes_result(
        "adk_bytes",
        "Google ADK",
        sizes.fork_items,
        ours_bytes,
        theirs_bytes,
        "ADK's SqliteSessionService file",
    )


def adk_list(ctx: Context) -> list[Result]:
    import sqlite3

    count = ctx.sizes.big
    with _paired(ctx, "adk_list", _adk) as pair:
        ours, theirs = pair.ours, pair.theirs
        with ours.store.store.transaction():
            for index in range(count):
                ours._create(ADK_APP, f"user-{index % 100}", f"s-{index}", {"n": index})
        pair.loop.run(theirs.create_session(app_name=ADK_APP, user_id="user-0", session_id="s-0"))
        with sqlite3.connect(theirs._db_path) as db:
            db.executemany(
                "INSERT INTO sessions (app_name, user_id, id, state, create_time, update_time)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (ADK_APP, f"user-{i % 100}", f"s-{i}", f'{{"n": {i}}}', 1e9 + i, 1e9 + i)
                    for i in range(1, count)
                ],
            )

        def listing(service: Any) -> Callable[[], Any]:
            return lambda: service.list_sessions(app_name=ADK_APP)

        sizes_seen = [len(pair.loop.run(listing(s)()).sessions) for s in (ours, theirs)]
        assert sizes_seen == [count, count], sizes_seen
        return _compare(
            ctx,
            "adk_list",
            f"ADK list_sessions of an app with {count:,} sessions",
            "lists/s",
            baseline=lambda: _timed(pair.loop, listing(theirs), 3),
            subject=lambda: _timed(pair.loop, listing(ours), 3),
            baseline_description="ADK's SqliteSessionService",
            target=Target("absolute", 1 / 0.100, ratio_minimum=1.0),
            per="list",
        )


# LangGraph


def _lg_message(step: int) -> Any:
    from langchain_core.messages import AIMessage, HumanMessage

    kind = HumanMessage if step % 2 == 0 else AIMessage
    text = f"step {step}: the weather in Oslo is sunny, 21 degrees, light wind from the west. "
    return kind(content=text * 3, id=f"m-{step}")


class _LgThread:
    """Feeds a saver the checkpoints of one growing thread, as a graph's steps would."""

    def __init__(self, saver: Any, thread_id: str) -> None:
        self.saver, self.thread_id = saver, thread_id
        self.messages: list[Any] = []
        self.config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}

    def step(self) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        self.messages = [*self.messages, _lg_message(len(self.messages))]
        checkpoint = empty_checkpoint()
        version = len(self.messages)
        checkpoint["channel_values"] = {"messages": self.messages, "step": version}
        checkpoint["channel_versions"] = {"messages": version, "step": version}
        metadata = {"source": "loop", "step": version, "parents": {}}
        self.config = self.saver.put(
            self.config, checkpoint, metadata, {"messages": version, "step": version}
        )


def _lg(root: Path, loop: _Loop) -> _Pair:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    from integrations.langgraph import SessionlogSaver

    ours = SessionlogSaver(root / "sessionlog")
    theirs = SqliteSaver(sqlite3.connect(root / "lg.db", check_same_thread=False))
    return _Pair(root, loop, ours, theirs, [ours.store.close, theirs.conn.close])


@contextmanager
def _lg_grown(ctx: Context, name: str) -> Iterator[tuple[_Pair, list[_LgThread]]]:
    """Both savers holding a thread "t" of `lg_steps` checkpoints."""
    with _paired(ctx, name, _lg) as pair:
        threads = [_LgThread(saver, "t") for saver in (pair.ours, pair.theirs)]
        for _ in range(ctx.sizes.lg_steps):
            for thread in threads:
                thread.step()
        yield pair, threads


def lg_put(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    with _lg_grown(ctx, "lg_put") as (_, threads):
        return _compare(
            ctx,
            "lg_put",
            f"LangGraph put, durable, on a thread of {sizes.lg_steps:,}+ checkpoints",
            "puts/s",
            baseline=lambda: _plain(threads[1].step, sizes.turns),
            subject=lambda: _plain(threads[0].step, sizes.turns),
            baseline_description="LangGraph's SqliteSaver on a file (WAL, its defaults)",
        )


def lg_latest(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    with _lg_grown(ctx, "lg_latest") as (pair, _):
        ours, theirs = pair.ours, pair.theirs
        got = [s.get_tuple(config).checkpoint["channel_values"]["messages"] for s in (ours, theirs)]
        assert got[0] == got[1] and len(got[0]) == sizes.lg_steps
        return _compare(
            ctx,
            "lg_latest",
            f"LangGraph get_tuple, latest of {sizes.lg_steps:,} checkpoints",
            "reads/s",
            baseline=lambda: _plain(lambda: theirs.get_tuple(config), sizes.calls // 5 or 1),
            subject=lambda: _plain(lambda: ours.get_tuple(config), sizes.calls // 5 or 1),
            baseline_description="LangGraph's SqliteSaver",
            per="read",
        )


def lg_copy(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    source = {"configurable": {"thread_id": "t"}}
    copies = [0]
    with _lg_grown(ctx, "lg_copy") as (pair, _):
        ours, theirs = pair.ours, pair.theirs

        def copy() -> None:  # SqliteSaver cannot copy a thread: read each checkpoint, put again
            copies[0] += 1
            target = f"copy-{copies[0]}"
            for found in reversed(list(theirs.list(source))):
                parent = (
                    found.parent_config["configurable"]["checkpoint_id"]
                    if found.parent_config
                    else None
                )
                config = {"configurable": {"thread_id": target, "checkpoint_ns": ""}}
                if parent:
                    config["configurable"]["checkpoint_id"] = parent
                versions = found.checkpoint["channel_versions"]
                theirs.put(config, found.checkpoint, found.metadata, versions)

        def fork() -> None:
            copies[0] += 1
            ours.copy_thread("t", f"copy-{copies[0]}")

        return _compare(
            ctx,
            "lg_copy",
            f"LangGraph copy_thread of a {sizes.lg_steps:,}-checkpoint thread",
            "copies/s",
            baseline=lambda: _plain(copy, 1),
            subject=lambda: _plain(fork, sizes.calls // 5 or 1),
            baseline_description="reading every SqliteSaver checkpoint and putting it again",
            target=FORK_TARGET,
            per="copy",
            warmup=0,
            rounds=min(sizes.rounds, 5),
        )


def lg_bytes(ctx: Context) -> list[Result]:
    import msgspec

    from integrations.langgraph import thread_key

    sizes = ctx.sizes
    with _paired(ctx, "lg_bytes", _lg) as pair:
        ours = pair.ours
        threads = [_LgThread(saver, "t") for saver in (ours, pair.theirs)]
        data = pair.root / "sessionlog" / "data.mdb"
        for step in range(sizes.lg_steps):
            if step == sizes.lg_steps - 100:
                before = data.stat().st_blocks * 512
            for thread in threads:
                thread.step()
        growth = (data.stat().st_blocks * 512 - before) / 100
        last = ours.store.messages(thread_key("t"), last=1)[0]["item"]
        item_bytes = len(msgspec.msgpack.encode(last))
        new_message = len(ours.serde.dumps_typed([_lg_message(sizes.lg_steps - 1)])[1])
        ours_bytes, theirs_bytes = pair.disk_bytes()
    [result] = _bytes_result(
        "lg_bytes",
        "LangGraph",
        sizes.lg_steps,
        ours_bytes,
        theirs_bytes,
        "LangGraph's SqliteSaver file (and its WAL)",
    )
    result.unit = "checkpoints/MB"
    result.notes.update(
        {
            "ours_disk_growth_per_checkpoint_last_100": growth,
            "ours_item_bytes_last_checkpoint": item_bytes,
            "new_message_serialized_bytes": new_message,
            "item_to_message_ratio": item_bytes / new_message,
        }
    )
    return [result]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "oa_append": oa_append,
    "oa_last20": oa_last20,
    "oa_fork": oa_fork,
    "oa_bytes": oa_bytes,
    "adk_append": adk_append,
    "adk_last20": adk_last20,
    "adk_fork": adk_fork,
    "adk_bytes": adk_bytes,
    "adk_list": adk_list,
    "lg_put": lg_put,
    "lg_latest": lg_latest,
    "lg_copy": lg_copy,
    "lg_bytes": lg_bytes,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    # Each row in a process of its own: `lg_latest` builds 2,000 messages a read on both sides,
    # at a speed that depended on what the rows before it had left in the heap (0.90 after the
    # others, 1.25 to 1.33 alone).
    return _scaffold.run(BENCHMARKS, ctx, names, isolated=True)
