"""The writer process that `test_retention_crash.py` kills with SIGKILL during a sweep or a
truncation.

Usage: `python tests/_retention_crash_writer.py STORE_PATH SINK_PATH OP ARG`. It opens the store,
prints `ready {}`, then `started OP` and runs the one operation: `sweep` (archive, then forget,
every closed session, `ARG` sessions per archive commit, as of a time far enough ahead that all
are due) or `truncate` (archive and drop the log's positions below `ARG`). When it returns it
prints `done {...}` and exits. Every line is flushed; a line the kill cut short was never acknowledged.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sessions import DirectorySink, LocalKeyProvider, RetentionPolicy, SessionStore

KEY = LocalKeyProvider(bytes(range(32)))
"""The store is encrypted, so a sweep also forgets (destroys each retired session's key)."""
AHEAD = timedelta(days=30)
"""How far past the store's last event the sweep runs: every closed session is due."""


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(path: str, sink_path: str, op: str, arg: str) -> None:
    sink = DirectorySink(sink_path)
    with SessionStore.open(path, keys=KEY) as store:
        say("ready {}")
        say(f"started {op}")
        if op == "sweep":
            policy = RetentionPolicy(
                max_age=timedelta(days=1), action="archive", sink=sink, batch_sessions=int(arg)
            )
            report = store.sweep(policy, now=datetime.now(UTC) + AHEAD)
            say("done " + json.dumps({"archived": report.archived}))
        else:
            anchor, _ = store.truncate_log(int(arg), sink=sink)
            say("done " + json.dumps({"anchor": anchor}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
