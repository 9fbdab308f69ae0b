"""Argument checks and plain-data views shared by the engine's verbs.

Every check raises `InvalidArgumentError` naming the verb, the argument, what was expected and what
came; nothing here touches storage.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import projections as pj
from eventlog import InvalidArgumentError, check_encodable


def iso(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).isoformat()


def check_count(value: object, name: str, verb: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{verb}: `{name}` must be an int, got {type(value).__name__}")
    if value < 0:
        raise InvalidArgumentError(f"{verb}: `{name}` must be >= 0, got {value}")
    return value


def check_dict(value: object, name: str, verb: str, *, optional: bool = True) -> dict[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidArgumentError(
            f"{verb}: `{name}` must be a dict with string keys, got {type(value).__name__}"
        )
    data = dict(value)
    check_encodable(data, what=f"{verb}: `{name}`")
    return data


def check_text(value: object, name: str, verb: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidArgumentError(f"{verb}: `{name}` must be a str, got {type(value).__name__}")
    return value


def check_policy(policy: object, verb: str) -> dict[str, Any]:
    data = check_dict(policy, "workspace_policy", verb, optional=False)
    mode = data.get("default_mount_mode")
    if mode is not None and (not isinstance(mode, str) or not mode):
        raise InvalidArgumentError(
            f"{verb}: `workspace_policy.default_mount_mode` must be a non-empty str, got {mode!r}"
        )
    return data


def client_dict(client: pj.LiveClient) -> dict[str, Any]:
    return {
        "client_id": client.client_id,
        "mode": client.mode,
        "attached_at": iso(client.attached_at),
        "last_seen_at": iso(client.last_seen_at),
        "metadata": dict(client.metadata),
    }
