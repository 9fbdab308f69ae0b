"""Opening never bricks a path and never kills the process.

Fault model: several processes open the same new path at once; a process creating a store is
killed (SIGKILL) at any point; the filesystem is full when a store is created, when it commits,
and when its directory is made. Every open of a new path then succeeds or raises `StorageError`
saying the disk is full; no path is ever left refused; nothing dies of SIGBUS.

A full filesystem is real: a small tmpfs mounted for the test (we run as root here and in CI).
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from eventlog import ANY, EventLog, StorageError
from eventlog._disk import LOCK_FILE_BYTES
from eventlog.events import Message, MessageInjected
from tests import _require

ROOT = Path(__file__).resolve().parent.parent


def event(size: int = 100) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content="z" * size))


def child(code: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


# Concurrent and killed first opens


OPEN_ALL = """
import sys, time
from eventlog import EventLog, ANY
from eventlog.events import Message, MessageInjected
start = float(sys.argv[2])
while time.time() < start:
    pass
for number in range(int(sys.argv[3])):
    with EventLog.open(f"{sys.argv[1]}-{number}") as log:
        log.append("s", [MessageInjected(message=Message(role="user", content="hi"))],
                   expected_version=ANY)
"""


def test_concurrent_first_opens_all_succeed(tmp_path: Path) -> None:
    # Every racer opens the same new paths in the same order from the same instant, so each
    # path is a race between all of them.
    racers, paths = 4, 40
    base = tmp_path / "race"
    start = time.time() + 1.5  # every racer is started and spinning by then
    procs = [child(OPEN_ALL, str(base), str(start), str(paths)) for _ in range(racers)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-1500:]
    for number in range(paths):
        with EventLog.open(f"{base}-{number}") as log:
            assert log.head == racers
            assert log.verify(isolated=False).ok


def test_an_empty_data_file_is_a_store_being_created_not_a_truncated_one(tmp_path: Path) -> None:
    # What a creator killed between LMDB creating the file and writing its first pages leaves.
    path = tmp_path / "log"
    path.mkdir()
    (path / "data.mdb").touch()
    (path / "lock.mdb").touch()
    with EventLog.open(path) as log:
        assert log.head == 0
        log.append("s", [event()], expected_version=ANY)
    with EventLog.open(path, readonly=True) as log:
        assert log.head == 1


def test_a_first_open_killed_anywhere_never_bricks_the_path(tmp_path: Path) -> None:
    code = "import sys\nfrom eventlog import EventLog\nEventLog.open(sys.argv[1]).close()\n"
    rng = random.Random(5)
    # Calibrate: how long a whole first open takes here, so kills land all along it.
    began = time.monotonic()
    proc = child(code, str(tmp_path / "calibrate"))
    proc.communicate(timeout=60)
    whole = time.monotonic() - began
    killed = 0
    for attempt in range(12):
        path = tmp_path / f"killed-{attempt}"
        proc = child(code, str(path))
        time.sleep(rng.uniform(0.3, 1.0) * whole)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        killed += proc.returncode == -signal.SIGKILL
        with EventLog.open(path) as log:  # whatever the kill left, the path opens
            log.append("s", [event()], expected_version=ANY)
            assert log.verify(isolated=False).ok
    assert killed > 0, "no kill landed before the open finished; the test showed nothing"


def test_our_lock_file_size_is_the_one_lmdb_makes(tmp_path: Path) -> None:
    # The lock file is allocated before LMDB maps it; a size LMDB would not choose changes its
    # reader table, so keep the two equal.
    env = lmdb.open(str(tmp_path / "plain"), max_dbs=8)
    env.close()
    assert (tmp_path / "plain" / "lock.mdb").stat().st_size == LOCK_FILE_BYTES
    EventLog.open(tmp_path / "ours").close()
    assert (tmp_path / "ours" / "lock.mdb").stat().st_size == LOCK_FILE_BYTES


# A full filesystem


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs with at most 64 inodes, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=64", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        _require.missing("TMPFS", f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave_bytes: int = 0) -> None:
    """Fill `disk` until at most `leave_bytes` are free."""
    with (disk / "filler").open("ab") as handle:
        while True:
            free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            if free <= leave_bytes:
                return
            try:
                handle.write(b"\0" * min(4096, free - leave_bytes))
                handle.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return


OPEN_NEW = """
import sys
from eventlog import EventLog, StorageError
try:
    EventLog.open(sys.argv[1]).close()
except StorageError as exc:
    print("StorageError:", exc)
"""


def test_a_new_store_on_a_full_disk_is_a_storage_error(small_disk: Path) -> None:
    fill(small_disk)
    proc = child(OPEN_NEW, str(small_disk / "store"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"died with {proc.returncode}: {err.decode()[-1500:]}"
    said = out.decode()
    assert said.startswith("StorageError:"), said
    assert "disk" in said and "full" in said, said
    # Room again: the same path opens, nothing was bricked.
    (small_disk / "filler").unlink()
    with EventLog.open(small_disk / "store") as log:
        log.append("s", [event()], expected_version=ANY)
        assert log.verify().ok


def test_commits_on_a_full_disk_say_the_disk_is_full(small_disk: Path) -> None:
    path = small_disk / "store"
    # Format 2 stores records as they are: format 3 would pack these into almost nothing.
    with EventLog.open(path, map_size=8 * 1024 * 1024, format_version=2) as log:
        log.append("s", [event()], expected_version=ANY)
        fill(small_disk, leave_bytes=64 * 1024)
        with pytest.raises(StorageError) as raised:
            for _ in range(200):
                log.append("s", [event(20_000)], expected_version=ANY)
        assert "disk" in str(raised.value) and "full" in str(raised.value), raised.value
        acknowledged = log.head
    (small_disk / "filler").unlink()
    with EventLog.open(path) as log:
        assert log.head == acknowledged
        assert log.verify().ok


def test_making_the_directory_on_a_full_disk_is_a_storage_error(small_disk: Path) -> None:
    # Use up the inodes: then mkdir itself fails with ENOSPC.
    made = 0
    with pytest.raises(OSError):
        while True:
            (small_disk / f"d{made}").mkdir()
            made += 1
    with pytest.raises(StorageError) as raised:
        EventLog.open(small_disk / "store" / "nested")
    assert "disk" in str(raised.value) and "full" in str(raised.value), raised.value
