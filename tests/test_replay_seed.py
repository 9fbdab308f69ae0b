"""`replay.seed_from_jsonl`: every expectation of the Harn-derived fixtures, then one test per rule
of the llm_transcript.jsonl seeding rules (formats, shapes, metadata, options, validation, errors,
atomicity), on real LMDB stores in `tmp_path`."""

from __future__ import annotations

import dataclasses
import json
import re
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3

from eventlog import limits
from replay import SeedResult, _limits, seed_from_jsonl
from replay._transcript import read_transcript
from sessions import InvalidArgumentError, SessionStore
from tests.conftest import STORE_KINDS

FIXTURES = Path(__file__).parent / "fixtures/harn/_derived_from_harn_tests/llm_transcript_seed"
EXPECTATIONS: dict[str, Any] = json.loads((FIXTURES / "expectations.json").read_text())
RESULT_FIELDS = [
    "ok",
    "session_id",
    "turns_loaded",
    "messages_loaded",
    "source_records",
    "source_format",
    "partial",
    "truncated",
    "provider",
    "model",
    "tool_format",
    "error",
    "source",
]


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """Every test taking the shared `store` fixture runs on LMDB and on PostgreSQL."""
    return str(request.param)


def write(tmp_path: Path, *lines: object, name: str = "transcript.jsonl") -> Path:
    """A transcript file: dicts become compact JSON lines, str and bytes are written as given."""
    out = bytearray()
    for line in lines:
        if isinstance(line, bytes):
            out += line
        elif isinstance(line, str):
            out += line.encode()
        else:
            out += json.dumps(line).encode()
        out += b"\n"
    path = tmp_path / name
    path.write_bytes(bytes(out))
    return path


def msg(role: str, content: Any = None, **fields: Any) -> dict[str, Any]:
    """A nested `message` record."""
    message = {"role": role, **({} if content is None else {"content": content}), **fields}
    return {"type": "message", "message": message}


def session_ids(store: SessionStore) -> set[str]:
    return {s["session_id"] for s in store.list_sessions(limit=200)["sessions"]}


def seed_ok(store: SessionStore, path: Path, **options: Any) -> tuple[SeedResult, list[Any]]:
    result = seed_from_jsonl(store, path, **options)
    assert result.ok, result.error
    assert result.session_id is not None
    return result, store.messages(result.session_id)


def assert_refused(store: SessionStore, path: Path, pattern: str, **options: Any) -> SeedResult:
    """Seeding fails with an error matching `pattern`, and the log is exactly as it was."""
    head, sessions = store.log.head, session_ids(store)
    result = seed_from_jsonl(store, path, **options)
    assert not result.ok
    assert result.session_id is None
    assert result.error is not None
    assert re.search(pattern, result.error), result.error
    assert store.log.head == head
    assert session_ids(store) == sessions
    return result


# 1. The expectations of the Harn-derived fixtures, one test each.


def _expectation_cases() -> Iterator[Any]:
    for name, entry in EXPECTATIONS.items():
        expect = entry["expect"]
        if "ok" in expect:
            yield pytest.param(name, entry["opts"], expect, id=name)
            continue
        for variant, expected in expect.items():  # several option sets for one file
            opts = dict(entry["opts"])
            if variant == "with_validate_false":
                opts["validate"] = False
            else:
                assert variant == "default", f"{name}: unknown variant {variant}"
            yield pytest.param(name, opts, expected, id=f"{name}-{variant}")


@pytest.mark.parametrize(("name", "opts", "expect"), list(_expectation_cases()))
def test_expectation(
    store: SessionStore, name: str, opts: dict[str, Any], expect: dict[str, Any]
) -> None:
    head = store.log.head
    result = seed_from_jsonl(store, FIXTURES / name, **opts)
    assert result.ok is expect["ok"], result.error
    if not result.ok:
        assert expect["error_contains"] in (result.error or "")
        assert store.log.head == head
        assert session_ids(store) == set()
        return
    assert result.session_id is not None
    snapshot = store.snapshot(result.session_id)
    assert snapshot is not None
    messages = snapshot["transcript"]
    checked = 0
    for key, value in expect.items():
        if key in ("ok", "note"):
            continue
        checked += 1
        if key == "messages":
            assert messages == value
        elif key == "system_prompt":
            assert snapshot["system_prompt"] == value
        elif key == "tool_format":
            assert result.tool_format == value
            assert snapshot["tool_format"] == value
        elif match := re.fullmatch(r"messages\[(\d+)\](?:\.(\w+))?", key):
            message = messages[int(match[1])]
            assert (message if match[2] is None else message[match[2]]) == value
        else:
            assert key in RESULT_FIELDS, f"expectation key {key!r} is not checked by this test"
            assert result[key] == value
    assert checked >= 3
    assert result.messages_loaded == len(messages) == store.length(result.session_id)


