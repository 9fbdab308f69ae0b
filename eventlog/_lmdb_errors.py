"""How the LMDB backend turns `lmdb` errors into sessionlog's: damage, a full map or disk, a store
that cannot be opened. Only `eventlog/_lmdb.py` and the file compaction call it; nothing else
sees an `lmdb.Error`.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ParamSpec, TypeVar

import lmdb

from eventlog._disk import free_bytes, full
from eventlog.errors import CorruptStoreError, SessionLogError, StorageError, StoreFullError

_T = TypeVar("_T")
_P = ParamSpec("_P")


def translate(exc: lmdb.Error, doing: str) -> SessionLogError:
    """One place that maps LMDB's errors onto ours."""
    if isinstance(exc, lmdb.MapFullError):
        return StoreFullError(f"{doing}: the store's map is full; it has been grown, retry")
    if isinstance(exc, (lmdb.CorruptedError, lmdb.InvalidError, lmdb.PageNotFoundError)):
        return CorruptStoreError(f"{doing}: the data file is damaged: {exc}")
    if isinstance(exc, lmdb.VersionMismatchError):
        return CorruptStoreError(f"{doing}: written by an incompatible LMDB version: {exc}")
    return StorageError(f"{doing}: {exc}")


def reads(method: Callable[_P, _T]) -> Callable[_P, _T]:
    """Translate the `lmdb.Error` a read meets (a damaged page: `CorruptedError`,
    `PageNotFoundError`) into ours, for reads inside write transactions as well as readers."""

    @functools.wraps(method)
    def read(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(*args, **kwargs)
        except lmdb.Error as exc:
            raise translate_read(exc, f"reading ({method.__name__})") from exc

    return read


def translated(items: Iterator[_T], doing: str) -> Iterator[_T]:
    """`items`, with `lmdb.Error` met while iterating translated into ours."""
    try:
        yield from items
    except lmdb.Error as exc:
        raise translate_read(exc, doing) from exc


def translate_read(exc: lmdb.Error, doing: str) -> SessionLogError:
    """`translate`, for an error met by a read. LMDB marks a transaction failed (MDB_BAD_TXN)
    when the lookup that opens a table in it meets a damaged page, and says no more: on a read,
    that is damage too."""
    if isinstance(exc, lmdb.BadTxnError):
        return CorruptStoreError(f"{doing}: the data file is damaged: {exc}")
    return translate(exc, doing)


def errno_of(exc: lmdb.Error) -> int | None:
    code = exc.args[1] if len(exc.args) > 1 else None
    if isinstance(code, int):
        return code
    return errno.EIO if "Input/output error" in str(exc) else None


def open_failure(exc: lmdb.Error, path: Path, readonly: bool) -> SessionLogError:
    data_file = path / "data.mdb"
    size = data_file.stat().st_size if data_file.exists() else None
    if isinstance(exc, lmdb.DiskError):
        return full(f"opening `{path}`", path, free_bytes(path))
    if size == 0 and readonly:
        return StorageError(
            f"opening `{path}`: no store there yet (its data file is empty: being created, or "
            "its creator was killed); open it writable to create it"
        )
    if size is not None and 0 < size < 2 * 4096:
        # LMDB re-initialises only an empty file; a shorter-than-two-pages one is damage.
        return CorruptStoreError(f"`{data_file}` is {size} bytes: truncated or not an LMDB store")
    return translate(exc, f"opening `{path}`")
