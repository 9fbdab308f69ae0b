"""Writer processes for the PostgreSQL cluster tests; each writes one JSON line per acknowledged
command to its output file, flushed before the next command, so the test knows what was promised.

`python -m tests._pg_workers engine URL INDEX ROUNDS OUT`: sessions `own-INDEX` and `shared` through
the engine, plus raw appends to stream `race` with a version read before the append (stale
writers are refused and counted). `keyed URL INDEX ROUNDS OUT`: keyed appends to stream `wINDEX`,
each retried with the same idempotency key until it is acknowledged (for a server that is killed
and restarted); `keyed-once` stops at the first failure instead.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Any

from eventlog import ConcurrencyError, EventLog, StorageError
from eventlog.events import Message, MessageInjected
from sessions import SessionStore

RETRY_FOR_S = 90.0
"""How long a keyed writer keeps retrying one command while the server is away."""


def said(text: str) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content=text))


def ack(out: IO[str], **fields: Any) -> None:
    out.write(json.dumps(fields) + "\n")
    out.flush()


def engine(url: str, index: int, rounds: int, out: IO[str]) -> None:
    with SessionStore.open(url) as store:
        own = f"own-{index}"
        store.open_session(own)
        store.open_session("shared")
        stale = 0
        for turn in range(rounds):
            text = f"{index}:{turn}"
            store.inject(own, {"role": "user", "content": text})
            ack(out, kind="own", text=text)
            store.inject("shared", {"role": "user", "content": text})
            ack(out, kind="shared", text=text)
            version = store.log.stream_version("race")
            try:
                (position,) = store.log.append("race", [said(text)], expected_version=version)
            except ConcurrencyError:
                stale += 1
                continue
            ack(out, kind="race", text=text, position=position)
        try:
            store.log.append("race", [said(f"{index}:stale")], expected_version=0)
        except ConcurrencyError:
            stale += 1
            ack(out, kind="refused", text=f"{index}:stale")
        ack(out, kind="done", stale=stale)


def keyed(url: str, index: int, rounds: int, out: IO[str], *, retry: bool) -> None:
    log = open_with_retry(url) if retry else EventLog.open(url)
    stream = f"w{index}"
    with log:
        for turn in range(rounds):
            key = f"{stream}-{turn}"
            deadline = time.monotonic() + RETRY_FOR_S
            while True:
                try:
                    positions = log.append(
                        stream,
                        [said(key)],
                        expected_version=turn,
                        meta={"idempotency_key": key},
                    )
                    break
                except StorageError as exc:
                    if not retry or time.monotonic() > deadline:
                        ack(out, kind="failed", error=str(exc))
                        return
                    ack(out, kind="retry", key=key, error=type(exc).__name__)
                    time.sleep(0.2)
            ack(out, kind="ack", key=key, positions=positions)
        ack(out, kind="done")


def open_with_retry(url: str) -> EventLog:
    deadline = time.monotonic() + RETRY_FOR_S
    while True:
        try:
            return EventLog.open(url)
        except StorageError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main(argv: list[str]) -> None:
    mode, url, index, rounds, path = argv
    with open(path, "a") as out:
        if mode == "engine":
            engine(url, int(index), int(rounds), out)
        else:
            keyed(url, int(index), int(rounds), out, retry=mode == "keyed")


if __name__ == "__main__":
    main(sys.argv[1:])
