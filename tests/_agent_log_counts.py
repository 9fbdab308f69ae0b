"""Independent counts of what an agent log holds, read straight from the file's JSON.

Written apart from the importers (no code shared) so the tests compare two readings of the same
bytes. Each counter returns: messages per role, tool calls, tool results, dangling call ids,
error results, sidechain sessions and compactions.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures" / "agent-logs"


def jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for number, line in enumerate(path.read_bytes().split(b"\n"), start=1):
        if line.strip():
            out.append((number, json.loads(line)))
    return out


def claude(path: Path) -> dict[str, Any]:
    roles: Counter[str] = Counter()
    calls, results, errors, ids = 0, 0, 0, set()
    answered = set()
    chain: dict[str, int] = {}  # uuid of a sidechain record -> its sidechain's number
    last: dict[int, object] = {}  # sidechain number (0: main) -> what its last message was
    sidechains = compactions = 0
    for _, record in jsonl(path):
        message = record.get("message")
        side = 0
        if record.get("isSidechain") is True:
            side = chain.get(record.get("parentUuid"), 0)
            if not side:  # a subagent conversation starts (its root, or its first survivor)
                sidechains += 1
                side = sidechains
            chain[record.get("uuid")] = side
        if record.get("type") == "assistant" and isinstance(message, dict):
            key = ("assistant", message.get("id"))
            if key[1] is None or last.get(side) != key:
                roles["assistant"] += 1
            last[side] = key
            for block in message.get("content") or []:
                if block.get("type") == "tool_use":
                    calls += 1
                    ids.add(block["id"])
        elif record.get("isCompactSummary") is True:
            compactions += 1  # what the agent's next request began with: a summary, no prompt
            last[side] = "summary"
        elif (
            record.get("type") == "user" and not record.get("isMeta") and isinstance(message, dict)
        ):
            content = message["content"]
            blocks = content if isinstance(content, list) else []
            here = [b for b in blocks if b.get("type") == "tool_result"]
            for block in here:
                results += 1
                roles["tool"] += 1
                answered.add(block["tool_use_id"])
                errors += block.get("is_error") is True
                last[side] = "tool"
            if not here or any(b.get("type") != "tool_result" for b in blocks):
                roles["user"] += 1
                last[side] = "user"
    return {
        "roles": dict(roles),
        "tool_calls": calls,
        "tool_results": results,
        "dangling": ids - answered,
        "error_results": errors,
        "sidechains": sidechains,
        "compactions": compactions,
    }


def codex(path: Path) -> dict[str, Any]:
    roles: Counter[str] = Counter()
    calls, results, ids, answered = 0, 0, set(), set()
    in_turn = False  # inside a run of the model's items, which make one assistant message
    compactions = 0
    for _, record in jsonl(path):
        item = record["payload"]
        if record["type"] == "compacted":
            compactions += 1
            in_turn = False
            continue
        if record["type"] != "response_item":
            continue
        kind = item["type"]
        calling = ("function_call", "custom_tool_call", "local_shell_call")
        model_side = kind in ("reasoning", "web_search_call", *calling) or (
            kind == "message" and item["role"] == "assistant"
        )
        if model_side:
            if not in_turn:
                roles["assistant"] += 1
            in_turn = True
            if kind in calling:
                calls += 1
                ids.add(item["call_id"])
        elif kind == "message":
            in_turn = False
            roles[item["role"]] += 1
        elif kind in {f"{call}_output" for call in calling}:
            in_turn = False
            results += 1
            roles["tool"] += 1
            answered.add(item["call_id"])
        # Any other kind (a damaged one too) is kept as a record of its own: it neither ends the
        # model's turn nor makes a message.
    return {
        "roles": dict(roles),
        "tool_calls": calls,
        "tool_results": results,
        "dangling": ids - answered,
        "error_results": None,
        "sidechains": 0,
        "compactions": compactions,
    }


def pi(path: Path) -> dict[str, Any]:
    roles: Counter[str] = Counter()
    calls, results, errors, ids, answered = 0, 0, 0, set(), set()
    compactions = 0
    for _, record in jsonl(path):
        if record["type"] == "compaction":
            compactions += 1
        if record["type"] != "message":
            continue
        message = record["message"]
        role = {"toolResult": "tool"}.get(message["role"], message["role"])
        roles[role] += 1
        if role == "assistant":
            for block in message["content"]:
                if block["type"] == "toolCall":
                    calls += 1
                    ids.add(block["id"])
        elif role == "tool":
            results += 1
            answered.add(message["toolCallId"])
            errors += message.get("isError") is True
    return {
        "roles": dict(roles),
        "tool_calls": calls,
        "tool_results": results,
        "dangling": ids - answered,
        "error_results": errors,
        "sidechains": 0,
        "compactions": compactions,
    }


def gemini(path: Path) -> dict[str, Any]:
    document = json.loads(path.read_bytes())
    roles: Counter[str] = Counter()
    calls, results, errors = 0, 0, 0
    for message in document["messages"]:
        if message["type"] == "user":
            roles["user"] += 1
        elif message["type"] == "gemini":
            roles["assistant"] += 1
            for call in message.get("toolCalls") or []:
                calls += 1
                if "result" in call:
                    results += 1
                    roles["tool"] += 1
                    errors += call.get("status") == "error"
    return {
        "roles": dict(roles),
        "tool_calls": calls,
        "tool_results": results,
        "dangling": set(),
        "error_results": errors,
        "sidechains": 0,
        "compactions": 0,
    }


def _has_text(content: object) -> bool:
    """Whether an OpenAI message content holds text: a string, or a text block with a string."""
    if isinstance(content, str):
        return True
    return isinstance(content, list) and any(
        isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
        for block in content
    )


def openai(path: Path) -> dict[str, Any]:
    document = json.loads(path.read_bytes())
    messages = document["history"] if "history" in document else document["messages"]
    roles: Counter[str] = Counter(m["role"] for m in messages)
    if messages and messages[0]["role"] == "system" and _has_text(messages[0].get("content")):
        roles["system"] -= 1  # the first system message with text is the system prompt
    calls = sum(len(m.get("tool_calls") or []) for m in messages if m["role"] == "assistant")
    return {
        "roles": {role: n for role, n in roles.items() if n},
        "tool_calls": calls,
        "tool_results": roles["tool"],
        "dangling": set(),
        "error_results": None,
        "sidechains": 0,
        "compactions": 0,
    }


COUNTERS = {
    "claude-code": claude,
    "codex": codex,
    "pi": pi,
    "gemini-cli": gemini,
    "openai-chat": openai,
}

SAMPLES = sorted(
    (path.parent.name if path.parent.parent == FIXTURES else path.parent.parent.name, path)
    for path in FIXTURES.rglob("*")
    if path.suffix in (".jsonl", ".json", ".traj")
)
"""(format, path) of every sample file."""
