"""Seed 002's bridge as an MCP server, driven by the MCP SDK's own client: over streamable HTTP
(uvicorn on loopback, bearer sessions) and over stdio (`sessionlog mcp` as a child process).
The whole delegation sequence, one-shot `tasks_delegate`, cancel, expiry by the periodic reaper,
64 sessions delegated at once, and the seed's error codes as MCP tool errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from service.mcp import (
    Agent,
    BridgeConfig,
    build_server,
    http_app,
    load_agents,
    running_bridge,
)
from sessions import SessionStore
from sessions.runtime import ConfigurationError, MockProvider, OpenAIProvider, Tool
from tests._model_stubs import Reply, StubServer, openai_stream
from tests._runtime_providers import SlowProvider

ROOT = Path(__file__).resolve().parent.parent


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result, or `Refused` with the bridge's error code."""
    result = await client.call_tool(tool, arguments)
    if result.is_error:
        text = result.content[0].text  # type: ignore[union-attr]
        # The SDK says which tool failed before the bridge's own words.
        assert text.startswith(f"Error executing tool {tool}: {{"), text
        error = json.loads(text[text.index("{") :])
        raise Refused(error["code"], error["message"])
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


def free_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def bearer(store: SessionStore, principal: str, **attributes: Any) -> str:
    """The token of a new bearer session of `principal` (attributes such as ``sessions="all"``)."""
    expires = datetime.now(UTC) + timedelta(hours=1)
    return store.tokens.create(principal, expires, attributes=attributes or None).token


@contextlib.asynccontextmanager
async def http_bridge(
    store: SessionStore,
    config: BridgeConfig,
    *,
    api_keys: dict[str, str] | None = None,
    authenticated: bool = True,
) -> AsyncIterator[tuple[str, str]]:
    """The bridge on uvicorn in this event loop; yields its URL and a bearer token. Without
    `authenticated`, the bare MCP app is served, with no `BearerAuth` in front."""
    token = bearer(store, "tester")
    async with running_bridge(store, config) as bridge:
        sock = free_socket()
        if authenticated:
            app = http_app(bridge, api_keys)
        else:
            app = build_server(bridge).streamable_http_app(streamable_http_path="/mcp")
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        port = sock.getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}/mcp", token
        finally:
            server.should_exit = True
            await task
            sock.close()


