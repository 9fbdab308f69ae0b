"""The OpenAI Agents SDK's own `OpenAIResponsesCompactionSession` around a `SessionlogSession`,
its `responses.compact` calls answered by a local HTTP server in the API's wire format.

What is checked: a compaction, manual or automatic (the SDK's `Runner`), replaces the history in
one commit (counted as LMDB write transactions); a replacement whose stored suffix changed after
the snapshot is refused and writes nothing; the log keeps what was replaced (`as_of`); the leading
expired items `EncryptedSession` names are dropped in the same commit.

Fault model of the kill tests: the process is SIGKILLed at a chosen point of a replacement (with
the history already cut inside the open transaction, or right after the commit); an LMDB commit
is atomic and durable, so the store reopened shows the old history or the new one. The SDK's
fallback without the hooks (`clear_session`, then `add_items`) is killed at the same place for
contrast: its first commit is durable, and the history it leaves is empty.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.extensions.memory.encrypt_session import EncryptedSession
from agents.memory import SessionSettings
from agents.memory.openai_responses_compaction_session import OpenAIResponsesCompactionSession
from agents.testing import ScriptedModel, assistant_message
from openai import AsyncOpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from eventlog import OutcomeUnknownError
from integrations.openai_agents import SessionlogSession
from sessions import ContextPolicy, SessionStore
from tests._service import serving
from tests.conftest import open_store, store_target_of
from tests.test_aio_cancel import cancel_behind

set_tracing_disabled(True)  # no tracing exporter: the tests talk to no service
WORKER = Path(__file__).with_name("_openai_agents_compaction_worker.py")
ROOT = Path(__file__).resolve().parent.parent


class Compactor:
    """A stand-in for the Responses API's `POST /responses/compact`: it answers with the user
    messages of the input and one compaction item, as the API does, and keeps every request.
    `during` runs inside a request, before the answer (another writer, say)."""

    def __init__(self) -> None:
        self.url = ""
        self.requests: list[dict[str, Any]] = []
        self.during: Callable[[], object] | None = None

    def run(self, main: Callable[[AsyncOpenAI], Awaitable[None]]) -> None:
        """`asyncio.run(main(client))`, with a client of this server closed in the loop."""

        async def with_client() -> None:
            async with AsyncOpenAI(base_url=self.url, api_key="x", max_retries=0) as client:
                await main(client)

        asyncio.run(with_client())

    async def compact(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        if self.during is not None:
            self.during()
        given = body.get("input") or []
        output: list[dict[str, Any]] = [
            user_output(text_of(item)) for item in given if item.get("role") == "user"
        ]
        about = f"{len(given)} items" if given else body.get("previous_response_id")
        output.append(compaction(len(self.requests), f"summary of {about}"))
        usage = {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 12,
        }
        return JSONResponse(
            {
                "id": f"cmp-response-{len(self.requests)}",
                "created_at": 1_700_000_000,
                "object": "response.compaction",
                "output": output,
                "usage": usage,
            }
        )


def text_of(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])


def user_output(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def compaction(number: int, summary: str) -> dict[str, Any]:
    return {"type": "compaction", "id": f"cmp-{number}", "encrypted_content": summary}


@pytest.fixture(scope="module")
def server() -> Iterator[Compactor]:
    compactor = Compactor()
    app = Starlette(routes=[Route("/responses/compact", compactor.compact, methods=["POST"])])
    with serving(app) as url:
        compactor.url = url
        yield compactor


@pytest.fixture
def compactor(server: Compactor) -> Iterator[Compactor]:
    server.requests.clear()
    server.during = None
    yield server
    server.during = None


def compacting(
    session: Any, client: AsyncOpenAI, **options: Any
) -> OpenAIResponsesCompactionSession:
    return OpenAIResponsesCompactionSession(
        session.session_id, underlying_session=session, client=client, **options
    )


def turns(count: int, first: int = 0) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i in range(first, first + count):
        items += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    return items


def commits(store: SessionStore) -> int:
    """The id of the last write transaction the store's LMDB environment committed: it grows by
    one a commit (`StorageTxn.commit_sequence`)."""
    return int(store.log._storage.env.info()["last_txnid"])  # type: ignore[attr-defined]


def stored(store: SessionStore, sid: str = "s") -> list[Any]:
    return [entry["item"] for entry in store.messages(sid)]


def count_replacements(session: SessionlogSession) -> list[tuple[bool, int]]:
    """Spy on the snapshots the SDK reads: each `replace_suffix` call's answer, and how many
    commits it took."""
    moves: list[tuple[bool, int]] = []
    read = session._get_compaction_snapshot
    store = session.store.store

    async def counted(limit: int, **options: Any) -> Any:
        snapshot = await read(limit, **options)
        if snapshot is None:
            return None

        async def replace_suffix(start: int, output: list[Any]) -> bool:
            before = commits(store)
            done = await snapshot.replace_suffix(start, output)
            moves.append((done, commits(store) - before))
            return done

        return dataclasses.replace(snapshot, replace_suffix=replace_suffix)

    session._get_compaction_snapshot = counted  # type: ignore[method-assign]
    return moves


class Hookless:
    """A session with the four methods of the protocol and neither compaction hook: how the SDK
    wrapper saw a `SessionlogSession` before it had them."""

    def __init__(self, session: SessionlogSession) -> None:
        self.session_id = session.session_id
        self.session_settings = session.session_settings
        self.get_items = session.get_items
        self.add_items = session.add_items
        self.pop_item = session.pop_item
        self.clear_session = session.clear_session


def test_a_manual_compaction_replaces_the_history_in_one_commit(
    tmp_path: Path, compactor: Compactor
) -> None:
    async def main(client: AsyncOpenAI) -> None:
        ours = SessionlogSession("s", store=tmp_path / "store")
        store = ours.store.store
        await ours.add_items(turns(2))  # type: ignore[arg-type]
        head, before = store.log.head, commits(store)
        await compacting(ours, client).run_compaction({"force": True})
        assert commits(store) == before + 1
        assert compactor.requests == [{"model": "gpt-4.1", "input": turns(2)}]
        compacted = [user_output("q0"), user_output("q1"), compaction(1, "summary of 4 items")]
        assert await ours.get_items() == compacted
        kinds = [type(e.data).__name__ for e in store.log.read(after=head, limit=10)]
        assert kinds == ["SessionReset", "MessagesInjected"]
        assert stored(store.as_of(head)) == turns(2)  # the log keeps what was replaced
        # Without the hooks the SDK clears, commits, adds and commits: empty in between.
        other = SessionlogSession("t", store=ours.store)
        await other.add_items(turns(2))  # type: ignore[arg-type]
        seen_between: list[list[Any]] = []
        add_items = other.add_items

        async def add_after_clear(items: list[Any], **options: Any) -> None:
            seen_between.append(await other.get_items())
            await add_items(items, **options)

        hookless = Hookless(other)
        hookless.add_items = add_after_clear
        before = commits(store)
        await compacting(hookless, client).run_compaction({"force": True})
        assert commits(store) == before + 2 and seen_between == [[]]
        assert store.verify(projections=True).ok
        await ours.store.aclose()

    compactor.run(main)


def test_the_runner_compacts_through_the_snapshot_in_one_commit(
    tmp_path: Path, compactor: Compactor
) -> None:
    """Each turn's automatic compaction covers the whole history (`previous_response_id` mode)
    and replaces it in one commit; the next turn's model call starts from its output."""

    async def main(client: AsyncOpenAI) -> None:
        ours = SessionlogSession("s", store=tmp_path / "store")
        store = ours.store.store
        moves = count_replacements(ours)
        wrapped = compacting(ours, client, should_trigger_compaction=lambda context: True)
        steps = [[assistant_message(f"answer {i}", item_id=f"m-{i}")] for i in range(2)]
        model = ScriptedModel(steps)
        agent = Agent(name="a", model=model)
        await Runner.run(agent, "first question", session=wrapped)
        head = store.log.head
        first = [compaction(1, "summary of resp-789")]
        assert await ours.get_items() == first
        await Runner.run(agent, "second question", session=wrapped)
        assert model.calls[1].input == [*first, {"role": "user", "content": "second question"}]
        assert moves == [(True, 1), (True, 1)]
        assert [r.get("previous_response_id") for r in compactor.requests] == ["resp-789"] * 2
        assert await ours.get_items() == [compaction(2, "summary of resp-789")]
        # before each replacement's two events (rewind, append), the log has the turn whole
        first_turn = stored(store.as_of(head - 2))
        assert first_turn[0] == {"role": "user", "content": "first question"}
        assert [item.get("id") for item in first_turn] == [None, "m-0"]
        assert stored(store.as_of(store.log.head - 2))[:2] == [*first, model.calls[1].input[1]]
        await ours.store.aclose()

    compactor.run(main)


