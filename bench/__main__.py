"""`python -m bench [--quick] [--suite NAME ...] [--only NAME ...] [--rounds N] [--json PATH]
[--rebuild-cache] [--strict]`.

Runs nine suites, each against baselines measured in the same run: `log` (bench/log_bench.py, the
event log), `engine` (bench/engine_bench.py, the session engine), `replay`
(bench/replay_bench.py, seeding a session from an llm_transcript.jsonl file, and exporting it as
a bundle), and `tokens`
(bench/tokens_bench.py, bearer-session get and durable touch), and `runtime`
(bench/runtime_bench.py, durable prompt round-trips through the delegation runtime), and
`context` (bench/context_bench.py, the context view of a 10,000-message session), and
`crypt` (bench/crypt_bench.py, durable inject and cold snapshot on an encrypted store against a
plain one), and `retention` (bench/retention_bench.py, sweep of closed sessions, truncate_log and
compact-store, with the store's size before and after), and
`service` (bench/service_bench.py, the HTTP service against the in-process engine), and
`postgres` (bench/pg_bench.py, the peer workloads on PostgreSQL as ratios to LMDB), and
`integrations` (bench/integrations_bench.py, the framework backends against each framework's own
durable store), and `viewer` (bench/viewer_bench.py, the session viewer in headless Chromium).
`--only` takes
benchmark names of any suite and runs only the suites they belong to. Each suite prints one table
of medians when it ends and writes it as JSON to `var/bench/<suite>.json` (a `--quick` run writes
`var/bench/<suite>.quick.json`, so a smoke run never replaces real figures).

The engine suite caches the big stores it builds under `var/bench-cache/` (see
bench/engine_bench.py); `--rebuild-cache` builds them again. Scratch stores live under
`var/bench-tmp/` on the repository's filesystem (fsync costs depend on it) and are deleted after.
Exits 1 on a missed target or check only with `--strict`: figures from a shared machine are
advisory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import (
    context_bench,
    crypt_bench,
    engine_bench,
    integrations_bench,
    log_bench,
    pg_bench,
    replay_bench,
    retention_bench,
    runtime_bench,
    service_bench,
    tokens_bench,
    viewer_bench,
)
from bench._timing import Result, filesystem_of, machine, table

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"


@dataclass(frozen=True)
class Suite:
    name: str
    benchmarks: Sequence[str]
    full: Any  # the suite's Sizes
    quick: Any
    run: Callable[[Path, Any, argparse.Namespace, list[str]], list[Result]]
    summary: Callable[[list[Result]], str] = lambda results: ""
    checks: Callable[[list[Result]], list[engine_bench.Check]] = lambda results: []


def _plain(module: Any) -> Callable[[Path, Any, argparse.Namespace, list[str]], list[Result]]:
    """The runner of a suite whose context is the shared one (`bench/_scaffold.py`)."""

    def run(tmp: Path, sizes: Any, args: argparse.Namespace, names: list[str]) -> list[Result]:
        return module.run(module.Context(tmp=tmp, sizes=sizes, progress=not args.quiet), names)

    return run


def _run_engine(tmp: Path, sizes: Any, args: argparse.Namespace, names: list[str]) -> list[Result]:
    ctx = engine_bench.Context(
        tmp=tmp,
        cache_dir=VAR / "bench-cache",
        sizes=sizes,
        rebuild_cache=args.rebuild_cache,
        progress=not args.quiet,
        quick=args.quick,
    )
    return engine_bench.run(ctx, names)


SUITES = (
    Suite("log", list(log_bench.BENCHMARKS), log_bench.FULL, log_bench.QUICK, _plain(log_bench)),
    Suite(
        "engine",
        list(engine_bench.BENCHMARKS),
        engine_bench.FULL,
        engine_bench.QUICK,
        _run_engine,
        summary=engine_bench.summary,
        checks=engine_bench.checks,
    ),
    Suite(
        "replay",
        list(replay_bench.BENCHMARKS),
        replay_bench.FULL,
        replay_bench.QUICK,
        _plain(replay_bench),
        summary=replay_bench.summary,
    ),
    Suite(
        "tokens",
        list(tokens_bench.BENCHMARKS),
        tokens_bench.FULL,
        tokens_bench.QUICK,
        _plain(tokens_bench),
    ),
    Suite(
        "runtime",
        list(runtime_bench.BENCHMARKS),
        runtime_bench.FULL,
        runtime_bench.QUICK,
        _plain(runtime_bench),
        summary=runtime_bench.summary,
    ),
    Suite(
        "crypt",
        list(crypt_bench.BENCHMARKS),
        crypt_bench.FULL,
        crypt_bench.QUICK,
        _plain(crypt_bench),
    ),
    Suite(
        "retention",
        list(retention_bench.BENCHMARKS),
        retention_bench.FULL,
        retention_bench.QUICK,
        _plain(retention_bench),
        summary=retention_bench.summary,
    ),
    Suite(
        "context",
        list(context_bench.BENCHMARKS),
        context_bench.FULL,
        context_bench.QUICK,
        _plain(context_bench),
    ),
    Suite(
        "integrations",
        list(integrations_bench.BENCHMARKS),
        integrations_bench.FULL,
        integrations_bench.QUICK,
        _plain(integrations_bench),
    ),
    Suite(
        "service",
        list(service_bench.BENCHMARKS),
        service_bench.FULL,
        service_bench.QUICK,
        _plain(service_bench),
        summary=service_bench.summary,
    ),
    Suite(
        "viewer",
        list(viewer_bench.BENCHMARKS),
        viewer_bench.FULL,
        viewer_bench.QUICK,
        _plain(viewer_bench),
    ),
    Suite(
        "postgres",
        list(pg_bench.BENCHMARKS),
        pg_bench.FULL,
        pg_bench.QUICK,
        _plain(pg_bench),
    ),
)
ALL_BENCHMARKS = [name for suite in SUITES for name in suite.benchmarks]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 rounds: a smoke run")
    parser.add_argument(
        "--suite",
        action="append",
        choices=[suite.name for suite in SUITES],
        help="run only this suite (repeatable; default: all)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=ALL_BENCHMARKS,
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(ALL_BENCHMARKS)}",
    )
    parser.add_argument("--rounds", type=int, help="recorded rounds per side (default 9, quick 3)")
    parser.add_argument(
        "--json", type=Path, help="where to write the results (only when one suite runs)"
    )
    parser.add_argument(
        "--rebuild-cache",
        action="store_true",
        help="build the engine suite's cached stores (var/bench-cache/) again",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--quiet", action="store_true", help="print only the tables")
    return parser.parse_args(argv)


def _with_rounds(sizes: Any, rounds: int) -> Any:
    names = {f.name for f in dataclasses.fields(sizes)}
    return dataclasses.replace(
        sizes,
        **{name: rounds for name in ("rounds", "read_rounds", "rebuild_rounds") if name in names},
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    plan: list[tuple[Suite, list[str]]] = []
    for suite in SUITES:
        if args.suite and suite.name not in args.suite:
            continue
        names = [name for name in suite.benchmarks if not args.only or name in args.only]
        if names:
            plan.append((suite, names))
    if not plan:
        raise SystemExit("nothing to run: --only names no benchmark of the chosen --suite")
    if args.json is not None and len(plan) > 1:
        raise SystemExit("--json needs a single suite: add --suite or --only")

    tmp_parent = VAR / "bench-tmp"
    created_parent = not tmp_parent.exists()
    tmp_parent.mkdir(parents=True, exist_ok=True)
    mount, fs_type = filesystem_of(tmp_parent)
    if not args.quiet:
        print(f"stores under {tmp_parent} ({fs_type} mounted at {mount})", flush=True)
    if fs_type in {"tmpfs", "ramfs"}:
        print(f"warning: {tmp_parent} is on {fs_type}; fsync costs nothing there", flush=True)

    missed = False
    try:
        for suite, names in plan:
            missed |= _run_suite(suite, names, args, tmp_parent, mount, fs_type)
    finally:
        if created_parent:
            shutil.rmtree(tmp_parent, ignore_errors=True)
    return 1 if args.strict and missed else 0


def _run_suite(
    suite: Suite,
    names: list[str],
    args: argparse.Namespace,
    tmp_parent: Path,
    mount: str,
    fs_type: str,
) -> bool:
    """Run one suite, print its table, write its JSON; True when a target or check was missed."""
    sizes = suite.quick if args.quick else suite.full
    if args.rounds is not None:
        sizes = _with_rounds(sizes, args.rounds)
    out = args.json or VAR / "bench" / (
        f"{suite.name}.quick.json" if args.quick else f"{suite.name}.json"
    )
    if not args.quiet:
        print(f"\n== {suite.name} suite{' (quick)' if args.quick else ''}", flush=True)
    started = time.time()
    machine_at_start = machine()
    tmp = Path(tempfile.mkdtemp(prefix=f"{suite.name}-", dir=tmp_parent))
    try:
        results = suite.run(tmp, sizes, args, names)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.time() - started

    checks = suite.checks(results)
    print(f"\n{suite.name} suite:")
    print(table(results))
    extra = suite.summary(results)
    if extra:
        print()
        print(extra)
    others = [
        f"{label}: {getattr(sizes, name)}"
        for name, label in (("read_rounds", "read_all/verify"), ("rebuild_rounds", "rebuild"))
        if hasattr(sizes, name)
    ]
    print(
        f"\n{'quick ' if args.quick else ''}{suite.name} run took {elapsed:.0f}s; medians of "
        f"{sizes.rounds} rounds per side ({', '.join(others)}), baseline and ours alternating;\n"
        "ratio = median over rounds of ours/baseline measured back to back"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "suite": suite.name,
        "quick": args.quick,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "elapsed_s": round(elapsed, 1),
        "machine": machine_at_start,
        "load_average_at_end": machine()["load_average"],
        "filesystem": {"path": str(tmp_parent), "mount": mount, "type": fs_type},
        "sizes": dataclasses.asdict(sizes),
        "results": [r.to_json() for r in results],
        "checks": [c.to_json() for c in checks],
    }
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"results written to {out}")
    return any(r.passed is False for r in results) or any(not c.passed for c in checks)


if __name__ == "__main__":
    sys.exit(main())
