"""Errors as RFC 9457 `application/problem+json`: one stable `type` per class of the engine's error
tree, the HTTP status that fits it, and the message that says what and where.

Owns the mapping from exceptions to answers; it must never put a traceback, a token or a stored
secret in a body, and never answer 500 for a caller's bad input.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from eventlog import (
    CapacityError,
    ConcurrencyError,
    ControllerConflictError,
    ForgottenError,
    IntegrityError,
    InvalidArgumentError,
    KeyUnavailableError,
    LengthConflictError,
    LimitExceededError,
    LogClosedError,
    SessionExistsError,
    SessionLogError,
    StorageError,
    TruncatedError,
    UnknownSessionError,
)
from replay import BundleConflictError, BundleError

logger = logging.getLogger("sessionlog.service")

PROBLEM_TYPE_PREFIX = "urn:sessionlog:problem:"
MEDIA_TYPE = "application/problem+json"


class HTTPProblem(Exception):
    """A problem the service itself finds (bad JSON, a missing route, an oversized body, too
    much work at once). `headers` go with the answer (a 503's `Retry-After`); `extra` fields go
    in its body."""

    def __init__(
        self,
        status: int,
        kind: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.detail = detail
        self.headers = dict(headers or {})
        self.extra = extra


# (class, status, kind, Harn code). Most specific first: the first match wins.
_TABLE: tuple[tuple[type[BaseException], int, str, str], ...] = (
    (UnknownSessionError, 404, "unknown-session", "resource_not_found"),
    (ForgottenError, 410, "forgotten", "resource_not_found"),
    (TruncatedError, 410, "truncated", "resource_not_found"),
    (BundleConflictError, 409, "bundle-conflict", "conflict"),
    (SessionExistsError, 409, "session-exists", "conflict"),
    (ControllerConflictError, 409, "controller-conflict", "conflict"),
    (LengthConflictError, 409, "length-conflict", "conflict"),
    (ConcurrencyError, 409, "concurrency", "conflict"),
    (CapacityError, 409, "capacity", "conflict"),
    (LimitExceededError, 413, "limit-exceeded", "payload_too_large"),
    (BundleError, 422, "invalid-bundle", "invalid_request"),
    (InvalidArgumentError, 422, "invalid-argument", "invalid_request"),
    (IntegrityError, 500, "integrity", "internal_error"),
    (LogClosedError, 503, "unavailable", "service_unavailable"),
    (KeyUnavailableError, 503, "key-unavailable", "service_unavailable"),
    (StorageError, 503, "storage", "service_unavailable"),
    (SessionLogError, 409, "refused", "conflict"),
)

TITLES = {
    "unknown-session": "No such session",
    "forgotten": "The session was forgotten: its content is gone for good",
    "truncated": "That part of the log was truncated: it lives only in an archive now",
    "key-unavailable": "The store's key is missing or is not the one it was written with",
    "bundle-conflict": "Another session holds that id",
    "session-exists": "The session already exists",
    "controller-conflict": "Another client controls the session",
    "concurrency": "The session changed meanwhile",
    "length-conflict": "The transcript does not hold the expected number of entries",
    "precondition-failed": "A precondition of the request does not hold",
    "capacity": "The store is full",
    "limit-exceeded": "A limit was exceeded",
    "invalid-bundle": "The bundle was refused",
    "invalid-transcript": "The transcript cannot be seeded",
    "invalid-argument": "Invalid argument",
    "integrity": "The store failed an integrity check",
    "unavailable": "The service is stopping",
    "busy": "The server is doing as much of this at once as it may: try again after Retry-After",
    "storage": "Storage failed",
    "refused": "The engine refused the request",
    "malformed-request": "The request is not well-formed",
    "unauthorized": "Unauthorized",
    "forbidden": "Not allowed for this principal",
    "not-found": "Not found",
    "method-not-allowed": "Method not allowed",
    "unsupported-media-type": "Unsupported media type",
    "payload-too-large": "The request body is too large",
    "idempotency-key-reused": "The Idempotency-Key was used for another request",
    "idempotency-result-truncated": "The request was applied, but its answer was truncated away",
    "unsupported-protocol-version": "Unsupported protocol version",
    "internal": "Internal error",
}

KINDS = sorted(TITLES)
"""Every problem type the service answers with (the OpenAPI document lists them)."""

_CODES = {
    "malformed-request": "invalid_request",
    "unauthorized": "unauthenticated",
    "forbidden": "permission_denied",
    "not-found": "resource_not_found",
    "method-not-allowed": "invalid_request",
    "unsupported-media-type": "invalid_request",
    "payload-too-large": "payload_too_large",
    "idempotency-key-reused": "idempotency_key_reused",
    "idempotency-result-truncated": "resource_not_found",
    "unsupported-protocol-version": "unsupported_protocol_version",
    "busy": "service_unavailable",
    "precondition-failed": "conflict",
    "internal": "internal_error",
}


def problem_of(exc: BaseException, instance: str) -> tuple[int, dict[str, Any]]:
    """The status and body answering `exc`."""
    if isinstance(exc, HTTPProblem):
        return exc.status, body(exc.status, exc.kind, exc.detail, instance, **exc.extra)
    for cls, status, kind, code in _TABLE:
        if isinstance(exc, cls):
            return status, body(status, kind, str(exc), instance, code=code, **_details(exc))
    logger.exception("unexpected error answering %s", instance)
    return 500, body(500, "internal", "the server failed; the error is in its log", instance)


def body(status: int, kind: str, detail: str, instance: str, **extra: Any) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "type": PROBLEM_TYPE_PREFIX + kind,
        "title": TITLES[kind],
        "status": status,
        "detail": detail,
        "instance": instance,
        "code": extra.pop("code", None) or _CODES.get(kind, "invalid_request"),
    }
    answer.update(extra)
    return answer


def encode(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer, ensure_ascii=False).encode()


def _details(exc: BaseException) -> dict[str, Any]:
    """The machine-readable fields of an engine error (never a token or a payload)."""
    if isinstance(exc, LimitExceededError):
        return {"limit_name": exc.limit_name, "limit": exc.limit, "actual": exc.actual}
    if isinstance(exc, UnknownSessionError):
        return {"session_id": exc.session_id}
    if isinstance(exc, IntegrityError) and exc.position is not None:
        return {"position": exc.position}
    if isinstance(exc, LengthConflictError):
        return {
            "session_id": exc.session_id,
            "expected_length": exc.expected,
            "actual_length": exc.actual,
        }
    if isinstance(exc, ConcurrencyError):
        return {"stream": exc.stream, "actual_version": exc.actual}
    if isinstance(exc, BundleError):
        return {"issues": [str(issue) for issue in exc.issues][:50]}
    return {}
