"""Retries that wait for their request while something ends it: `Runtime.stop`, the `cancel`
verb, a lost lease, or the retry's own caller giving up. A waiting retry must always end, with
what the log recorded for its request or with a typed error saying why there is nothing to
answer, and must write nothing itself; a retry given up must not disturb the run it waited for.

The interleavings are forced, not slept into: the provider parks until the test lets it answer,
and parks again inside its cancellation until the test lets the cancel land, so a retry can be
queued before `stop` begins or after it. Every wait has a timeout: a hang fails the test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from eventlog import LeaseLostError, LogClosedError
from service.mcp import Agent, BridgeConfig, BridgeError, running_bridge
from service.mcp._bridge import LOCAL
from sessions import SessionStore
from sessions.runtime import (
    Completion,
    PromptCancelledError,
    Runtime,
    RuntimeStoppedError,
)

WAIT_S = 10.0
"""Long enough for any of these steps on a loaded machine; a hang fails the test after it."""


class HeldProvider:
    """Answers once `release` is set. A cancel reaches it at once (`cancelling` is set) but only
    lands when `let_go` is set (or `WAIT_S` passed), so a test can act while the prompt is being
    cancelled."""

    def __init__(self, name: str = "held") -> None:
        self.name = name
        self.defaults: Mapping[str, Any] = {}
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelling = asyncio.Event()
        self.let_go = asyncio.Event()
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Completion:
        self.calls += 1
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelling.set()
            with contextlib.suppress(TimeoutError):  # bounded: a test that fails must not hang
                await asyncio.wait_for(self.let_go.wait(), WAIT_S)
            raise
        return Completion(text="held answer", usage={"input_tokens": 1, "output_tokens": 1})


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())  # type: ignore[arg-type]


def types_of(store: SessionStore, sid: str) -> list[str]:
    return [envelope.type for envelope in store.log.read_stream(sid)]


async def within(awaitable: Awaitable[Any]) -> Any:
    return await asyncio.wait_for(awaitable, WAIT_S)


async def parked(task: asyncio.Task[Any]) -> None:
    """Let `task` run until it waits (a retry reaches its wait for the running request without
    any other pause), and check that it does wait."""
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done(), task


async def first_and_retry(
    runtime: Runtime, held: HeldProvider
) -> tuple[str, asyncio.Task[Any], asyncio.Task[Any]]:
    """A new session whose request `r1` is in `held`'s model call, and a retry of `r1` waiting
    for it."""
    sid = str((await runtime.create("agent"))["session_id"])
    first = asyncio.create_task(runtime.prompt(sid, "job", request_id="r1"))
    await within(held.entered.wait())
    retry = asyncio.create_task(runtime.prompt(sid, "job", request_id="r1"))
    await parked(retry)
    return sid, first, retry


async def error_of(task: asyncio.Task[Any]) -> BaseException:
    """What `task` raised (it must raise, and within `WAIT_S`)."""
    try:
        result = await within(task)
    except Exception as exc:  # the error is what the test looks at
        return exc
    raise AssertionError(f"expected an error, got {result!r}")


async def a_retry_meets_stop(store: SessionStore, scope: str, before: bool) -> str:
    """Run `r1` on a held provider, queue a retry of it (`before` `stop` begins, or after),
    stop the runtime, and check what the first call, the retry and `stop` end with."""
    held = HeldProvider()
    runtime = Runtime(store, providers=[held], default_provider="held")
    await runtime.start()
    sid = str((await runtime.create("agent", scope=scope))["session_id"])
    first = asyncio.create_task(runtime.prompt(sid, "job", request_id="r1"))
    await within(held.entered.wait())
    retry = asyncio.create_task(runtime.prompt(sid, "job", request_id="r1")) if before else None
    if retry is not None:
        await parked(retry)
    stopping = asyncio.create_task(runtime.stop())
    await within(held.cancelling.wait())  # `stop` has begun: it is cancelling `r1`
    if retry is None:
        retry = asyncio.create_task(runtime.prompt(sid, "job", request_id="r1"))
        await parked(retry)
    held.let_go.set()
    await within(stopping)
    assert retry.done(), "stop returned while a retry was still waiting"
    assert "(shutdown)" in str(await error_of(first))
    answered = await error_of(retry)
    assert isinstance(answered, PromptCancelledError), repr(answered)
    assert "`r1`" in str(answered) and "cancelled (shutdown)" in str(answered)
    assert held.calls == 1
    return sid


@pytest.mark.parametrize("scope", ["persistent", "ephemeral"])
def test_a_retry_waiting_when_stop_begins_answers_the_cancellation_stop_recorded(
    store: SessionStore, scope: str
) -> None:
    sid = run(lambda: a_retry_meets_stop(store, scope, before=True))
    if scope == "persistent":  # the ephemeral store went with the runtime
        assert types_of(store, sid) == ["session_opened", "prompt_started", "prompt_cancelled"]


@pytest.mark.parametrize("scope", ["persistent", "ephemeral"])
def test_a_retry_arriving_after_stop_began_answers_the_cancellation_stop_recorded(
    store: SessionStore, scope: str
) -> None:
    # It used to find the runtime stopped once its wait ended and raise "the runtime is not
    # started", although the log held the request's outcome.
    sid = run(lambda: a_retry_meets_stop(store, scope, before=False))
    if scope == "persistent":
        assert types_of(store, sid) == ["session_opened", "prompt_started", "prompt_cancelled"]


@pytest.mark.parametrize("to_the_stopping_one", [False, True])
def test_a_prompt_sent_while_stop_runs_starts_nothing_and_writes_nothing(
    store: SessionStore, to_the_stopping_one: bool
) -> None:
    # It used to start: its model was called after `stop` had taken its list of prompts, `stop`
    # returned with it still running, and its session stayed recorded busy. Sent to the session
    # whose prompt `stop` is cancelling, it was refused as busy, which tells a caller to try
    # again later, when nothing will start.
    held, other = HeldProvider(), HeldProvider("other")

    async def body() -> tuple[str, str]:
        runtime = Runtime(store, providers=[held, other], default_provider="held")
        await runtime.start()
        sid = str((await runtime.create("agent"))["session_id"])
        idle = str((await runtime.create("agent", provider="other"))["session_id"])
        first = asyncio.create_task(runtime.prompt(sid, "job", request_id="r1"))
        await within(held.entered.wait())
        stopping = asyncio.create_task(runtime.stop())
        await within(held.cancelling.wait())
        head = store.log.head
        late = sid if to_the_stopping_one else idle
        with pytest.raises(RuntimeStoppedError, match="`r2` of session") as caught:
            await within(runtime.prompt(late, "late", request_id="r2"))
        assert (caught.value.session_id, caught.value.request_id) == (late, "r2")
        assert store.log.head == head and other.calls == 0 and held.calls == 1
        held.let_go.set()
        await within(stopping)
        assert isinstance(await error_of(first), PromptCancelledError)
        return sid, idle

    sid, idle = run(body)
    assert types_of(store, idle) == ["session_opened"]
    assert types_of(store, sid) == ["session_opened", "prompt_started", "prompt_cancelled"]


def test_after_stop_a_retry_answers_from_the_log_and_a_new_request_is_refused(
    store: SessionStore,
) -> None:
    held = HeldProvider()
    held.release.set()

    async def body() -> None:
        runtime = Runtime(store, providers=[held], default_provider="held")
        await runtime.start()
        sid = str((await runtime.create("agent"))["session_id"])
        eph = str((await runtime.create("agent", scope="ephemeral"))["session_id"])
        done = await runtime.prompt(sid, "job", request_id="r1")
        await runtime.prompt(eph, "job", request_id="e1")
        await runtime.stop()
        head = store.log.head
        assert await within(runtime.prompt(sid, "job", request_id="r1")) == done
        with pytest.raises(RuntimeStoppedError):
            await within(runtime.prompt(sid, "more", request_id="r2"))
        with pytest.raises(RuntimeStoppedError):  # its store is gone with the runtime
            await within(runtime.prompt(eph, "job", request_id="e1"))
        assert store.log.head == head and held.calls == 2

    run(body)


def test_a_retry_waiting_when_its_request_is_cancelled_gets_the_cancellation(
    store: SessionStore,
) -> None:
    held = HeldProvider()

    async def body() -> str:
        async with Runtime(store, providers=[held], default_provider="held") as runtime:
            sid, first, retry = await first_and_retry(runtime, held)
            cancelling = asyncio.create_task(runtime.cancel(sid, "r1"))
            await within(held.cancelling.wait())
            late = asyncio.create_task(runtime.prompt(sid, "job", request_id="r1"))
            await parked(late)  # a second retry, queued while the cancel lands
            held.let_go.set()
            assert await within(cancelling) is True
            assert "cancelled (cancelled)" in str(await error_of(first))
            for each in (retry, late):
                answered = await error_of(each)
                assert isinstance(answered, PromptCancelledError), repr(answered)
                assert "cancelled (cancelled)" in str(answered)
            assert held.calls == 1
            return sid

    sid = run(body)
    assert types_of(store, sid) == ["session_opened", "prompt_started", "prompt_cancelled"]


def test_a_waiting_retry_whose_caller_gives_up_leaves_the_first_run_going(
    store: SessionStore,
) -> None:
    held = HeldProvider()

    async def body() -> str:
        async with Runtime(store, providers=[held], default_provider="held") as runtime:
            sid, first, retry = await first_and_retry(runtime, held)
            retry.cancel()
            with pytest.raises(asyncio.CancelledError):
                await within(retry)
            assert not first.done() and not held.cancelling.is_set()
            assert (await runtime.status(sid))["status"] == "busy"
            held.release.set()
            answer = await within(first)
            assert answer["text"] == "held answer"
            assert await within(runtime.prompt(sid, "job", request_id="r1")) == answer
            assert held.calls == 1
            return sid

    sid = run(body)
    assert types_of(store, sid) == ["session_opened", "prompt_started", "prompt_completed"]


def test_a_retry_waiting_when_the_lease_is_lost_gets_lease_lost(store: SessionStore) -> None:
    # What the lease watcher does on a lost lease (`_lease.py`), done by hand: mark the leases
    # lost, cancel the prompts. Nothing may be written then, so `r1` stays recorded in flight
    # and the next runtime fails it as interrupted; until then nothing can answer it.
    held = HeldProvider()
    held.let_go.set()

    async def body() -> str:
        runtime = Runtime(store, providers=[held], default_provider="held")
        await runtime.start()
        sid, first, retry = await first_and_retry(runtime, held)
        for lease in runtime._lease.held:
            lease.lost = True
        for flight in list(runtime._flights.values()):
            flight.cancel("lease_lost")
        assert isinstance(await error_of(first), LeaseLostError)
        assert isinstance(await error_of(retry), LeaseLostError)
        await within(runtime.stop())
        with pytest.raises(RuntimeStoppedError, match="`r1`"):
            await within(runtime.prompt(sid, "job", request_id="r1"))
        return sid

    sid = run(body)
    assert types_of(store, sid) == ["session_opened", "prompt_started"]


def test_a_store_closed_under_a_waiting_retry_ends_both_calls_with_log_closed(
    tmp_path: Path,
) -> None:
    # Closing the store under a running runtime is the caller's mistake, but it must not hang
    # anyone: the first call cannot record its end, and the retry cannot look one up.
    held = HeldProvider()

    async def body() -> None:
        store = SessionStore.open(tmp_path / "store")
        runtime = Runtime(store, providers=[held], default_provider="held")
        await runtime.start()
        sid, first, retry = await first_and_retry(runtime, held)
        await within(asyncio.to_thread(store.close))
        held.release.set()
        assert isinstance(await error_of(first), LogClosedError)
        assert isinstance(await error_of(retry), LogClosedError)
        await within(runtime.stop())
        with pytest.raises(RuntimeStoppedError):
            await within(runtime.prompt(sid, "job", request_id="r1"))

    run(body)


def test_a_bridge_shutting_down_answers_a_waiting_retry_and_refuses_a_new_prompt(
    store: SessionStore,
) -> None:
    held = HeldProvider("helper:held")
    agent = Agent(id="helper", providers={"held": held}, default_provider="held")

    async def body() -> None:
        config = BridgeConfig(agents={agent.id: agent})
        async with running_bridge(store, config) as bridge:
            sid = (await bridge.create(LOCAL, "helper"))["sessionId"]
            idle = (await bridge.create(LOCAL, "helper"))["sessionId"]
            first = asyncio.create_task(bridge.prompt(LOCAL, sid, "job", request_id="q1"))
            await within(held.entered.wait())
            retry = asyncio.create_task(bridge.prompt(LOCAL, sid, "job", request_id="q1"))
            await parked(retry)
            stopping = asyncio.create_task(bridge.runtime.stop())
            await within(held.cancelling.wait())
            late = asyncio.create_task(bridge.prompt(LOCAL, idle, "late", request_id="q2"))
            held.let_go.set()
            await within(stopping)
            codes = []
            for each in (first, retry, late):
                refused = await error_of(each)
                assert isinstance(refused, BridgeError), repr(refused)
                codes.append(refused.code)
            assert codes == ["CANCELLED", "CANCELLED", "RUNTIME_STOPPED"]
            assert held.calls == 1

    run(body)