# 2. Reading the file


def test_blank_lines_are_skipped_and_still_counted_in_line_numbers(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(tmp_path, "", msg("user", "hi"), "   ", "\t", msg("assistant", "yo"), "")
    result, messages = seed_ok(store, path)
    assert [m["content"] for m in messages] == ["hi", "yo"]
    assert result.source_records == 2
    bad = write(tmp_path, "", "  ", "[1, 2]", name="bad.jsonl")
    assert_refused(store, bad, r"^.*bad\.jsonl:3: expected a JSON object, got a list$")


def test_crlf_line_ends_and_a_missing_final_newline_are_read(
    store: SessionStore, tmp_path: Path
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(
        json.dumps(msg("user", "a")).encode() + b"\r\n" + json.dumps(msg("user", "b")).encode()
    )
    _, messages = seed_ok(store, path)
    assert [m["content"] for m in messages] == ["a", "b"]


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        (b'{"type": "message", ', r"t\.jsonl:2: invalid JSON: "),
        (b"[1, 2]", r"t\.jsonl:2: expected a JSON object, got a list$"),
        (b'"text"', r"t\.jsonl:2: expected a JSON object, got a string$"),
        (b"42", r"t\.jsonl:2: expected a JSON object, got a number$"),
        (b"null", r"t\.jsonl:2: expected a JSON object, got null$"),
        (b"true", r"t\.jsonl:2: expected a JSON object, got a boolean$"),
        (b'{"a": 1} {"b": 2}', r"t\.jsonl:2: invalid JSON: .*trailing"),
        (
            b'{"type": "message", "content": "caf\xe9"}',
            r"t\.jsonl:2: invalid UTF-8 at byte 36 of the line",
        ),
        (b"\xff\xfe{}", r"t\.jsonl:2: invalid UTF-8 at byte 1 "),
        (b"[" * 5_000 + b"]" * 5_000, r"t\.jsonl:2: JSON nested too deeply"),
    ],
    ids=[
        "truncated",
        "list",
        "string",
        "number",
        "null",
        "boolean",
        "two-values",
        "bad-utf8-in-string",
        "bad-utf8-outside",
        "deep",
    ],
)
def test_a_bad_line_is_an_error_naming_file_and_line(
    store: SessionStore, tmp_path: Path, line: bytes, pattern: str
) -> None:
    path = write(tmp_path, msg("user", "fine"), line, msg("user", "after"), name="t.jsonl")
    result = assert_refused(store, path, pattern)
    assert result.source_records == 0
    assert str(path) in (result.error or "")


def test_a_line_past_the_length_bound_is_an_error(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_limits, "transcript_line_bytes_max", 100)
    exactly: dict[str, Any] = {"type": "message", "message": {"role": "user", "content": ""}}
    exactly["message"]["content"] = "x" * (100 - len(json.dumps(exactly)))
    assert len(json.dumps(exactly)) == 100
    _, messages = seed_ok(store, write(tmp_path, exactly, name="fits.jsonl"))
    assert len(messages) == 1
    long = msg("user", "y" * 200)
    path = write(tmp_path, msg("user", "ok"), long, name="long.jsonl")
    assert_refused(
        store, path, r"long\.jsonl:2: line is longer than transcript_line_bytes_max = 100"
    )
    last_without_newline = tmp_path / "last.jsonl"
    last_without_newline.write_bytes(json.dumps(long).encode())
    assert_refused(store, last_without_newline, r"last\.jsonl:1: line is longer")