def test_a_partial_snapshot_replaces_only_the_suffix_the_model_saw(
    tmp_path: Path, compactor: Compactor
) -> None:
    """With a read limit the model sees the last items only: the SDK compacts those (in `input`
    mode, from a user message on) and the items before them stay, in front of the output."""

    async def main(client: AsyncOpenAI) -> None:
        ours = SessionlogSession(
            "s", store=tmp_path / "store", session_settings=SessionSettings(limit=2)
        )
        store = ours.store.store
        await ours.add_items(turns(2))  # type: ignore[arg-type]
        moves = count_replacements(ours)
        wrapped = compacting(ours, client, should_trigger_compaction=lambda context: True)
        model = ScriptedModel([[assistant_message("a2", item_id="m-2")]])
        head = store.log.head
        await Runner.run(Agent(name="a", model=model), "q2", session=wrapped)
        assert model.calls[0].input == [*turns(1, first=1), {"role": "user", "content": "q2"}]
        assert moves == [(True, 1)]
        [request] = compactor.requests
        assert "previous_response_id" not in request and len(request["input"]) == 4
        assert stored(store) == [
            *turns(1),
            user_output("q1"),
            user_output("q2"),
            compaction(1, "summary of 4 items"),
        ]
        assert stored(store.as_of(head))[-2:] == turns(1, first=1)
        await ours.store.aclose()

    compactor.run(main)


