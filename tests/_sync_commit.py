"""One durable commit between two markers, for `test_log_durability.py` to watch under strace.

Usage: `python tests/_sync_commit.py LOG_PATH SYNC` (SYNC is 1 or 0). It opens the log, commits
once to warm up (creating the stream's tables), then asks the kernel about two paths that do not
exist, around one more commit: those two failing `statfs` calls mark in the trace where the
commit began and ended, so the sync calls between them are the commit's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eventlog import ANY, EventLog
from eventlog.events import SessionReset

BEGIN = "/sessionlog-commit-begin"
END = "/sessionlog-commit-end"


def mark(path: str) -> None:
    try:
        os.statvfs(path)
    except OSError:
        pass  # the failing call is the mark


def main() -> None:
    path, sync = sys.argv[1], sys.argv[2] == "1"
    with EventLog.open(path, sync=sync) as log:
        log.append("s", [SessionReset()], expected_version=ANY)
        mark(BEGIN)
        log.append("s", [SessionReset()], expected_version=ANY)
        mark(END)


if __name__ == "__main__":
    main()
