"""Process bodies for the multi-process log tests, importable by `multiprocessing`'s spawn start.

Each worker opens its own `EventLog` (never one inherited across a fork) and writes what it did to a
JSON file, which the test reads after the process has exited.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from eventlog import ANY, ConcurrencyError, EventLog
from eventlog.events import Message, MessageInjected

SHARED_STREAMS = ("shared-0", "shared-1")
_FILLER = "".join(chr(97 + k % 26) for k in range(1_000_100))


def size_for(position: int, seed: int) -> int:
    """The payload size of the growth tests' event at `position`: mostly tens of KB, some ~1 MB."""
    rng = random.Random(f"{seed}:{position}")
    roll = rng.random()
    if roll < 0.85:
        return rng.randint(1_000, 100_000)
    if roll < 0.95:
        return rng.randint(100_000, 500_000)
    return rng.randint(900_000, 1_000_000)


def content_for(position: int, seed: int) -> str:
    """The growth tests' payload at `position`, so a reader can check it without being told."""
    start = position % 26
    return f"{position:09d}:" + _FILLER[start : start + size_for(position, seed)]


def own_stream(worker: int) -> str:
    return f"own-{worker}"


def labelled(worker: int, seq: int, count: int) -> list[MessageInjected]:
    return [
        MessageInjected(message=Message(role="user", content=f"w{worker}:{seq}:{index}"))
        for index in range(count)
    ]


def append_worker(path: str, worker: int, seed: int, ops: int, barrier: Any, out: str) -> None:
    """Appends to the shared streams (racing the others) and to its own stream (racing nobody)."""
    rng = random.Random(seed)
    acked: list[dict[str, Any]] = []
    conflicts: list[dict[str, Any]] = []
    own_conflicts: list[str] = []
    with EventLog.open(path) as log:
        own = own_stream(worker)
        own_version = log.stream_version(own)
        barrier.wait()
        for seq in range(ops):
            count = rng.randint(1, 3)
            events = labelled(worker, seq, count)
            meta = {"w": worker, "seq": seq}
            if rng.random() < 0.6:
                stream = rng.choice(SHARED_STREAMS)
                with log.view() as view:  # the head and the version come from one snapshot
                    head_seen = view.head
                    expected = view.stream_version(stream)
                try:
                    positions = log.append(stream, events, expected_version=expected, meta=meta)
                except ConcurrencyError as exc:
                    conflicts.append(
                        {
                            "stream": exc.stream,
                            "expected": exc.expected,
                            "actual": exc.actual,
                            "asked": [stream, expected],
                            "head_seen": head_seen,
                        }
                    )
                    continue
                first_version = expected + 1
            else:
                stream = own
                try:
                    positions = log.append(stream, events, expected_version=own_version, meta=meta)
                except ConcurrencyError as exc:
                    own_conflicts.append(str(exc))
                    own_version = exc.actual
                    continue
                first_version = own_version + 1
                own_version += count
            acked.append(
                {"seq": seq, "stream": stream, "positions": positions, "first": first_version}
            )
    Path(out).write_text(
        json.dumps({"acked": acked, "conflicts": conflicts, "own_conflicts": own_conflicts})
    )


def open_worker(path: str, barrier: Any, out: str) -> None:
    """Opens the log at the same moment as the others and appends one event."""
    barrier.wait()
    with EventLog.open(path) as log:
        log.append("opened", labelled(0, 0, 1), expected_version=ANY)
    Path(out).write_text("ok")


def tail_reader(path: str, total: int, sizes_seed: int, out: str, opened: Any) -> None:
    """Follows a log that another process is growing; checks every event as it arrives."""
    seen = 0
    wrong: list[int] = []
    with EventLog.open(path, map_size=64 * 1024, readonly=True) as log:
        first_map = log._storage.map_size()
        opened.set()
        for envelope in log.tail(follow=True, poll_interval_s=0.002):
            seen += 1
            data = envelope.data
            assert isinstance(data, MessageInjected)
            if envelope.position != seen or data.message.content != content_for(
                envelope.position, sizes_seed
            ):
                wrong.append(envelope.position)
            if seen == total:
                break
        last_map = log._storage.map_size()
        ok = log.verify().ok
    Path(out).write_text(
        json.dumps(
            {"seen": seen, "wrong": wrong, "first_map": first_map, "last_map": last_map, "ok": ok}
        )
    )
