"""What every benchmark suite shares beside the timing (`_timing.py`): the base of its sizes, its
context, and the loop that runs the benchmarks asked for.

A suite subclasses `Sizes` with what it measures (keyword-only fields, so a subclass may add fields
with or without defaults), uses `Context` as it is or subclasses it, and hands `run` its table of
benchmarks.
"""

from __future__ import annotations

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


def run(
    benchmarks: Mapping[str, Callable[[C], list[Result]]],
    ctx: C,
    names: Sequence[str],
    around: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> list[Result]:
    """Run the benchmarks `names` of `benchmarks` in order, each announced by a line and run
    inside `around()`."""
    results: list[Result] = []
    for name in names:
        ctx.note(f"{name}:")
        with around():
            results.extend(benchmarks[name](ctx))
    return results
