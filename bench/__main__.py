"""`python -m bench [--quick] [--only NAME ...] [--rounds N] [--json PATH] [--strict]`.

Prints one table of medians at the end and writes it as JSON (by default to `var/bench/log.json`;
a `--quick` run writes `var/bench/log.quick.json` so a smoke run never replaces real figures).
Exits 1 on a missed target only with `--strict`: figures from a shared machine are advisory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench._timing import filesystem_of, machine, table
from bench.log_bench import BENCHMARKS, FULL, QUICK, Context, run

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 rounds: a smoke run")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(BENCHMARKS),
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument("--rounds", type=int, help="recorded rounds per side (default 9, quick 3)")
    parser.add_argument("--json", type=Path, help="where to write the results")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--quiet", action="store_true", help="print only the table")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.rounds is not None:
        if args.rounds < 1:
            raise SystemExit("--rounds must be >= 1")
        sizes = dataclasses.replace(sizes, rounds=args.rounds, read_rounds=args.rounds)
    names = [name for name in BENCHMARKS if not args.only or name in args.only]
    out = args.json or VAR / "bench" / ("log.quick.json" if args.quick else "log.json")

    tmp_parent = VAR / "bench-tmp"
    created_parent = not tmp_parent.exists()
    tmp_parent.mkdir(parents=True, exist_ok=True)
    mount, fs_type = filesystem_of(tmp_parent)
    if not args.quiet:
        print(f"stores under {tmp_parent} ({fs_type} mounted at {mount})", flush=True)
    if fs_type in {"tmpfs", "ramfs"}:
        print(f"warning: {tmp_parent} is on {fs_type}; fsync costs nothing there", flush=True)

    started = time.time()
    machine_at_start = machine()
    tmp = Path(tempfile.mkdtemp(prefix="run-", dir=tmp_parent))
    try:
        results = run(Context(tmp=tmp, sizes=sizes, progress=not args.quiet), names)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if created_parent:
            shutil.rmtree(tmp_parent, ignore_errors=True)
    elapsed = time.time() - started

    print()
    print(table(results))
    print(
        f"\n{'quick ' if args.quick else ''}run took {elapsed:.0f}s; medians of {sizes.rounds} "
        f"rounds per side (read_all/verify: {sizes.read_rounds}), baseline and ours alternating;\n"
        "ratio = median over rounds of ours/baseline measured back to back"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "suite": "log",
        "quick": args.quick,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "elapsed_s": round(elapsed, 1),
        "machine": machine_at_start,
        "load_average_at_end": machine()["load_average"],
        "filesystem": {"path": str(tmp_parent), "mount": mount, "type": fs_type},
        "sizes": dataclasses.asdict(sizes),
        "results": [r.to_json() for r in results],
    }
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"results written to {out}")
    missed = [r.name for r in results if r.passed is False]
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
