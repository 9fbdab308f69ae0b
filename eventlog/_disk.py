"""The files of an LMDB store before LMDB maps them: the directory, the lock file, free space.

LMDB writes its lock file through a mapping, so a block missing behind it (a full disk) is
SIGBUS, not an error. This module makes sure the blocks exist, and that a new store has room to be
created whole, so a full disk is a `StorageError` saying so. It never calls LMDB.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from eventlog.errors import StorageError

LOCK_FILE_BYTES = 8192
"""The size LMDB gives a new lock file (a header and 126 reader slots of 64 bytes): allocated
before LMDB maps the file, so that writing through the mapping can never meet a missing block."""
NEW_STORE_BYTES_MIN = 256 * 1024
"""Free space a new store needs before it is created: its two meta pages, the first commits'
pages, and room to say so if the disk then fills. Below it, creating is refused as disk full
instead of leaving a half-written data file."""


def prepare_files(path: Path) -> None:
    """Make the directory and a fully allocated lock file, or raise `StorageError`.

    LMDB sizes the lock file with ftruncate (no blocks behind it) and writes it through a
    mapping: on a full disk that write kills the process with SIGBUS. Allocating the blocks
    first turns a full disk into ENOSPC here, where it can be reported."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        data_file = path / "data.mdb"
        if not data_file.exists() or data_file.stat().st_size == 0:
            free = free_bytes(path)
            if free < NEW_STORE_BYTES_MIN:
                raise full(f"creating a store in `{path}`", path, free)
        descriptor = os.open(path / "lock.mdb", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(descriptor).st_size < LOCK_FILE_BYTES:
                _allocate(descriptor, LOCK_FILE_BYTES)
        finally:
            os.close(descriptor)
    except StorageError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise full(f"creating a store in `{path}`", path, free_bytes(path)) from exc
        raise StorageError(f"creating a store in `{path}`: {exc.strerror}: {exc.filename}") from exc


def _allocate(descriptor: int, size: int) -> None:
    """Give the file real blocks up to `size`; where the platform or filesystem cannot, leave it
    to LMDB as before (only the full-disk case is then not caught here)."""
    allocate = getattr(os, "posix_fallocate", None)
    if allocate is None:
        return
    try:
        allocate(descriptor, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


def free_bytes(path: Path) -> int:
    """Bytes free to us on the filesystem holding `path` (or its nearest existing parent)."""
    for place in (path, *path.parents):
        try:
            found = os.statvfs(place)
        except OSError:
            continue
        return found.f_bavail * found.f_frsize
    return 0


def full(doing: str, path: Path, free: int) -> StorageError:
    return StorageError(
        f"{doing}: the disk holding `{path}` is full ({free:,} bytes free); nothing was written"
    )