def test_a_suffix_changed_meanwhile_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        ours = SessionlogSession("s", store=tmp_path / "store")
        store = ours.store.store
        await ours.add_items(turns(2))  # type: ignore[arg-type]
        out = [compaction(1, "summary")]
        extra = {"role": "user", "content": "late"}
        last = turns(2)[-1]
        changes: dict[str, Callable[[], Any]] = {
            "added to": lambda: ours.add_items([extra]),  # type: ignore[list-item]
            "popped": ours.pop_item,
            "popped and added again": lambda: pop_then_add(ours, last),
            "cleared": ours.clear_session,
        }
        for change, make in changes.items():
            await ours.clear_session()
            await ours.add_items(turns(2))  # type: ignore[arg-type]
            snapshot = await ours._get_compaction_snapshot(3)
            assert snapshot is not None and snapshot.items == turns(2)[1:]
            assert not snapshot.complete
            await make()
            head, now = store.log.head, await ours.get_items()
            assert not await snapshot.replace_suffix(0, out), change
            assert store.log.head == head and await ours.get_items() == now, change
        # a write elsewhere (another session) is no change of this suffix
        await ours.clear_session()
        await ours.add_items(turns(2))  # type: ignore[arg-type]
        snapshot = await ours._get_compaction_snapshot(3)
        assert snapshot is not None
        await SessionlogSession("other", store=ours.store).add_items([extra])  # type: ignore[list-item]
        assert await snapshot.replace_suffix(1, out)
        assert await ours.get_items() == [*turns(1), *out]
        assert not await snapshot.replace_suffix(1, out)  # replaced once: it changed
        assert not await snapshot.replace_suffix(3, out)  # nothing read from there on
        await ours.store.aclose()

    asyncio.run(main())


