"""`python -m bench.peers [--quick] [--only NAME ...] [--passes N] [--json PATH] [--markdown PATH]
[--render JSON]`.

Runs each adapter (bench/peers/_worker.py) in a process of its own, one after another, on stores
under `var/bench-tmp/`, then prints one table with ratios to sessionlog, the durability settings
each library runs with, and the issue's targets. Writes `var/bench/peers.json` (`--quick`:
`peers.quick.json`) and, after a full run of every adapter, `bench/PEERS.md`. Peers that are not
installed in this interpreter are listed as not run: `make bench-peers` installs them all into a
virtualenv of their own. With `--passes N` the adapters run N times (in reversed order every other
pass) and each figure is the median over passes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._timing import filesystem_of, machine
from bench.peers import _report
from bench.peers._worker import ADAPTERS

ROOT = Path(__file__).resolve().parent.parent.parent
VAR = ROOT / "var"
WORKER_TIMEOUT_S = 1_800  # one adapter's full run takes minutes; an hour would mean a hang


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    sizes.add_argument("--tiny", action="store_true", help="the test suite's sizes (no figures)")
    parser.add_argument(
        "--only",
        action="append",
        choices=list(ADAPTERS),
        metavar="NAME",
        help=f"run only this adapter (repeatable): {', '.join(ADAPTERS)}",
    )
    parser.add_argument("--passes", type=int, default=1, help="runs of every adapter (default 1)")
    parser.add_argument("--json", type=Path, help="where the figures go")
    parser.add_argument(
        "--markdown",
        type=Path,
        help="where the report goes (default: bench/PEERS.md after a full run "
        "of every adapter, none otherwise)",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the report")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="run nothing: print the report of an earlier run's JSON (and write "
        "it to --markdown when given)",
    )
    return parser.parse_args(argv)


def _run_worker(name: str, sizes: str, tmp: Path, quiet: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp))
    out = work / "result.json"
    command = [
        sys.executable,
        "-m",
        "bench.peers._worker",
        name,
        str(work / "stores"),
        sizes,
        str(out),
    ]
    if quiet:
        command.append("--quiet")
    try:
        done = subprocess.run(command, cwd=ROOT, timeout=WORKER_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the {name} adapter failed with exit code {done.returncode}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _median_of(values: list[Any]) -> Any:
    """Figures of several passes as one: medians of numbers, rounds joined, the rest as first seen."""
    first = values[0]
    if isinstance(first, bool) or not isinstance(first, (int, float, dict, list)):
        return first
    if isinstance(first, dict):
        return {key: _median_of([v[key] for v in values]) for key in first}
    if isinstance(first, list):
        return [item for v in values for item in v]
    return statistics.median(values)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.passes < 1:
        raise SystemExit(f"--passes must be >= 1, got {args.passes}")
    if args.render is not None:
        report = _report.render(json.loads(args.render.read_text()))
        print(report.text)
        if args.markdown is not None:
            args.markdown.write_text(report.markdown)
        return 0
    sizes = "tiny" if args.tiny else "quick" if args.quick else "full"
    names = [name for name in ADAPTERS if not args.only or name in args.only]
    tmp_parent = VAR / "bench-tmp"
    tmp_parent.mkdir(parents=True, exist_ok=True)
    mount, fs_type = filesystem_of(tmp_parent)
    if not args.quiet:
        print(f"stores under {tmp_parent} ({fs_type} mounted at {mount})", flush=True)
    started = time.time()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    tmp = Path(tempfile.mkdtemp(prefix="peers-", dir=tmp_parent))
    try:
        for number in range(args.passes):
            order = names if number % 2 == 0 else names[::-1]
            for name in order:
                if not args.quiet:
                    print(f"== {name} (pass {number + 1}/{args.passes})", flush=True)
                runs[name].append(_run_worker(name, sizes, tmp, args.quiet))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results = {name: _median_of(found) for name, found in runs.items()}
    document = {
        "suite": "peers",
        "sizes": sizes,
        "passes": args.passes,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "elapsed_s": round(time.time() - started, 1),
        "machine": machine(),
        "filesystem": {"mount": mount, "type": fs_type},
        "adapters": results,
        "targets": _report.targets(results),
    }
    report = _report.render(document)
    print("\n" + report.text)
    out = args.json or VAR / "bench" / ("peers.json" if sizes == "full" else f"peers.{sizes}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nresults written to {out}")
    markdown = args.markdown
    if markdown is None and sizes == "full" and not args.only:
        markdown = ROOT / "bench" / "PEERS.md"
    if markdown is not None:
        markdown.write_text(report.markdown)
        print(f"report written to {markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
