"""Which backend a path or URL names, opened: `EventLog.open` hands the result to the log.

A `postgresql://` (or `postgres://`) URL is a PostgreSQL store (`eventlog/_postgres.py`), which
needs psycopg; anything else is the directory of an LMDB store (`eventlog/_lmdb.py`). Each
backend is imported only when asked for, so neither driver is needed for the other, nor for the
in-memory log.
"""

from __future__ import annotations

import os

from eventlog._handles import FORK_ADVICE, open_on
from eventlog._storage import Storage
from eventlog.errors import ConfigurationError, StorageError


def open_storage(
    path: str | os.PathLike[str],
    *,
    map_size: int,
    sync: bool,
    readonly: bool,
    headroom_bytes: int,
    format_version: int,
) -> tuple[Storage, str]:
    """The storage at `path` and the description the log gives it in messages (see
    `EventLog.open` for the options; the LMDB ones do not apply to PostgreSQL)."""
    if isinstance(path, str) and path.startswith(("postgresql://", "postgres://")):
        try:
            from eventlog._postgres import PostgresStorage
        except ModuleNotFoundError as exc:
            if exc.name is None or not exc.name.startswith("psycopg"):
                raise
            raise ConfigurationError(
                f"a postgresql:// store needs the PostgreSQL driver, which is not installed "
                f"(no module `{exc.name}`): install the extra with "
                f"pip install 'sessionlog-engine[postgres]'"
            ) from exc
        pg = PostgresStorage(path, sync=sync, readonly=readonly)
        return pg, f"postgresql:{pg.where}"
    from eventlog._lmdb import LmdbStorage

    if open_on(path, forked=True) is not None:
        raise StorageError(f"the store `{path}` was open when this process forked: {FORK_ADVICE}")
    storage = LmdbStorage(
        path,
        map_size=map_size,
        sync=sync,
        readonly=readonly,
        headroom_bytes=headroom_bytes,
        format_version=format_version,
    )
    return storage, f"lmdb:{path}"
