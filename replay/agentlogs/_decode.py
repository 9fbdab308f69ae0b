"""Decoding an agent log's JSON, and saying where and why it does not decode.

Decoding is msgspec's and strict, with one leniency: a lone UTF-16 surrogate escape (`"\\ud83d"`
without its pair, which JavaScript's `JSON.stringify` writes when it cuts a text inside an emoji)
decodes to U+FFFD, as the engine stores no lone surrogate. It never changes the bytes a caller
keeps of what it decoded. A record's outline (its own fields, not what they hold) costs a skim of
its line, for telling what the record is.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

_decode = msgspec.json.Decoder().decode
_skim = msgspec.json.Decoder(msgspec.Raw).decode  # checks the syntax, builds nothing
# Any JSON value, an object's fields and an array's items skimmed (checked, kept as their bytes).
_skim_fields = msgspec.json.Decoder(
    dict[str, msgspec.Raw] | list[msgspec.Raw] | str | int | float | bool | None
).decode
_AT_BYTE = re.compile(r"byte (\d+)")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # a decoded pair is one character: these are lone


def decode_line(line: bytes) -> Any:
    """The JSON value of `line`; msgspec's `ValueError` (or `RecursionError`) when it does not
    decode, unless it fails only for a lone surrogate escape: then the stdlib `json`, which
    takes one, decodes it, and each lone surrogate in its strings becomes U+FFFD."""
    try:
        return _decode(line)
    except ValueError as exc:
        if not _SURROGATE_ESCAPE.search(line):
            raise
        try:  # as strict as msgspec otherwise: UTF-8 only, no NaN or Infinity
            value = json.loads(line.decode(), parse_constant=_no_constant)
        except (ValueError, RecursionError):
            # Damaged besides: msgspec says how once the escapes no longer stop it first (each
            # replaced by U+FFFD's, as long, so the byte it names is the file's).
            _decode(_SURROGATE_ESCAPE.sub(rb"\\ufffd", line))
            raise exc from None
        return _replaced(value)


def outline(line: bytes) -> Any:
    """The JSON value of `line` in outline, from one skim of it: an object as its fields, each
    number, string, boolean or null decoded and each object or array left empty; an array
    empty; any other value decoded. Enough to tell what a record is without building what it
    holds (a line may be megabytes). Raises as `decode_line` does when `line` is not JSON;
    bad UTF-8 is found only in the values decoded."""
    try:
        value = _skim_fields(line)
    except ValueError:
        if not _SURROGATE_ESCAPE.search(line):
            raise
        # The skim stops at a lone surrogate escape (which `decode_line` takes): each surrogate
        # escape is read as U+FFFD's, as long, and the line skimmed again.
        return outline(_SURROGATE_ESCAPE.sub(rb"\\ufffd", line))
    if type(value) is list:
        return []
    if type(value) is dict:
        return {key: _outlined(raw) for key, raw in value.items()}
    return value


def _outlined(raw: msgspec.Raw) -> Any:
    first = memoryview(raw)[:1].tobytes()
    if first == b"{":
        return {}
    if first == b"[":
        return []
    return _decode(raw)


def _skim_error(data: bytes) -> Exception | None:
    """Why a skim of `data` (which builds nothing) does not take it as one JSON value: msgspec's
    error, or the interpreter's for data too deeply nested; None when it does. Each lone
    surrogate escape is read as U+FFFD's, as long, as `decode_line` takes one; bad UTF-8 in a
    string passes."""
    try:
        _skim(data)
    except RecursionError as exc:
        return exc
    except ValueError as exc:
        if not _SURROGATE_ESCAPE.search(data):
            return exc
        return _skim_error(_SURROGATE_ESCAPE.sub(rb"\\ufffd", data))  # none is left after
    return None


def whole_json(data: bytes) -> bool:
    """Whether `data` holds one JSON value, from its first byte to its last, rather than the
    start of one still being written. Too deeply nested to tell counts as whole: reading it
    says so."""
    return not isinstance(_skim_error(data), ValueError)


def unfinished_json(data: bytes) -> bool:
    """Whether `data` is the start of a JSON value still being written: not whole, and its skim
    ran out of data before the value ended, rather than stopping at a byte no JSON may hold
    there (data that is damaged, which no writing on can make whole)."""
    error = _skim_error(data)
    return isinstance(error, ValueError) and "truncated" in str(error).lower()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _replaced(value: Any) -> Any:
    if type(value) is str:
        return _LONE_SURROGATE.sub("\ufffd", value)
    if type(value) is list:
        return [_replaced(item) for item in value]
    if type(value) is dict:
        return {_replaced(key): _replaced(item) for key, item in value.items()}
    return value


def why_undecodable(data: bytes, exc: ValueError) -> str:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"invalid UTF-8 at byte {bad.start + 1} of the line"
    text = str(exc)
    if "truncated" in text.lower():
        return "truncated JSON (the line ends inside a value)"
    return f"invalid JSON: {text}"


def failing_line(data: bytes, exc: ValueError) -> int | None:
    """The line of `data` (a whole document) holding the byte where decoding failed."""
    try:
        data.decode()
    except UnicodeDecodeError as bad:
        return data.count(b"\n", 0, bad.start) + 1
    found = _AT_BYTE.search(str(exc))
    line = data.count(b"\n", 0, int(found.group(1))) + 1 if found else None
    if line is None and ("truncated" in str(exc).lower()):  # at its last byte that is not blank
        line = data.count(b"\n", 0, len(data.rstrip())) + 1
    return line
