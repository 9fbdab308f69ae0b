"""A prompt's request id in an encrypted session, and what `forget` leaves of it: the events and the
runtime projection's request index hold its digest keyed by the session's data key, and
`prompt_started` a sealed copy of its text, so retries find it, status and records show it while
the key lives, and after `forget` no file holds its text and no guess of it can be checked.
Request ids written before they were digested still read, recover and answer their retries."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from eventlog import events as ev
from projections import _runtime as rt
from service.mcp import Agent, running_bridge
from service.mcp._bridge import LOCAL
from sessions import ForgottenError, SessionStore
from sessions._keyring import KEYED_TEXT
from sessions._seal import SEALED_TEXT
from sessions._sealed_fields import KEYED
from sessions.runtime import (
    InputRejectedError,
    MockProvider,
    PromptCancelledError,
    ProviderError,
    Runtime,
    SessionBusyError,
    _jobs,
    reject,
)
from tests._runtime_providers import FINAL_ANSWER, ScriptedProvider, SlowProvider, calls
from tests.conftest import assert_rebuild_changes_nothing
from tests.test_encryption import KEY, every_byte
from tests.test_forget_traces import kinds_holding
from tests.test_mcp_bridge import config_of

RID = "ticket-4711-alice"


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())  # type: ignore[arg-type]


def indexed(store: SessionStore, sid: str, request_id: str) -> bool:
    """Whether the runtime projection's request index confirms `request_id` as it is given."""
    with store.log.view() as view:
        return rt.load_request(view, sid, request_id) is not None


def stored_ids(store: SessionStore, sid: str) -> dict[str, set[str]]:
    """The request ids the session's events carry, by kind."""
    found: dict[str, set[str]] = {}
    for envelope in store.log.read_stream(sid):
        rid = getattr(envelope.data, "request_id", None)
        if rid is not None:
            found.setdefault(envelope.type, set()).add(rid)
    return found


def test_a_request_id_leaves_no_text_and_no_checkable_guess_after_forget(tmp_path: Path) -> None:
    """The reproducer: before request ids were digested the text sat in `prompt_started` and
    `prompt_completed`, and the index `rt/r/<sid>\\0<request id>` confirmed it after `forget`."""
    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:

        async def body() -> str:
            async with Runtime(store, providers=[MockProvider()]) as runtime:
                sid = str((await runtime.create("agent"))["session_id"])
                answer = await runtime.prompt(sid, "hello", request_id=RID)
                assert answer["request_id"] == RID
                return sid

        sid = run(body)
        store.forget(sid)
        assert store.log.verify().ok
        assert kinds_holding(store, sid, RID) == set()
        assert not indexed(store, sid, RID)
        with pytest.raises(ForgottenError):
            store.keyed_digest(sid, RID)  # the key a guess would need is gone with the data key
        mock = MockProvider()

        async def retried() -> None:
            async with Runtime(store, providers=[mock]) as runtime:
                with pytest.raises(ForgottenError):
                    await runtime.prompt(sid, "hello", request_id=RID)
            assert mock.calls == 0

        run(retried)
    assert RID.encode() not in every_byte(path)


def test_every_event_of_a_request_carries_one_keyed_digest_and_retries_find_it(
    tmp_path: Path,
) -> None:
    """A tool loop's events (started, step, tool call started and finished, completed) all name
    the request by the same keyed digest, which the index holds; the retry answers the first
    run, before and after a rebuild; another session keys the same text otherwise."""
    scripted = ScriptedProvider([calls(("noop", {})), FINAL_ANSWER])
    tools = [{"name": "noop", "fn": lambda: "done"}]
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:

        async def body() -> tuple[str, str]:
            async with Runtime(store, providers=[scripted], default_provider="scripted") as runtime:
                sid = str((await runtime.create("agent"))["session_id"])
                other = str((await runtime.create("agent"))["session_id"])
                first = await runtime.prompt(sid, "go", request_id=RID, tools=tools)
                assert await runtime.prompt(sid, "go", request_id=RID, tools=tools) == first
                assert_rebuild_changes_nothing(store)
                assert await runtime.prompt(sid, "go", request_id=RID, tools=tools) == first
                assert len(scripted.seen) == 2
                record = await runtime.record(sid)
                assert [loop["request_id"] for loop in record.loops] == [RID, RID]
                assert [loop["status"] for loop in record.loops] == ["completed"] * 2
                assert (await runtime.status(sid))["status"] == "idle"
                return sid, other

        sid, other = run(body)
        ids = stored_ids(store, sid)
        kinds = {"prompt_started", "step_completed", "tool_call_started"}
        assert kinds | {"tool_call_finished", "prompt_completed"} == set(ids)
        [digest] = set().union(*ids.values())
        assert digest.startswith(KEYED_TEXT) and digest == store.keyed_digest(sid, RID)
        assert digest != store.keyed_digest(other, RID)
        assert indexed(store, sid, digest) and not indexed(store, sid, RID)
        [started] = [e.data for e in store.log.read_stream(sid) if e.type == "prompt_started"]
        assert isinstance(started, ev.PromptStarted)
        assert started.sealed_request_id is not None
        assert started.sealed_request_id.startswith(SEALED_TEXT)


