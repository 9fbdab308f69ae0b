"""`seed_from_jsonl` on files of arbitrary lines never raises, and either seeds a well-formed session
or leaves the log exactly as it was.

Lines mix random JSON values, random bytes, invalid UTF-8, deep nesting, huge strings, records of
known kinds with fields of the wrong types, and records that are fine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from replay import seed_from_jsonl
from sessions import SessionStore

KINDS = [
    "message",
    "tool_result",
    "tool_results",
    "system_prompt",
    "tool_schemas",
    "provider_call_request",
    "request",
    "provider_call_response",
    "response",
    "routing_decision",
]
ROLES = st.sampled_from(["user", "assistant", "tool", "tool_result", "", "  "])

scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: some do not fit the log's 64-bit integers
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
message_like = st.fixed_dictionaries(
    {},
    optional={
        "role": ROLES | json_values,
        "content": st.text(max_size=30) | json_values,
        "text": json_values,
        "tool_calls": json_values,
        "native_tool_calls": json_values,
        "tool_call_id": json_values,
        "name": json_values,
        "files": st.lists(st.text(max_size=5) | json_values, max_size=12),
        "usage": json_values,
        "metadata": json_values,
        "synthetic": json_values,
    },
)
known_records = st.fixed_dictionaries(
    {"type": st.sampled_from(KINDS) | json_values},
    optional={
        "kind": st.sampled_from(KINDS),
        "message": message_like | json_values,
        "role": ROLES | json_values,
        "content": json_values,
        "text": json_values,
        "messages": st.lists(message_like | json_values, max_size=4) | json_values,
        "results": st.lists(json_values | message_like, max_size=4) | json_values,
        "request_snapshot": st.fixed_dictionaries(
            {}, optional={"messages": st.lists(message_like, max_size=3), "system": json_values}
        )
        | json_values,
        "tool_calls": json_values,
        "thinking": json_values,
        "provider": json_values,
        "model": json_values,
        "tool_format": json_values,
        "system": json_values,
    },
)


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    choice = draw(st.integers(0, 8))
    if choice == 0:
        return json.dumps(draw(json_values), ensure_ascii=draw(st.booleans())).encode()
    if choice == 1:
        return draw(st.binary(max_size=40)).replace(b"\n", b"")
    if choice == 2:  # invalid UTF-8 inside a string of an otherwise good record
        bad = draw(st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80"]))
        return b'{"type":"message","message":{"role":"user","content":"a' + bad + b'"}}'
    if choice == 3:  # deep nesting, on both sides of what the decoder accepts
        depth = draw(st.integers(1, 3_000))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
        inner = opener * depth + b"1" + closer * depth if opener == b'{"a":' else None
        nested = inner if inner is not None else opener * depth + closer * depth
        return b'{"type":"message","message":{"role":"user","content":"x","deep":' + nested + b"}}"
    if choice == 4:  # a huge string
        size = draw(st.integers(10_000, 300_000))
        return json.dumps({"type": "message", "role": "user", "content": "x" * size}).encode()
    if choice == 5:
        return b""
    if choice == 6:  # a record that is fine
        role = draw(st.sampled_from(["user", "assistant"]))
        return json.dumps({"type": "message", "message": {"role": role, "content": "ok"}}).encode()
    return json.dumps(draw(known_records), ensure_ascii=draw(st.booleans())).encode()


def _ids(store: SessionStore) -> set[str]:
    ids: set[str] = set()
    cursor = None
    while True:
        page: dict[str, Any] = store.list_sessions(cursor=cursor, limit=200)
        ids.update(s["session_id"] for s in page["sessions"])
        cursor = page["next_cursor"]
        if cursor is None:
            return ids


# One store and one file for all the examples, on purpose: each example must leave the sessions
# already there untouched, and the shared fixture checks the whole store once at the end.
@settings(
    suppress_health_check=[
        *settings.default.suppress_health_check,
        HealthCheck.function_scoped_fixture,
    ]
)
@given(body=st.lists(lines(), max_size=8), final_newline=st.booleans())
def test_arbitrary_lines_never_raise_and_never_half_write(
    store: SessionStore, tmp_path: Path, body: list[bytes], final_newline: bool
) -> None:
    path = tmp_path / "llm_transcript.jsonl"
    path.write_bytes(b"\n".join(body) + (b"\n" if final_newline and body else b""))
    head, before = store.log.head, _ids(store)
    result = seed_from_jsonl(store, path)
    event("seeded" if result.ok else "refused")
    if result.ok:
        assert result.session_id is not None
        assert result.session_id not in before
        messages = store.messages(result.session_id)
        assert len(messages) == result.messages_loaded == result.turns_loaded
        assert all(isinstance(m["role"], str) and m["role"].strip() for m in messages)
        assert store.log.head > head
    else:
        assert result.error
        assert str(path) in result.error
        assert result.session_id is None
        assert store.log.head == head
        assert _ids(store) == before