async def pop_then_add(session: SessionlogSession, item: dict[str, Any]) -> None:
    await session.pop_item()
    await session.add_items([item])  # type: ignore[list-item]


def test_the_sdk_skips_a_replacement_when_another_writer_added_meanwhile(
    tmp_path: Path, compactor: Compactor
) -> None:
    """Another writer appends while the compact request is out: the SDK's replacement is refused
    and the history is the turn with that item after it, as written."""

    async def main(client: AsyncOpenAI) -> None:
        ours = SessionlogSession("s", store=tmp_path / "store")
        store = ours.store.store
        moves = count_replacements(ours)
        wrapped = compacting(ours, client, should_trigger_compaction=lambda context: True)
        late = {"role": "user", "content": "written by another process"}
        head: list[int] = []

        def another_writer() -> None:
            store.inject("s", {"role": "user", "item": late})
            head.append(store.log.head)

        compactor.during = another_writer
        model = ScriptedModel([[assistant_message("answer", item_id="m-1")]])
        await Runner.run(Agent(name="a", model=model), "question", session=wrapped)
        assert len(compactor.requests) == 1 and moves == [(False, 0)]
        items = await ours.get_items()
        assert items[0] == {"role": "user", "content": "question"} and items[-1] == late
        assert len(items) == 3 and store.log.head == head[0]
        await ours.store.aclose()

    compactor.run(main)


def expired(item: Any) -> bool:
    return isinstance(item, dict) and item.get("expired") is True


def test_prune_prefix_drops_the_expired_leading_items_in_the_same_commit(tmp_path: Path) -> None:
    async def main() -> None:
        ours = SessionlogSession("s", store=tmp_path / "store")
        store = ours.store.store
        old = [{"type": "x", "n": i, "expired": True} for i in range(5)]
        kept = [{"type": "x", "n": 5}, {"type": "x", "n": 6, "expired": True}]
        await ours.add_items([*old, *kept, *turns(1)])  # type: ignore[list-item]
        snapshot = await ours._get_compaction_snapshot(2, prune_prefix=expired)
        assert snapshot is not None and snapshot.items == turns(1)
        out = [compaction(1, "summary")]
        head, before = store.log.head, commits(store)
        assert await snapshot.replace_suffix(0, out)
        assert commits(store) == before + 1
        # read two at a time, the five expired ones go; from the first that is not, all stay
        assert await ours.get_items() == [*kept, *out]
        assert stored(store.as_of(head)) == [*old, *kept, *turns(1)]
        # expired up to the suffix: all of it goes
        await ours.clear_session()
        await ours.add_items([*old[:2], *turns(1)])  # type: ignore[list-item]
        snapshot = await ours._get_compaction_snapshot(2, prune_prefix=expired)
        assert snapshot is not None and await snapshot.replace_suffix(1, out)
        assert await ours.get_items() == [turns(1)[0], *out]
        assert store.verify(projections=True).ok
        await ours.store.aclose()

    asyncio.run(main())


