"""`replay.import_agent_log` throughput and memory, one row per format (part of `--suite replay`).

Each row generates one large log of its format (`Sizes.transcript_bytes`: 50 MB, `--quick` 5 MB;
MB is 10^6 bytes of the file), written the way the agent writes it (Claude Code: streamed
assistant records sharing a message id, tool_use / tool_result; Codex: the rollout envelope with
reasoning, function calls and their JSON-in-a-string outputs, turn contexts, UI echoes; pi:
header, messages with tool calls and results; Gemini CLI: one JSON document with inline tool
results; OpenAI-style: a SWE-agent-like `.traj` with `history`). The file is one session, so
"the largest session" is the file.

- ``agent_log_<format>``: `import_agent_log` into an open, empty, durable store (a fresh one each
  round, opening not timed), target >= 50 MB/s. Baseline: decoding the same file with msgspec in
  the same run (line by line for JSONL, whole for a document): the floor for any reader.
- Notes: the `tracemalloc` peak of one import as a multiple of the file (target <= 3), and the
  bytes the store grew by as a multiple of the file (every record is kept, each text once).
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from bench._timing import Result, Sample, Stopwatch, Target, compare
from replay import import_agent_log
from sessions import SessionStore

MB = 1_000_000
WORDS = [
    "the",
    "a",
    "file",
    "test",
    "run",
    "patch",
    "read",
    "module",
    "function",
    "value",
    "error",
    "line",
    "output",
    "fix",
]


def _text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    total = 0
    while total < size:
        word = rng.choice(WORDS)
        words.append(word)
        total += len(word) + 1
    return " ".join(words)


# Generators: each yields the file's records, one turn at a time.


def _claude(rng: random.Random) -> Iterator[dict[str, Any]]:
    base = {"sessionId": "s-1", "version": "1.0.100", "cwd": "/work", "isSidechain": False}
    parent = None
    for turn in itertools.count():
        uuid = f"u-{turn}"
        yield {
            **base,
            "type": "user",
            "uuid": uuid,
            "parentUuid": parent,
            "message": {"role": "user", "content": _text(rng, 200)},
        }
        mid = f"msg_{turn}"
        for part in range(2):
            call_id = f"toolu_{turn}_{part}"
            content = (
                [{"type": "text", "text": _text(rng, 300)}]
                if part == 0
                else [
                    {
                        "type": "tool_use",
                        "id": call_id,
                        "name": "Bash",
                        "input": {"command": _text(rng, 40)},
                    }
                ]
            )
            yield {
                **base,
                "type": "assistant",
                "uuid": f"a-{turn}-{part}",
                "parentUuid": uuid,
                "message": {
                    "id": mid,
                    "role": "assistant",
                    "model": "claude-x",
                    "content": content,
                    "usage": {"input_tokens": 10, "output_tokens": 5},
                },
            }
        yield {
            **base,
            "type": "user",
            "uuid": f"r-{turn}",
            "parentUuid": f"a-{turn}-1",
            "message": {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{turn}_1",
                        "content": _text(rng, 1500),
                    }
                ],
            },
        }
        parent = f"r-{turn}"


def _codex(rng: random.Random) -> Iterator[dict[str, Any]]:
    yield {"type": "session_meta", "payload": {"id": "c-1", "cli_version": "0.47.0", "cwd": "/w"}}
    for turn in itertools.count():
        prompt = _text(rng, 200)
        yield {"type": "event_msg", "payload": {"type": "user_message", "message": prompt}}
        yield {
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": prompt}],
            },
        }
        yield {"type": "turn_context", "payload": {"model": "gpt-x", "cwd": "/w"}}
        yield {
            "type": "response_item",
            "payload": {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": _text(rng, 80)}],
                "encrypted_content": "x" * 400,
            },
        }
        call = f"call_{turn}"
        yield {
            "type": "response_item",
            "payload": {
                "type": "function_call",
                "name": "shell",
                "arguments": json.dumps({"command": ["ls"]}),
                "call_id": call,
            },
        }
        out = json.dumps({"output": _text(rng, 1500), "metadata": {"exit_code": 0}})
        yield {
            "type": "response_item",
            "payload": {"type": "function_call_output", "call_id": call, "output": out},
        }
        yield {
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": _text(rng, 300)}],
            },
        }
        yield {"type": "event_msg", "payload": {"type": "token_count", "info": {"total": turn}}}


def _pi(rng: random.Random) -> Iterator[dict[str, Any]]:
    yield {"type": "session", "id": "p-1", "cwd": "/w", "timestamp": "2025-01-01T00:00:00Z"}
    for turn in itertools.count():
        yield {
            "type": "message",
            "message": {"role": "user", "content": [{"type": "text", "text": _text(rng, 200)}]},
        }
        call = f"t{turn}"
        yield {
            "type": "message",
            "message": {
                "role": "assistant",
                "provider": "anthropic",
                "model": "claude-x",
                "content": [
                    {"type": "text", "text": _text(rng, 300)},
                    {
                        "type": "toolCall",
                        "id": call,
                        "name": "bash",
                        "arguments": {"command": "ls"},
                    },
                ],
                "usage": {"input": 10, "output": 5},
                "stopReason": "toolUse",
            },
        }
        yield {
            "type": "message",
            "message": {
                "role": "toolResult",
                "toolCallId": call,
                "toolName": "bash",
                "content": [{"type": "text", "text": _text(rng, 1500)}],
                "isError": False,
            },
        }


def _gemini_messages(rng: random.Random) -> Iterator[dict[str, Any]]:
    for turn in itertools.count():
        yield {"id": f"u{turn}", "type": "user", "content": _text(rng, 200)}
        yield {
            "id": f"g{turn}",
            "type": "gemini",
            "content": _text(rng, 300),
            "model": "gemini-x",
            "tokens": {"input": 10, "output": 5},
            "toolCalls": [
                {
                    "id": f"c{turn}",
                    "name": "write_file",
                    "args": {"file_path": f"/w/f{turn % 7}.txt", "content": _text(rng, 500)},
                    "result": [
                        {
                            "functionResponse": {
                                "id": f"c{turn}",
                                "name": "write_file",
                                "response": {"output": _text(rng, 1000)},
                            }
                        }
                    ],
                    "status": "success",
                }
            ],
        }


def _openai_messages(rng: random.Random) -> Iterator[dict[str, Any]]:
    yield {"role": "system", "content": _text(rng, 500)}
    for turn in itertools.count():
        yield {"role": "user", "content": _text(rng, 200)}
        call = f"call_{turn}"
        yield {
            "role": "assistant",
            "content": _text(rng, 300),
            "tool_calls": [
                {
                    "id": call,
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"cmd": "ls"}'},
                }
            ],
        }
        yield {"role": "tool", "tool_call_id": call, "content": _text(rng, 1500)}


def _write_lines(path: Path, records: Iterator[dict[str, Any]], size: int) -> None:
    encode = msgspec.json.Encoder().encode
    written = 0
    with path.open("wb") as file:
        for record in records:
            line = encode(record) + b"\n"
            file.write(line)
            written += len(line)
            if written >= size:
                return


def _write_document(
    path: Path, wrap: Callable[[list[Any]], Any], records: Iterator[Any], size: int
) -> None:
    held: list[Any] = []
    total = 0
    for record in records:
        held.append(record)
        total += len(msgspec.json.encode(record))
        if total >= size:
            break
    path.write_bytes(msgspec.json.encode(wrap(held)))


def make_log(fmt: str, path: Path, size: int, seed: int = 5) -> None:
    rng = random.Random(seed)
    if fmt == "claude-code":
        _write_lines(path, _claude(rng), size)
    elif fmt == "codex":
        _write_lines(path, _codex(rng), size)
    elif fmt == "pi":
        _write_lines(path, _pi(rng), size)
    elif fmt == "gemini-cli":
        _write_document(
            path, lambda m: {"sessionId": "g-1", "messages": m}, _gemini_messages(rng), size
        )
    else:
        _write_document(path, lambda m: {"history": m, "info": {}}, _openai_messages(rng), size)


FORMATS = ("claude-code", "codex", "pi", "gemini-cli", "openai-chat")
SUFFIX = {"gemini-cli": ".json", "openai-chat": ".traj"}


def _decode_round(path: Path, megabytes: float, document: bool) -> Callable[[], Sample]:
    def run() -> Sample:
        decode = msgspec.json.Decoder().decode
        with Stopwatch() as watch:
            if document:
                decode(path.read_bytes())
            else:
                with path.open("rb", buffering=1 << 20) as file:
                    for line in file:
                        decode(line)
        return watch.sample(megabytes)

    return run


def _import_round(tmp: Path, path: Path, fmt: str, megabytes: float) -> Callable[[], Sample]:
    counter = itertools.count()

    def run() -> Sample:
        target = tmp / f"agentlog-store-{next(counter)}"
        try:
            with SessionStore.open(target) as store:
                with Stopwatch() as watch:
                    result = import_agent_log(store, path, format=fmt)
                assert result.files[0].written
        finally:
            shutil.rmtree(target, ignore_errors=True)
        return watch.sample(megabytes)

    return run


def _memory(tmp: Path, path: Path, fmt: str) -> tuple[float, float]:
    """The tracemalloc peak of one import, and the bytes the store then takes on disk, each as a
    multiple of the file's bytes."""
    target = tmp / "agentlog-memory"
    try:
        with SessionStore.open(target) as store:
            empty = store.log.size_bytes()
            tracemalloc.start()
            try:
                import_agent_log(store, path, format=fmt)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            stored = store.log.size_bytes() - empty
    finally:
        shutil.rmtree(target, ignore_errors=True)
    size = path.stat().st_size
    return peak / size, stored / size