def test_a_utf8_byte_order_mark_before_the_first_line_is_ignored(
    store: SessionStore, tmp_path: Path
) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(msg("user", "hi")).encode() + b"\n")
    _, messages = seed_ok(store, path)
    assert messages == [{"role": "user", "content": "hi"}]


def test_a_missing_or_unreadable_file_is_a_result_not_an_exception(
    store: SessionStore, tmp_path: Path
) -> None:
    result = assert_refused(
        store, tmp_path / "absent.jsonl", r"absent\.jsonl: cannot read the file: "
    )
    assert result.source == {"file": "absent.jsonl"}
    assert_refused(store, tmp_path, r"cannot read the file: Is a directory")


def test_a_path_of_the_wrong_type_raises(store: SessionStore) -> None:
    with pytest.raises(InvalidArgumentError, match="path must be a str or path"):
        seed_from_jsonl(store, 42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="path must be a str or path, got bytes"):
        seed_from_jsonl(store, b"t.jsonl")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="without NUL"):
        seed_from_jsonl(store, "t\0.jsonl")


def test_the_record_kind_falls_back_from_type_to_kind(store: SessionStore, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {"kind": "system_prompt", "content": "from kind"},
        {"kind": "message", "message": {"role": "user", "content": "hi"}},
        {"type": 7, "kind": "message", "role": "assistant", "content": "typed badly"},
        {"type": "routing_decision", "kind": "message", "role": "user", "content": "ignored"},
    )
    result, messages = seed_ok(store, path)
    assert result.source_format == "message_events"
    assert [m["content"] for m in messages] == ["hi", "typed badly"]
    assert result.source_records == 4
    assert store.snapshot(result.session_id or "")["system_prompt"] == "from kind"  # type: ignore[index]


# 3. Source formats


def test_message_events_win_over_snapshots_and_responses(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        {"type": "request", "messages": [{"role": "user", "content": "snap"}]},
        {"type": "response", "text": "reply"},
        msg("user", "event"),
        {"type": "provider_call_request", "request_snapshot": {"messages": []}},
        {"type": "provider_call_response", "text": "late reply"},
    )
    result, messages = seed_ok(store, path)
    assert result.source_format == "message_events"
    assert messages == [{"role": "user", "content": "event"}]


def test_a_message_record_decides_the_format_even_when_it_yields_nothing(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        {"type": "request", "messages": [{"role": "user", "content": "snap"}]},
        {"type": "message", "message": {"role": "", "content": "no role"}},
    )
    result = assert_refused(store, path, r"transcript\.jsonl: the transcript has no prompt-visible")
    assert result.source_format == "message_events"
    assert result.source_records == 2


def test_each_snapshot_replaces_and_each_later_response_appends(
    store: SessionStore, tmp_path: Path
) -> None:
    calls = [{"id": "c1", "name": "lookup", "arguments": {"q": "x"}}]
    path = write(
        tmp_path,
        {"type": "provider_call_response", "text": "before any snapshot"},
        {
            "type": "provider_call_request",
            "request_snapshot": {"messages": [{"role": "user", "content": "one"}]},
        },
        {"type": "provider_call_response", "text": "", "tool_calls": calls, "thinking": "hmm"},
        {"type": "provider_call_response", "text": "   ", "tool_calls": []},  # says nothing
        {"type": "request", "messages": [{"role": "user", "content": "two"}, {"role": ""}]},
        {"type": "response", "text": "answer", "thinking": "  "},
        {"type": "routing_decision", "messages": "not a list"},
    )
    result, messages = seed_ok(store, path)
    assert result.source_format == "request_snapshots"
    assert messages == [
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "answer"},
    ]
    path = write(tmp_path, *json.loads(f"[{','.join(path.read_text().splitlines()[:4])}]"))
    _, messages = seed_ok(store, path)
    assert messages == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "", "tool_calls": calls, "reasoning": "hmm"},
    ]


def test_request_snapshot_messages_are_preferred_over_top_level_messages(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        {
            "type": "request",
            "request_snapshot": {"messages": [{"role": "user", "content": "inner"}]},
            "messages": [{"role": "user", "content": "outer"}],
        },
    )
    _, messages = seed_ok(store, path)
    assert messages == [{"role": "user", "content": "inner"}]


