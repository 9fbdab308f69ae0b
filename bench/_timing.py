"""Shared benchmark machinery: alternating rounds, medians, targets, the table and its JSON.

Every figure is a rate (units per second, higher is better) and is compared with a baseline
measured in the same run on the same machine. Rounds alternate baseline and subject in an ABBA
order (B S, S B, B S, ...) so slow drift of a shared, noisy machine hits both sides alike, and
the table quotes medians, which one descheduled round cannot move.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One timed round: `units` of work in `wall_s` seconds, of which `cpu_s` on this process's CPU.

    Wall time is the figure (an fsync is wall time); CPU time is kept beside it because on a shared,
    overloaded machine it shows what the code costs when the scheduler is not in the way."""

    units: float
    wall_s: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.units / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def cpu_rate(self) -> float:
        return self.units / self.cpu_s if self.cpu_s > 0 else float("inf")


Round = Callable[[], Sample]
"""One round of one side: does its own untimed setup, then times its work with a `Stopwatch`."""


class Stopwatch:
    """Times one `with` block in wall and CPU time; `sample(units)` is the result."""

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self._wall = 0.0
        self._cpu = 0.0

    def __enter__(self) -> Stopwatch:
        gc.collect()  # garbage left by setup or by the other side is not this block's cost
        self._cpu = time.process_time()
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.cpu_s = time.process_time() - self._cpu

    def sample(self, units: float) -> Sample:
        return Sample(units, self.wall_s, self.cpu_s)


@dataclass(frozen=True)
class Target:
    """What counts as a pass: `ratio` compares ours with the baseline, `absolute` ours alone.

    An absolute target may also ask for `ratio_minimum` against the baseline (for example "under
    50 ms, and no slower on the big store than on the small one")."""

    kind: str  # "ratio" or "absolute"
    minimum: float
    ratio_minimum: float | None = None

    def describe(self, unit: str, per: str | None = None) -> str:
        if self.kind == "ratio":
            text = f"ratio >= {self.minimum:g}"
        elif per is not None:  # a rate shown as time per operation: the minimum rate is a maximum
            text = f"<= {_duration(1 / self.minimum)}/{per}"
        else:
            text = f">= {_number(self.minimum)} {unit}"
        if self.ratio_minimum is not None:
            text += f", ratio >= {self.ratio_minimum:g}"
        return text

    def met(self, ours: float, ratio: float) -> bool:
        passed = (ratio if self.kind == "ratio" else ours) >= self.minimum
        if self.ratio_minimum is not None:
            passed = passed and ratio >= self.ratio_minimum
        return passed


@dataclass
class Result:
    name: str
    description: str
    unit: str
    ours: float
    baseline: float
    baseline_description: str
    target: Target | None
    rounds: int
    ours_cpu: float = 0.0  # median rate by CPU time, for information
    baseline_cpu: float = 0.0
    ours_rounds: list[float] = field(default_factory=list)
    baseline_rounds: list[float] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    per: str | None = None
    """When set (e.g. "fork"), the table shows time per `per` (1 / rate) instead of the rate."""

    def show(self, rate: float) -> str:
        """A rate of this result as the table shows it."""
        if self.per is not None:
            return f"{_duration(1 / rate) if rate > 0 else 'inf'}/{self.per}"
        return f"{_number(rate)} {self.unit}"

    @property
    def ratio(self) -> float:
        """The median over rounds of ours/baseline within a round: a baseline and a subject run
        back to back see the same machine, so when a shared machine changes pace mid-run (another
        job starts hammering the disk) the pairs stay comparable while the two medians need not."""
        pairs = [
            o / b for o, b in zip(self.ours_rounds, self.baseline_rounds, strict=True) if b > 0
        ]
        return statistics.median(pairs) if pairs else float("nan")

    @property
    def ratio_of_medians(self) -> float:
        return self.ours / self.baseline if self.baseline else float("nan")

    @property
    def passed(self) -> bool | None:
        return None if self.target is None else self.target.met(self.ours, self.ratio)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = self.ratio
        data["ratio_of_medians"] = self.ratio_of_medians
        data["passed"] = self.passed
        data["cpu_ratio"] = self.ours_cpu / self.baseline_cpu if self.baseline_cpu else None
        data["target"] = (
            None
            if self.target is None
            else {**asdict(self.target), "text": self.target.describe(self.unit, self.per)}
        )
        if self.per is not None:
            data["seconds_per_op"] = {
                "ours": 1 / self.ours if self.ours else None,
                "baseline": 1 / self.baseline if self.baseline else None,
                "ours_cpu": 1 / self.ours_cpu if self.ours_cpu else None,
            }
        return data