def test_status_cancel_and_the_bridge_name_the_callers_id_while_the_key_lives(
    tmp_path: Path,
) -> None:
    """A busy session's status shows the caller's request id, opened from its sealed copy;
    cancel by that id works, and so does the bridge's cancel of whatever runs (which reads it
    from the status). After `forget` records show no request id at all."""
    slow = SlowProvider("helper:slow")
    agent = Agent(id="helper", providers={"slow": slow}, default_provider="slow")
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:

        async def body() -> str:
            async with running_bridge(store, config_of(agent)) as bridge:
                runtime = bridge.runtime
                sid = (await bridge.create(LOCAL, "helper"))["sessionId"]
                asking = asyncio.create_task(runtime.prompt(sid, "wait", request_id=RID))
                await asyncio.wait_for(slow.entered.wait(), 10)
                status = await runtime.status(sid)
                assert (status["status"], status["request_id"]) == ("busy", RID)
                with pytest.raises(SessionBusyError, match=RID):
                    _jobs.start_prompt(  # another process's prompt: refused by the record
                        store,
                        sid,
                        "r2",
                        ev.Message(role="user", content="x"),
                        lambda _: {},
                        {},
                        ("l2", None, None),
                        [],
                    )
                cancelled = await bridge.cancel(LOCAL, sid)
                assert cancelled == {"cancelled": True, "sessionId": sid, "requestId": RID}
                with pytest.raises(PromptCancelledError):
                    await asking
                assert [loop["request_id"] for loop in (await runtime.record(sid)).loops] == [RID]
                await runtime.close(sid)
                store.forget(sid)
                loops = (await runtime.record(sid)).loops
                assert [(loop["request_id"], loop["status"]) for loop in loops] == [
                    (None, "cancelled")
                ]
                return str(sid)

        sid = run(body)
        assert kinds_holding(store, sid, RID) == set()


def test_a_rejected_prompts_request_id_is_kept_as_its_digest(tmp_path: Path) -> None:
    """`input_rejected` carries the caller's request id too: as a keyed digest."""

    def refuse(text: str) -> Any:
        return reject("no")

    with SessionStore.open(tmp_path / "s", keys=KEY) as store:

        async def body() -> str:
            async with Runtime(
                store, providers=[MockProvider()], input_filters=[refuse]
            ) as runtime:
                sid = str((await runtime.create("agent"))["session_id"])
                with pytest.raises(InputRejectedError):
                    await runtime.prompt(sid, "hello", request_id=RID)
                return sid

        sid = run(body)
        assert stored_ids(store, sid) == {"input_rejected": {store.keyed_digest(sid, RID)}}


def test_request_ids_stored_before_digests_still_recover_show_and_answer_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events written before request ids were digested hold the text: a completed request
    answers its retry; a prompt left in flight then is failed by recovery under the id it was
    started with (so the session is no longer busy) and its retry raises the recorded failure; the
    records show both ids, and a rebuild folds them the same."""
    mock = MockProvider()
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:

        async def before() -> tuple[str, dict[str, Any]]:
            async with Runtime(store, providers=[mock]) as runtime:
                sid = str((await runtime.create("agent"))["session_id"])
                return sid, await runtime.prompt(sid, "first", request_id="old-0")

        with monkeypatch.context() as old:
            old.delitem(KEYED, ev.PromptStarted)  # what was written before this change
            sid, answer = run(before)
            asked = ev.Message(role="user", content="hello")
            _jobs.start_prompt(store, sid, "old-1", asked, lambda _: {}, {}, ("l1", None, None), [])
        assert stored_ids(store, sid) == {
            "prompt_started": {"old-0", "old-1"},
            "prompt_completed": {"old-0"},
        }

        async def after() -> list[tuple[str, str]]:
            async with Runtime(store, providers=[mock]) as runtime:
                assert runtime.recovered == [sid]
                # The failure names the prompt as it was stored: else it would still be busy.
                assert (await runtime.status(sid))["status"] == "failed"
                assert await runtime.prompt(sid, "first", request_id="old-0") == answer
                with pytest.raises(ProviderError, match=r"`old-1`.*interrupted"):
                    await runtime.prompt(sid, "hello", request_id="old-1")
                assert mock.calls == 1
                return [
                    (loop["request_id"], loop["status"])
                    for loop in (await runtime.record(sid)).loops
                ]

        assert run(after) == [("old-0", "completed"), ("old-1", "failed")]
        assert stored_ids(store, sid)["prompt_failed"] == {"old-1"}
        assert_rebuild_changes_nothing(store)