def test_responses_only_is_refused_unless_validation_is_off(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        {"type": "provider_call_response", "provider": "p", "model": "m", "text": "one"},
        {"type": "interpreted_response", "text": "ignored"},
        {"type": "response", "text": "two", "tool_calls": [{"id": "c"}]},
    )
    refused = assert_refused(store, path, r"exact prefix reconstruction is impossible")
    assert (refused.source_format, refused.partial) == ("provider_responses_only", True)
    result, messages = seed_ok(store, path, validate=False)
    assert (result.source_format, result.partial, result.source_records) == (
        "provider_responses_only",
        True,
        3,
    )
    assert messages == [
        {"role": "assistant", "content": "one"},
        {"role": "assistant", "content": "two", "tool_calls": [{"id": "c"}]},
    ]


# 4. Message shapes


def test_nested_messages_keep_every_key_and_are_preferred_over_flat_fields(
    store: SessionStore, tmp_path: Path
) -> None:
    nested = {"role": "assistant", "content": "nested", "x_vendor": {"trace": [1]}, "model": "m"}
    path = write(
        tmp_path,
        {
            "type": "message",
            "session_id": "s",
            "message_index": 0,
            "message": nested,
            "role": "user",
            "content": "flat",
        },
    )
    _, messages = seed_ok(store, path)
    assert messages == [nested]


def test_flat_messages_copy_their_fields_and_treat_null_as_absent(
    store: SessionStore, tmp_path: Path
) -> None:
    calls = [{"id": "c1", "name": "f", "arguments": {}}]
    path = write(
        tmp_path,
        {"type": "message", "role": "user", "content": "hi", "name": None, "tool_calls": None},
        {"type": "message", "role": "assistant", "content": None, "text": "from text"},
        {"type": "message", "role": "assistant", "tool_calls": calls, "reasoning": "r"},
        {
            "type": "tool_result",
            "content": "out",
            "tool_use_id": "c1",
            "tool_call_id": "c1",
            "name": "f",
            "native_tool_calls": [1],
        },
        {"type": "message", "message": {"role": 5, "content": "bad nested"}, "role": "user"},
        {"type": "message", "message": {"role": "user"}, "content": "no role anywhere"},
    )
    _, messages = seed_ok(store, path)
    assert messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "from text"},
        {"role": "assistant", "content": "", "tool_calls": calls, "reasoning": "r"},
        {
            "role": "tool",
            "content": "out",
            "name": "f",
            "tool_call_id": "c1",
            "tool_use_id": "c1",
            "native_tool_calls": [1],
        },
        {"role": "user", "content": ""},
    ]


def test_messages_without_role_or_anything_to_say_are_dropped(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        msg("user", "kept"),
        {"type": "message", "message": {"role": "  ", "content": "blank role"}},
        {"type": "message", "message": {"content": "no role"}},
        {"type": "message", "message": {"role": "assistant", "content": None}},
        {"type": "message", "message": {"role": "assistant", "name": "x"}},
        {"type": "message", "message": {"role": "assistant", "native_tool_calls": [{"id": 1}]}},
        {"type": "message", "message": "not an object"},
    )
    _, messages = seed_ok(store, path)
    assert messages == [
        {"role": "user", "content": "kept"},
        {"role": "assistant", "native_tool_calls": [{"id": 1}]},
    ]


def test_tool_results_in_both_shapes(store: SessionStore, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        msg("user", "go"),
        {
            "type": "tool_results",
            "messages": [{"role": "tool", "content": "a", "tool_call_id": "1"}, {"content": "x"}],
            "results": [{"observation": "ignored: messages win"}],
        },
        {
            "type": "tool_results",
            "results": [
                {"tool_name": "t", "name": "ignored", "tool_call_id": "2", "observation": "b"},
                {"name": "n", "tool_use_id": "3", "rendered_result": "c", "output": "no"},
                {"tool_name": "", "output": "o", "content": "no"},
                {"content": [{"type": "text", "text": "d"}]},
                {"tool_call_id": 4},
                "not an object",
            ],
        },
        {"type": "tool_results", "results": "not a list"},
    )
    _, messages = seed_ok(store, path)
    assert messages == [
        {"role": "user", "content": "go"},
        {"role": "tool", "content": "a", "tool_call_id": "1"},
        {"role": "tool", "name": "t", "tool_call_id": "2", "content": "b"},
        {"role": "tool", "name": "n", "tool_call_id": "3", "content": "c"},
        {"role": "tool", "content": "o"},
        {"role": "tool", "content": [{"type": "text", "text": "d"}]},
        {"role": "tool", "content": ""},
    ]


