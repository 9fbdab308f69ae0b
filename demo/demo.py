"""The main job, on the embedded LMDB store under var/demo: the event log at work.

Appends a conversation, starts a writer process and kills it with SIGKILL mid-flight, reopens the
store, checks that every event the writer had acknowledged is there, and verifies the hash chain.
Running it again reuses the store and shows the log growing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eventlog import ANY, EventLog  # noqa: E402
from eventlog.events import Message, MessageInjected  # noqa: E402

STORE = ROOT / "var" / "demo" / "log"
WRITER = """
import sys
from eventlog import ANY, EventLog
from eventlog.events import Message, MessageInjected
with EventLog.open(sys.argv[1]) as log:
    n = 0
    while True:
        n += 1
        event = MessageInjected(message=Message(role="user", content=f"writer message {n}"))
        [position] = log.append("demo-writer", [event], expected_version=ANY)
        print(position, flush=True)
"""


def main() -> None:
    STORE.parent.mkdir(parents=True, exist_ok=True)
    with EventLog.open(STORE) as log:
        start = log.head
        turns = [("user", "Hello!"), ("assistant", "Hi. What are we doing?"), ("user", "Audit.")]
        for role, text in turns:
            log.append(
                "demo-chat",
                [MessageInjected(message=Message(role=role, content=text))],
                expected_version=ANY,
            )
        print(f"appended {len(turns)} messages to demo-chat; head {start} -> {log.head}")

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(STORE)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert writer.stdout is not None
    acknowledged: list[int] = []
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        line = writer.stdout.readline()
        if not line:
            break
        acknowledged.append(int(line))
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    print(f"writer killed with SIGKILL after {len(acknowledged)} acknowledged durable appends")

    with EventLog.open(STORE) as log:
        missing = [p for p in acknowledged if p > log.head]
        report = log.verify()
        print(f"reopened: head {log.head}, acknowledged events missing: {len(missing)}")
        print(
            f"verify: ok={report.ok}, {report.events_checked} events, "
            f"{report.streams_checked} streams, head hash {report.head_hash.hex()[:16]}"
        )
        last = log.read_stream("demo-chat", after=max(0, log.stream_version("demo-chat") - 1))
        print(f"last demo-chat message: {last[0].data.message.content!r}")  # type: ignore[union-attr]
        if missing or not report.ok:
            sys.exit(1)


if __name__ == "__main__":
    main()
