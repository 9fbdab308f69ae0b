"""The session routes of `sessionlog serve`, over real HTTP against a running server: every route's
happy path, its typed errors (problem+json), idempotent retries, and the principals' walls."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.client import Client, ServiceError
from tests._service import Server

PROBLEM = "urn:sessionlog:problem:"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("service") / "store").start()
    yield running
    assert running.stop() in (0, -signal.SIGTERM)  # uvicorn ends by the signal it drained for
    assert "Application shutdown complete" in running.log_path.read_text()


@pytest.fixture
def admin(server: Server) -> Iterator[Client]:
    with server.client() as client:
        yield client


@pytest.fixture
def http(server: Server) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {server.admin_key}"}
    with httpx.Client(base_url=server.url, headers=headers) as client:
        yield client


def problem(response: httpx.Response, status: int, kind: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == PROBLEM + kind and body["status"] == status
    assert "Traceback" not in response.text
    return dict(body)


def test_create_read_rename_close_delete(admin: Client, http: httpx.Client) -> None:
    created = http.post("/v1/sessions", json={"id": "life", "title": "first", "metadata": {"k": 1}})
    assert created.status_code == 201
    assert created.json()["id"] == "life" and created.json()["object"] == "session"
    assert created.json()["state"] == "ACTIVE" and created.json()["metadata"] == {"k": 1}
    admin.inject("life", {"role": "user", "content": "hi"})
    snapshot = admin.snapshot("life")
    assert snapshot is not None and snapshot["transcript"] == [{"role": "user", "content": "hi"}]
    assert http.patch("/v1/sessions/life", json={"title": "second"}).json()["title"] == "second"
    closed = http.post("/v1/sessions/life/close", json={"reason": "done"})
    assert closed.status_code == 200 and closed.json()["state"] == "CLOSED"
    problem(
        http.post("/v1/sessions/life/messages", json={"message": {"role": "user"}}),
        404,
        "unknown-session",
    )
    assert admin.snapshot("life") is not None  # a closed session stays readable
    assert http.delete("/v1/sessions/life").status_code == 404  # closed: no lifecycle verb
    minted = admin.open_session(title="minted")
    assert http.delete(f"/v1/sessions/{minted}").status_code == 204
    assert admin.snapshot(minted) is None


def test_snapshot_as_of_shows_the_past(admin: Client) -> None:
    sid = admin.open_session("past")
    first = admin.inject(sid, {"role": "user", "content": "one"})
    admin.inject(sid, {"role": "user", "content": "two"})
    then = admin.snapshot(sid, as_of=first["last_event_id"])
    assert then is not None and [m["content"] for m in then["transcript"]] == ["one"]
    assert admin.length(sid) == 2


def test_list_pages_and_filters(admin: Client) -> None:
    parent = admin.open_session("list-parent", metadata={"team": "red"})
    children = {admin.fork(parent, f"list-child-{i}") for i in range(3)}
    admin.open_session("list-other", metadata={"team": "blue"})
    page = admin.list_sessions(parent=parent, limit=2)
    assert len(page["data"]) == 2 and page["next_cursor"] is not None
    rest = admin.list_sessions(parent=parent, limit=2, cursor=page["next_cursor"])
    assert {s["id"] for s in page["data"] + rest["data"]} == children
    red = admin.list_sessions(metadata_key="team", metadata_value="red")["data"]
    assert {s["id"] for s in red} == {parent, *children}  # forks carry their parent's metadata
    with pytest.raises(ServiceError) as bad:
        admin.list_sessions(limit=0)
    assert bad.value.status == 422 and bad.value.kind == "invalid-argument"


def test_fork_forms_and_ancestry(admin: Client, http: httpx.Client) -> None:
    sid = admin.open_session("tree")
    acks = [admin.inject(sid, {"role": "user", "content": f"m{i}"}) for i in range(4)]
    whole = admin.fork(sid, "tree-whole")
    first_two = admin.fork_at(sid, 2, "tree-two")
    at_event = http.post(f"/v1/sessions/{sid}/fork", json={"at_event_id": acks[2]["last_event_id"]})
    assert at_event.status_code == 201 and at_event.json()["length"] == 3
    assert admin.length(whole) == 4 and admin.length(first_two) == 2
    ancestry = admin.ancestry(first_two)
    assert ancestry == {"parent_id": sid, "child_ids": [], "root_id": sid}
    assert set(admin.ancestry(sid)["child_ids"]) >= {whole, first_two}  # type: ignore[index]
    both = http.post(f"/v1/sessions/{sid}/fork", json={"keep_first": 1, "at_event_id": 1})
    problem(both, 422, "invalid-argument")
    problem(http.post(f"/v1/sessions/{sid}/fork", json={"child_id": whole}), 409, "session-exists")
    problem(http.get("/v1/sessions/nope/ancestry"), 404, "unknown-session")


def test_messages_single_batch_and_pages(admin: Client, http: httpx.Client) -> None:
    sid = admin.open_session("msgs")
    assert admin.inject_many(sid, [{"role": "user", "content": f"b{i}"} for i in range(25)]) == 25
    page = http.get(f"/v1/sessions/{sid}/messages", params={"after": 20, "limit": 3}).json()
    assert [m["content"] for m in page["data"]] == ["b20", "b21", "b22"]
    assert page["next_after"] == 23 and page["length"] == 25
    assert [m["content"] for m in admin.messages(sid)] == [f"b{i}" for i in range(25)]


def test_bad_messages_write_nothing(admin: Client, http: httpx.Client) -> None:
    sid = admin.open_session("bad-msgs")
    head = admin.health()["head"]
    no_role = http.post(f"/v1/sessions/{sid}/messages", json={"message": {"content": "x"}})
    assert "role" in str(problem(no_role, 422, "invalid-argument")["detail"])
    one_bad = {"messages": [{"role": "user", "content": "ok"}, {"content": "no role"}]}
    detail = problem(
        http.post(f"/v1/sessions/{sid}/messages", json=one_bad), 422, "invalid-argument"
    )
    assert "messages[1]" in str(detail["detail"])
    neither = http.post(f"/v1/sessions/{sid}/messages", json={})
    problem(neither, 422, "invalid-argument")
    assert admin.health()["head"] == head and admin.length(sid) == 0


def test_malformed_requests_are_typed(http: httpx.Client) -> None:
    problem(
        http.post(
            "/v1/sessions", content=b"{not json", headers={"content-type": "application/json"}
        ),
        400,
        "malformed-request",
    )
    problem(
        http.post("/v1/sessions", content=b"[1]", headers={"content-type": "application/json"}),
        400,
        "malformed-request",
    )
    problem(
        http.post("/v1/sessions", content=b"x=1", headers={"content-type": "text/plain"}),
        415,
        "unsupported-media-type",
    )
    unknown = problem(
        http.post("/v1/sessions", json={"id": "u", "colour": "red"}), 422, "invalid-argument"
    )
    assert "colour" in str(unknown["detail"])
    problem(http.post("/v1/sessions", json={"id": 7}), 422, "invalid-argument")
    problem(http.get("/v1/nowhere"), 404, "not-found")
    problem(http.put("/v1/sessions"), 405, "method-not-allowed")
    problem(
        http.get("/v1/sessions", headers={"harn-agents-protocol-version": "v0"}),
        426,
        "unsupported-protocol-version",
    )
    problem(http.get("/v1/sessions/x/messages", params={"limit": "many"}), 422, "invalid-argument")


def test_oversized_bodies_get_413(http: httpx.Client) -> None:
    from service import _limits

    big = b'{"id": "' + b"x" * (_limits.body_bytes_max + 10) + b'"}'
    problem(
        http.post("/v1/sessions", content=big, headers={"content-type": "application/json"}),
        413,
        "payload-too-large",
    )
    http.post("/v1/sessions", json={"id": "huge"})
    text = "y" * (4 * 1024 * 1024 + 1)
    too_big = http.post(
        "/v1/sessions/huge/messages", json={"message": {"role": "user", "content": text}}
    )
    assert problem(too_big, 413, "limit-exceeded")["limit_name"] == "event_bytes_max"


def test_unknown_session_everywhere_is_404(http: httpx.Client) -> None:
    for method, path, body in [
        ("GET", "/v1/sessions/ghost", None),
        ("GET", "/v1/sessions/ghost/messages", None),
        ("POST", "/v1/sessions/ghost/messages", {"message": {"role": "user", "content": "x"}}),
        ("POST", "/v1/sessions/ghost/trim", {"keep_last": 1}),
        ("POST", "/v1/sessions/ghost/fork", {}),
        ("GET", "/v1/sessions/ghost/scratchpad", None),
        ("POST", "/v1/sessions/ghost/clients/c1/attach", {}),
        ("GET", "/v1/sessions/ghost/events", None),
        ("GET", "/v1/sessions/ghost/events/stream", None),
        ("GET", "/v1/sessions/ghost/bundle", None),
    ]:
        problem(http.request(method, path, json=body), 404, "unknown-session")


def test_trim_compact_reset(admin: Client, http: httpx.Client) -> None:
    sid = admin.open_session("shrink")
    admin.inject_many(sid, [{"role": "user", "content": f"m{i}"} for i in range(20)])
    assert admin.trim(sid, 15) == 15
    assert admin.compact(sid, compact_strategy="truncate", keep_last=5) == 5
    assert [m["content"] for m in admin.messages(sid)] == [f"m{i}" for i in range(15, 20)]
    problem(http.post(f"/v1/sessions/{sid}/trim", json={"keep_last": -1}), 422, "invalid-argument")
    problem(
        http.post(f"/v1/sessions/{sid}/compact", json={"compact_strategy": "magic"}),
        422,
        "invalid-argument",
    )
    problem(
        http.post(f"/v1/sessions/{sid}/compact", json={"compact_strategy": "llm"}),
        422,
        "invalid-argument",
    )
    admin.reset(sid)
    assert admin.length(sid) == 0


def test_scratchpad(admin: Client, http: httpx.Client) -> None:
    sid = admin.open_session("pad")
    assert admin.scratchpad(sid) is None
    set_ = admin.set_scratchpad(sid, {"plan": [1, 2]}, reason="start")
    assert set_["scratchpad"] == {"plan": [1, 2]} and set_["version"] == 1
    assert admin.clear_scratchpad(sid)["scratchpad"] is None
    big = {"scratchpad": {"x": "z" * (64 * 1024)}}
    problem(http.put(f"/v1/sessions/{sid}/scratchpad", json=big), 413, "limit-exceeded")


def test_live_clients(admin: Client, http: httpx.Client) -> None:
    sid = admin.open_session("live")
    assert admin.attach(sid, "ui-1", mode="controller")["controller_id"] == "ui-1"
    admin.attach(sid, "ui-2")
    conflict = http.post(f"/v1/sessions/{sid}/clients/ui-2/attach", json={"mode": "controller"})
    problem(conflict, 409, "controller-conflict")
    prompted = admin.client_inject_prompt(sid, "ui-1", "do it")
    assert prompted["appended"] == 1 and admin.length(sid) == 1
    not_controller = http.post(f"/v1/sessions/{sid}/clients/ui-2/prompt", json={"content": "x"})
    problem(not_controller, 409, "controller-conflict")
    routed = admin.route_permission(sid, "ui-1", {"tool": "shell"})
    assert routed["session_id"] == sid
    assert admin.heartbeat(sid, "ui-2")["clients"][1]["client_id"] == "ui-2"
    assert admin.takeover(sid, "ui-2")["controller_id"] == "ui-2"
    after = admin.detach(sid, "ui-2")
    assert after["controller_id"] is None and [c["client_id"] for c in after["clients"]] == ["ui-1"]
    problem(
        http.post(f"/v1/sessions/{sid}/clients/ui-9/heartbeat", json={}), 422, "invalid-argument"
    )
    problem(
        http.post(f"/v1/sessions/{sid}/clients/ui-1/attach", json={"mode": "boss"}),
        422,
        "invalid-argument",
    )


def test_idempotent_retries_write_once(admin: Client, http: httpx.Client) -> None:
    sid = admin.open_session("idem")
    body = {"message": {"role": "user", "content": "once"}}
    key = {"idempotency-key": "req-1"}
    first = http.post(f"/v1/sessions/{sid}/messages", json=body, headers=key)
    again = http.post(f"/v1/sessions/{sid}/messages", json=body, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert first.json()["first_event_id"] == again.json()["first_event_id"]
    assert admin.length(sid) == 1
    other = http.post(
        f"/v1/sessions/{sid}/messages",
        json={"message": {"role": "user", "content": "x"}},
        headers=key,
    )
    problem(other, 409, "idempotency-key-reused")
    created = http.post("/v1/sessions", json={"title": "t"}, headers={"idempotency-key": "mk"})
    retried = http.post("/v1/sessions", json={"title": "t"}, headers={"idempotency-key": "mk"})
    assert created.json()["id"] == retried.json()["id"]
    fork1 = http.post(f"/v1/sessions/{sid}/fork", json={}, headers={"idempotency-key": "f"})
    fork2 = http.post(f"/v1/sessions/{sid}/fork", json={}, headers={"idempotency-key": "f"})
    assert fork1.json()["id"] == fork2.json()["id"]
    assert len(admin.ancestry(sid)["child_ids"]) == 1  # type: ignore[index]
    problem(
        http.post("/v1/sessions", json={}, headers={"idempotency-key": "k" * 201}),
        400,
        "malformed-request",
    )


def test_authentication_is_required(server: Server) -> None:
    for headers in ({}, {"authorization": "Bearer " + "A1b2" * 10}, {"authorization": "Basic abc"}):
        response = httpx.get(server.url + "/v1/sessions", headers=headers)
        problem(response, 401, "unauthorized")
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert httpx.get(server.url + "/v1/health").json()["ok"] is True


def tokens_for(admin: Client, *names: str, **attributes: object) -> list[str]:
    return [
        admin.create_token(name, "2099-01-01T00:00:00Z", attributes or None)["token"]
        for name in names
    ]


def test_principals_see_only_their_own_sessions(server: Server, admin: Client) -> None:
    alice_token, bob_token = tokens_for(admin, "alice", "bob")
    with server.client(alice_token) as alice, server.client(bob_token) as bob:
        mine = alice.open_session("alice-1")
        alice.inject(mine, {"role": "user", "content": "secret"})
        child = alice.fork(mine)
        assert alice.ancestry(child)["parent_id"] == mine  # type: ignore[index]
        for sid in (mine, child):
            assert bob.snapshot(sid) is None
            for call in (
                lambda s=sid: bob.inject(s, {"role": "user", "content": "x"}),
                lambda s=sid: bob.fork(s),
                lambda s=sid: bob.messages(s),
                lambda s=sid: bob.events(s),
                lambda s=sid: next(iter(bob.follow(s, reconnects_max=0))),
                lambda s=sid: bob.export_bundle(s),
            ):
                with pytest.raises(ServiceError) as hidden:
                    call()
                assert hidden.value.status == 404 and hidden.value.kind == "unknown-session"
                assert f"no session `{sid}`" in str(hidden.value)
        bobs = bob.open_session("bob-1")
        assert [s["id"] for s in bob.list_sessions()["data"]] == [bobs]
        assert {s["id"] for s in alice.list_sessions()["data"]} == {mine, child}
        with pytest.raises(ServiceError) as stolen:
            bob.open_session("bob-2", metadata={"sessionlog.owner": "alice"})
        assert stolen.value.status == 422
        for call in (
            bob.events,
            bob.verify,
            lambda: bob.create_token("x", "2099-01-01T00:00:00Z"),
        ):
            with pytest.raises(ServiceError) as denied:
                call()
            assert denied.value.status == 403
    (everything,) = tokens_for(admin, "auditor", sessions="all")
    with server.client(everything) as auditor:
        assert auditor.snapshot(mine) is not None and auditor.snapshot(bobs) is not None


def test_an_id_holding_another_principals_history_is_not_taken(
    server: Server, admin: Client
) -> None:
    """Reopening another principal's closed or deleted session, or forking into it, would hand
    the taker that history (the events page, `as_of`): refused as a taken id, saying nothing of
    what it holds. The owner may reopen its own closed session."""
    alice_token, bob_token = tokens_for(admin, "alice", "bob")
    with server.client(alice_token) as alice, server.client(bob_token) as bob:
        for sid in ("alice-closed", "alice-deleted", "alice-open"):
            alice.open_session(sid, system_prompt="ALICE PROMPT", metadata={"crm": "ALICE META"})
            alice.inject(sid, {"role": "user", "content": "ALICE SECRET"})
        alice.close_session("alice-closed")
        alice.delete("alice-deleted")
        own = bob.open_session("bob-own")
        for sid in ("alice-closed", "alice-deleted", "alice-open"):
            for call in (
                lambda s=sid: bob.open_session(s),
                lambda s=sid: bob.open_session(s, system_prompt="guess"),
                lambda s=sid: bob.fork(own, s),
                lambda s=sid: bob.fork_at(own, 0, s),
            ):
                with pytest.raises(ServiceError) as taken:
                    call()
                assert taken.value.status == 409 and taken.value.kind == "session-exists"
                assert "ALICE" not in str(taken.value.problem)
            assert bob.snapshot(sid) is None
            with pytest.raises(ServiceError) as hidden:
                bob.events(sid)
            assert hidden.value.status == 404
        assert not {s["id"] for s in bob.list_sessions()["data"]} & {"alice-closed", "alice-open"}
        with pytest.raises(ServiceError) as other:
            alice.open_session("alice-open", system_prompt="another")
        assert other.value.status == 409 and "ALICE" not in str(other.value.problem)
        assert alice.open_session("alice-closed") == "alice-closed"  # its own: reopened
        for bad in ("team/alpha", ".", ".."):
            with pytest.raises(ServiceError) as unaddressable:
                alice.open_session(bad)
            assert unaddressable.value.status == 422 and "URL" in str(unaddressable.value)
            with pytest.raises(ServiceError) as child:
                alice.fork("alice-closed", bad)
            assert child.value.status == 422


def test_odd_input_gets_a_typed_answer_never_a_server_error(
    server: Server, http: httpx.Client
) -> None:
    """A lone surrogate where a string is not wanted (or as a field name), an integer too big for
    a float, and digits of other scripts in a number: 422 naming the input, and nothing
    written."""
    http.post("/v1/sessions", json={"id": "odd"}).raise_for_status()
    head = http.get("/v1/events", params={"limit": 1}).json()
    before = len(http.get("/v1/events", params={"limit": 1000}).json()["data"])
    raw = {"content-type": "application/json"}
    for method, path, body in (
        ("POST", "/v1/sessions", '{"metadata": "\\ud800"}'),
        ("POST", "/v1/sessions", '{"\\ud800": 1}'),
        ("POST", "/v1/sessions/odd/messages", '{"messages": ["\\ud800"]}'),
        ("POST", "/v1/sessions", '{"metadata": {"n": 1' + "0" * 400 + "}}"),
        ("PATCH", "/v1/sessions/odd", '{"metadata": {"n": -1' + "0" * 400 + "}}"),
    ):
        sent = http.request(method, path, content=body, headers=raw)
        answer = problem(sent, 422, "invalid-argument")
        assert "surrogate" in str(answer["detail"]) or "64 bits" in str(answer["detail"])
    for query in ({"after": "\u00b2"}, {"after": "\u0661"}):
        problem(http.get("/v1/events/stream", params=query), 422, "invalid-argument")
    for limit in ("\u0661", "+5", "1_0"):
        problem(http.get("/v1/events", params={"limit": limit}), 422, "invalid-argument")
    assert len(http.get("/v1/events", params={"limit": 1000}).json()["data"]) == before
    assert head["data"]


def test_tokens_are_shown_once_and_revocable(
    server: Server, admin: Client, http: httpx.Client
) -> None:
    created = http.post(
        "/v1/tokens",
        json={"principal": "carol", "expires_at": "2099-01-01T00:00:00Z"},
        headers={"idempotency-key": "tok"},
    )
    assert created.status_code == 201
    token, handle = created.json()["token"], created.json()["handle"]
    retried = http.post(
        "/v1/tokens",
        json={"principal": "carol", "expires_at": "2099-01-01T00:00:00Z"},
        headers={"idempotency-key": "tok"},
    )
    assert retried.json()["handle"] == handle and retried.json()["token"] is None
    with server.client(token) as carol:
        assert carol.list_sessions()["data"] == []
        assert admin.revoke_token(handle) is True
        with pytest.raises(ServiceError) as gone:
            carol.list_sessions()
        assert gone.value.status == 401
    assert admin.revoke_token(handle) is False
    problem(
        http.post("/v1/tokens", json={"principal": "d", "expires_at": "yesterday"}),
        422,
        "invalid-argument",
    )


def test_openapi_document_is_served_and_current(server: Server) -> None:
    served = httpx.get(server.url + "/v1/openapi.json").json()
    assert served["openapi"] == "3.1.0"
    assert "/v1/sessions/{session_id}/events/stream" in served["paths"]
    written = json.loads((Path(__file__).parent.parent / "docs" / "openapi.json").read_text())
    assert served == written, "run `python docs/generate.py` to rewrite docs/openapi.json"


def test_patch_metadata_is_a_merge_patch(server: Server, admin: Client, http: httpx.Client) -> None:
    sid = admin.open_session("meta", metadata={"keep": 1, "drop": 2})
    patched = http.patch(
        f"/v1/sessions/{sid}", json={"title": "t", "metadata": {"new": "x", "drop": None}}
    )
    assert patched.status_code == 200
    assert patched.json()["metadata"] == {"keep": 1, "new": "x"} and patched.json()["title"] == "t"
    assert admin.update_metadata(sid, {"more": True}, remove=["keep"]) == {"new": "x", "more": True}
    problem(http.patch(f"/v1/sessions/{sid}", json={"metadata": [1]}), 422, "invalid-argument")
    (token,) = tokens_for(admin, "mallory")
    with server.client(token) as mallory:
        own = mallory.open_session("mallory-1")
        with pytest.raises(ServiceError) as taken:
            mallory.update_metadata(own, {"sessionlog.owner": "alice"})
        assert taken.value.status == 422
        with pytest.raises(ServiceError) as dropped:
            mallory.update_metadata(own, remove=["sessionlog.owner"])
        assert dropped.value.status == 422
        assert mallory.summary(own)["metadata"] == {"sessionlog.owner": "mallory"}  # type: ignore[index]