# 5. Metadata


def test_metadata_comes_from_every_record_and_the_last_request_wins(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        {"type": "provider_call_response", "provider": "resp-p", "model": "resp-m"},
        {"type": "system_prompt", "content": "first"},
        msg("user", "hi"),
        {"type": "provider_call_request", "provider": "p1", "model": "m1", "tool_format": "text"},
        {"type": "request", "request_snapshot": {"system": "from snapshot"}, "provider": " "},
        {"type": "provider_call_request", "provider": "p2", "tool_format": "native"},
        {"type": "provider_call_response", "provider": "resp-later", "model": "resp-later"},
        {"type": "system_prompt", "content": ""},
        {"type": "request", "system": 5, "model": None},
    )
    result, _ = seed_ok(store, path)
    assert (result.provider, result.model, result.tool_format) == ("p2", "m1", "native")
    snapshot = store.snapshot(result.session_id or "")
    assert snapshot is not None
    assert snapshot["system_prompt"] == "from snapshot"
    assert snapshot["tool_format"] == "native"


def test_responses_name_the_provider_only_where_no_request_did(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        msg("user", "hi"),
        {"type": "response", "provider": "first", "model": "m-first"},
        {"type": "response", "provider": "second", "model": "m-second"},
        {"type": "request", "model": "m-request"},
    )
    result, _ = seed_ok(store, path)
    assert (result.provider, result.model, result.tool_format) == ("first", "m-request", None)


def test_the_session_records_prompt_tool_format_and_where_it_came_from(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        {"type": "system_prompt", "content": "be brief"},
        {"type": "provider_call_request", "provider": "p", "model": "m", "tool_format": "native"},
        msg("user", "hi"),
        name="llm_transcript.jsonl",
    )
    provenance = {"run": 7, "host": {"os": "linux"}}
    result, _ = seed_ok(
        store,
        path,
        source_agent="harn",
        source_session_id="abc",
        source_kind="worker",
        source_label="nightly",
        source_provenance=provenance,
    )
    digest = blake3(path.read_bytes()).hexdigest()
    expected_source = {
        "file": "llm_transcript.jsonl",
        "blake3": digest,
        "agent": "harn",
        "session_id": "abc",
        "kind": "worker",
        "label": "nightly",
        "provenance": provenance,
    }
    assert result.source == expected_source
    snapshot = store.snapshot(result.session_id or "")
    assert snapshot is not None
    assert (snapshot["system_prompt"], snapshot["tool_format"]) == ("be brief", "native")
    assert snapshot["metadata"] == {
        "seeded_from": {
            **expected_source,
            "source_format": "message_events",
            "source_records": 3,
            "partial": False,
            "truncated": False,
            "provider": "p",
            "model": "m",
            "tool_format": "native",
        }
    }
    assert str(tmp_path) not in json.dumps(snapshot["metadata"])


# 6. Options


def test_drop_tool_calls_strips_tool_payloads_and_drops_what_is_left_empty(
    store: SessionStore, tmp_path: Path
) -> None:
    blocks = [
        {"type": "text", "text": "look"},
        {"type": "tool_use", "id": "c1", "name": "f", "input": {}},
        "bare string block",
        {"text": "untyped block"},
    ]
    path = write(
        tmp_path,
        msg("user", "hi", tool_call_id="stray", tool_use_id="stray"),
        msg("assistant", blocks, tool_calls=[{"id": "c1"}], native_tool_calls=[{"id": "c1"}]),
        msg("tool", "result", tool_call_id="c1"),
        msg("tool_result", "result"),
        msg("assistant", "  ", tool_calls=[{"id": "c2"}]),
        msg("assistant", None, tool_calls=[{"id": "c3"}]),
        msg("user", [{"type": "image", "source": "..."}]),
        msg("user", ""),
        msg("assistant", "done", model="m"),
    )
    result, messages = seed_ok(store, path, drop_tool_calls=True)
    assert messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [blocks[0], blocks[2], blocks[3]]},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "done", "model": "m"},
    ]
    assert not result.truncated


