"""The writer process that `test_sessions_group.py` kills with SIGKILL while 16 threads inject.

Usage: `python tests/_group_crash_writer.py STORE_PATH ROUND`. It opens `SessionStore.open`
(durable), opens one session per thread (`t0`..`t15`, reused round after round), then runs 16
threads, each injecting `{"role": "user", "content": "ROUND:THREAD:I"}` into its own session
for I = 0, 1, 2, ... forever, so their commands share group commits. It reports on stdout, one
flushed line each: `ready {}` once every session is open, `cmd {"t": T, "i": I}` before each
inject, and `ack {"t": T, "i": I}` after the inject returned (its commit is durable by then).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sessions import SessionStore

THREADS = 16
_printing = threading.Lock()


def emit(word: str, body: dict[str, int]) -> None:
    line = f"{word} {json.dumps(body, separators=(',', ':'))}\n"
    with _printing:
        sys.stdout.write(line)
        sys.stdout.flush()


def inject_forever(store: SessionStore, round_no: int, thread: int) -> None:
    sid = f"t{thread}"
    index = 0
    while True:
        emit("cmd", {"t": thread, "i": index})
        store.inject(sid, {"role": "user", "content": f"{round_no}:{thread}:{index}"})
        emit("ack", {"t": thread, "i": index})
        index += 1


def main() -> None:
    path, round_no = sys.argv[1], int(sys.argv[2])
    store = SessionStore.open(path)
    for thread in range(THREADS):
        store.open_session(f"t{thread}")
    emit("ready", {})
    for thread in range(THREADS):
        threading.Thread(target=inject_forever, args=(store, round_no, thread)).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
