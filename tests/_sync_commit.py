"""One durable commit between two markers, for `test_log_durability.py` to watch under strace.

Usage: `python tests/_sync_commit.py LOG_PATH SYNC [group]` (SYNC is 1 or 0). It opens the log,
commits once to warm up (creating the stream's tables), then asks the kernel about two paths that
do not exist, around one more commit: those two failing `statfs` calls mark in the trace where the
commit began and ended, so the sync calls between them are the commit's own.

With `group` it opens a `SessionStore` instead, with one session per thread, and between the marks
16 threads each make 20 durable `inject` calls, sharing group commits; it then prints
`{"commands": 320, "commits": C}` on stdout, C being the commits they made (shared or alone).
"""

from __future__ import annotations

import json
import os
import sys
import threading
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


def group(path: str, sync: bool) -> None:
    from sessions import SessionStore

    with SessionStore.open(path, sync=sync) as store:
        sids = [store.open_session() for _ in range(16)]

        def write(sid: str) -> None:
            for index in range(20):
                store.inject(sid, {"role": "user", "content": f"{sid}:{index}"})

        threads = [threading.Thread(target=write, args=(sid,)) for sid in sids]
        shared_commits, shared = store._group.commits, store._group.shared
        mark(BEGIN)
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        mark(END)
        shared_commits = store._group.commits - shared_commits
        alone = 16 * 20 - (store._group.shared - shared)
        print(json.dumps({"commands": 16 * 20, "commits": shared_commits + alone}))


def main() -> None:
    path, sync = sys.argv[1], sys.argv[2] == "1"
    if sys.argv[3:] == ["group"]:
        group(path, sync)
        return
    with EventLog.open(path, sync=sync) as log:
        log.append("s", [SessionReset()], expected_version=ANY)
        mark(BEGIN)
        log.append("s", [SessionReset()], expected_version=ANY)
        mark(END)


if __name__ == "__main__":
    main()