def test_truncate_to_last_keeps_the_last_n_and_says_so(store: SessionStore, tmp_path: Path) -> None:
    path = write(tmp_path, *(msg("user", str(i)) for i in range(5)))
    result, messages = seed_ok(store, path, truncate_to_last=2)
    assert [m["content"] for m in messages] == ["3", "4"]
    assert result.truncated
    assert (result.messages_loaded, result.turns_loaded) == (2, 2)
    result, messages = seed_ok(store, path, truncate_to_last=5)
    assert len(messages) == 5
    assert not result.truncated


def test_truncate_to_last_zero_asks_for_an_empty_session(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(tmp_path, msg("user", "a"))
    result, messages = seed_ok(store, path, truncate_to_last=0)
    assert messages == []
    assert result.truncated
    assert result.messages_loaded == 0
    empty = write(tmp_path, {"type": "message", "role": None}, name="empty.jsonl")
    result, messages = seed_ok(store, empty, truncate_to_last=0)
    assert (messages, result.truncated) == ([], False)


def test_drop_tool_calls_runs_before_truncate_to_last(store: SessionStore, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        msg("user", "q1"),
        msg("assistant", "a1"),
        msg("user", "q2"),
        msg("assistant", "", tool_calls=[{"id": "c"}]),
        msg("tool", "r", tool_call_id="c"),
    )
    # Truncating first would keep only the tool-call turn and its result, and dropping them
    # would then leave nothing; in the rule's order the last two text messages survive.
    result, messages = seed_ok(store, path, drop_tool_calls=True, truncate_to_last=2)
    assert messages == [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    assert result.truncated


def test_options_that_drop_every_message_fail_validation(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(tmp_path, msg("tool", "r"), msg("assistant", "", tool_calls=[{"id": "c"}]))
    assert_refused(
        store,
        path,
        r"transcript\.jsonl: the seed options dropped every message",
        drop_tool_calls=True,
    )
    result, messages = seed_ok(store, path, drop_tool_calls=True, validate=False)
    assert (messages, result.messages_loaded) == ([], 0)


def test_a_transcript_without_prompt_visible_messages_fails_validation(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(tmp_path, {"type": "system_prompt", "content": "s"}, {"type": "request"})
    result = assert_refused(store, path, r"transcript\.jsonl: the transcript has no prompt-visible")
    assert result.source_records == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    assert_refused(store, empty, r"no prompt-visible messages")


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"provider": "anthropic"}, r"provider is 'mock' .*expected 'anthropic'"),
        ({"model": "big"}, r"model is 'm' .*expected 'big'"),
        ({"provider": "mock", "model": "other"}, r"model is 'm' .*expected 'other'"),
    ],
)
def test_provider_and_model_guardrails(
    store: SessionStore, tmp_path: Path, options: dict[str, str], pattern: str
) -> None:
    path = write(
        tmp_path,
        {"type": "provider_call_request", "provider": "old", "model": "old-m"},
        {"type": "provider_call_request", "provider": "mock", "model": "m"},
        msg("user", "hi"),
    )
    assert_refused(store, path, pattern, **options)
    result, _ = seed_ok(store, path, **options, validate=False)
    assert result.provider == "mock"
    result, _ = seed_ok(store, path, provider="mock", model="m")
    assert (result.provider, result.model) == ("mock", "m")


