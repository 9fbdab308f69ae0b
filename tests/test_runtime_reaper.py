"""The periodic reaper inside `async with Runtime(...)`: sessions past their TTL or idle limit
are closed without anyone calling `reap`, `on_session_close` hears why, and the reaper stops with
the runtime."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

import projections as pj
from eventlog import InvalidArgumentError, UnknownSessionError
from eventlog.errors import ConfigurationError
from sessions import DirectorySink, RetentionPolicy, SessionStore
from sessions.runtime import Runtime


@pytest.mark.parametrize(
    ("ttl_s", "idle_s", "reason"), [(0.3, 60.0, "expired"), (60.0, 0.3, "idle")]
)
def test_the_reaper_closes_by_itself(
    store: SessionStore, ttl_s: float, idle_s: float, reason: str
) -> None:
    heard: list[tuple[str, str]] = []
    closed = asyncio.Event()

    def on_close(session_id: str, why: str) -> None:
        heard.append((session_id, why))
        closed.set()

    async def body() -> None:
        async with Runtime(
            store, ttl_s=ttl_s, idle_s=idle_s, reap_interval_s=0.05, on_session_close=on_close
        ) as runtime:
            sid = (await runtime.create("agent"))["session_id"]
            keep = None
            if reason == "idle":  # a session kept busy-ish by prompts is not idle
                keep = (await runtime.create("agent"))["session_id"]
            await runtime.prompt(sid, "hello")
            for _ in range(8):
                if keep is not None:
                    await runtime.prompt(keep, "still here")
                await asyncio.sleep(0.05)
            await asyncio.wait_for(closed.wait(), 10)
            assert heard[0] == (sid, reason)
            with pytest.raises(UnknownSessionError):
                await runtime.status(sid)
            if keep is not None:
                assert (await runtime.status(keep))["status"] == "idle"

    asyncio.run(body())
    types = [envelope.type for envelope in store.log.read_stream(heard[0][0])]
    assert types[-1] == "agent_session_closed"


def test_the_reaper_stops_with_the_runtime(store: SessionStore) -> None:
    async def body() -> None:
        runtime = Runtime(store, reap_interval_s=0.05)
        async with runtime:
            reaper = runtime._reaper
            assert reaper is not None and not reaper.done()
        assert reaper.done() and runtime._reaper is None
        async with Runtime(store, reap_interval_s=None) as manual:
            assert manual._reaper is None

    asyncio.run(body())
    with pytest.raises(InvalidArgumentError, match="reap_interval_s"):
        Runtime(store, reap_interval_s=0)


def test_the_reaper_sweeps_by_the_retention_policy(store: SessionStore, tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path / "archive")
    policy = RetentionPolicy(max_age=timedelta(0), action="archive", sink=sink)
    old = store.open_session("old")
    store.inject(old, {"role": "user", "content": "past"})
    store.close_session(old)
    kept = store.open_session("kept")

    async def body() -> None:
        async with Runtime(store, reap_interval_s=0.05, retention=policy):
            for _ in range(200):
                if sink.names():
                    break
                await asyncio.sleep(0.05)

    asyncio.run(body())
    with store.log.view() as view:
        archived = pj.load_state(view, old)
        open_one = pj.load_state(view, kept)
    assert archived is not None and archived.archive in sink.names()
    assert open_one is not None and open_one.archive is None
    with pytest.raises(ConfigurationError, match="retention"):
        Runtime(store, retention=timedelta(days=1))  # type: ignore[arg-type]
