"""A small Python client of the service (httpx): the store's verbs over HTTP, and `follow()`, an
iterator over a live event stream that resumes by itself after a dropped connection.

Every POST carries an `Idempotency-Key` (a fresh one unless given), so a write retried after a
transport failure (`retries`) is written once. Errors come back as `ServiceError` holding the
server's problem details. Never logs a token.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

from eventlog import SessionLogError

_CONTROL = ("overflow", "shutdown")


class ServiceError(SessionLogError):
    """The service answered with a problem (RFC 9457): `status`, `type`, `problem`."""

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.problem = dict(problem)
        self.type = str(problem.get("type", ""))
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")

    @property
    def kind(self) -> str:
        """The problem type without its prefix (`unknown-session`, `limit-exceeded`, ...)."""
        return self.type.rsplit(":", 1)[-1]


class Client:
    """``Client("http://127.0.0.1:8700", token)``; use as a context manager or `close()` it."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        retries: int = 0,
        retry_delay_s: float = 0.2,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"authorization": f"Bearer {token}"}
        self._timeout = timeout_s
        self.retries = retries
        self.retry_delay_s = retry_delay_s
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers, timeout=timeout_s)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # Plumbing

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """One call; raises `ServiceError` for a problem answer. A POST is retried up to
        `retries` times after a transport failure, with the same key."""
        sent = dict(headers or {})
        if method == "POST":
            sent["idempotency-key"] = idempotency_key or uuid.uuid4().hex
        query = {k: _query_value(v) for k, v in (params or {}).items() if v is not None}
        attempts = self.retries + 1 if method in ("POST", "GET", "PUT", "DELETE") else 1
        for attempt in range(attempts):
            try:
                response = self._http.request(
                    method, path, json=json_body, content=content, params=query, headers=sent
                )
                break
            except httpx.TransportError:
                if attempt + 1 == attempts:
                    raise
                time.sleep(self.retry_delay_s * (attempt + 1))
        if response.status_code >= 400:
            raise _error(response)
        return response

    def _json(self, method: str, path: str, **how: Any) -> Any:
        return self.request(method, path, **how).json()

    # Sessions

    def open_session(self, session_id: str | None = None, **options: Any) -> str:
        body = {"id": session_id, **options}
        found: str = self._json("POST", "/v1/sessions", json_body=body)["id"]
        return found

    def summary(self, session_id: str) -> dict[str, Any] | None:
        """The session without its transcript; None when it is unknown (or not yours)."""
        return self._or_none(f"/v1/sessions/{session_id}", without="transcript")

    def snapshot(self, session_id: str, *, as_of: int | None = None) -> dict[str, Any] | None:
        params = {"as_of": as_of} if as_of is not None else None
        return self._or_none(f"/v1/sessions/{session_id}", params=params)

    def exists(self, session_id: str) -> bool:
        found = self.summary(session_id)
        return found is not None and found.get("status") == "active"

    def list_sessions(self, **filters: Any) -> dict[str, Any]:
        page: dict[str, Any] = self._json("GET", "/v1/sessions", params=filters)
        return page

    def rename(self, session_id: str, title: str | None) -> None:
        self.request("PATCH", f"/v1/sessions/{session_id}", json_body={"title": title})

    def update_metadata(
        self,
        session_id: str,
        metadata: Mapping[str, Any] | None = None,
        *,
        remove: list[str] | tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """Set keys and remove keys of the session's metadata; returns the metadata after."""
        patch = {**dict(metadata or {}), **dict.fromkeys(remove)}
        found = self._json("PATCH", f"/v1/sessions/{session_id}", json_body={"metadata": patch})
        return dict(found["metadata"])

    def close_session(self, session_id: str, reason: str | None = None) -> None:
        self.request("POST", f"/v1/sessions/{session_id}/close", json_body={"reason": reason})

    def delete(self, session_id: str, *, reason: str | None = None) -> None:
        self.request("DELETE", f"/v1/sessions/{session_id}", params={"reason": reason})

    def fork(self, source_id: str, destination_id: str | None = None) -> str:
        return self._fork(source_id, {"child_id": destination_id})

    def fork_at(self, source_id: str, keep_first: int, destination_id: str | None = None) -> str:
        return self._fork(source_id, {"keep_first": keep_first, "child_id": destination_id})

    def _fork(self, source_id: str, body: dict[str, Any]) -> str:
        found: str = self._json("POST", f"/v1/sessions/{source_id}/fork", json_body=body)["id"]
        return found

    def ancestry(self, session_id: str) -> dict[str, Any] | None:
        return self._or_none(f"/v1/sessions/{session_id}/ancestry", without="session_id")

    # Messages

    def messages(
        self, session_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """A page (with `limit`), or the whole transcript, page after page."""
        path = f"/v1/sessions/{session_id}/messages"
        if limit is not None:
            page = self._json("GET", path, params={"after": after, "limit": limit})
            return list(page["data"])
        found: list[dict[str, Any]] = []
        cursor: int | None = after
        while cursor is not None:
            page = self._json("GET", path, params={"after": cursor, "limit": 1000})
            found.extend(page["data"])
            cursor = page["next_after"]
        return found

    def length(self, session_id: str) -> int:
        page = self._json("GET", f"/v1/sessions/{session_id}/messages", params={"limit": 1})
        return int(page["length"])

    def inject(
        self,
        session_id: str,
        message: Mapping[str, Any],
        *,
        expected_length: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """`expected_length`: write only if the transcript holds that many entries, else a
        `ServiceError` of kind `length-conflict` (409), as the store's `LengthConflictError`."""
        body = _conditional({"message": dict(message)}, expected_length)
        found: dict[str, Any] = self._json(
            "POST",
            f"/v1/sessions/{session_id}/messages",
            json_body=body,
            idempotency_key=idempotency_key,
        )
        return found

    def inject_many(
        self,
        session_id: str,
        messages: list[Mapping[str, Any]],
        *,
        expected_length: int | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        body = _conditional({"messages": [dict(m) for m in messages]}, expected_length)
        found = self._json(
            "POST",
            f"/v1/sessions/{session_id}/messages",
            json_body=body,
            idempotency_key=idempotency_key,
        )
        return int(found["appended"])

    def trim(self, session_id: str, keep_last: int) -> int:
        path = f"/v1/sessions/{session_id}/trim"
        return int(self._json("POST", path, json_body={"keep_last": keep_last})["kept"])

    def compact(self, session_id: str, **options: Any) -> int:
        path = f"/v1/sessions/{session_id}/compact"
        return int(self._json("POST", path, json_body=options)["kept"])

    def reset(self, session_id: str) -> None:
        self.request("POST", f"/v1/sessions/{session_id}/reset")

    # Scratchpad and live clients

    def scratchpad(self, session_id: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self._json("GET", f"/v1/sessions/{session_id}/scratchpad")[
            "scratchpad"
        ]
        return found

    def set_scratchpad(
        self, session_id: str, scratchpad: Mapping[str, Any] | None, **opts: Any
    ) -> dict[str, Any]:
        body = {"scratchpad": None if scratchpad is None else dict(scratchpad), **opts}
        found: dict[str, Any] = self._json(
            "PUT", f"/v1/sessions/{session_id}/scratchpad", json_body=body
        )
        return found

    def clear_scratchpad(self, session_id: str) -> dict[str, Any]:
        return self.set_scratchpad(session_id, None)

    def client_action(
        self, session_id: str, client_id: str, action: str, opts: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """`attach`, `heartbeat`, `detach` or `takeover`; returns the live clients after it."""
        path = f"/v1/sessions/{session_id}/clients/{client_id}/{action}"
        found: dict[str, Any] = self._json("POST", path, json_body=dict(opts or {}))
        return found

    def attach(self, session_id: str, client_id: str, **opts: Any) -> dict[str, Any]:
        return self.client_action(session_id, client_id, "attach", opts)

    def takeover(self, session_id: str, client_id: str, **opts: Any) -> dict[str, Any]:
        return self.client_action(session_id, client_id, "takeover", opts)

    def detach(self, session_id: str, client_id: str, **opts: Any) -> dict[str, Any]:
        return self.client_action(session_id, client_id, "detach", opts)

    def heartbeat(self, session_id: str, client_id: str, **opts: Any) -> dict[str, Any]:
        return self.client_action(session_id, client_id, "heartbeat", opts)

    def client_inject_prompt(
        self,
        session_id: str,
        client_id: str,
        content: Any,
        options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        path = f"/v1/sessions/{session_id}/clients/{client_id}/prompt"
        body = {"content": content, "options": dict(options) if options else None}
        found: dict[str, Any] = self._json("POST", path, json_body=body)
        return found

    def route_permission(
        self, session_id: str, client_id: str, request: Mapping[str, Any]
    ) -> dict[str, Any]:
        path = f"/v1/sessions/{session_id}/clients/{client_id}/permission"
        found: dict[str, Any] = self._json("POST", path, json_body={"request": dict(request)})
        return found

    # Events

    def events(
        self, session_id: str | None = None, *, after: int = 0, limit: int = 100
    ) -> list[dict[str, Any]]:
        path = "/v1/events" if session_id is None else f"/v1/sessions/{session_id}/events"
        page = self._json("GET", path, params={"after_event_id": after, "limit": limit})
        return list(page["data"])

    def follow(
        self,
        session_id: str | None = None,
        *,
        after: int = 0,
        reconnect_delay_s: float = 0.2,
        reconnects_max: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The events after `after`, then each as it is committed, forever: a dropped connection,
        a server restart, an overflow or a shutdown event reconnect from the last event seen.
        Close the iterator (or break out of the loop) to stop."""
        path = (
            "/v1/events/stream"
            if session_id is None
            else f"/v1/sessions/{session_id}/events/stream"
        )
        cursor = after
        reconnects = 0
        while True:
            try:
                for kind, data in self._frames(path, cursor):
                    if kind in _CONTROL:
                        break
                    if kind == "error":
                        raise ServiceError(int(data.get("status", 400)), data)
                    cursor = int(data["id"])
                    reconnects = 0
                    yield data
            except (httpx.TransportError, ServiceError) as exc:
                if isinstance(exc, ServiceError) and exc.status not in (502, 503, 504):
                    raise
            reconnects += 1
            if reconnects_max is not None and reconnects > reconnects_max:
                raise ServiceError(503, {"title": "stream lost", "detail": f"after {cursor}"})
            time.sleep(reconnect_delay_s)

    def _frames(self, path: str, cursor: int) -> Iterator[tuple[str, dict[str, Any]]]:
        headers = {"last-event-id": str(cursor), "accept": "text/event-stream"}
        timeout = httpx.Timeout(self._timeout, read=60.0)
        with self._http.stream("GET", path, headers=headers, timeout=timeout) as response:
            if response.status_code >= 400:
                response.read()
                raise _error(response)
            yield from parse_sse(response.iter_lines())

    # Bundles, seeding, verify, tokens

    def export_bundle(self, session_id: str, mode: str = "sanitized") -> dict[str, Any]:
        found: dict[str, Any] = self._json(
            "GET", f"/v1/sessions/{session_id}/bundle", params={"mode": mode}
        )
        return found

    def import_bundle(self, bundle: Mapping[str, Any]) -> str:
        found: str = self._json("POST", "/v1/sessions:import", json_body=dict(bundle))["session_id"]
        return found

    def seed(self, transcript: bytes, **options: Any) -> dict[str, Any]:
        found: dict[str, Any] = self._json(
            "POST",
            "/v1/sessions:seed",
            content=transcript,
            params=options,
            headers={"content-type": "application/jsonl"},
        )
        return found

    def verify(self, *, projections: bool = False) -> dict[str, Any]:
        found: dict[str, Any] = self._json("GET", "/v1/verify", params={"projections": projections})
        return found

    def health(self) -> dict[str, Any]:
        found: dict[str, Any] = self._json("GET", "/v1/health")
        return found

    def create_token(
        self, principal: str, expires_at: str, attributes: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        body = {"principal": principal, "expires_at": expires_at, "attributes": attributes}
        found: dict[str, Any] = self._json("POST", "/v1/tokens", json_body=body)
        return found

    def revoke_token(self, handle: str) -> bool:
        try:
            self.request("DELETE", f"/v1/tokens/{handle}")
        except ServiceError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _or_none(
        self, path: str, *, without: str | None = None, **how: Any
    ) -> dict[str, Any] | None:
        """The object at `path` (less its key `without`), or None when the service answers 404."""
        try:
            found: dict[str, Any] = self._json("GET", path, **how)
        except ServiceError as exc:
            if exc.status == 404:
                return None
            raise
        if without is not None:
            found.pop(without, None)
        return found


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(event, data)`` for each frame of a text/event-stream; comments are skipped."""
    kind, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield kind, json.loads("\n".join(data))
            kind, data = "message", list[str]()
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            kind = value
        elif name == "data":
            data.append(value)


def _query_value(value: Any) -> Any:
    return ("true" if value else "false") if isinstance(value, bool) else value


def _error(response: httpx.Response) -> ServiceError:
    try:
        problem = response.json()
    except ValueError:
        problem = {"title": response.reason_phrase, "detail": response.text[:200]}
    if not isinstance(problem, dict):
        problem = {"detail": str(problem)[:200]}
    return ServiceError(response.status_code, problem)


def _conditional(body: dict[str, Any], expected_length: int | None) -> dict[str, Any]:
    if expected_length is not None:
        body["expected_length"] = expected_length
    return body
