"""`python -m bench.engine_profile NAME [--top N] [--units N] [--layers]`: where an engine benchmark
spends time.

Runs the subject of one engine benchmark under cProfile on a store like the benchmark's and prints
the functions with the most time of their own, per unit of work (per inject, per message, per
event), with calls per unit. cProfile adds a roughly constant cost per Python call, so the profiled
total is two to three times the real time: read the split, not the absolute figures. The time
without the profiler is printed first. Stores live under `var/bench-tmp` and are deleted after;
`rebuild` uses the cached 200,000-event store of the engine suite (built when missing).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import engine_bench as eb
from sessions import SessionStore

ROOT = Path(__file__).resolve().parent.parent
Work = Callable[[], None]


def _inject_batched(tmp: Path, units: int) -> tuple[Work, str, SessionStore]:
    store = SessionStore.open(tmp / "store")
    sessions = [store.open_session() for _ in range(8)]
    messages = eb.make_messages(4_000, seed=32)
    count = 0

    def work() -> None:
        nonlocal count
        for _ in range(units // 1_000):
            with store.transaction():
                for index in range(count, count + 1_000):
                    store.inject(sessions[index % 8], messages[index % len(messages)])
            count += 1_000

    return work, "inject", store


def _inject_durable(tmp: Path, units: int) -> tuple[Work, str, SessionStore]:
    store = SessionStore.open(tmp / "store")
    sessions = [store.open_session() for _ in range(8)]
    messages = eb.make_messages(units, seed=31)

    def work() -> None:
        for index, message in enumerate(messages):
            store.inject(sessions[index % 8], message)

    return work, "inject", store


def _snapshot_cold(tmp: Path, units: int) -> tuple[Work, str, SessionStore]:
    n = 1_000
    pool = eb.make_messages(n * 4, seed=41)
    with SessionStore.open(tmp / "store", sync=False) as built:
        sessions = [built.open_session() for _ in range(4)]
        with built.transaction():
            for index in range(n * 4):
                built.inject(sessions[index % 4], pool[index])
    store = SessionStore.open(tmp / "store", hot_sessions=0)

    def work() -> None:
        for _ in range(max(1, units // n)):
            store.snapshot(sessions[1])

    return work, "message", store


def _fork(tmp: Path, units: int) -> tuple[Work, str, SessionStore]:
    store = SessionStore.open(tmp / "store")
    source = store.open_session()
    with store.transaction():
        for message in eb.make_messages(1_000, seed=21):
            store.inject(source, message)

    def work() -> None:
        for _ in range(units):
            store.fork(source)

    return work, "fork", store


def _rebuild(tmp: Path, units: int) -> tuple[Work, str, SessionStore]:
    ctx = eb.Context(tmp=tmp, cache_dir=ROOT / "var" / "bench-cache", sizes=eb.FULL)
    cached, _ = eb.cached_store(
        ctx,
        f"mix-{eb.FULL.rebuild_events}",
        lambda s: eb.build_population(s, events=eb.FULL.rebuild_events, seed=61, mix=True),
    )
    store = SessionStore.open(eb.copy_store(cached, tmp / "store"))

    def work() -> None:
        store.rebuild()

    return work, "event", store


SUBJECTS: dict[str, tuple[Callable[[Path, int], tuple[Work, str, SessionStore]], int]] = {
    "inject_batched": (_inject_batched, 10_000),
    "inject_durable": (_inject_durable, 300),
    "snapshot_cold": (_snapshot_cold, 20_000),
    "fork": (_fork, 300),
    "rebuild": (_rebuild, 0),  # units: the events in the store
}


def report(profile: cProfile.Profile, units: int, unit: str, top: int) -> str:
    stats = pstats.Stats(profile)
    rows: list[tuple[float, float, int, str]] = []
    for (filename, line, function), value in stats.stats.items():  # type: ignore[attr-defined]
        calls, own, cumulative = value[1], value[2], value[3]
        path = Path(filename)
        name = f"{path.parent.name}/{path.name}:{line}({function})" if filename != "~" else function
        rows.append((own, cumulative, calls, name))
    total = sum(row[0] for row in rows)
    lines = [
        f"profiled total {total / units * 1e6:.2f} µs/{unit}",
        f"{'own µs/' + unit:>14} {'cum µs/' + unit:>14} {'calls/' + unit:>12}  function",
    ]
    for own, cumulative, calls, name in sorted(rows, reverse=True)[:top]:
        lines.append(
            f"{own / units * 1e6:14.3f} {cumulative / units * 1e6:14.3f} "
            f"{calls / units:12.2f}  {name}"
        )
    return "\n".join(lines)


LAYERS = (
    ("sessions/", "command: the verb, its checks and decision (sessions/)"),
    ("projections/", "fold: the projection of what was appended (projections/)"),
    ("eventlog/_codec.py", "encode and hash the records (eventlog/_codec.py)"),
    ("eventlog/_lmdb", "storage: the LMDB puts and the commit (eventlog/_lmdb*.py)"),
    ("eventlog/", "log: checks, versions, pending events (eventlog/, the rest)"),
)
"""Where each function's own time is counted, by the path of its file; a built-in (an LMDB put, a
msgspec encode, a blake3 digest) counts where its caller's file does."""


def _layer(filename: str) -> str | None:
    path = Path(filename)
    where = f"{path.parent.name}/{path.name}"
    for prefix, layer in LAYERS:
        if where.startswith(prefix):
            return layer
    return None


def layer_report(profile: cProfile.Profile, units: int, unit: str) -> str:
    """The profiled time per unit of work split by layer (`LAYERS`), each a share of the whole."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    totals: dict[str, float] = {}
    for (filename, _, _), (_, _, own, _, callers) in stats.items():
        layer = _layer(filename) if filename != "~" else None
        if layer is not None or filename != "~":
            totals[layer or "other"] = totals.get(layer or "other", 0.0) + own
            continue
        for (caller_file, _, _), edge in callers.items():  # a built-in: by who called it
            name = _layer(caller_file) or "other"
            totals[name] = totals.get(name, 0.0) + edge[2]
    whole = sum(totals.values())
    lines = [f"profiled total {whole / units * 1e6:.2f} µs/{unit}, by layer:"]
    for name, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        lines.append(f"{seconds / units * 1e6:10.2f} µs/{unit} {seconds / whole:6.1%}  {name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_profile", description=__doc__)
    parser.add_argument("name", choices=sorted(SUBJECTS))
    parser.add_argument("--top", type=int, default=30, help="functions to show (default 30)")
    parser.add_argument("--units", type=int, help="work per run (injects, messages, forks)")
    parser.add_argument(
        "--layers", action="store_true", help="also split the time by layer (see LAYERS)"
    )
    args = parser.parse_args(argv)
    make, default_units = SUBJECTS[args.name]
    tmp_parent = ROOT / "var" / "bench-tmp"
    tmp_parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="profile-", dir=tmp_parent))
    try:
        work, unit, store = make(tmp, args.units or default_units)
        try:
            units = args.units or default_units or store.log.head
            work()  # warm-up: caches, first pages
            gc.collect()
            started = time.perf_counter()
            work()
            elapsed = time.perf_counter() - started
            print(
                f"{args.name}: {elapsed / units * 1e6:.2f} µs/{unit} without the profiler "
                f"({units / elapsed:,.0f} {unit}s/s)"
            )
            profile = cProfile.Profile()
            profile.enable()
            work()
            profile.disable()
            print(report(profile, units, unit, args.top))
            if args.layers:
                print(layer_report(profile, units, unit))
        finally:
            store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
