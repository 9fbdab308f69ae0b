"""A prompt's request id is idempotent per session: a caller that lost the answer (a dropped
connection, a timeout) and sends the same `request_id` again gets the first run's recorded
outcome, and the model is not called again; the same id with another prompt is refused. Through
the runtime and through the MCP bridge, on a real LMDB store in `tmp_path`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import projections
from eventlog import LimitExceededError
from eventlog import events as ev
from sessions import SessionStore, UnknownSessionError
from sessions.runtime import (
    Completion,
    MockProvider,
    PromptCancelledError,
    ProviderError,
    RequestConflictError,
    Runtime,
    SessionBusyError,
    SessionFailedError,
)
from tests._runtime_providers import (
    FINAL_ANSWER,
    FailingProvider,
    ScriptedProvider,
    SlowProvider,
    calls,
)
from tests.conftest import assert_rebuild_changes_nothing
from tests.test_encryption import KEY, every_byte
from tests.test_mcp_bridge import Refused, call, config_of, http_bridge, http_client, mock_agent


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())  # type: ignore[arg-type]


def types_of(store: SessionStore, sid: str) -> list[str]:
    return [envelope.type for envelope in store.log.read_stream(sid)]


def test_a_retried_request_id_answers_the_first_run_and_calls_no_model_also_after_close(
    store: SessionStore,
) -> None:
    # After `close` a retry used to be refused as an unknown session: a caller that lost the
    # answer could not tell whether its request had run.
    mock = MockProvider()

    async def body() -> str:
        async with Runtime(store, providers=[mock]) as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            first = await runtime.prompt(sid, "list the files", request_id="r1")
            again = await runtime.prompt(sid, "list the files", request_id="r1")
            assert again == first
            assert mock.calls == 1
            await runtime.close(sid)
            head = store.log.head
            assert await runtime.prompt(sid, "list the files", request_id="r1") == first
            with pytest.raises(RequestConflictError):
                await runtime.prompt(sid, "another job", request_id="r1")
            with pytest.raises(UnknownSessionError):  # a new request finds no open session
                await runtime.prompt(sid, "list the files", request_id="r2")
            assert store.log.head == head and mock.calls == 1
            return sid

    sid = run(body)
    assert [m["role"] for m in store.messages(sid)] == ["user", "assistant"]
    assert types_of(store, sid).count("prompt_started") == 1


def test_a_retry_while_the_first_runs_waits_for_its_answer(store: SessionStore) -> None:
    slow = SlowProvider()

    async def body() -> str:
        async with Runtime(store, providers=[slow], default_provider="slow") as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            first = asyncio.create_task(runtime.prompt(sid, "long job", request_id="r1"))
            await slow.entered.wait()
            retry = asyncio.create_task(runtime.prompt(sid, "long job", request_id="r1"))
            await asyncio.sleep(0.05)
            assert not retry.done()  # neither refused as busy nor run: it waits
            slow.release.set()
            assert await retry == await first
            assert (await first)["text"] == "slow answer"
            assert slow.calls == 1
            return sid

    sid = run(body)
    assert types_of(store, sid).count("prompt_started") == 1


def test_a_retried_request_id_over_mcp_runs_the_model_once(store: SessionStore) -> None:
    agent = mock_agent()
    mock = agent.providers["mock"]
    assert isinstance(mock, MockProvider)

    async def body() -> str:
        async with (
            http_bridge(store, config_of(agent)) as (url, token),
            http_client(url, token) as client,
        ):
            sid = (await call(client, "sessions_create", agentId="helper"))["sessionId"]
            ask = {"sessionId": sid, "prompt": "Explain it", "requestId": "req-7"}
            first = await call(client, "sessions_prompt", **ask)
            again = await call(client, "sessions_prompt", **ask)
            assert again == first and first["requestId"] == "req-7"
            assert mock.calls == 1
            with pytest.raises(Refused) as refused:
                await call(client, "sessions_prompt", **{**ask, "prompt": "Something else"})
            assert refused.value.code == "REQUEST_CONFLICT"
            assert "req-7" in refused.value.message
            assert mock.calls == 1
            return str(sid)

    sid = run(body)
    assert [m["role"] for m in store.messages(sid)] == ["user", "assistant"]


def test_the_same_request_id_with_another_prompt_is_refused_and_writes_nothing(
    store: SessionStore, tmp_path: Path
) -> None:
    mock = MockProvider()
    attached = tmp_path / "notes.txt"
    attached.write_text("notes")

    async def body() -> None:
        async with Runtime(store, providers=[mock]) as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            await runtime.prompt(sid, "hello", request_id="r1")
            head = store.log.head
            with pytest.raises(RequestConflictError, match="request `r1` of session") as caught:
                await runtime.prompt(sid, "goodbye", request_id="r1")
            assert (caught.value.session_id, caught.value.request_id) == (sid, "r1")
            assert caught.value.position is not None and caught.value.position < head
            with pytest.raises(RequestConflictError):  # the same text, another file: another prompt
                await runtime.prompt(sid, "hello", request_id="r1", files=[attached])
            assert store.log.head == head and mock.calls == 1
            with_file = await runtime.prompt(sid, "read it", request_id="r2", files=[attached])
            again = await runtime.prompt(sid, "read it", request_id="r2", files=[attached])
            assert again == with_file and mock.calls == 2

    run(body)


def test_a_conflicting_retry_while_the_first_runs_is_refused_at_once(store: SessionStore) -> None:
    slow = SlowProvider()

    async def body() -> None:
        async with Runtime(store, providers=[slow], default_provider="slow") as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            first = asyncio.create_task(runtime.prompt(sid, "long job", request_id="r1"))
            await slow.entered.wait()
            with pytest.raises(RequestConflictError, match="which is running"):
                await runtime.prompt(sid, "another job", request_id="r1")
            with pytest.raises(SessionBusyError, match="busy with request `r1`"):
                await runtime.prompt(sid, "another job", request_id="r2")
            slow.release.set()
            assert (await first)["text"] == "slow answer"
            assert slow.calls == 1

    run(body)


def test_retries_racing_the_first_call_share_its_one_run(store: SessionStore) -> None:
    slow = SlowProvider(delay_s=0.05)

    async def body() -> None:
        async with Runtime(store, providers=[slow], default_provider="slow") as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            results = await asyncio.gather(
                *(runtime.prompt(sid, "once", request_id="r1") for _ in range(4))
            )
            assert all(result == results[0] for result in results)
            assert slow.calls == 1
            assert types_of(store, sid).count("prompt_started") == 1

    run(body)


def test_a_retry_of_a_failed_request_raises_the_recorded_failure(store: SessionStore) -> None:
    failing = FailingProvider()

    async def body() -> None:
        async with Runtime(store, providers=[failing], default_provider="failing") as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            with pytest.raises(ProviderError, match="upstream 503"):
                await runtime.prompt(sid, "hello", request_id="r1")
            head = store.log.head
            with pytest.raises(ProviderError, match=r"failed \(provider\).*upstream 503.*new"):
                await runtime.prompt(sid, "hello", request_id="r1")
            assert failing.calls == 1 and store.log.head == head
            with pytest.raises(SessionFailedError):  # a new request meets the failed session
                await runtime.prompt(sid, "hello", request_id="r2")

    run(body)


class FlakyProvider:
    """Times out once (a failure that may pass: the session stays idle), then answers."""

    def __init__(self) -> None:
        self.name = "flaky"
        self.defaults: Mapping[str, Any] = {}
        self.calls = 0

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Completion:
        self.calls += 1
        if self.calls == 1:
            raise TimeoutError("the model took too long")
        return Completion(text="at last", usage={"input_tokens": 1, "output_tokens": 1})


def test_after_a_transient_failure_only_a_new_request_id_runs_again(store: SessionStore) -> None:
    flaky = FlakyProvider()

    async def body() -> None:
        async with Runtime(store, providers=[flaky], default_provider="flaky") as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            with pytest.raises(ProviderError, match="transient"):
                await runtime.prompt(sid, "hello", request_id="r1")
            with pytest.raises(ProviderError, match=r"`r1`.*failed \(transient\)"):
                await runtime.prompt(sid, "hello", request_id="r1")
            assert flaky.calls == 1
            assert (await runtime.prompt(sid, "hello", request_id="r2"))["text"] == "at last"
            assert flaky.calls == 2

    run(body)


@pytest.mark.parametrize("by_close", [False, True])
def test_a_retry_of_a_cancelled_request_is_cancelled_again_without_a_call(
    store: SessionStore, by_close: bool
) -> None:
    # Cancelled by closing its session, the retry used to find no session.
    slow = SlowProvider()

    async def body() -> None:
        async with Runtime(store, providers=[slow], default_provider="slow") as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            task = asyncio.create_task(runtime.prompt(sid, "long job", request_id="r9"))
            await slow.entered.wait()
            if by_close:
                await runtime.close(sid, reason="expired")
            else:
                assert await runtime.cancel(sid, "r9") is True
            with pytest.raises(PromptCancelledError):
                await task
            head = store.log.head
            why = "expired" if by_close else "cancelled"
            with pytest.raises(PromptCancelledError, match=rf"`r9`.*cancelled \({why}\)"):
                await runtime.prompt(sid, "long job", request_id="r9")
            assert slow.calls == 1 and store.log.head == head

    run(body)


def test_a_request_interrupted_by_a_stop_is_not_run_after_the_restart(
    store: SessionStore,
) -> None:
    from sessions.runtime import _jobs

    mock = MockProvider()

    async def body() -> None:
        async with Runtime(store, providers=[mock]) as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
        # What a process that stopped mid-prompt leaves: `prompt_started` and nothing after it.
        asked = ev.Message(role="user", content="hello")
        _jobs.start_prompt(store, sid, "r1", asked, lambda _: {}, {}, ("l1", None, None), [])
        async with Runtime(store, providers=[mock]) as runtime:
            assert runtime.recovered == [sid]
            with pytest.raises(ProviderError, match=r"`r1`.*failed \(interrupted\)"):
                await runtime.prompt(sid, "hello", request_id="r1")
            assert mock.calls == 0

    run(body)


def test_a_retried_tool_loop_answers_its_steps_and_usage(store: SessionStore) -> None:
    scripted = ScriptedProvider([calls(("noop", {})), FINAL_ANSWER])
    tools = [{"name": "noop", "fn": lambda: "done"}]

    async def body() -> None:
        async with Runtime(store, providers=[scripted], default_provider="scripted") as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            first = await runtime.prompt(sid, "go", request_id="r1", tools=tools)
            assert first["steps"] == 2 and first["usage"]["input_tokens"] == 40
            assert await runtime.prompt(sid, "go", request_id="r1", tools=tools) == first
            assert len(scripted.seen) == 2

    run(body)


def test_the_request_index_folds_the_same_on_rebuild_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"

    async def first_runs() -> tuple[str, dict[str, Any]]:
        with SessionStore.open(path) as store:
            async with Runtime(store) as runtime:
                sid = str((await runtime.create("agent"))["session_id"])
                answer = await runtime.prompt(sid, "hello", request_id="r1")
                await runtime.prompt(sid, "more", request_id="r2")
            with store.log.view() as view:
                loop = projections._runtime.load_request(view, sid, "r1")
            assert loop is not None and loop.request_id == "r1" and loop.steps == 1
            assert loop.ended_position > loop.position
            assert_rebuild_changes_nothing(store)
            return sid, answer

    sid, answer = run(first_runs)
    # What a store of the layout before this one holds: no request index.
    with SessionStore.open(path) as store, store.log.transaction() as tx:
        for key, _ in tx.kv_scan():
            if key.startswith(projections._keys.RUNTIME_REQUEST_PREFIX):
                tx.kv_delete(key)
        tx.kv_put(projections._keys.LAYOUT_KEY, b"\x05")
    mock = MockProvider()

    async def retried() -> None:
        with SessionStore.open(path) as store:  # another layout: rebuilt on open
            async with Runtime(store, providers=[mock]) as runtime:
                assert await runtime.prompt(sid, "hello", request_id="r1") == answer
            assert mock.calls == 0
            assert store.verify(projections=True).ok

    run(retried)


def test_a_retry_on_an_encrypted_session_compares_and_answers_the_sealed_records(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s"
    mock = MockProvider()

    async def body() -> None:
        with SessionStore.open(path, keys=KEY) as store:
            async with Runtime(store, providers=[mock]) as runtime:
                sid = str((await runtime.create("agent"))["session_id"])
                first = await runtime.prompt(sid, "sealed-question-7f3a", request_id="r1")
                again = await runtime.prompt(sid, "sealed-question-7f3a", request_id="r1")
                assert again == first and first["text"] == "mock reply to: sealed-question-7f3a"
                with pytest.raises(RequestConflictError):
                    await runtime.prompt(sid, "another-question", request_id="r1")
                await runtime.close(sid)
                closed = await runtime.prompt(sid, "sealed-question-7f3a", request_id="r1")
                assert closed == first
                assert mock.calls == 1

    run(body)
    assert b"sealed-question-7f3a" not in every_byte(path)


def test_a_request_id_too_long_to_index_is_refused_before_anything_runs(
    store: SessionStore,
) -> None:
    mock = MockProvider()

    async def body() -> None:
        async with Runtime(store, providers=[mock]) as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            head = store.log.head
            with pytest.raises(LimitExceededError, match="kv_key_bytes_max"):
                await runtime.prompt(sid, "hello", request_id="\U0001f600" * 120)
            assert store.log.head == head and mock.calls == 0
            ascii_max = "r" * 128  # every id of ASCII characters fits
            assert (await runtime.prompt(sid, "hi", request_id=ascii_max))[
                "request_id"
            ] == ascii_max

    run(body)


def test_a_retry_of_an_ended_request_answers_while_another_runs(store: SessionStore) -> None:
    slow = SlowProvider()

    async def body() -> None:
        async with Runtime(store, providers=[slow], default_provider="slow") as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            slow.release.set()
            first = await runtime.prompt(sid, "one", request_id="r1")
            slow.release.clear()
            slow.entered.clear()
            second = asyncio.create_task(runtime.prompt(sid, "two", request_id="r2"))
            await slow.entered.wait()
            again = await runtime.prompt(sid, "one", request_id="r1")  # not refused as busy
            assert again == first
            with pytest.raises(SessionBusyError):
                await runtime.prompt(sid, "three", request_id="r3")
            slow.release.set()
            await second
            assert slow.calls == 2

    run(body)


def test_a_retry_of_a_cancelled_request_on_an_encrypted_session_says_its_reason(
    tmp_path: Path,
) -> None:
    slow = SlowProvider()

    async def body() -> None:
        with SessionStore.open(tmp_path / "s", keys=KEY) as store:
            async with Runtime(store, providers=[slow], default_provider="slow") as runtime:
                sid = str((await runtime.create("agent"))["session_id"])
                task = asyncio.create_task(runtime.prompt(sid, "long job", request_id="r9"))
                await slow.entered.wait()
                assert await runtime.cancel(sid, "r9") is True
                with pytest.raises(PromptCancelledError):
                    await task
                with pytest.raises(PromptCancelledError, match=r"cancelled \(cancelled\);"):
                    await runtime.prompt(sid, "long job", request_id="r9")  # not its sealed text

    run(body)


def test_a_deleted_session_answers_no_retry(store: SessionStore) -> None:
    mock = MockProvider()

    async def body() -> None:
        async with Runtime(store, providers=[mock]) as runtime:
            sid = str((await runtime.create("agent"))["session_id"])
            await runtime.prompt(sid, "list the files", request_id="r1")
            await asyncio.to_thread(store.delete, sid)
            with pytest.raises(UnknownSessionError):
                await runtime.prompt(sid, "list the files", request_id="r1")
            assert mock.calls == 1

    run(body)