def test_encrypted_session_prunes_expired_items_through_the_hook(
    tmp_path: Path, compactor: Compactor
) -> None:
    """`EncryptedSession` over the compaction wrapper over ours, run by the `Runner`: its snapshot
    passes `prune_prefix`, and the leading expired envelopes go in the replacement's commit, up to
    the first item that is not one (a plain item here)."""

    async def main(client: AsyncOpenAI) -> None:
        ours = SessionlogSession("s", store=tmp_path / "store")
        store = ours.store.store
        wrapped = compacting(ours, client, should_trigger_compaction=lambda context: True)
        encrypted = EncryptedSession("s", wrapped, encryption_key="k" * 32, ttl=600)
        hour_ago = int(time.time()) - 3600

        def stale(text: str) -> dict[str, Any]:
            data = json.dumps({"role": "user", "content": text}).encode()
            token = encrypted.cipher.encrypt_at_time(data, hour_ago).decode()
            return {"__enc__": 1, "v": 1, "kid": "hkdf-v1", "payload": token}

        plain = {"role": "user", "content": "not an envelope"}
        await ours.add_items([stale("a"), plain, stale("c"), stale("b")])  # type: ignore[list-item]
        await encrypted.add_items(turns(1))  # type: ignore[arg-type]
        moves = count_replacements(ours)
        model = ScriptedModel([[assistant_message("a1", item_id="m-1")]])
        await Runner.run(Agent(name="a", model=model), "q1", session=encrypted)
        assert model.calls[0].input == [*turns(1), {"role": "user", "content": "q1"}]
        assert moves == [(True, 1)]
        items = stored(store)
        assert len(items) == 5 and items[0] == plain  # "a" went; "b" was in the replaced suffix
        assert json.loads(encrypted.cipher.decrypt(items[1]["payload"].encode())) == {
            "role": "user",
            "content": "c",
        }
        assert await encrypted.get_items() == [
            user_output("q0"),
            user_output("q1"),
            compaction(1, "summary of 4 items"),
        ]
        await ours.store.aclose()

    compactor.run(main)


def test_the_hooks_step_aside_where_items_are_not_stored_as_is(
    tmp_path: Path, compactor: Compactor
) -> None:
    """With a `compaction` policy the model sees the context view, not the stored suffix: no
    snapshot, and the manual compaction replaces the whole history, still in one commit. A
    subclass that changes how items are stored gets neither hook."""

    class Tagged(SessionlogSession):
        async def add_items(self, items: list[Any], **options: Any) -> None:
            await super().add_items([{**item, "tag": 1} for item in items], **options)

    async def main(client: AsyncOpenAI) -> None:
        policy = ContextPolicy(summarizer=lambda items, **options: "summary")
        ours = SessionlogSession("s", store=tmp_path / "store", compaction=policy)
        store = ours.store.store
        await ours.add_items(turns(2))  # type: ignore[arg-type]
        assert await ours._get_compaction_snapshot(5) is None
        before = commits(store)
        await compacting(ours, client).run_compaction({"force": True})
        assert commits(store) == before + 1 and len(await ours.get_items()) == 3
        tagged = Tagged("t", store=ours.store)
        await tagged.add_items(turns(1))  # type: ignore[arg-type]
        assert await tagged._get_compaction_snapshot(5) is None
        assert not await tagged._atomic_replace_items([compaction(1, "s")])  # type: ignore[list-item]
        await compacting(tagged, client).run_compaction({"force": True})
        assert [item.get("tag") for item in await tagged.get_items()] == [1, 1]
        await ours.store.aclose()

    compactor.run(main)


def test_a_routed_session_compacts_the_session_the_wrapper_reads(
    tmp_path: Path, compactor: Compactor
) -> None:
    """The SDK's wrapper calls every method of the session it wraps without the run's context,
    so `route` is given None there; the hooks act on that same stored session."""

    def route(wrapper: Any, sid: str) -> str:
        return f"{'shared' if wrapper is None else wrapper.context['tenant']}.{sid}"

    async def main(client: AsyncOpenAI) -> None:
        ours = SessionlogSession("chat", store=tmp_path / "store", route=route)
        store = ours.store.store
        wrapped = compacting(ours, client)
        await wrapped.add_items(turns(1))  # type: ignore[arg-type]
        acme = SimpleNamespace(context={"tenant": "acme"})
        await ours.add_items([{"role": "user", "content": "acme's"}], wrapper=acme)  # type: ignore[arg-type]
        await wrapped.run_compaction({"force": True})
        assert stored(store, "shared.chat") == [
            user_output("q0"),
            compaction(1, "summary of 2 items"),
        ]
        assert stored(store, "acme.chat") == [{"role": "user", "content": "acme's"}]
        snapshot = await ours._get_compaction_snapshot(5)
        assert snapshot is not None and snapshot.items == await wrapped.get_items()
        await ours.store.aclose()

    compactor.run(main)


