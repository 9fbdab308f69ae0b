"""The OpenAPI 3.1 document of the service, written from the code: the operations listed here,
their bodies' JSON Schemas from the Structs in `_schemas` (msgspec writes them), and one problem
type per error class. `docs/openapi.json` is this document, kept current by a test.
"""

from __future__ import annotations

import inspect
import json
from functools import cache
from typing import Any

import msgspec

from service import _limits, _problems
from service import _schemas as sc

_REF = "#/components/schemas/{name}"
_S = "/v1/sessions/{session_id}"

# (method, path, operation id, summary, request body, {status: response body})
_OPS: list[tuple[str, str, str, str, Any, dict[int, Any]]] = [
    ("get", "/v1/sessions", "listSessions", "A page of sessions", None, {200: sc.SessionPage}),
    (
        "post",
        "/v1/sessions",
        "createSession",
        "Open a session",
        sc.CreateSession,
        {201: sc.Session},
    ),
    ("get", _S, "getSession", "The snapshot (as_of: in the past)", None, {200: sc.SessionSnapshot}),
    ("patch", _S, "patchSession", "Rename, change metadata", sc.PatchSession, {200: sc.Session}),
    ("delete", _S, "deleteSession", "Delete (events stay in the log)", None, {204: None}),
    ("post", _S + "/close", "closeSession", "Close", sc.CloseSession, {200: sc.Session}),
    ("post", _S + "/fork", "forkSession", "Fork", sc.ForkSession, {201: sc.Session}),
    ("get", _S + "/ancestry", "getAncestry", "Parent, children, root", None, {200: sc.Ancestry}),
    (
        "get",
        _S + "/messages",
        "listMessages",
        "A page of the transcript",
        None,
        {200: sc.MessagePage},
    ),
    (
        "post",
        _S + "/messages",
        "injectMessages",
        "Inject one or a batch",
        sc.InjectMessages,
        {201: sc.InjectResult},
    ),
    ("post", _S + "/trim", "trimSession", "Keep the last messages", sc.TrimSession, {200: sc.Kept}),
    (
        "post",
        _S + "/compact",
        "compactSession",
        "Compact the transcript",
        dict[str, Any],
        {200: sc.Kept},
    ),
    ("post", _S + "/reset", "resetSession", "Wipe the transcript", None, {200: sc.Session}),
    ("get", _S + "/scratchpad", "getScratchpad", "The scratchpad", None, {200: sc.Scratchpad}),
    (
        "put",
        _S + "/scratchpad",
        "putScratchpad",
        "Replace or clear the scratchpad",
        sc.PutScratchpad,
        {200: sc.Scratchpad},
    ),
    ("get", _S + "/clients", "listClients", "The live clients", None, {200: sc.LiveClients}),
    *(
        (
            "post",
            _S + "/clients/{client_id}/" + action,
            action + "Client",
            action.title(),
            dict[str, Any],
            {200: sc.LiveClients},
        )
        for action in ("attach", "heartbeat", "detach", "takeover")
    ),
    (
        "post",
        _S + "/clients/{client_id}/prompt",
        "promptClient",
        "A prompt from the controller",
        sc.ClientPrompt,
        {201: sc.InjectResult},
    ),
    (
        "post",
        _S + "/clients/{client_id}/permission",
        "routePermission",
        "Route a permission request",
        sc.ClientPermission,
        {200: dict[str, Any]},
    ),
    (
        "get",
        _S + "/events",
        "listSessionEvents",
        "A page of the session's events",
        None,
        {200: sc.EventPage},
    ),
    (
        "get",
        _S + "/events/stream",
        "streamSessionEvents",
        "The session's events, live (SSE)",
        None,
        {200: "sse"},
    ),
    ("get", "/v1/events", "listEvents", "A page of the whole log", None, {200: sc.EventPage}),
    ("get", "/v1/events/stream", "streamEvents", "The whole log, live (SSE)", None, {200: "sse"}),
    ("get", _S + "/bundle", "exportBundle", "The session bundle v1", None, {200: dict[str, Any]}),
    (
        "post",
        "/v1/sessions:import",
        "importBundle",
        "Import a session bundle",
        dict[str, Any],
        {201: sc.Imported},
    ),
    (
        "post",
        "/v1/sessions:seed",
        "seedSession",
        "A session from llm_transcript.jsonl",
        "jsonl",
        {201: sc.SeedResult},
    ),
    (
        "get",
        "/v1/verify",
        "verify",
        "Check the chain and the indexes",
        None,
        {200: sc.VerifyResult},
    ),
    ("get", "/v1/health", "health", "Liveness and the log's head", None, {200: sc.Health}),
    (
        "post",
        "/v1/tokens",
        "createToken",
        "A bearer session (admin)",
        sc.CreateToken,
        {201: sc.Token, 200: sc.Token},
    ),
    (
        "delete",
        "/v1/tokens/{handle}",
        "revokeToken",
        "Revoke a bearer session (admin)",
        None,
        {204: None},
    ),
]

