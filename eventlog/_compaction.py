"""Compacting an LMDB store's files: a compact copy of the environment put in place of the original.

LMDB reuses freed pages but never shrinks its data file; after a truncation (`EventLog.truncate`)
most of the file can be free pages. `compact_files` copies the live pages into a fresh file (LMDB's
own compacting copy) and renames it over `data.mdb`, which is atomic: a crash leaves the old file
or the new one, never a mix, and at worst a leftover copy that the next run removes.

Only when no other process has the store open: every process with an LMDB environment open holds
a shared lock on the first byte of `lock.mdb`, so this takes that byte exclusively, and refuses
when it cannot. While it holds it, a process opening the store waits in LMDB's open until the new
file is in place (writers and readers alike, except a read-only open that had already opened the
old file: it reads the store as it was, unchanged in content, until it reopens). It then opens the
store once itself, which resets the lock file from the new file's meta pages, as LMDB does for the
first process to open a store. It never changes an event or a projection key.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import lmdb

from eventlog._lmdb_errors import translate
from eventlog.errors import InvalidArgumentError, StorageError, StoreBusyError

_COPY_PREFIX = ".compact-"
"""The directory inside the store the copy is written in: the same file system, so the rename is
atomic. One left by a killed run is removed by the next."""


def compact_files(path: Path) -> tuple[int, int]:
    """Replace the data file of the LMDB store in `path` with a compact copy; returns its size
    in bytes before and after. `StoreBusyError` while another process has the store open."""
    data_file, lock_file = path / "data.mdb", path / "lock.mdb"
    if not data_file.is_file() or not lock_file.is_file():
        raise InvalidArgumentError(f"compact: no LMDB store at `{path}`", got=str(path))
    before = data_file.stat().st_size
    guard = os.open(lock_file, os.O_RDWR)
    try:
        try:
            fcntl.lockf(guard, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError as exc:
            raise StoreBusyError(
                f"compact: another process has the store `{path}` open; stop it first "
                "(compacting replaces the data file under every open handle)",
                where=str(path),
            ) from exc
        for stale in path.glob(_COPY_PREFIX + "*"):
            shutil.rmtree(stale, ignore_errors=True)
        copy_dir = path / f"{_COPY_PREFIX}{os.getpid()}"
        copy_dir.mkdir()
        try:
            _copy(path, copy_dir)
            os.replace(copy_dir / "data.mdb", data_file)
            _fsync_dir(path)
        finally:
            shutil.rmtree(copy_dir, ignore_errors=True)
        _reset_lock_file(path)  # also ends the guard: closing the environment drops our locks
    finally:
        os.close(guard)
    return before, data_file.stat().st_size


def _copy(path: Path, copy_dir: Path) -> None:
    """LMDB's compacting copy of `path` into `copy_dir`, made durable. The environment is opened
    without LMDB's locking: the guard excludes every other process already."""
    try:
        env = lmdb.open(str(path), subdir=True, readonly=True, lock=False, max_dbs=8)
        try:
            env.copy(str(copy_dir), compact=True)
        finally:
            env.close()
    except lmdb.Error as exc:
        raise translate(exc, f"compact: copying `{path}`") from exc
    descriptor = os.open(copy_dir / "data.mdb", os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _reset_lock_file(path: Path) -> None:
    """Open the store once: this process holds the lock file's first byte, so LMDB takes it as
    the first opener and rewrites the lock file from the new data file (its last transaction
    id, no readers), then lets the waiting openers in."""
    try:
        lmdb.open(str(path), subdir=True, max_dbs=8).close()
    except lmdb.Error as exc:
        raise translate(exc, f"compact: reopening `{path}`") from exc


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    except OSError as exc:
        raise StorageError(f"compact: syncing the directory `{path}`: {exc}") from exc
    finally:
        os.close(descriptor)
