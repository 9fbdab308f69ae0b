"""The workloads every adapter runs, in its own process, and the figures they produce.

Everything here goes through the `Adapter` interface, so each library does the same work with the
same messages. Timing is wall time (an fsync is wall time) with `time.perf_counter`; every figure
is a median over rounds or over appends. A workload checks what it wrote reads back whole, outside
the timed part, so an adapter that dropped messages fails loudly instead of looking fast.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._timing import run_threads
from bench.peers._adapter import Adapter, Message, directory_bytes


@dataclass(frozen=True)
class Sizes:
    rounds: int  # rounds of the durable, batched and reopen workloads
    durable_appends: int  # single-message appends per durable round (a fresh session each round)
    batch_messages: int  # messages per batched commit
    batches: int  # batched commits per round
    grow_messages: int  # the session grown one durable append at a time
    grow_window: int  # appends at each end of the growth compared (first N vs last N)
    forks: int  # forks of the grown session
    budget_s: float  # per workload: past this, stop after `rounds_min` rounds (slow peers)
    rounds_min: int = 2


FULL = Sizes(
    rounds=5,
    durable_appends=200,
    batch_messages=100,
    batches=10,
    grow_messages=2_000,
    grow_window=100,
    forks=20,
    budget_s=60.0,
)
QUICK = Sizes(
    rounds=3,
    durable_appends=30,
    batch_messages=100,
    batches=2,
    grow_messages=200,
    grow_window=20,
    forks=3,
    budget_s=10.0,
)
TINY = Sizes(  # the test suite's: checks the plumbing and the JSON, measures nothing
    rounds=2,
    durable_appends=3,
    batch_messages=5,
    batches=2,
    grow_messages=12,
    grow_window=3,
    forks=2,
    budget_s=5.0,
)
WARM_APPENDS = 5  # appends to another session before the growth is timed (see `grow`)
SIZES = {"full": FULL, "quick": QUICK, "tiny": TINY}

_VOCABULARY = (
    "the session agent tool call result user model reply token context window file path read "
    "write patch test build error retry plan step summary cache prompt stream event log commit"
)
_WORDS = _VOCABULARY.split(" ")


def make_messages(count: int, seed: int) -> list[Message]:
    """Alternating user and assistant messages of realistic, varied lengths (80 to 900 chars),
    the same generator and seed for every adapter."""
    rng = random.Random(seed)
    out: list[Message] = []
    for index in range(count):
        user = index % 2 == 0
        length = rng.randint(80, 300) if user else rng.randint(200, 900)
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < length:
            words.append(rng.choice(_WORDS))
        out.append({"role": "user" if user else "assistant", "content": " ".join(words)[:length]})
    return out


class Timer:
    """Wall time of one `with` block, after a collection so earlier garbage is not its cost."""

    seconds = 0.0

    def __enter__(self) -> Timer:
        gc.collect()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start


def _rounds(sizes: Sizes, run_round: Callable[[int], float]) -> list[float]:
    """Up to `sizes.rounds` results of `run_round`, fewer past the budget (never under the
    minimum), so one slow library keeps the whole run to its time."""
    started = time.perf_counter()
    out: list[float] = []
    for index in range(sizes.rounds):
        if index >= sizes.rounds_min and time.perf_counter() - started > sizes.budget_s:
            break
        out.append(run_round(index))
    return out


def _check(adapter: Adapter, session_id: str, expected: list[Message], what: str) -> None:
    got = adapter.contents(adapter.read(session_id))
    want = [m["content"] for m in expected]
    if got != want:
        raise AssertionError(
            f"{adapter.name} {what}: read back {len(got)} messages, expected {len(want)} "
            "with the same contents"
        )


def durable_append(adapter: Adapter, sizes: Sizes, note: Callable[[str], None]) -> dict[str, Any]:
    """Single-message appends, one commit each, into a fresh session per round."""
    warm = adapter.create()
    for message in make_messages(3, seed=1):
        adapter.append(warm, message)

    def one(index: int) -> float:
        sid = adapter.create()
        messages = make_messages(sizes.durable_appends, seed=100 + index)
        with Timer() as timer:
            for message in messages:
                adapter.append(sid, message)
        rate = len(messages) / timer.seconds
        note(f"durable_append round {index + 1}: {rate:,.0f} appends/s")
        if index == 0:
            _check(adapter, sid, messages, "durable_append")
        return rate

    rates = _rounds(sizes, one)
    return {"rate": statistics.median(rates), "rounds": rates, "unit": "messages/s"}


WRITERS = 16
"""Threads of `concurrent_append`, each appending to a session of its own."""


def concurrent_append(
    adapter: Adapter, sizes: Sizes, note: Callable[[str], None]
) -> dict[str, Any]:
    """`WRITERS` threads, each making `durable_appends` single-message appends (one durable
    call each) into a fresh session of its own, all at once; the rate counts every thread's."""

    def one(index: int) -> float:
        sids = [adapter.create() for _ in range(WRITERS)]
        messages = make_messages(sizes.durable_appends, seed=200 + index)

        def write(sid: str) -> None:
            for message in messages:
                adapter.append(sid, message)

        with Timer() as timer:
            run_threads(write, sids)
        rate = WRITERS * len(messages) / timer.seconds
        note(f"concurrent_append round {index + 1}: {rate:,.0f} appends/s")
        if index == 0:
            for sid in sids:
                _check(adapter, sid, messages, "concurrent_append")
        return rate

    rates = _rounds(sizes, one)
    return {"rate": statistics.median(rates), "rounds": rates, "unit": "messages/s"}


