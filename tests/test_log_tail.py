"""Tailing from another process: a reader follows a log that a separate writer process appends to,
from any starting position, with no gap and no repeat, and sees each event with its stored hash."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eventlog import ANY, Envelope, EventLog
from eventlog.events import Message, MessageInjected
from tests import _pg

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


@pytest.mark.parametrize("kind", ["lmdb", "postgres"])
def test_a_following_subscription_hears_every_process_in_order(tmp_path: Path, kind: str) -> None:
    """`subscribe(follow=True)`: commits of another process and of this one reach the callback
    once each, in position order, with no gap; closing the log stops the subscription's thread."""
    where = str(tmp_path / "log") if kind == "lmdb" else _pg.fresh_schema_url("follow")
    log = EventLog.open(where)
    try:
        log.append("tail-a", [said("before")], expected_version=ANY)
        heard: list[tuple[int, str]] = []
        done = threading.Event()
        total = 60

        def hear(envelope: Envelope) -> None:
            heard.append((envelope.position, envelope.data.message.content))  # type: ignore[attr-defined]
            if len(heard) == total + 5:
                done.set()

        subscription = log.subscribe(hear, after=1, follow=True, poll_interval_s=0.005)
        root = Path(__file__).resolve().parent.parent
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, where, str(total)],
            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        )
        for n in range(5):  # this process writes too, in between
            log.append("tail-c", [said(f"here{n}")], expected_version=ANY)
        assert writer.wait(timeout=60) == 0
        assert done.wait(timeout=30), f"heard {len(heard)} of {total + 5}"
        assert [position for position, _ in heard] == list(range(2, total + 7))
        contents = [content for _, content in heard]
        assert [c for c in contents if c.startswith("m")] == [f"m{n}" for n in range(total)]
        assert [c for c in contents if c.startswith("here")] == [f"here{n}" for n in range(5)]
    finally:
        log.close()
    assert subscription.active is False
    assert subscription._thread is not None and not subscription._thread.is_alive()


def said(text: str) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content=text))