def test_a_guardrail_on_a_transcript_that_names_no_provider(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(tmp_path, msg("user", "hi"))
    assert_refused(store, path, r"provider is 'unknown' .*expected 'mock'", provider="mock")


def test_rename_session_names_the_new_session(store: SessionStore, tmp_path: Path) -> None:
    path = write(tmp_path, msg("user", "hi"))
    result, _ = seed_ok(store, path, rename_session="imported-1")
    assert result.session_id == "imported-1"
    assert store.exists("imported-1")


def test_rename_session_to_an_existing_id_is_an_error_and_writes_nothing(
    store: SessionStore, tmp_path: Path
) -> None:
    store.open_session("taken")
    store.inject("taken", {"role": "user", "content": "mine"})
    path = write(tmp_path, msg("user", "theirs"))
    assert_refused(store, path, r"session `taken` already exists", rename_session="taken")
    assert store.messages("taken") == [{"role": "user", "content": "mine"}]


def test_rename_session_to_an_id_the_engine_refuses_raises_and_writes_nothing(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(tmp_path, msg("user", "hi"))
    head = store.log.head
    with pytest.raises(InvalidArgumentError, match="session id"):
        seed_from_jsonl(store, path, rename_session=" padded")
    assert store.log.head == head


def test_without_rename_the_id_is_a_fresh_uuid7(store: SessionStore, tmp_path: Path) -> None:
    path = write(tmp_path, msg("user", "hi"))
    first, _ = seed_ok(store, path)
    second, _ = seed_ok(store, path)
    assert first.session_id != second.session_id
    assert uuid.UUID(str(first.session_id)).version == 7


def test_unknown_options_raise_naming_the_option(store: SessionStore, tmp_path: Path) -> None:
    path = write(tmp_path, msg("user", "hi"))
    head = store.log.head
    with pytest.raises(InvalidArgumentError, match=r"unknown option 'truncate_last'"):
        seed_from_jsonl(store, path, truncate_last=2)
    assert store.log.head == head


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("truncate_to_last", "2"),
        ("truncate_to_last", -1),
        ("truncate_to_last", True),
        ("truncate_to_last", 1.5),
        ("drop_tool_calls", "yes"),
        ("drop_tool_calls", 1),
        ("validate", "false"),
        ("rename_session", 5),
        ("rename_session", "  "),
        ("provider", ["mock"]),
        ("model", ""),
        ("source_agent", 1),
        ("source_session_id", b"abc"),
        ("source_kind", {}),
        ("source_label", 2.0),
        ("source_provenance", ["a"]),
        ("source_provenance", {1: "a"}),
        ("source_provenance", {"big": 2**70}),
    ],
)
def test_wrong_option_types_raise_naming_the_option(
    store: SessionStore, tmp_path: Path, name: str, value: object
) -> None:
    path = write(tmp_path, msg("user", "hi"))
    head = store.log.head
    with pytest.raises(InvalidArgumentError, match=f"`{name}`"):
        seed_from_jsonl(store, path, **{name: value})
    assert store.log.head == head


def test_none_means_the_default_for_every_option(store: SessionStore, tmp_path: Path) -> None:
    path = write(tmp_path, msg("user", "hi"), msg("tool", "r"))
    result, messages = seed_ok(store, path, **dict.fromkeys(RESULT_OPTIONS))
    assert len(messages) == 2
    assert result.source == {
        "file": "transcript.jsonl",
        "blake3": blake3(path.read_bytes()).hexdigest(),
    }


RESULT_OPTIONS = [
    "truncate_to_last",
    "drop_tool_calls",
    "validate",
    "rename_session",
    "provider",
    "model",
    "source_agent",
    "source_session_id",
    "source_kind",
    "source_label",
    "source_provenance",
]


# 7. What the engine refuses, and atomicity


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        (msg("user", "x", files=[f"f{i}" for i in range(11)]), r"files_per_message_max = 10"),
        (msg("user", {"not": "a str or list"}), r"\$\.content"),
        (msg("user", "x", usage={"input_tokens": "many"}), r"\$\.usage\.input_tokens"),
        (msg("user", "x", x_vendor=2**70), r"does not fit in 64 bits"),
    ],
    ids=["too-many-files", "content-object", "usage-type", "huge-int"],
)
def test_a_message_the_engine_refuses_fails_naming_its_line(
    store: SessionStore, tmp_path: Path, bad: dict[str, Any], pattern: str
) -> None:
    path = write(tmp_path, msg("user", "a"), "", msg("assistant", "b"), bad, msg("user", "c"))
    assert_refused(
        store, path, rf"transcript\.jsonl:4: the session engine refused this message: .*{pattern}"
    )