def batched_append(adapter: Adapter, sizes: Sizes, note: Callable[[str], None]) -> dict[str, Any]:
    """`batches` commits of `batch_messages` messages each, into a fresh session per round."""

    def one(index: int) -> float:
        sid = adapter.create()
        messages = make_messages(sizes.batch_messages * sizes.batches, seed=200 + index)
        step = sizes.batch_messages
        with Timer() as timer:
            for first in range(0, len(messages), step):
                adapter.append_batch(sid, messages[first : first + step])
        rate = len(messages) / timer.seconds
        note(f"batched_append round {index + 1}: {rate:,.0f} messages/s")
        if index == 0:
            _check(adapter, sid, messages, "batched_append")
        return rate

    rates = _rounds(sizes, one)
    return {
        "rate": statistics.median(rates),
        "rounds": rates,
        "unit": "messages/s",
        "batch_messages": sizes.batch_messages,
    }


def grow(adapter: Adapter, sizes: Sizes, note: Callable[[str], None]) -> dict[str, Any]:
    """One session grown to `grow_messages` by durable single appends, each timed; then the bytes
    the store grew by, per message. Leaves the adapter closed; returns the session's id."""
    adapter.open()
    sid = adapter.create()
    warm = adapter.create()
    adapter.close()
    empty_bytes = directory_bytes(adapter.directory)
    messages = make_messages(sizes.grow_messages, seed=300)
    adapter.open()
    # A library's first commits after opening pay for connections, statement caches and the
    # file's first pages; a few appends to another session take that out of the first window.
    # Their bytes stay in the store, so they count in the bytes per message.
    warming = make_messages(WARM_APPENDS, seed=301)
    for message in warming:
        adapter.append(warm, message)
    times: list[float] = []
    for message in messages:
        started = time.perf_counter()
        adapter.append(sid, message)
        times.append(time.perf_counter() - started)
    _check(adapter, sid, messages, "grow")
    adapter.close()
    grown_bytes = directory_bytes(adapter.directory) - empty_bytes
    written = messages + warming
    window = sizes.grow_window
    first, last = times[:window], times[-window:]
    result = {
        "session_id": sid,
        "messages": len(messages),
        "first_s": statistics.median(first),
        "last_s": statistics.median(last),
        "first_mean_s": statistics.fmean(first),
        "last_mean_s": statistics.fmean(last),
        "total_s": sum(times),
        "window": window,
        "bytes_per_message": grown_bytes / len(written),
        "content_bytes_per_message": sum(len(m["content"].encode()) for m in written)
        / len(written),
        "bytes_total": grown_bytes,
    }
    result["ratio"] = result["last_s"] / result["first_s"]
    note(
        f"grow: first {window} {result['first_s'] * 1e3:.3g} ms, last {window} "
        f"{result['last_s'] * 1e3:.3g} ms (x{result['ratio']:.2f}), "
        f"{result['bytes_per_message']:,.0f} bytes/message"
    )
    return result