def compare(
    *,
    name: str,
    description: str,
    unit: str,
    baseline: Round,
    subject: Round,
    baseline_description: str,
    rounds: int,
    target: Target | None,
    warmup: int = 1,
    budget_s: float = float("inf"),
    min_rounds: int = 3,
    progress: bool = True,
) -> Result:
    """Run `warmup` unrecorded rounds of each side, then up to `rounds` recorded rounds of each,
    alternating ABBA; return the medians. Past `budget_s` seconds (a machine far slower than
    usual) it stops after `min_rounds`, so one run keeps to its time."""
    started = time.perf_counter()
    for _ in range(warmup):
        baseline()
        subject()
    ours: list[Sample] = []
    theirs: list[Sample] = []
    for index in range(rounds):
        if index >= min_rounds and time.perf_counter() - started > budget_s:
            if progress:
                print(f"  {name}: over its {budget_s:.0f}s budget, stopped at {index} rounds")
            break
        if index % 2 == 0:
            theirs.append(baseline())
            ours.append(subject())
        else:
            ours.append(subject())
            theirs.append(baseline())
        if progress:
            print(
                f"  {name} round {index + 1}/{rounds}: ours {_number(ours[-1].rate)} {unit} "
                f"(CPU {_number(ours[-1].cpu_rate)}), baseline {_number(theirs[-1].rate)} {unit} "
                f"(CPU {_number(theirs[-1].cpu_rate)})",
                flush=True,
            )
    return Result(
        name=name,
        description=description,
        unit=unit,
        ours=statistics.median(s.rate for s in ours),
        baseline=statistics.median(s.rate for s in theirs),
        baseline_description=baseline_description,
        target=target,
        rounds=len(ours),
        ours_cpu=statistics.median(s.cpu_rate for s in ours),
        baseline_cpu=statistics.median(s.cpu_rate for s in theirs),
        ours_rounds=[s.rate for s in ours],
        baseline_rounds=[s.rate for s in theirs],
    )


def information(
    name: str,
    description: str,
    unit: str,
    baseline: tuple[Round, str],
    subject: Round,
    rounds: int,
    **options: Any,
) -> Result:
    """`compare` for a row without a target, its figures information only: `baseline` is the
    baseline's round and its description; `options` are `compare`'s other keywords."""
    return compare(
        name=name,
        description=description,
        unit=unit,
        baseline=baseline[0],
        subject=subject,
        baseline_description=baseline[1],
        rounds=rounds,
        target=None,
        **options,
    )


def run_threads(target: Callable[[str], object], names: Sequence[str]) -> None:
    """`target(name)` on a thread of its own for each of `names`, all started before any is
    joined (concurrent writers, in the benches that time them)."""
    threads = [threading.Thread(target=target, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _number(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def table(results: list[Result]) -> str:
    """The results as one plain-text table: medians, ratio, target, pass/miss."""
    header = (
        "benchmark",
        "ours (median)",
        "baseline (median)",
        "ratio",
        "target",
        "result",
        "ours by CPU time",
    )
    rows = [header]
    for r in results:
        verdict = {None: "info", True: "pass", False: "MISS"}[r.passed]
        rows.append(
            (
                r.name,
                r.show(r.ours),
                r.show(r.baseline),
                f"{r.ratio:.2f}" if r.ratio < 100 else f"{r.ratio:,.0f}",
                "-" if r.target is None else r.target.describe(r.unit, r.per),
                verdict,
                r.show(r.ours_cpu),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for number, row in enumerate(rows):
        cells = [
            cell.ljust(width) if i in (0, 4, 5) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def filesystem_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem type) holding `path`, from /proc/self/mountinfo when available."""
    target = os.path.realpath(path)
    best = ("?", "unknown")
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        try:
            mount_point = fields[4].replace("\\040", " ")
            fs_type = fields[fields.index("-") + 1]
        except (IndexError, ValueError):
            continue
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best[0] if best[0] != "?" else ""):
            best = (mount_point, fs_type)
    return best


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def written_bytes() -> int | None:
    """Bytes this process has handed to `write()`-family system calls so far (`wchar` of Linux's
    /proc/self/io: what LMDB writes for its pages and meta page, before the kernel merges any);
    None where that file does not exist."""
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "wchar":
            return int(value)
    return None


def write_bytes_per(work: Callable[[], Any], units: int) -> float | None:
    """`write()` bytes per unit of `work` (run once, untimed); None where it cannot be measured."""
    before = written_bytes()
    work()
    after = written_bytes()
    if before is None or after is None or units <= 0:
        return None
    return (after - before) / units