@contextlib.asynccontextmanager
async def http_client(url: str, token: str) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP, sending the bearer token."""
    headers = {"authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport) as client:  # type: ignore[arg-type]
            yield client


def config_of(*agents: Agent, **limits: Any) -> BridgeConfig:
    return BridgeConfig(agents={agent.id: agent for agent in agents}, **limits)


def mock_agent(agent_id: str = "helper", **extra: Any) -> Agent:
    return Agent(
        id=agent_id,
        providers={"mock": MockProvider(f"{agent_id}:mock")},
        default_provider="mock",
        **extra,
    )


def test_the_delegation_sequence_over_http(store: SessionStore) -> None:
    async def body() -> list[Any]:
        async with StubServer() as stub:
            stub.script(Reply(events=openai_stream(["first ", "answer"], usage=(45, 120))),
                        Reply(events=openai_stream(["second"])))  # fmt: skip
            openai = OpenAIProvider("multi:openai", base_url=stub.url, api_key="k",
                                    defaults={"model": "gpt-base", "temperature": 1.0})  # fmt: skip
            multi = Agent(
                id="multi",
                providers={"mock": MockProvider("multi:mock"), "openai": openai},
                default_provider="mock",
                description="two providers",
            )
            async with http_bridge(store, config_of(multi)) as (url, token):
                async with http_client(url, token) as client:
                    names = {tool.name for tool in (await client.list_tools()).tools}
                    assert names == {
                        "bridge_health", "agents_discover", "sessions_create", "sessions_prompt",
                        "sessions_status", "sessions_cancel", "sessions_close", "tasks_delegate",
                    }  # fmt: skip
                    health = await call(client, "bridge_health")
                    assert health == {"status": "ok", "agents": 1, "sessions": 0}
                    (found,) = (await call(client, "agents_discover"))["agents"]
                    assert found["providers"] == ["mock", "openai"]
                    assert found["defaultProvider"] == "mock"
                    with pytest.raises(Refused) as refused:
                        await call(client, "sessions_create", agentId="multi",
                                   metadata={"provider": "gemini"})  # fmt: skip
                    assert refused.value.code == "CONFIG"
                    created = await call(
                        client,
                        "sessions_create",
                        agentId="multi",
                        metadata={"provider": "openai",
                                  "runtimeParams": {"model": "gpt-4o", "temperature": 0.7}},
                    )  # fmt: skip
                    sid = created["sessionId"]
                    assert created == {"sessionId": sid, "agentId": "multi", "status": "active"}
                    answer = await call(
                        client, "sessions_prompt", sessionId=sid, prompt="Explain it",
                        runtimeParams={"temperature": 0.2, "maxTokens": 500},
                    )  # fmt: skip
                    assert answer == {
                        "text": "first answer",
                        "stopReason": "end_turn",
                        "requestId": answer["requestId"],
                        "usage": {"inputTokens": 45, "outputTokens": 120},
                    }
                    status = await call(client, "sessions_status", sessionId=sid)
                    assert status["status"] == "idle" and status["agentId"] == "multi"
                    assert isinstance(status["createdAt"], int)
                    assert status["lastActivityAt"] >= status["createdAt"] > 1_700_000_000_000
                    follow = await call(client, "sessions_prompt", sessionId=sid, prompt="More")
                    assert follow["text"] == "second"
                    closed = await call(client, "sessions_close", sessionId=sid)
                    assert closed == {"closed": True, "sessionId": sid}
                    with pytest.raises(Refused) as gone:
                        await call(client, "sessions_status", sessionId=sid)
                    assert gone.value.code == "SESSION_NOT_FOUND"
                    assert gone.value.message.startswith("Session not found")
                    with pytest.raises(Refused) as unknown:
                        await call(client, "sessions_create", agentId="nobody")
                    assert unknown.value.code == "AGENT_NOT_FOUND"
                async with httpx.AsyncClient() as plain:  # no bearer: refused before MCP
                    assert (await plain.post(url, json={})).status_code == 401
        return [request.json for request in stub.requests]

    first, second = asyncio.run(body())
    assert first["model"] == "gpt-4o" and first["temperature"] == 0.2
    assert first["max_tokens"] == 500
    assert second["temperature"] == 0.7 and "max_tokens" not in second
    assert [m["content"] for m in second["messages"]] == ["Explain it", "first answer", "More"]


def test_tasks_delegate_64_at_once(store: SessionStore) -> None:
    async def body() -> None:
        bridge = http_bridge(store, config_of(mock_agent()))
        async with bridge as (url, token), http_client(url, token) as client:
            results = await asyncio.gather(
                *(
                    call(
                        client,
                        "tasks_delegate",
                        agentId="helper",
                        prompt=f"task {i}",
                        runtimeParams={"maxTokens": 50},
                    )
                    for i in range(64)
                )
            )
            assert [r["text"] for r in results] == [f"mock reply to: task {i}" for i in range(64)]
            assert len({r["sessionId"] for r in results}) == 64
            assert all(r["stopReason"] == "end_turn" for r in results)
            assert (await call(client, "bridge_health"))["sessions"] == 0
            with pytest.raises(Refused) as closed:
                await call(client, "sessions_status", sessionId=results[0]["sessionId"])
            assert closed.value.code == "SESSION_NOT_FOUND"

    asyncio.run(body())


def test_cancel_an_inflight_prompt(store: SessionStore) -> None:
    slow = SlowProvider("helper:slow")
    agent = Agent(id="helper", providers={"slow": slow}, default_provider="slow")

    async def body() -> None:
        bridge = http_bridge(store, config_of(agent))
        async with (
            bridge as (url, token),
            http_client(url, token) as client,
            http_client(url, token) as other,
        ):
            sid = (await call(client, "sessions_create", agentId="helper"))["sessionId"]
            asking = asyncio.create_task(
                call(client, "sessions_prompt", sessionId=sid, prompt="wait", requestId="r1")
            )
            await asyncio.wait_for(slow.entered.wait(), 10)
            busy = await call(other, "sessions_status", sessionId=sid)
            assert busy["status"] == "busy"
            with pytest.raises(Refused) as refused:
                await call(other, "sessions_prompt", sessionId=sid, prompt="also")
            assert refused.value.code == "SESSION_BUSY"
            cancelled = await call(other, "sessions_cancel", sessionId=sid, requestId="r1")
            assert cancelled == {"cancelled": True, "sessionId": sid, "requestId": "r1"}
            with pytest.raises(Refused) as stopped:
                await asking
            assert stopped.value.code == "CANCELLED"
            assert (await call(other, "sessions_status", sessionId=sid))["status"] == "idle"
        assert slow.cancelled == 1

    asyncio.run(body())


def test_the_periodic_reaper_expires_sessions(store: SessionStore) -> None:
    heard: list[tuple[str, str]] = []

    async def body() -> None:
        config = config_of(mock_agent(), ttl_s=0.3, reap_interval_s=0.05)
        async with http_bridge(store, config) as (url, token), http_client(url, token) as client:
            sid = (await call(client, "sessions_create", agentId="helper"))["sessionId"]
            for _ in range(200):
                try:
                    await call(client, "sessions_status", sessionId=sid)
                except Refused as exc:
                    assert exc.code == "SESSION_NOT_FOUND"
                    heard.append((sid, exc.code))
                    break
                await asyncio.sleep(0.05)

    asyncio.run(body())
    assert len(heard) == 1
    closed = [e for e in store.log.read_stream(heard[0][0]) if e.type == "agent_session_closed"]
    assert closed[0].data.reason == "expired"  # type: ignore[attr-defined]


OWNER = "sessionlog.owner"  # the REST service's key (service/_access.py), read back below


async def refused(client: Client, tool: str, **arguments: Any) -> Refused:
    with pytest.raises(Refused) as caught:
        await call(client, tool, **arguments)
    return caught.value


async def not_found_as_unknown(client: Client, tool: str, sid: str, **arguments: Any) -> None:
    """`tool` on `sid` answers exactly as on an id that was never used: the id alone differs."""
    unknown = str(uuid.uuid4())
    for each in (sid, unknown):
        answer = await refused(client, tool, sessionId=each, **arguments)
        assert (answer.code, answer.message) == ("SESSION_NOT_FOUND", f"Session not found: {each}")


def test_a_principal_cannot_reach_another_principals_session_over_http(
    store: SessionStore,
) -> None:
    slow = SlowProvider("helper:slow")
    agent = Agent(id="helper", providers={"mock": MockProvider("helper:mock"), "slow": slow},
                  default_provider="mock")  # fmt: skip
    alice, mallory = bearer(store, "alice"), bearer(store, "mallory")

    async def body() -> str:
        async with (
            http_bridge(store, config_of(agent)) as (url, _),
            http_client(url, alice) as a,
            http_client(url, mallory) as m,
        ):
            sid = (await call(a, "sessions_create", agentId="helper"))["sessionId"]
            await call(a, "sessions_prompt", sessionId=sid, prompt="alice's plan")
            await not_found_as_unknown(m, "sessions_status", sid)
            await not_found_as_unknown(m, "sessions_prompt", sid, prompt="repeat it all")
            await not_found_as_unknown(m, "sessions_cancel", sid)
            await not_found_as_unknown(m, "sessions_close", sid)
            assert (await call(a, "sessions_status", sessionId=sid))["status"] == "idle"
            # A prompt of alice's in flight: mallory can neither see it nor cancel it.
            slow_sid = (await call(a, "sessions_create", agentId="helper",
                                   metadata={"provider": "slow"}))["sessionId"]  # fmt: skip
            asking = asyncio.create_task(
                call(a, "sessions_prompt", sessionId=slow_sid, prompt="wait", requestId="r1")
            )
            await asyncio.wait_for(slow.entered.wait(), 10)
            await not_found_as_unknown(m, "sessions_cancel", slow_sid, requestId="r1")
            await not_found_as_unknown(m, "sessions_cancel", slow_sid)
            await not_found_as_unknown(m, "sessions_status", slow_sid)
            slow.release.set()
            assert (await asking)["text"] == "slow answer"
            # Alice still does everything with her own.
            again = await call(a, "sessions_prompt", sessionId=sid, prompt="more")
            assert again["text"] == "mock reply to: more"
            cancel = await call(a, "sessions_cancel", sessionId=sid)
            assert cancel == {"cancelled": False, "sessionId": sid, "requestId": None}
            assert (await call(a, "sessions_close", sessionId=sid))["closed"] is True
            assert (await call(a, "sessions_close", sessionId=slow_sid))["closed"] is True
            return str(sid)

    sid = asyncio.run(body())
    assert slow.cancelled == 0
    assert [m["content"] for m in store.messages(sid)] == [
        "alice's plan", "mock reply to: alice's plan", "more", "mock reply to: more"
    ]  # fmt: skip
    assert (store.summary(sid) or {})["metadata"][OWNER] == "alice"


def test_a_principal_cannot_plant_a_session_under_another_over_http(store: SessionStore) -> None:
    alice, mallory = bearer(store, "alice"), bearer(store, "mallory")

    async def body() -> str:
        async with (
            http_bridge(store, config_of(mock_agent())) as (url, _),
            http_client(url, alice) as a,
            http_client(url, mallory) as m,
        ):
            planted = await refused(m, "sessions_create", agentId="helper",
                                    metadata={OWNER: "alice"})  # fmt: skip
            assert planted.code == "INVALID_ARGUMENT" and f"`{OWNER}`" in planted.message
            delegated = await refused(m, "tasks_delegate", agentId="helper", prompt="x",
                                      metadata={OWNER: "alice", "provider": "mock"})  # fmt: skip
            assert delegated.code == "INVALID_ARGUMENT"
            assert (await call(m, "bridge_health"))["sessions"] == 0  # nothing was made
            sid = (await call(m, "sessions_create", agentId="helper"))["sessionId"]
            await not_found_as_unknown(a, "sessions_status", sid)
            return str(sid)

    sid = asyncio.run(body())
    assert (store.summary(sid) or {})["metadata"][OWNER] == "mallory"


def test_an_admin_and_a_grant_of_all_reach_every_session_over_http(store: SessionStore) -> None:
    key = secrets.token_urlsafe(32)
    alice, mallory = bearer(store, "alice"), bearer(store, "mallory")
    auditor = bearer(store, "auditor", sessions="all")

    async def body() -> None:
        async with (
            http_bridge(store, config_of(mock_agent()), api_keys={key: "operator"}) as (url, _),
            http_client(url, alice) as a,
            http_client(url, mallory) as m,
            http_client(url, key) as admin,
            http_client(url, auditor) as every,
        ):
            mine = (await call(a, "sessions_create", agentId="helper"))["sessionId"]
            theirs = (await call(m, "sessions_create", agentId="helper"))["sessionId"]
            await not_found_as_unknown(a, "sessions_status", theirs)
            for client in (admin, every):
                for sid in (mine, theirs):
                    assert (await call(client, "sessions_status", sessionId=sid))["status"]
                    answer = await call(client, "sessions_prompt", sessionId=sid, prompt="hi")
                    assert answer["text"] == "mock reply to: hi"
                    assert (await call(client, "sessions_cancel", sessionId=sid))[
                        "cancelled"
                    ] is False
            # Only an admin names an owner: a session made on alice's behalf is hers alone.
            made = await call(admin, "sessions_create", agentId="helper", metadata={OWNER: "alice"})
            await call(a, "sessions_prompt", sessionId=made["sessionId"], prompt="mine now")
            await not_found_as_unknown(m, "sessions_status", made["sessionId"])
            named = await refused(every, "sessions_create", agentId="helper",
                                  metadata={OWNER: "alice"})  # fmt: skip
            assert named.code == "INVALID_ARGUMENT"
            assert (await call(every, "sessions_close", sessionId=mine))["closed"] is True
            assert (await call(admin, "sessions_close", sessionId=theirs))["closed"] is True
            assert (await call(a, "sessions_close", sessionId=made["sessionId"]))["closed"] is True

    asyncio.run(body())


def test_the_bare_mcp_app_over_http_refuses_without_a_principal(store: SessionStore) -> None:
    """Served without `BearerAuth` in front (not what `http_app` does), no tool that names or
    makes a session runs: it would not know whose the session is."""

    async def body() -> None:
        bare = http_bridge(store, config_of(mock_agent()), authenticated=False)
        async with bare as (url, _), http_client(url, "none") as client:
            assert (await call(client, "bridge_health"))["sessions"] == 0
            answer = await refused(client, "sessions_create", agentId="helper")
            assert answer.code == "CONFIG" and "authenticated principal" in answer.message
            answer = await refused(client, "sessions_status", sessionId=str(uuid.uuid4()))
            assert answer.code == "CONFIG"

    asyncio.run(body())


def word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


AGENTS_TOML = """
[bridge]
reap_interval_s = 5

