"""`sync=True` makes every commit durable, and nothing else can tell that it does not.

White-box: the LMDB environment's `sync` and `metasync` flags follow the `sync=` argument, and a
PostgreSQL write transaction leaves `synchronous_commit` on unless `sync=False`. Black-box: one
commit is watched under strace (the system-call tracer) and must issue at least one sync call
(fsync, fdatasync, msync or sync_file_range) with `sync=True`, and none with `sync=False`; and
16 threads injecting at once, whose commands share group commits, make one sync call per commit.

Without strace on the machine that last test is skipped, loudly, except where the environment
sets `CI` or `SESSIONLOG_REQUIRE_STRACE=1` (`.ci/run` sets both): there it fails, so CI can never
pass without having counted.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eventlog import EventLog
from tests import _pg, _require

CHILD = Path(__file__).resolve().parent / "_sync_commit.py"
SYNC_CALLS = ("fsync", "fdatasync", "msync", "sync_file_range")


@pytest.mark.parametrize("sync", [True, False])
def test_the_lmdb_environment_syncs_data_and_meta_as_asked(tmp_path: Path, sync: bool) -> None:
    with EventLog.open(tmp_path / "log", sync=sync) as log:
        flags = log._storage.env.flags()  # type: ignore[attr-defined]
    assert (flags["sync"], flags["metasync"]) == (sync, sync)
    assert not flags["map_async"]


@pytest.mark.needs("POSTGRES")
@pytest.mark.parametrize("sync", [True, False])
def test_a_postgres_write_commits_synchronously_unless_asked_not_to(sync: bool) -> None:
    with EventLog.open(_pg.fresh_schema_url(), sync=sync) as log:
        txn = log._storage.begin_write()  # type: ignore[attr-defined]
        try:
            setting = txn.conn.execute(b"SHOW synchronous_commit").fetchone()[0]
        finally:
            txn.abort()
    if sync:
        assert setting != "off", setting  # on, remote_write, remote_apply, local: all wait
    else:
        assert setting == "off"


NO_STRACE = (
    "strace is not installed, so no test here counts the sync calls of a commit; "
    "install strace (the Debian package `strace`) to run them"
)


def strace_path() -> str:
    return shutil.which("strace") or _require.missing("STRACE", NO_STRACE)


def sync_calls_of_one_commit(tmp_path: Path, sync: bool, *mode: str) -> list[str]:
    """The sync system calls the child made between its two marks, as strace wrote them."""
    strace = strace_path()
    trace = tmp_path / "trace.txt"
    wanted = ",".join((*SYNC_CALLS, "statfs"))
    child = [sys.executable, str(CHILD), str(tmp_path / "log"), "1" if sync else "0", *mode]
    done = subprocess.run(
        [strace, "-f", "-qq", "-e", f"trace={wanted}", "-o", str(trace), *child],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"strace or the child failed: {done.stderr[-2000:]}"
    (tmp_path / "stdout.txt").write_text(done.stdout)
    lines = trace.read_text().splitlines()
    begin = [i for i, line in enumerate(lines) if "sessionlog-commit-begin" in line]
    end = [i for i, line in enumerate(lines) if "sessionlog-commit-end" in line]
    assert len(begin) == 1 and len(end) == 1, f"the marks are not in the trace: {lines[-20:]}"
    calls = re.compile(rf"\b({'|'.join(SYNC_CALLS)})\(")
    return [line for line in lines[begin[0] + 1 : end[0]] if calls.search(line)]


@pytest.mark.needs("STRACE")
def test_a_durable_commit_makes_a_sync_system_call(tmp_path: Path) -> None:
    calls = sync_calls_of_one_commit(tmp_path, sync=True)
    # LMDB syncs the data pages once; the meta page goes through its O_DSYNC descriptor.
    assert len(calls) == 1 and "fdatasync(" in calls[0], calls


@pytest.mark.needs("STRACE")
def test_a_commit_without_sync_makes_none(tmp_path: Path) -> None:
    assert sync_calls_of_one_commit(tmp_path, sync=False) == []


@pytest.mark.needs("STRACE")
def test_a_group_commit_makes_one_sync_call_per_batch(tmp_path: Path) -> None:
    # 16 threads, 20 durable injects each: they share commits, and each commit, shared or not,
    # costs the disk one sync, so the batch pays it once for all its commands.
    calls = sync_calls_of_one_commit(tmp_path, True, "group")
    counts = json.loads((tmp_path / "stdout.txt").read_text())
    assert all("fdatasync(" in call for call in calls), calls
    assert len(calls) == counts["commits"], counts
    assert counts["commits"] < counts["commands"] / 4, f"the threads hardly shared: {counts}"
