"""`export_messages` gives request bodies the providers' own SDK types accept, key for key.

Each body is checked against the official Python SDKs' typed request params (OpenAI Chat
Completions, Anthropic Messages, OpenAI Responses) by a strict walk: every required key present,
no key the type does not declare, every value of a declared type. Imported sessions round trip:
every message of the source comes back in the source's own API shape.
"""

from __future__ import annotations

import itertools
import json
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union

import pytest
import typing_extensions
from anthropic.types import message_create_params as anthropic_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params as responses_params

import replay
from sessionlog.cli import main
from sessions import InvalidArgumentError, SessionStore, UnknownSessionError
from tests._agent_log_counts import FIXTURES, SAMPLES

REQUEST_TYPES = {
    "openai-chat": chat_params.CompletionCreateParamsNonStreaming,
    "anthropic-messages": anthropic_params.MessageCreateParamsNonStreaming,
    "responses": responses_params.ResponseCreateParamsNonStreaming,
}
CALLER_KEYS = {  # what the caller adds: the model and its parameters
    "openai-chat": {"model": "m"},
    "anthropic-messages": {"model": "m", "max_tokens": 1024},
    "responses": {"model": "m"},
}


def problems(value: Any, kind: Any, where: str = "$") -> list[str]:
    """Why `value` is not a `kind` (a TypedDict, union, literal, list or scalar type)."""
    origin = typing.get_origin(kind)
    if origin is typing.Annotated:
        return problems(value, typing.get_args(kind)[0], where)
    if origin in (typing.Required, typing.NotRequired):
        return problems(value, typing.get_args(kind)[0], where)
    if origin in (Union, types.UnionType):
        found = [problems(value, option, where) for option in typing.get_args(kind)]
        return [] if any(not f for f in found) else min(found, key=len)
    if origin is Literal:
        return [] if value in typing.get_args(kind) else [f"{where}: {value!r} not in {kind}"]
    if kind is type(None):
        return [] if value is None else [f"{where}: expected null"]
    if typing_extensions.is_typeddict(kind):
        return typeddict_problems(value, kind, where)
    if origin in (list, Iterable, Sequence, typing.Iterable, typing.Sequence):
        if not isinstance(value, list):
            return [f"{where}: expected a list"]
        (item,) = typing.get_args(kind)
        return [p for i, v in enumerate(value) for p in problems(v, item, f"{where}[{i}]")]
    if origin in (dict, Mapping):
        return [] if isinstance(value, dict) else [f"{where}: expected an object"]
    if kind in (str, int, float, bool):
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        return [] if ok else [f"{where}: expected {kind.__name__}, got {value!r}"[:200]]
    if kind is object or kind is Any:
        return []
    if isinstance(kind, type):  # a class (the SDKs' response models): JSON is never one
        return [] if isinstance(value, kind) else [f"{where}: not a {kind.__name__}"]
    if isinstance(typing.get_origin(kind), type):  # a file object or a path: never JSON
        return [f"{where}: not a {typing.get_origin(kind).__name__}"]
    UNKNOWN.add(repr(kind))
    return []  # a type this walk does not know (binary files, callables): not ours to send


UNKNOWN: set[str] = set()


