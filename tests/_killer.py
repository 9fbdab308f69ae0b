"""The harness both crash tests share: run a writer script, collect the lines it acknowledges,
and SIGKILL it at a moment a seeded random generator picks.

A writer prints `ready ...` once its store is open, then one line per step it starts (the
`started` word) and more lines as it acknowledges work. A line cut short by the kill never ends
with a newline and is dropped: it was never acknowledged.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 60.0


@dataclass
class Writer:
    """A running writer process and what it has reported so far."""

    proc: subprocess.Popen[bytes]
    started: str
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)
    reader: threading.Thread | None = None

    def pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if not raw.endswith(b"\n"):
                break  # cut short by the kill: never acknowledged
            with self.changed:
                self.lines.append(raw.decode())
                self.changed.notify_all()
            if raw.startswith(b"ready "):
                self.ready.set()

    def steps(self) -> int:
        prefix = self.started + " "
        return sum(line.startswith(prefix) for line in self.lines)

    def wait_for_steps(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while self.steps() < count and self.proc.poll() is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.changed.wait(left)


def start_writer(script: Path, started: str, args: list[str], stderr: Path) -> Writer:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=err, env=env
        )
    writer = Writer(proc, started)
    writer.reader = threading.Thread(target=writer.pump, daemon=True)
    writer.reader.start()
    return writer


@dataclass(frozen=True)
class KillPlan:
    """How `kill_at_random_moment` spreads its kills (weights of startup / anytime / in-step)."""

    weights: tuple[int, int, int]
    startup_max_s: float
    anytime_max_s: float
    steps: tuple[int, int]
    in_step_max_s: float


def kill_at_random_moment(writer: Writer, rng: random.Random, plan: KillPlan) -> str:
    """SIGKILL the writer at a moment chosen by `rng`; returns how the moment was chosen."""
    mode = rng.choices(["startup", "anytime", "in-call"], weights=plan.weights)[0]
    if mode == "startup":
        time.sleep(rng.uniform(0.0, plan.startup_max_s))  # imports, open(), or the first steps
    else:
        assert writer.ready.wait(READY_TIMEOUT_S), "the writer never opened its store"
        if mode == "anytime":
            time.sleep(rng.uniform(0.0, plan.anytime_max_s))
        else:
            writer.wait_for_steps(rng.randint(*plan.steps), READY_TIMEOUT_S)
            time.sleep(rng.uniform(0.0, plan.in_step_max_s))  # mostly inside a call or its commit
    writer.proc.send_signal(signal.SIGKILL)
    writer.proc.wait(timeout=60)
    assert writer.reader is not None and writer.proc.stdout is not None
    writer.reader.join(timeout=60)
    writer.proc.stdout.close()
    return mode