def rows(
    tmp: Path, size: int, rounds: int, budget_s: float, progress: bool, note: Callable[[str], None]
) -> list[Result]:
    results = []
    for fmt in FORMATS:
        path = tmp / f"agent-log-{fmt}{SUFFIX.get(fmt, '.jsonl')}"
        if not path.exists():
            make_log(fmt, path, size)
        megabytes = path.stat().st_size / MB
        document = fmt in SUFFIX
        result = compare(
            name=f"agent_log_{fmt}",
            description=f"import_agent_log of a {megabytes:.0f} MB {fmt} log, one durable commit",
            unit="MB/s",
            baseline=_decode_round(path, megabytes, document),
            subject=_import_round(tmp, path, fmt, megabytes),
            baseline_description="msgspec decode of the same file"
            + (" (whole)" if document else " (line by line)"),
            rounds=rounds,
            target=Target("absolute", 50.0),
            budget_s=budget_s,
            progress=progress,
        )
        ratio, stored = _memory(tmp, path, fmt)
        result.notes.update(
            file_bytes=path.stat().st_size,
            tracemalloc_peak_per_file_byte=ratio,
            stored_bytes_per_file_byte=stored,
        )
        note(
            f"  {fmt}: tracemalloc peak {ratio:.2f} x the file (the session), stored {stored:.2f} x"
        )
        results.append(result)
    return results