def test_a_cancelled_replacement_raises_once_it_is_stored(tmp_path: Path) -> None:
    async def main() -> None:
        ours = SessionlogSession("s", store=tmp_path / "store")
        await ours.add_items(turns(1))  # type: ignore[arg-type]
        out = [compaction(1, "summary")]
        await cancel_behind(ours.store, ours._atomic_replace_items(out))  # type: ignore[arg-type]
        assert await ours.get_items() == out
        await ours.store.aclose()

    asyncio.run(main())


@pytest.mark.needs("POSTGRES")
def test_a_replacement_of_unknown_outcome_is_applied_once(tmp_path: Path) -> None:
    """On PostgreSQL a commit can end with its outcome unknown: the replacement carries a key of
    its own, and asked again it finds its first commit rather than refusing or replacing twice."""
    store = open_store("postgres", store_target_of("postgres", tmp_path))

    async def main() -> None:
        ours = SessionlogSession("s", store=store)
        await ours.add_items(turns(2))  # type: ignore[arg-type]
        real = ours.store._write
        lost: list[int] = []

        async def committed_then_lost(*args: Any, **kwargs: Any) -> Any:
            written = await real(*args, **kwargs)
            if len(lost) < 2:
                lost.append(1)
                raise OutcomeUnknownError("commit outcome unknown")
            return written

        snapshot = await ours._get_compaction_snapshot(2)
        assert snapshot is not None
        ours.store._write = committed_then_lost  # type: ignore[method-assign]
        try:
            assert await snapshot.replace_suffix(0, [compaction(1, "one")])
            assert await ours._atomic_replace_items([compaction(2, "two")])  # type: ignore[list-item]
        finally:
            del ours.store._write
        assert len(lost) == 2
        assert await ours.get_items() == [compaction(2, "two")]
        await ours.store.aclose()

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "left"),
    [
        ("manual-inside", "old"),
        ("manual-after", "new"),
        ("automatic-inside", "old"),
        ("automatic-after", "new"),
        ("fallback-inside", "empty"),
    ],
)
def test_a_process_killed_mid_replacement_leaves_the_old_or_the_new_history(
    tmp_path: Path, compactor: Compactor, mode: str, left: str
) -> None:
    """`inside`: killed with the history cut inside the replacement's open transaction, before
    the output is written; `after`: killed once the commit returned. `fallback` is the SDK's
    clear-then-add of a session without the hooks, killed as it adds: the one empty state."""
    path = tmp_path / "store"
    with SessionStore.open(path) as store:
        store.open_session("s")
        store.inject_many("s", [{"role": item["role"], "item": item} for item in turns(2)])
    marker = tmp_path / "dying"
    child = subprocess.Popen(
        [sys.executable, str(WORKER), str(path), compactor.url, mode, str(marker)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.wait(120) == -signal.SIGKILL, "the worker was not killed"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert marker.read_text() == mode
    with SessionStore.open(path) as store:
        history = stored(store)
        assert store.verify(projections=True).ok
    if not mode.startswith("automatic"):
        new = [user_output("q0"), user_output("q1"), compaction(1, "summary of 4 items")]
        assert history == {"old": turns(2), "new": new, "empty": []}[left]
    elif left == "new":
        assert history == [compaction(1, "summary of resp-789")]
    else:  # the turn the runner stored before it compacted, whole
        assert history[:5] == [*turns(2), {"role": "user", "content": "q2"}]
        assert len(history) == 6 and history[5]["id"] == "m-2"