def reopen_read(
    adapter: Adapter, sizes: Sizes, sid: str, expected: int, note: Callable[[str], None]
) -> dict[str, Any]:
    """Open the closed store and read the grown session whole; the OS page cache stays warm,
    the library starts with nothing in memory."""

    def one(index: int) -> float:
        with Timer() as timer:
            adapter.open()
            transcript = adapter.read(sid)
        adapter.close()
        if len(transcript) != expected:
            raise AssertionError(f"{adapter.name} reopen_read: {len(transcript)} != {expected}")
        note(f"reopen_read round {index + 1}: {timer.seconds * 1e3:.3g} ms")
        return timer.seconds

    seconds = _rounds(sizes, one)
    return {"seconds": statistics.median(seconds), "rounds": seconds, "messages": expected}


def fork(
    adapter: Adapter, sizes: Sizes, sid: str, expected: int, note: Callable[[str], None]
) -> dict[str, Any]:
    """Fork the grown session `forks` times (fewer past the budget), each timed; then the bytes
    the store grew by, per fork. Leaves the adapter closed."""
    before = directory_bytes(adapter.directory)
    adapter.open()
    seconds: list[float] = []
    children: list[str] = []
    started = time.perf_counter()
    for index in range(sizes.forks):
        if index >= sizes.rounds_min and time.perf_counter() - started > sizes.budget_s:
            break
        with Timer() as timer:
            children.append(adapter.fork(sid))
        seconds.append(timer.seconds)
    child = adapter.read(children[-1])
    adapter.close()
    if len(child) != expected:
        raise AssertionError(f"{adapter.name} fork: the child holds {len(child)} != {expected}")
    per_fork = (directory_bytes(adapter.directory) - before) / len(seconds)
    note(f"fork: {statistics.median(seconds) * 1e3:.3g} ms, {per_fork:,.0f} bytes per fork")
    return {
        "seconds": statistics.median(seconds),
        "rounds": seconds,
        "forks": len(seconds),
        "bytes_per_fork": per_fork,
        "messages": expected,
    }


def run_all(
    make: Callable[[Path], Adapter], directory: Path, sizes: Sizes, note: Callable[[str], None]
) -> dict[str, Any]:
    """Every workload on fresh stores under `directory`; the figures as one JSON-ready dict."""
    grown = make(directory / "grow")
    grown.directory.mkdir(parents=True)
    grew = grow(grown, sizes, note)
    sid, count = grew["session_id"], grew["messages"]
    reopened = reopen_read(grown, sizes, sid, count, note)
    forked = fork(grown, sizes, sid, count, note)

    appends = make(directory / "append")
    appends.directory.mkdir(parents=True)
    appends.open()
    try:
        durable = durable_append(appends, sizes, note)
        concurrent = concurrent_append(appends, sizes, note) if appends.concurrent else None
        batched = batched_append(appends, sizes, note)
        durability = appends.durability()
    finally:
        appends.close()
    found = {
        "durability": durability,
        "durable_append": durable,
        "batched_append": batched,
        "grow": grew,
        "reopen_read": reopened,
        "fork": forked,
    }
    if concurrent is not None:
        found["concurrent_append"] = concurrent
    return found
