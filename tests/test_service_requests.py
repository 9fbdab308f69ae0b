"""What a request may set and carry, over real HTTP against a running `sessionlog serve`: an inject
conditional on the transcript's length (optimistic concurrency for orchestrators in any language),
and headers the service would otherwise read leniently (a content coding, a charset other than
UTF-8, a duplicated header, an `If-Match` it has no entity tag for), each refused with a problem
before anything is written."""

from __future__ import annotations

import gzip
import json
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.client import ServiceError
from tests._service import Server

PROBLEM = "urn:sessionlog:problem:"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("requests") / "store").start()
    yield running
    assert running.stop() in (0, -signal.SIGTERM)


@pytest.fixture
def http(server: Server) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {server.admin_key}"}
    with httpx.Client(base_url=server.url, headers=headers) as client:
        yield client


def problem(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["type"] == PROBLEM + kind and body["status"] == status
    return body


def _message(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _head(http: httpx.Client) -> int:
    head: int = http.get("/v1/health").json()["head"]
    return head


def _length(http: httpx.Client, sid: str) -> int:
    length: int = http.get(f"/v1/sessions/{sid}/messages", params={"limit": 1}).json()["length"]
    return length


def _open(http: httpx.Client, sid: str) -> str:
    assert http.post("/v1/sessions", json={"id": sid}).status_code == 201
    return f"/v1/sessions/{sid}/messages"


# Optimistic concurrency


def test_an_inject_conditional_on_the_length_writes_only_on_that_length(
    http: httpx.Client,
) -> None:
    path = _open(http, "cond")
    first = http.post(path, json={"message": _message("one"), "expected_length": 0})
    assert first.status_code == 201, first.text
    assert first.json()["length"] == 1
    head = _head(http)
    stale = http.post(
        path, json={"messages": [_message("two"), _message("three")], "expected_length": 0}
    )
    body = problem(stale, 409, "length-conflict")
    assert (body["session_id"], body["expected_length"], body["actual_length"]) == ("cond", 0, 1)
    assert "holds 1 entries, not the expected 0" in body["detail"]
    assert body["code"] == "conflict"
    assert _head(http) == head and _length(http, "cond") == 1  # nothing written
    batch = http.post(
        path, json={"messages": [_message("two"), _message("three")], "expected_length": 1}
    )
    assert batch.status_code == 201 and batch.json()["length"] == 3
    for bad in (-1, "1", 1.5, True):
        problem(
            http.post(path, json={"message": _message("x"), "expected_length": bad}),
            422,
            "invalid-argument",
        )
    assert _length(http, "cond") == 3


def test_a_retried_conditional_inject_answers_as_its_first_attempt(http: httpx.Client) -> None:
    # The first attempt's commit made the length differ from the condition; its retry (same
    # Idempotency-Key, same body) must get the first answer, not a conflict with itself.
    path = _open(http, "cond-retry")
    body = {"message": _message("once"), "expected_length": 0}
    key = {"idempotency-key": "cond-1"}
    first = http.post(path, json=body, headers=key)
    again = http.post(path, json=body, headers=key)
    assert first.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["first_event_id"] == first.json()["first_event_id"]
    assert _length(http, "cond-retry") == 1


def test_the_python_client_passes_the_condition(server: Server) -> None:
    with server.client() as admin:
        sid = admin.open_session("cond-client")
        admin.inject(sid, _message("one"), expected_length=0)
        assert admin.inject_many(sid, [_message("two")], expected_length=1) == 1
        with pytest.raises(ServiceError) as conflict:
            admin.inject(sid, _message("late"), expected_length=1)
        assert conflict.value.status == 409 and conflict.value.kind == "length-conflict"
        assert conflict.value.problem["actual_length"] == 2
        assert admin.length(sid) == 2


def test_if_match_is_refused_since_the_service_has_no_entity_tags(http: httpx.Client) -> None:
    # Ignoring it would write unconditionally what the caller meant to write conditionally.
    path = _open(http, "match")
    head = _head(http)
    for tag in ('"1"', 'W/"1"', '"a", "b"'):
        refused = http.post(path, json={"message": _message("x")}, headers={"if-match": tag})
        body = problem(refused, 412, "precondition-failed")
        assert "expected_length" in body["detail"]
    assert _head(http) == head
    anything = http.post(path, json={"message": _message("x")}, headers={"if-match": "*"})
    assert anything.status_code == 201  # "*": any current representation, and there is one


# Lenient headers


def test_a_content_coding_is_refused(http: httpx.Client) -> None:
    path = _open(http, "coded")
    raw = json.dumps({"message": _message("zipped")}).encode()
    head = _head(http)
    for coding, body in (("gzip", gzip.compress(raw)), ("br", raw), ("identity, gzip", raw)):
        refused = http.post(
            path,
            content=body,
            headers={"content-type": "application/json", "content-encoding": coding},
        )
        answer = problem(refused, 415, "unsupported-media-type")
        assert "Content-Encoding" in answer["detail"] and coding in answer["detail"]
        assert refused.headers["accept-encoding"] == "identity"
    assert _head(http) == head
    plain = http.post(
        path,
        content=raw,
        headers={"content-type": "application/json", "content-encoding": "identity"},
    )
    assert plain.status_code == 201


def test_a_charset_other_than_utf8_is_refused(http: httpx.Client) -> None:
    path = _open(http, "charset")
    text = json.dumps({"message": _message("naïve")})
    head = _head(http)
    for charset, encoding in (("utf-16", "utf-16"), ("latin-1", "latin-1"), ('"UTF-32"', "utf-32")):
        refused = http.post(
            path,
            content=text.encode(encoding),
            headers={"content-type": f"application/json; charset={charset}"},
        )
        answer = problem(refused, 415, "unsupported-media-type")
        assert "UTF-8" in answer["detail"] and charset.strip('"') in answer["detail"]
    assert _head(http) == head
    for charset in ("utf-8", "UTF-8", '"utf-8"', "utf8", "us-ascii"):
        sent = http.post(
            path,
            content=text.encode(),
            headers={"content-type": f"application/json;charset={charset}"},
        )
        assert sent.status_code == 201, sent.text
    assert http.get(path).json()["data"][0]["content"] == "naïve"


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("content-type", ("application/json", "text/plain")),
        ("content-type", ("application/json", "application/json")),
        ("idempotency-key", ("dup-1", "dup-2")),
        ("idempotency-key", ("dup-3", "dup-3")),
    ],
)
def test_a_duplicated_header_is_refused(
    http: httpx.Client, name: str, values: tuple[str, str]
) -> None:
    # Which one a proxy, a framework or this server would read is anybody's guess: any repeat of
    # a header that holds one value is refused, the same values or not.
    path = _open(http, f"dup-{name}-{values[0] == values[1]}")
    head = _head(http)
    headers = [(name, value) for value in values]
    if name != "content-type":
        headers.append(("content-type", "application/json"))
    refused = http.post(
        path, content=json.dumps({"message": _message("twice")}).encode(), headers=headers
    )
    answer = problem(refused, 400, "malformed-request")
    assert f"2 `{name}` headers" in answer["detail"] and "one" in answer["detail"]
    assert _head(http) == head


def test_headers_are_checked_before_the_credential(server: Server) -> None:
    # A malformed request says what is wrong with it whoever sends it; it reveals nothing.
    refused = httpx.post(
        server.url + "/v1/sessions",
        content=b"{}",
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    problem(refused, 415, "unsupported-media-type")