def required(kind: Any, hint: Any) -> bool:
    """Whether a TypedDict key is required, read from its hint (the SDKs' modules postpone
    annotations, so `__required_keys__` cannot see their `Required[...]`)."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return required(kind, typing.get_args(hint)[0])
    if origin is typing.Required:
        return True
    return bool(kind.__total__) and origin is not typing.NotRequired


def typeddict_problems(value: Any, kind: Any, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: expected an object for {kind.__name__}"]
    hints = typing.get_type_hints(kind, include_extras=True)
    found = [f"{where}: unexpected key {k!r} for {kind.__name__}" for k in value if k not in hints]
    found += [
        f"{where}: missing {k!r}" for k, h in hints.items() if required(kind, h) and k not in value
    ]
    for key, item in value.items():
        if key in hints:
            found += problems(item, hints[key], f"{where}.{key}")
    return found


def imported(store: SessionStore, path: Path) -> list[str]:
    return replay.import_agent_log(store, path).session_ids


@pytest.mark.parametrize("fmt", replay.MESSAGE_FORMATS)
@pytest.mark.parametrize(("source", "path"), SAMPLES, ids=[p.name[:24] for _, p in SAMPLES])
def test_every_sample_exports_to_a_valid_request(
    store: SessionStore, fmt: str, source: str, path: Path
) -> None:
    for sid in imported(store, path):
        body = replay.export_messages(store, sid, fmt)
        assert problems({**body, **CALLER_KEYS[fmt]}, REQUEST_TYPES[fmt]) == []
        assert not UNKNOWN


def test_the_checker_refuses_extra_and_missing_keys() -> None:
    kind = REQUEST_TYPES["openai-chat"]
    extra = {"model": "m", "messages": [{"role": "user", "content": "hi", "usage": {}}]}
    assert any("unexpected key 'usage'" in p for p in problems(extra, kind))
    missing = {"model": "m", "messages": [{"role": "tool", "content": "x"}]}
    assert problems(missing, kind)
    wrong = {"model": "m", "max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]}
    assert problems(wrong, REQUEST_TYPES["anthropic-messages"])


def test_claude_code_round_trips_to_anthropic_messages(store: SessionStore) -> None:
    for _, path in SAMPLES:
        if path.parent.parent.name != "claude-code":
            continue
        for sid in imported(store, path):
            transcript = store.snapshot(sid)["transcript"]  # type: ignore[index]
            body = replay.export_messages(store, sid, "anthropic-messages")
            blocks = [b for turn in body["messages"] for b in turn["content"]]
            uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            texts = [b["text"] for b in blocks if b["type"] == "text"]
            assert uses == [c["id"] for m in transcript for c in m.get("tool_calls") or []]
            assert results == [m["tool_call_id"] for m in transcript if m["role"] == "tool"]
            said = [m["content"] for m in transcript if m["role"] != "tool" and m.get("content")]
            assert [t for t in texts if t] == said
            roles = [turn["role"] for turn in body["messages"]]
            assert all(a != b for a, b in itertools.pairwise(roles))


def test_codex_round_trips_to_responses(store: SessionStore) -> None:
    (sid,) = imported(store, FIXTURES / "codex" / "codex-pomodor-timer.jsonl")
    transcript = store.snapshot(sid)["transcript"]  # type: ignore[index]
    items = replay.export_messages(store, sid, "responses")["input"]
    calls = [i for i in items if i["type"] in ("function_call", "custom_tool_call")]
    outputs = [i for i in items if i["type"].endswith("_output")]
    assert [c["call_id"] for c in calls] == [
        c["id"] for m in transcript for c in m.get("tool_calls") or []
    ]
    assert [o["call_id"] for o in outputs] == [
        m["tool_call_id"] for m in transcript if m["role"] == "tool"
    ]
    custom = {c["call_id"] for c in calls if c["type"] == "custom_tool_call"}
    assert custom and all(
        (o["type"] == "custom_tool_call_output") == (o["call_id"] in custom) for o in outputs
    )
    said = [i["content"] for i in items if i["type"] == "message"]
    assert said == [m["content"] for m in transcript if m.get("content") and m["role"] != "tool"]


def test_trajectories_round_trip_to_openai_chat(store: SessionStore) -> None:
    for _, path in SAMPLES:
        if path.suffix != ".traj":
            continue
        (sid,) = imported(store, path)
        document = json.loads(path.read_bytes())
        body = replay.export_messages(store, sid, "openai-chat")
        assert [m["role"] for m in body["messages"]] == [m["role"] for m in document["history"]]
        assert [m["content"] for m in body["messages"]] == [
            m["content"] for m in document["history"]
        ]


def test_context_view_starts_at_the_latest_checkpoint(store: SessionStore, tmp_path: Path) -> None:
    lines = (FIXTURES / "pi" / "large-session.jsonl").read_text().splitlines()[:40]
    compaction = {"type": "compaction", "summary": "Earlier work, summarized.", "tokensBefore": 9}
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join([*lines[:30], json.dumps(compaction), *lines[30:]]) + "\n")
    (sid,) = imported(store, path)
    whole = replay.export_messages(store, sid, "openai-chat")["messages"]
    view = replay.export_messages(store, sid, "openai-chat", context=True)["messages"]
    assert len(view) < len(whole)
    assert view[1]["content"] == "Earlier work, summarized."


def test_bad_format_and_unknown_session(store: SessionStore) -> None:
    sid = store.open_session()
    with pytest.raises(InvalidArgumentError, match="format"):
        replay.export_messages(store, sid, "gemini")
    with pytest.raises(UnknownSessionError):
        replay.export_messages(store, "nope")


def test_cli_export_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = str(tmp_path / "s")
    path = FIXTURES / "gemini-cli" / "gemini-cli-pomodoro-timer.json"
    assert main(["--store", where, "import-agent-log", str(path), "--json"]) == 0
    sid = json.loads(capsys.readouterr().out)["files"][0]["sessions"][0]["session_id"]
    assert main(["--store", where, "export", sid, "--format", "openai-chat"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert problems({**body, "model": "m"}, REQUEST_TYPES["openai-chat"]) == []
    assert main(["--store", where, "export", sid, "--context"]) == 2


PNG_URL = "data:image/png;base64,iVBORw0KGgo="
IMAGE_BLOCKS = {  # one image in the block shape of each log that writes one
    "anthropic": {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    },
    "openai-chat": {"type": "image_url", "image_url": {"url": PNG_URL}},
    "responses": {"type": "input_image", "image_url": PNG_URL},
    "pi": {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
    "gemini": {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
}


@pytest.mark.parametrize("fmt", replay.MESSAGE_FORMATS)
@pytest.mark.parametrize("shape", IMAGE_BLOCKS)
def test_an_image_in_block_content_is_exported_as_an_image(
    store: SessionStore, fmt: str, shape: str
) -> None:
    content = [{"type": "text", "text": "look:"}, IMAGE_BLOCKS[shape]]
    call = {"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}
    sid = store.open_session()
    store.inject(sid, {"role": "user", "content": content})
    store.inject(sid, {"role": "assistant", "content": "", "tool_calls": [call]})
    store.inject(sid, {"role": "tool", "tool_call_id": "c1", "content": content})
    body = replay.export_messages(store, sid, fmt)
    assert problems({**body, **CALLER_KEYS[fmt]}, REQUEST_TYPES[fmt]) == []
    text = json.dumps(body)
    anthropic_image = json.dumps(IMAGE_BLOCKS["anthropic"]["source"]["data"])
    # Chat Completions takes images in user messages only; the others in tool results too.
    expected = {"openai-chat": 1, "anthropic-messages": 2, "responses": 2}[fmt]
    found = text.count(f'"{PNG_URL}"') + text.count(f'"data": {anthropic_image}')
    assert found == expected
    assert text.count('"look:"') == expected


def test_the_walk_knew_every_type_it_met() -> None:
    """The walk passed no type it does not know (it would have passed anything there)."""
    assert not UNKNOWN
