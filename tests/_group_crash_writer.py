"""The writer process that `test_sessions_group.py` kills with SIGKILL while 16 writers inject.

Usage: `python tests/_group_crash_writer.py STORE_PATH ROUND [threads|tasks]`. It opens
`SessionStore.open` (durable), opens one session per writer (`t0`..`t15`, reused round after
round), then runs 16 writers, each injecting `{"role": "user", "content": "ROUND:WRITER:I"}` into
its own session for I = 0, 1, 2, ... forever, so their commands share group commits. The writers
are threads calling `store.inject` (the default), or with `tasks` asyncio tasks awaiting
`AsyncSessionStore.inject` on one event loop (the queue's own thread leads their commits). It
reports on stdout, one flushed line each: `ready {}` once every session is open,
`cmd {"t": T, "i": I}` before each inject, and `ack {"t": T, "i": I}` after the inject returned
(its commit is durable by then).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sessions import SessionStore
from sessions.aio import AsyncSessionStore

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


async def inject_forever_async(store: AsyncSessionStore, round_no: int, task: int) -> None:
    sid = f"t{task}"
    index = 0
    while True:
        emit("cmd", {"t": task, "i": index})
        await store.inject(sid, {"role": "user", "content": f"{round_no}:{task}:{index}"})
        emit("ack", {"t": task, "i": index})
        index += 1


async def tasks(store: SessionStore, round_no: int) -> None:
    astore = AsyncSessionStore(store)
    await asyncio.gather(*(inject_forever_async(astore, round_no, k) for k in range(THREADS)))


def main() -> None:
    path, round_no = sys.argv[1], int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "threads"
    store = SessionStore.open(path)
    for thread in range(THREADS):
        store.open_session(f"t{thread}")
    emit("ready", {})
    if mode == "tasks":
        asyncio.run(tasks(store, round_no))
        return
    for thread in range(THREADS):
        threading.Thread(target=inject_forever, args=(store, round_no, thread)).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