def test_a_snapshot_message_the_engine_refuses_names_the_snapshot_line(
    store: SessionStore, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        {"type": "request", "messages": [{"role": "user", "content": "ok"}]},
        {"type": "request", "messages": [{"role": "user", "content": "ok", "metadata": 5}]},
        {"type": "response", "text": "fine"},
    )
    assert_refused(store, path, r"transcript\.jsonl:2: the session engine refused this message")


def test_a_transcript_longer_than_the_engine_allows_is_refused_where_it_goes_past(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "messages_per_transcript_max", 2)
    path = write(tmp_path, msg("user", "a"), msg("assistant", "b"), msg("user", "c"))
    assert_refused(store, path, r"transcript\.jsonl:3: .*exceeds messages_per_transcript_max = 2")
    _, messages = seed_ok(store, path, truncate_to_last=2)
    assert [m["content"] for m in messages] == ["b", "c"]


def test_a_failed_seed_inside_a_callers_transaction_undoes_only_itself(
    store: SessionStore, tmp_path: Path
) -> None:
    bad = write(tmp_path, msg("user", {"bad": "content"}))
    good = write(tmp_path, msg("user", "fine"), name="good.jsonl")
    with store.transaction():
        mine = store.open_session("mine")
        failed = seed_from_jsonl(store, bad)
        seeded = seed_from_jsonl(store, good)
    assert not failed.ok
    assert seeded.ok
    assert session_ids(store) == {mine, seeded.session_id}


def test_a_seeded_session_survives_reopen_and_rebuild(tmp_path: Path) -> None:
    path = write(tmp_path, {"type": "system_prompt", "content": "s"}, msg("user", "hi"))
    with SessionStore.open(tmp_path / "s") as store:
        result, messages = seed_ok(store, path)
    with SessionStore.open(tmp_path / "s") as store:
        assert store.messages(result.session_id or "") == messages
        store.rebuild()
        assert store.messages(result.session_id or "") == messages
        assert store.log.verify().ok


# 8. The result, and memory


def test_the_result_is_frozen_and_has_a_mapping_form(store: SessionStore, tmp_path: Path) -> None:
    result, _ = seed_ok(store, write(tmp_path, msg("user", "hi")))
    data = result.to_dict()
    assert list(data) == RESULT_FIELDS == list(result.keys())
    assert all(data[name] == result[name] for name in RESULT_FIELDS)
    assert data["turns_loaded"] == data["messages_loaded"] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.ok = False  # type: ignore[misc]
    with pytest.raises(KeyError):
        result["nope"]
    data["source"]["file"] = "changed"
    assert result.source["file"] == "transcript.jsonl"
    with pytest.raises(TypeError):
        result.source["file"] = "changed"  # type: ignore[index]


def test_superseded_snapshots_are_not_kept_in_memory(tmp_path: Path) -> None:
    """200 request snapshots of ~50 KB each: reading keeps the latest one, not the 10 MB file."""
    filler = "z" * 50_000
    lines = [
        {"type": "request", "messages": [{"role": "user", "content": f"{i}{filler}"}]}
        for i in range(200)
    ]
    path = write(tmp_path, *lines)
    assert path.stat().st_size > 10_000_000
    tracemalloc.start()
    try:
        transcript = read_transcript(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(transcript.messages) == 1
    assert transcript.messages[0]["content"].startswith("199")
    assert peak < 3_000_000, (
        f"peak {peak:,} bytes while reading a {path.stat().st_size:,} byte file"
    )


def test_with_truncate_to_last_only_the_last_messages_are_kept_while_reading(
    tmp_path: Path,
) -> None:
    """A 10 MB file of message events read with truncate_to_last=3 holds about three messages."""
    filler = "w" * 5_000
    path = write(tmp_path, *(msg("user", f"{i}{filler}") for i in range(2_000)))
    assert path.stat().st_size > 10_000_000
    tracemalloc.start()
    try:
        transcript = read_transcript(path, truncate_to_last=3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [m["content"][:4] for m in transcript.messages] == ["1997", "1998", "1999"]
    assert list(transcript.lines) == [1998, 1999, 2000]
    assert (transcript.found, transcript.truncated) == (2_000, True)
    assert peak < 3_000_000, (
        f"peak {peak:,} bytes while reading a {path.stat().st_size:,} byte file"
    )
