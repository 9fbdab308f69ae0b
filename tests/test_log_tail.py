"""Tailing from another process: a reader follows a log that a separate writer process appends to,
from any starting position, with no gap and no repeat, and sees each event with its stored hash."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from eventlog import ANY, EventLog
from eventlog.events import Message, MessageInjected

WRITER = """
import sys, time
from eventlog import ANY, EventLog
from eventlog.events import Message, MessageInjected
with EventLog.open(sys.argv[1]) as log:
    for n in range(int(sys.argv[2])):
        stream = "tail-a" if n % 3 else "tail-b"
        log.append(stream, [MessageInjected(message=Message(role="user", content=f"m{n}"))],
                   expected_version=ANY)
        time.sleep(0.002)
"""


def test_a_reader_follows_a_writer_in_another_process(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.append(
            "tail-a",
            [MessageInjected(message=Message(role="user", content="before"))],
            expected_version=ANY,
        )
        total = 150
        root = Path(__file__).resolve().parent.parent
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(total)],
            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        )
        deadline = time.monotonic() + 60
        seen = []
        for envelope in log.tail(
            after=1,
            follow=True,
            poll_interval_s=0.005,
            stop=lambda: writer.poll() is not None or time.monotonic() > deadline,
        ):
            seen.append(envelope)
            if len(seen) == total:
                break
        assert writer.wait(timeout=60) == 0
        assert [e.position for e in seen] == list(range(2, total + 2))
        assert [e.data.message.content for e in seen] == [f"m{n}" for n in range(total)]
        assert [e.hash for e in seen] == [e.hash for e in log.read(after=1, limit=total)]
        only_b = list(log.tail(after=0, stream="tail-b"))
        assert [e.data.message.content for e in only_b] == [f"m{n}" for n in range(0, total, 3)]
