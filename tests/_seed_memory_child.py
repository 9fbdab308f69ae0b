"""Seeds one transcript into a fresh store and reports the peak memory it took, for
`test_replay_seed_memory.py`.

Usage: `python tests/_seed_memory_child.py STORE_DIR TRANSCRIPT`. Prints one JSON line:
`{"baseline_bytes", "peak_bytes", "ok", "error", "messages"}`: the resident size just before
seeding (interpreter, imports, the open store, a warm-up seed) and the highest it reached while
seeding. Both are read from `/proc/self/status`, with the high-water mark reset to the current
size just before seeding (`clear_refs`). Not `getrusage`'s `ru_maxrss`: Linux carries it across
`exec` from the parent, so a child of a large test process would report the parent's size.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replay import seed_from_jsonl
from sessions import SessionStore


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Make the high-water mark the current size (Linux 4.0 and later)."""
    Path("/proc/self/clear_refs").write_text("5")


def main() -> None:
    store_dir, transcript = sys.argv[1], sys.argv[2]
    with SessionStore.open(store_dir) as store:
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as warm:
            warm.write('{"type":"message","role":"user","content":"warm-up"}\n')
        seed_from_jsonl(store, warm.name)  # every code path imported and its caches filled
        Path(warm.name).unlink()
        baseline = status_bytes("VmRSS")
        reset_peak()
        result = seed_from_jsonl(store, transcript)
        peak = status_bytes("VmHWM")
    print(
        json.dumps(
            {
                "baseline_bytes": baseline,
                "peak_bytes": peak,
                "ok": result.ok,
                "error": result.error,
                "messages": result.messages_loaded,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