[[agents]]
id = "helper"
description = "echoes"
system_prompt = "Be brief."

[agents.providers.mock]
kind = "mock"

[agents.providers.echo]
kind = "mock"
reply = "fixed answer here"
defaults = { maxTokens = 2 }

[[agents.tools]]
name = "word_count"
function = "tests.test_mcp_bridge:word_count"
parameters = { type = "object", properties = { text = { type = "string" } } }
"""


def test_the_delegation_sequence_over_stdio(tmp_path: Path) -> None:
    agents = tmp_path / "agents.toml"
    agents.write_text(AGENTS_TOML)
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "sessionlog",
            "--store",
            str(tmp_path / "store"),
            "mcp",
            "--agents",
            str(agents),
        ],
        env={"PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
    )

    async def body() -> str:
        async with Client(params) as client:  # type: ignore[arg-type]
            (agent,) = (await call(client, "agents_discover"))["agents"]
            assert agent["tools"] == ["word_count"] and agent["providers"] == ["mock", "echo"]
            sid = (await call(client, "sessions_create", agentId="helper"))["sessionId"]
            answer = await call(client, "sessions_prompt", sessionId=sid, prompt="hi there")
            assert answer["text"] == "mock reply to: hi there"
            assert (await call(client, "sessions_status", sessionId=sid))["status"] == "idle"
            assert (await call(client, "sessions_close", sessionId=sid))["closed"] is True
            one = await call(client, "tasks_delegate", agentId="helper", prompt="x",
                             metadata={"provider": "echo"})  # fmt: skip
            assert one["text"] == "fixed answer" and one["stopReason"] == "max_tokens"
            with pytest.raises(Refused) as refused:
                await call(client, "sessions_prompt", sessionId=sid, prompt="again")
            assert refused.value.code == "SESSION_NOT_FOUND"

        return str(sid)

    sid = asyncio.run(body())
    with SessionStore.open(tmp_path / "store") as store:  # the child process wrote it durably
        messages = store.messages(sid)
        assert [m["content"] for m in messages] == ["hi there", "mock reply to: hi there"]


def test_agents_toml_errors_name_the_key(tmp_path: Path) -> None:
    cases = {
        "[[agents]]\nid = 'a'\n": r"agents\[0\] \(a\): declare at least one \[agents.providers.NAME\]",
        "[[agents]]\nid = 'a'\n[agents.providers.p]\nkind = 'grok'\n": "kind must be one of",
        "[[agents]]\nid = 'a'\ndefault_provider = 'x'\n[agents.providers.p]\nkind = 'mock'\n":
            "default_provider 'x' is not one of its providers",
        "[bridge]\nspeed = 1\n[[agents]]\nid = 'a'\n": r"\[bridge\]: unknown keys \['speed'\]",
        "[[agents]]\nid = 'a'\n[agents.providers.p]\nkind = 'mock'\n"
        "[[agents.tools]]\nfunction = 'nowhere:thing'\n": "cannot be imported",
        "[[agents]]\nid = 'a'\n[agents.providers.p]\nkind = 'mock'\n"
        "defaults = { temperature = 7 }\n": "temperature must be from 0.0 to 2.0",
    }  # fmt: skip
    for index, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"agents{index}.toml"
        path.write_text(text)
        with pytest.raises(ConfigurationError, match=message):
            load_agents(path)
    good = tmp_path / "good.toml"
    good.write_text(AGENTS_TOML)
    config = load_agents(good)
    helper = config.agents["helper"]
    assert helper.providers["echo"].defaults == {"max_tokens": 2, "system_prompt": "Be brief."}
    assert isinstance(helper.tools[0], Tool) and helper.tools[0].fn is word_count
    assert config.reap_interval_s == 5


def test_an_agent_with_tools_runs_the_loop_through_the_bridge(store: SessionStore) -> None:
    from tests._runtime_providers import FINAL_ANSWER, ScriptedProvider, calls

    model = ScriptedProvider([calls(("word_count", {"text": "one two three"})), FINAL_ANSWER],
                             name="helper:scripted")  # fmt: skip
    tool = Tool("word_count", word_count, {"type": "object", "properties": {}})
    agent = Agent(id="helper", providers={"scripted": model}, default_provider="scripted",
                  tools=[tool])  # fmt: skip

    async def body() -> dict[str, Any]:
        bridge = http_bridge(store, config_of(agent, max_steps=4))
        async with bridge as (url, token), http_client(url, token) as client:
            return await call(client, "tasks_delegate", agentId="helper", prompt="count")

    result = asyncio.run(body())
    assert result["text"] == "all done" and result["stopReason"] == "end_turn"
    assert result["usage"] == {"inputTokens": 40, "outputTokens": 5}
    (_, tools), _ = model.seen
    assert tools == [tool.spec()]
    assert model.seen[1][0][-1] == {
        "role": "tool", "content": "3", "tool_call_id": "c1", "name": "word_count"
    }  # fmt: skip


def test_sessionlog_mcp_over_http_with_an_api_key(tmp_path: Path) -> None:
    import secrets
    import signal
    import subprocess
    import time

    agents = tmp_path / "agents.toml"
    agents.write_text(AGENTS_TOML)
    key = secrets.token_urlsafe(32)
    (tmp_path / "keys.txt").write_text(f"# who=key\ntester={key}\n")
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    command = [sys.executable, "-m", "sessionlog", "--store", str(tmp_path / "store"), "mcp",
               "--agents", str(agents), "--http", "--port", str(port),
               "--api-keys-file", str(tmp_path / "keys.txt")]  # fmt: skip
    with (tmp_path / "err.txt").open("wb") as err:
        proc = subprocess.Popen(command, cwd=ROOT, stderr=err, env={"PYTHONPATH": str(ROOT),
                                "PATH": "/usr/bin:/bin"})  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "err.txt").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the server never listened"
                time.sleep(0.1)

        async def body() -> dict[str, Any]:
            async with http_client(f"http://127.0.0.1:{port}/mcp", key) as client:
                return await call(client, "tasks_delegate", agentId="helper", prompt="hello")

        assert asyncio.run(body())["text"] == "mock reply to: hello"
        assert (tmp_path / "store" / "data.mdb").is_file()  # the store is in place while serving
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 0, (tmp_path / "err.txt").read_text()


def test_a_lost_lease_reaches_a_client_as_its_own_code() -> None:
    from eventlog import LeaseLostError
    from service.mcp._bridge import BridgeError, _guarded

    async def lost() -> None:
        raise LeaseLostError("runtime", "a store")

    with pytest.raises(BridgeError) as refused:
        asyncio.run(_guarded(lost()))
    assert refused.value.code == "LEASE_LOST"
    assert "`runtime` lease was lost" in refused.value.message
