"""The PostgreSQL log's schema: its tables, created and migrated in place, under a lock.

Opening a database creates the schema when it is missing and migrates an older one, once, however
many processes open it at the same moment; a schema this code cannot read is refused unchanged.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from eventlog.errors import CorruptStoreError, StorageError, StoreFormatError

FORMAT = "sessionlog-log/1"
SCHEMA_VERSION = 3
"""1: events, kv, meta. 2: adds `idempotency`, the keys of commands that may be retried. 3: adds
`stream_floors`, the last version of each stream a truncation deleted (the anchor is in `meta`)."""

_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL)",
        "CREATE TABLE events (position bigint PRIMARY KEY CHECK (position > 0),"
        ' stream text COLLATE "C" NOT NULL, version bigint NOT NULL CHECK (version > 0),'
        " record bytea NOT NULL, UNIQUE (stream, version))",
        # Records are hashed and often already dense; compressing them costs more than it saves.
        "ALTER TABLE events ALTER COLUMN record SET STORAGE EXTERNAL",
        "CREATE TABLE kv (key bytea PRIMARY KEY, value bytea NOT NULL)",
        "ALTER TABLE kv ALTER COLUMN value SET STORAGE EXTERNAL",
    ),
    2: (
        'CREATE TABLE idempotency (key text COLLATE "C" PRIMARY KEY,'
        ' stream text COLLATE "C" NOT NULL, first_position bigint NOT NULL,'
        " last_position bigint NOT NULL)",
    ),
    3: (
        'CREATE TABLE stream_floors (stream text COLLATE "C" PRIMARY KEY,'
        " version bigint NOT NULL CHECK (version > 0))",
    ),
}


def setup(conn: psycopg.Connection[Any], schema: str | None, readonly: bool, where: str) -> str:
    """Create or migrate the schema under a lock, so processes opening a new database at
    the same moment do it once; a schema this code cannot read is refused unchanged."""
    if schema is None:
        found = conn.execute("SELECT current_schema()").fetchone()
        if found is None or found[0] is None:
            raise StorageError(f"{where}: no schema on the search_path; pass ?schema=")
        schema = str(found[0])
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"sessionlog:{schema}",))
        if not readonly:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        version = _schema_version(conn, schema, where)
        if version == SCHEMA_VERSION:
            return schema
        if readonly and version == 0:
            raise StorageError(
                f"{where}: schema `{schema}` holds no sessionlog log; open it once writable "
                "to create one"
            )
        if readonly:
            raise StoreFormatError(
                f"{where}: schema `{schema}` is at version {version}, this version reads "
                f"{SCHEMA_VERSION}; open it once writable to migrate it",
                expected=SCHEMA_VERSION,
                got=version,
            )
        for step in range(version + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[step]:
                conn.execute(statement.encode())
        conn.execute(
            "INSERT INTO meta VALUES ('format', %s), ('schema_version', %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (FORMAT, str(SCHEMA_VERSION)),
        )
    return schema


def _schema_version(conn: psycopg.Connection[Any], schema: str, where: str) -> int:
    tables = {
        str(row[0])
        for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))
    }
    if "meta" not in tables:
        if tables & {"events", "kv"}:
            raise CorruptStoreError(
                f"{where}: schema `{schema}` has tables but is not a sessionlog log"
            )
        return 0
    rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    stated = rows.get("schema_version", "0")
    if not (isinstance(stated, str) and stated.isascii() and stated.isdigit()):
        raise CorruptStoreError(
            f"{where}: schema `{schema}` states schema version {stated!r}, not a number"
        )
    version = int(stated) if len(stated) <= 9 else 0
    if version == 0:  # a meta table is written with a version from 1
        raise CorruptStoreError(
            f"{where}: schema `{schema}` states schema version {stated!r}, which no version "
            "of sessionlog writes"
        )
    if rows.get("format") == FORMAT and version > SCHEMA_VERSION:
        raise StoreFormatError(
            f"{where}: schema `{schema}` is at version {version}, written by a newer version "
            f"of sessionlog; this version reads {FORMAT!r} up to version {SCHEMA_VERSION}",
            expected=SCHEMA_VERSION,
            got=version,
        )
    if rows.get("format") != FORMAT:
        raise CorruptStoreError(
            f"{where}: schema `{schema}` has format {rows.get('format')!r} version "
            f"{version}; this version reads {FORMAT!r} up to version {SCHEMA_VERSION}"
        )
    return version
