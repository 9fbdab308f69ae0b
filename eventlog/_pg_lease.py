"""A lease on a PostgreSQL store: a session-level advisory lock on a connection of its own.

The server drops the lock when that connection ends, so a dead holder never keeps it; and a
holder whose connection dropped has lost it without being told, which `Lease.check()` finds out
by asking the server (see `eventlog/_lease.py`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import psycopg

from eventlog._lease import Lease, describe
from eventlog.errors import LeaseHeldError


def take_lease(
    conninfo: str, kwargs: dict[str, Any], key: int, name: str, where: str, holder: dict[str, Any]
) -> Lease:
    """Connect and take the advisory lock `key`; `LeaseHeldError` naming the session that holds
    it. Raises psycopg's errors for the caller to translate."""
    conn = psycopg.connect(conninfo, **kwargs)
    try:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if row is None or not row[0]:
            found = conn.execute(
                "SELECT a.application_name, a.backend_start FROM pg_locks l"
                " JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'"
                " AND l.granted AND l.objsubid = 1 AND l.classid = %s AND l.objid = %s"
                " AND l.database = (SELECT oid FROM pg_database"
                " WHERE datname = current_database())",
                _halves(key),
            ).fetchone()
            who = (
                describe(None)
                if found is None
                else f"`{found[0]}` (connected since {found[1]:%Y-%m-%dT%H:%M:%S%z})"
            )
            raise LeaseHeldError(name, where, who)
    except BaseException:
        conn.close()
        raise
    return Lease(name, where, holder, conn.close, partial(_holds, conn, key))


def _halves(key: int) -> tuple[int, int]:
    """The bigint advisory key as `pg_locks` shows it: high half in classid, low in objid."""
    return (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF


def _holds(conn: psycopg.Connection[Any], key: int) -> bool:
    """Whether the lease connection `conn` still holds the advisory lock `key`; any failure to
    ask means the connection, and the lock with it, is gone."""
    if conn.closed or conn.broken:
        return False
    try:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND pid = pg_backend_pid() AND objsubid = 1 AND classid = %s AND objid = %s",
            _halves(key),
        ).fetchone()
    except psycopg.Error:
        return False
    return row is not None and row[0] == 1
