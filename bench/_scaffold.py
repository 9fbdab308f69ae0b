"""What every benchmark suite shares beside the timing (`_timing.py`): the base of its sizes, its
context, and the loop that runs the benchmarks asked for.

A suite subclasses `Sizes` with what it measures (keyword-only fields, so a subclass may add fields
with or without defaults), uses `Context` as it is or subclasses it, and hands `run` its table of
benchmarks.

A suite may run each benchmark in a process of its own (`isolated`): a row then measures the code
and its baseline from the same clean start, not whatever the rows before it left in the heap (a
read that builds thousands of objects runs at a speed that depends on how many the process
already holds, and on both sides differently).
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from bench._timing import Result


@dataclass(frozen=True, kw_only=True)
class Sizes:
    rounds: int  # timed rounds per side of each row
    budget_s: float = 60.0  # per row: past this, stop after three rounds (see `compare`)


S = TypeVar("S", bound=Sizes)


@dataclass(kw_only=True)
class Context(Generic[S]):
    tmp: Path  # this run's scratch directory (deleted afterwards)
    sizes: S
    progress: bool = True
    cache: dict[str, Any] = field(default_factory=dict)  # fixtures shared by a suite's rows

    def note(self, text: str) -> None:
        if self.progress:
            print(text, flush=True)


C = TypeVar("C", bound=Context[Any])
Benchmark = Callable[[Context[Any]], list[Result]]


def run(
    benchmarks: Mapping[str, Callable[[C], list[Result]]],
    ctx: C,
    names: Sequence[str],
    around: Callable[[], AbstractContextManager[Any]] = nullcontext,
    *,
    isolated: bool = False,
) -> list[Result]:
    """Run the benchmarks `names` of `benchmarks` in order, each announced by a line and run
    inside `around()`; with `isolated`, each in a child process of its own (`in_child`)."""
    results: list[Result] = []
    for name in names:
        ctx.note(f"{name}:")

        def row(name: str = name) -> list[Result]:
            with around():
                return benchmarks[name](ctx)

        results.extend(in_child(row) if isolated else row())
    return results


class ChildFailed(RuntimeError):
    """A benchmark run in a child process raised, or the child died; the child's traceback or
    exit status is the message."""


def in_child(work: Callable[[], list[Result]]) -> list[Result]:
    """`work()` run in a forked child process, its results sent back through a pipe. The child
    starts from this process as it is now (the suite's imports and context, nothing a previous
    row built), and what the row builds dies with it."""
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, send, and leave without running the parent's exit handlers
        status = 0
        try:
            os.close(read)
            try:
                payload: tuple[str, Any] = ("ok", work())
            except BaseException:  # sent to the parent, which raises it
                payload = ("error", traceback.format_exc())
            with os.fdopen(write, "wb") as out:
                pickle.dump(payload, out)
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # the parent sees the exit status
            status = 1
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as inbound:
        data = inbound.read()
    _, wait_status = os.waitpid(pid, 0)
    if not data:
        raise ChildFailed(
            f"the benchmark's child process ended ({os.waitstatus_to_exitcode(wait_status)}) "
            "without sending its results"
        )
    kind, value = pickle.loads(data)  # our own child's pipe
    if kind != "ok":
        raise ChildFailed(f"the benchmark failed in its child process:\n{value}")
    return value  # type: ignore[no-any-return]
