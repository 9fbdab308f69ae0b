"""One adapter's run, in a process of its own: `python -m bench.peers._worker NAME DIR SIZES OUT`.

Imports the adapter's module (and so its library) only here, runs every workload on stores under
DIR and writes the figures as JSON to OUT. A library that is not installed is reported in OUT as
missing rather than failing the run; any other error fails this process and names the adapter.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.peers._workloads import SIZES, run_all

ADAPTERS = {
    "sessionlog": "bench.peers.sessionlog_adapter:SessionlogAdapter",
    "lmdb": "bench.peers.lmdb_adapter:LmdbAdapter",
    "eventsourcing": "bench.peers.eventsourcing_adapter:EventsourcingAdapter",
    "langgraph": "bench.peers.langgraph_adapter:LanggraphAdapter",
    "openai-agents": "bench.peers.openai_agents_adapter:OpenaiAgentsAdapter",
    "google-adk": "bench.peers.adk_adapter:AdkAdapter",
}
"""Every adapter, by the name the command line uses; the driver runs them in this order."""


def run(name: str, directory: Path, sizes_name: str, quiet: bool) -> dict[str, Any]:
    module_name, _, class_name = ADAPTERS[name].partition(":")
    try:
        adapter_class = getattr(importlib.import_module(module_name), class_name)
    except ImportError as error:
        # A library that is present but lacks an optional part of its own (google-adk without its
        # [db] extra) raises ImportError from the ModuleNotFoundError of that part.
        root = error if isinstance(error, ModuleNotFoundError) else error.__cause__
        if not isinstance(root, ModuleNotFoundError):
            raise
        return {"adapter": name, "missing": f"{root.name} is not installed"}

    def note(text: str) -> None:
        if not quiet:
            print(f"  {name}: {text}", flush=True)

    started = time.perf_counter()
    probe = adapter_class(directory)
    figures = run_all(adapter_class, directory, SIZES[sizes_name], note)
    return {
        "adapter": name,
        "title": probe.title,
        "versions": probe.versions(),
        "fork_method": probe.fork_method,
        "batch_method": probe.batch_method,
        "elapsed_s": round(time.perf_counter() - started, 2),
        **figures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers._worker", description=__doc__)
    parser.add_argument("adapter", choices=list(ADAPTERS))
    parser.add_argument("directory", type=Path, help="an empty directory for the stores")
    parser.add_argument("sizes", choices=list(SIZES))
    parser.add_argument("out", type=Path, help="where the JSON figures go")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    result = run(args.adapter, args.directory, args.sizes, args.quiet)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
