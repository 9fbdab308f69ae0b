"""Plain data: what a caller may store inside an event and get back unchanged.

A value is plain when it is built from `str`, `int` (64-bit), finite `float`, `bool`, `None`,
lists (tuples read back as lists) and dicts with `str` keys, nested at most
`limits.value_depth_max` levels and never containing itself. Anything else would change type on
the way back (a set becomes a list, a datetime or bytes a string) or could not be written out as
JSON again (NaN, Infinity), so it is refused here, at the edge, before anything is written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import date, time
from typing import Any

from eventlog import limits
from eventlog.errors import InvalidArgumentError, LimitExceededError

_SCALARS = (str, bool, type(None))
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what msgpack stores as an integer


def _refuse(value: object) -> str | None:
    """Why a scalar is not plain data, or None when it is."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a JSON number"
    if isinstance(value, int):
        if _INT_MIN <= value <= _INT_MAX:
            return None
        return f"an integer of {value.bit_length()} bits does not fit in 64 bits"
    if isinstance(value, (set, frozenset)):
        return "a set would come back as a list; pass a list"
    if isinstance(value, (date, time)):
        return f"a {type(value).__name__} would come back as a string; pass an ISO 8601 string"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes would come back as a base64 string; pass a string"
    return (
        f"expected JSON data (str, int, float, bool, None, list, dict), got {type(value).__name__}"
    )


def _at(what: str, path: str) -> str:
    """`what` and the path inside it, cut in the middle when a deep path would flood a message."""
    if len(path) > 100:
        path = f"{path[:50]}...{path[-40:]}"
    return f"{what}{path}"


def is_plain(value: object) -> bool:
    """Whether `value` is certainly plain data, by exact types alone: the fast path of
    `check_plain`, which builds no path and tracks no container, so large plain values (a message
    carrying the records it came from) cost one visit per node. False means "look closer", not
    "refused": a subclass, a tuple, a Mapping or a cycle (which passes the depth bound) are left
    to the full walk, which judges them and names the path."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    depth_max = limits.value_depth_max
    while stack:
        item, depth = pop()
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if not _INT_MIN <= item <= _INT_MAX:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind is dict:
            if depth >= depth_max:
                return False
            for key, child in item.items():
                if type(key) is not str:
                    return False
                push((child, depth + 1))
        elif kind is list:
            if depth >= depth_max:
                return False
            for child in item:
                push((child, depth + 1))
        else:
            return False
    return True


def check_plain(value: object, *, what: str) -> None:
    """Refuse `value` unless it is plain data (see the module doc), with an
    `InvalidArgumentError` naming `what` and the path to the first offending part. A value nested
    deeper than `limits.value_depth_max` raises `LimitExceededError`. Iterative, so no input can
    exhaust the interpreter's stack."""
    if is_plain(value):
        return
    # (value, path, depth): depth counts the containers around the value, the outermost being 1.
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    open_ids: set[int] = set()  # containers on the current path, to catch a value inside itself
    leave: list[tuple[int, int]] = []  # (stack height at which to forget, id) per open container
    while stack:
        while leave and len(stack) < leave[-1][0]:
            open_ids.discard(leave.pop()[1])
        item, path, depth = stack.pop()
        if isinstance(item, _SCALARS):
            continue
        if isinstance(item, Mapping):
            children = list(item.items())
        elif isinstance(item, (list, tuple)):
            children = list(enumerate(item))
        else:
            reason = _refuse(item)
            if reason is not None:
                raise InvalidArgumentError(f"{_at(what, path)}: {reason}")
            continue
        if id(item) in open_ids:
            raise InvalidArgumentError(f"{_at(what, path)}: the value contains itself")
        if depth + 1 > limits.value_depth_max:
            raise LimitExceededError(
                f"{_at(what, path)}: nesting depth",
                "value_depth_max",
                limits.value_depth_max,
                depth + 1,
            )
        open_ids.add(id(item))
        leave.append((len(stack) + 1, id(item)))
        for key, child in reversed(children):
            if isinstance(item, Mapping):
                if not isinstance(key, str):
                    raise InvalidArgumentError(
                        f"{_at(what, path)}: keys must be str, got {type(key).__name__} {key!r:.40}"
                    )
                stack.append((child, f"{path}.{key}", depth + 1))
            else:
                stack.append((child, f"{path}[{key}]", depth + 1))
