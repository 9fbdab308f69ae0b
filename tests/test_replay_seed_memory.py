"""Seeding takes bounded memory for any input: at most four times the file, or a clean refusal.

Each case seeds a ~4 MB file in a child process (`_seed_memory_child.py`), which reports its
resident size before seeding and the highest it reached while seeding. Hostile files (millions of
objects from a few bytes each, in one line or many, nested or flat) must be refused naming
`file:line`, and refusing must itself stay within the bound; ordinary transcripts must seed,
within the bound too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "_seed_memory_child.py"
FILE_BYTES = 4_000_000
RATIO = 4
ALLOWANCE_BYTES = 2 * 1024 * 1024
"""Beyond four times the file: the allocator's and the interpreter's own slack (arenas, the read
buffer). Measured peaks stay under 3.3 times the file with no allowance at all."""


def repeat_lines(line: str) -> str:
    return line * (FILE_BYTES // len(line))


def one_line(head: str, item: str, tail: str) -> str:
    count = (FILE_BYTES - len(head) - len(tail)) // (len(item) + 1)
    return head + ",".join([item] * count) + tail + "\n"


def tool_results_with_output() -> str:
    results = [{"tool_call_id": f"c{i}", "output": "o" * 300} for i in range(20)]
    calls = {"type": "message", "role": "assistant", "content": "", "tool_calls": []}
    record = {"type": "tool_results", "results": results}
    return repeat_lines(json.dumps(calls) + "\n" + json.dumps(record) + "\n")


HOSTILE: dict[str, Callable[[], str]] = {
    "one line of empty tool results": lambda: one_line(
        '{"type":"tool_results","results":[', "{}", "]}"
    ),
    "one line of tiny tool messages": lambda: one_line(
        '{"type":"tool_results","messages":[', '{"role":"t","content":""}', "]}"
    ),
    "one request snapshot of tiny messages": lambda: one_line(
        '{"type":"request","messages":[', '{"role":"u","content":1}', "]}"
    ),
    "lines of empty flat tool results": lambda: repeat_lines('{"type":"tool_result"}\n'),
    "content of millions of numbers": lambda: one_line(
        '{"type":"message","role":"user","content":[', "1000", "]}"
    ),
    "deep nesting": lambda: (
        '{"type":"message","role":"user","content":'
        + "[" * (FILE_BYTES // 2)
        + "]" * (FILE_BYTES // 2)
        + "}\n"
    ),
}
ORDINARY: dict[str, Callable[[], str]] = {
    "many short messages": lambda: repeat_lines(
        '{"type":"message","role":"user","content":"hi"}\n'
    ),
    "long messages": lambda: repeat_lines(
        json.dumps({"type": "message", "role": "user", "content": "x" * 2_000}) + "\n"
    ),
    "tool calls with results": tool_results_with_output,
    "request snapshots": lambda: repeat_lines(
        json.dumps(
            {
                "type": "provider_call_request",
                "request_snapshot": {
                    "messages": [{"role": "user", "content": f"m{i}"} for i in range(500)]
                },
            }
        )
        + "\n"
    ),
}


def seed_in_child(tmp_path: Path, text: str) -> tuple[int, dict[str, Any]]:
    path = tmp_path / "transcript.jsonl"
    path.write_text(text)
    done = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path / "store"), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2_000:]  # a MemoryError or a crash fails here
    return path.stat().st_size, json.loads(done.stdout)


def assert_bounded(size: int, report: dict[str, Any]) -> None:
    used = report["peak_bytes"] - report["baseline_bytes"]
    assert used <= RATIO * size + ALLOWANCE_BYTES, (
        f"seeding a {size:,} byte file took {used:,} bytes ({used / size:.1f}x)"
    )


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_transcript_is_refused_at_its_line_within_bounded_memory(
    tmp_path: Path, name: str
) -> None:
    size, report = seed_in_child(tmp_path, HOSTILE[name]())
    assert report["ok"] is False
    assert re.match(r".*transcript\.jsonl:\d+: ", report["error"]), report["error"]
    assert_bounded(size, report)


@pytest.mark.parametrize("name", sorted(ORDINARY))
def test_an_ordinary_transcript_seeds_within_bounded_memory(tmp_path: Path, name: str) -> None:
    size, report = seed_in_child(tmp_path, ORDINARY[name]())
    assert report["ok"] is True, report["error"]
    assert report["messages"] > 0
    assert_bounded(size, report)
