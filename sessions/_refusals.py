"""The calls a store must refuse, for the state machine of `sessions.testing`: verbs called on an
id that names no open session, and malformed calls against an open one.
"""

from __future__ import annotations

from typing import Any

from eventlog import InvalidArgumentError, LimitExceededError

# Verbs called with an id that names no open session, with the rest of their arguments; each
# must raise `UnknownSessionError`.
ON_UNKNOWN_SESSION: dict[str, tuple[Any, ...]] = {
    "length": (),
    "messages": (),
    "inject": ({"role": "user", "content": "hi"},),
    "inject_many": ([{"role": "user", "content": "hi"}],),
    "reset": (),
    "trim": (1,),
    "fork": (),
    "fork_at": (0,),
    "compact": (),
    "scratchpad": (),
    "set_scratchpad": ({"k": 1},),
    "clear_scratchpad": (),
    "attach": ("tui",),
    "takeover": ("tui",),
    "detach": ("tui",),
    "heartbeat": ("tui",),
    "live_clients": (),
    "client_inject_prompt": ("tui", "go on"),
    "route_permission": ("tui", {"tool": "sh"}),
    "close_session": (),
    "delete": (),
    "rename": ("title",),
    "set_workspace_policy": ({"x": 1},),
    "add_root": ("/repo",),
    "remove_root": ("/repo",),
    "list_roots": (),
}

_FILES = [f"f{i}" for i in range(11)]
# Malformed calls against an open session (its id goes first): the error each must raise, the
# verb, and the rest of its arguments.
BAD_ARGUMENTS: list[tuple[type[Exception], str, tuple[Any, ...], dict[str, Any]]] = [
    (InvalidArgumentError, "trim", (-1,), {}),
    (InvalidArgumentError, "trim", (True,), {}),
    (InvalidArgumentError, "trim", ("3",), {}),
    (InvalidArgumentError, "fork_at", (-2,), {}),
    (InvalidArgumentError, "compact", (), {"keep_first": 3}),
    (InvalidArgumentError, "compact", (), {"compact_strategy": "zip"}),
    (InvalidArgumentError, "compact", (), {"hard_limit_strategy": 1}),
    (InvalidArgumentError, "compact", (), {"compact_strategy": "custom"}),
    (InvalidArgumentError, "compact", (), {"keep_last": -1}),
    (InvalidArgumentError, "compact", (), {"token_threshold": 1.5}),
    (InvalidArgumentError, "compact", (), {"mask_callback": "not callable"}),
    (InvalidArgumentError, "inject", ({"content": "no role"},), {}),
    (InvalidArgumentError, "inject", ({"role": "  "},), {}),
    (InvalidArgumentError, "inject", ("not a dict",), {}),
    (InvalidArgumentError, "inject", ({"role": "user", 1: "int key"},), {}),
    (InvalidArgumentError, "inject", ({"role": "user", "content": 5},), {}),
    (InvalidArgumentError, "inject", ({"role": "user", "synthetic": 1},), {}),
    (InvalidArgumentError, "inject", ({"role": "user", "x": 2**70},), {}),
    (LimitExceededError, "inject", ({"role": "user", "files": _FILES},), {}),
    (InvalidArgumentError, "inject_many", ([{"role": "user"}, {"content": "no role"}],), {}),
    (InvalidArgumentError, "inject_many", ({"role": "user"},), {}),
    (LimitExceededError, "inject_many", ([{"role": "user", "files": _FILES}],), {}),
    (InvalidArgumentError, "set_scratchpad", ([1],), {}),
    (InvalidArgumentError, "set_scratchpad", ({}, {"unknown": 1}), {}),
    (LimitExceededError, "set_scratchpad", ({"k": "x" * 70_000},), {}),
    (InvalidArgumentError, "attach", ("tui", {"mode": "boss"}), {}),
    (InvalidArgumentError, "attach", ("",), {}),
    (InvalidArgumentError, "attach", ("tui", {"takeover": "yes"}), {}),
    (InvalidArgumentError, "detach", ("stranger",), {}),
    (InvalidArgumentError, "heartbeat", ("stranger",), {}),
    (InvalidArgumentError, "client_inject_prompt", ("tui", "x", {"unknown": 1}), {}),
    (InvalidArgumentError, "route_permission", ("tui", [1]), {}),
    (InvalidArgumentError, "close_session", (5,), {}),
    (InvalidArgumentError, "open_session", (), {"colour": "red"}),
    (InvalidArgumentError, "rename", (5,), {}),
    (InvalidArgumentError, "add_root", ("",), {}),
    (InvalidArgumentError, "set_workspace_policy", ({"default_mount_mode": ""},), {}),
]