_QUERY: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "listSessions": [
        ("cursor", {"type": "string"}),
        ("limit", {"type": "integer", "minimum": 1, "maximum": 200}),
        ("status", {"type": "string", "enum": ["active", "closed", "deleted"]}),
        ("parent", {"type": "string"}),
        ("metadata_key", {"type": "string"}),
        ("metadata_value", {"type": "string"}),
    ],
    "getSession": [("as_of", {"type": "integer", "minimum": 0})],
    "deleteSession": [("reason", {"type": "string"})],
    "listMessages": [
        ("after", {"type": "integer", "minimum": 0}),
        ("limit", {"type": "integer", "minimum": 1, "maximum": _limits.page_messages_max}),
    ],
    "listSessionEvents": [
        ("after_event_id", {"type": "integer", "minimum": 0}),
        ("limit", {"type": "integer", "minimum": 1, "maximum": _limits.page_events_max}),
    ],
    "listEvents": [
        ("after_event_id", {"type": "integer", "minimum": 0}),
        ("limit", {"type": "integer", "minimum": 1, "maximum": _limits.page_events_max}),
    ],
    "streamSessionEvents": [("after", {"type": "integer", "minimum": 0})],
    "streamEvents": [("after", {"type": "integer", "minimum": 0})],
    "exportBundle": [("mode", {"type": "string", "enum": ["sanitized", "replay_only", "local"]})],
    "seedSession": [
        ("id", {"type": "string"}),
        ("truncate_to_last", {"type": "integer", "minimum": 0}),
        ("drop_tool_calls", {"type": "boolean"}),
    ],
    "verify": [("projections", {"type": "boolean"})],
}

_PUBLIC = {"health"}
_ERRORS = {"400", "401", "403", "404", "409", "412", "413", "415", "422", "426"}
_MORE_ERRORS = {"getSession": {"503"}, "forkSession": {"503"}}
"""The operations that rebuild a past state, and so may answer 503 `busy` (`past_rebuilds_max`)."""


def document() -> dict[str, Any]:
    structs = sorted(
        {
            t
            for *_, body, answers in _OPS
            for t in (body, *answers.values())
            if isinstance(t, type) and issubclass(t, msgspec.Struct)
        }
        | {sc.Problem},
        key=lambda t: t.__name__,
    )
    _, components = msgspec.json.schema_components(structs, ref_template=_REF)
    _clean_descriptions(components)
    paths: dict[str, dict[str, Any]] = {}
    for method, path, op_id, summary, body, answers in _OPS:
        paths.setdefault(path, {})[method] = _operation(method, path, op_id, summary, body, answers)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sessionlog",
            "version": "1",
            "description": (
                "Sessions of AI-agent conversations as an event-sourced HTTP service, in the "
                "resource model of the Agents Protocol v1. Bodies are UTF-8 with no content "
                "coding (else 415); `Content-Type`, `Content-Encoding`, `Idempotency-Key` and "
                "`Harn-Agents-Protocol-Version` come at most once (else 400). There are no entity "
                "tags: an `If-Match` other than `*` is answered 412, and an inject is made "
                "conditional by `expected_length` in its body (409 `length-conflict` when the "
                "transcript holds another number of entries; nothing is written). Errors are "
                "RFC 9457 problem details; their `type` is one of: "
                + ", ".join(_problems.PROBLEM_TYPE_PREFIX + k for k in _problems.KINDS)
            ),
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _operation(
    method: str, path: str, op_id: str, summary: str, body: Any, answers: dict[int, Any]
) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": op_id, "summary": summary}
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
        for name in ("session_id", "client_id", "handle")
        if "{" + name + "}" in path
    ]
    params += [
        {"name": n, "in": "query", "required": False, "schema": s} for n, s in _QUERY.get(op_id, [])
    ]
    if method == "post":
        params.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "maxLength": _limits.idempotency_key_chars_max},
            }
        )
    if params:
        op["parameters"] = params
    if body == "jsonl":
        op["requestBody"] = {
            "required": True,
            "content": {"application/jsonl": {"schema": {"type": "string"}}},
        }
    elif body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _schema(body)}},
        }
    responses: dict[str, Any] = {}
    for status, answer in answers.items():
        if answer is None:
            responses[str(status)] = {"description": "done"}
        elif answer == "sse":
            responses[str(status)] = {
                "description": "Server-Sent Events",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            }
        else:
            responses[str(status)] = {
                "description": "ok",
                "content": {"application/json": {"schema": _schema(answer)}},
            }
    problem = {"content": {_problems.MEDIA_TYPE: {"schema": {"$ref": _REF.format(name="Problem")}}}}
    codes = (_ERRORS | _MORE_ERRORS.get(op_id, set())) - ({"401"} if op_id in _PUBLIC else set())
    for code in sorted(codes):
        responses[code] = {"description": "problem", **problem}
    op["responses"] = responses
    if op_id in _PUBLIC:
        op["security"] = []
    return op


def _clean_descriptions(node: Any) -> None:
    """Dedent every `description` taken from a docstring: msgspec releases differ on whether they
    do it, and the document must not change with the msgspec that happens to be installed."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                node[key] = inspect.cleandoc(value)
            else:
                _clean_descriptions(value)
    elif isinstance(node, list):
        for item in node:
            _clean_descriptions(item)


def _schema(kind: Any) -> dict[str, Any]:
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return {"$ref": _REF.format(name=kind.__name__)}
    return {"type": "object"}


@cache
def document_bytes() -> bytes:
    return (json.dumps(document(), indent=2, sort_keys=True) + "\n").encode()
