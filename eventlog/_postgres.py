"""The PostgreSQL backend: the storage interface over one schema of one database, for many machines.

Tables `events` (position, stream, version, record), `kv` (projection state), `idempotency` and
`meta` (schema version) are created and migrated here. Every write transaction first takes an
EXCLUSIVE lock on `events`, so writers on every machine queue and each reads the head, stream
versions and projection state as the one before it committed them: positions stay dense and no
cache outlives a transaction. This module owns every `psycopg` call and translates its errors;
it must never hold a connection, or a transaction, past the call or block that asked for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors
from psycopg import sql

from eventlog import _pg_schema
from eventlog._lease import (
    CLIENT_KEEPALIVES,
    KEEPALIVE_OPTIONS,
    Lease,
    advisory_key,
    holder_record,
)
from eventlog._pg_keyring import PostgresKeyring
from eventlog._pg_lease import take_lease
from eventlog._storage import Buffer, StorageTxn
from eventlog.errors import (
    ConcurrencyError,
    CorruptStoreError,
    LogClosedError,
    OutcomeUnknownError,
    SessionLogError,
    StorageError,
)

SCHEMA_VERSION = _pg_schema.SCHEMA_VERSION

CONNECT_TIMEOUT_S = 5
"""A connection attempt to a server that does not answer gives up after this: a down server is an
error the caller sees, not a hang."""
POOL_WAIT_S = 10.0
"""How long a transaction waits for a free pooled connection (or for the pool to reconnect)."""
LOCK_TIMEOUT_MS = 30_000
"""How long a writer waits for the append lock. Writers hold it for one transaction, so only a
stuck client holds it this long, and the server ends that one's transaction (below)."""
IDLE_IN_TRANSACTION_MS = 60_000
"""A client that opened a transaction and went silent (a paused or partitioned process) loses it
after this, so it cannot hold the append lock for everyone else forever."""
POOL_MAX_DEFAULT = 8
"""Connections per process: one writer at a time plus readers from a few threads."""
BEGIN_ATTEMPTS = 3
"""A pooled connection can be dead (the server restarted): beginning on another one is safe, as
nothing was sent yet. Past this many dead ones in a row the server is taken to be down."""
_SAVEPOINT = "sessionlog_sp"


def is_postgres_url(target: object) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def split_url(url: str) -> tuple[str, str | None, int]:
    """The libpq URL without our own parameters, the schema named by `schema=`, and `pool_max=`."""
    parts = urlsplit(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    schema: str | None = None
    pool_max = POOL_MAX_DEFAULT
    kept: list[tuple[str, str]] = []
    for name, value in params:
        if name == "schema":
            schema = value
        elif name == "pool_max":
            if not value.isdigit() or int(value) < 1:
                raise StorageError(f"{_redact(url)}: pool_max must be an int >= 1, got {value!r}")
            pool_max = int(value)
        else:
            kept.append((name, value))
    if schema is not None and (not schema or len(schema.encode()) > 63 or "\x00" in schema):
        raise StorageError(f"{_redact(url)}: schema must be 1 to 63 bytes, got {schema!r}")
    return urlunsplit(parts._replace(query=urlencode(kept))), schema, pool_max


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def translate(exc: psycopg.Error, doing: str) -> SessionLogError:
    """One place that maps psycopg's errors onto ours."""
    if isinstance(exc, pg_errors.LockNotAvailable):
        return StorageError(
            f"{doing}: another writer held the append lock past {LOCK_TIMEOUT_MS} ms"
        )
    if isinstance(exc, pg_errors.QueryCanceled):
        return StorageError(f"{doing}: the server cancelled the statement: {exc}")
    if isinstance(exc, psycopg.OperationalError):
        return StorageError(f"{doing}: the PostgreSQL server cannot be reached: {exc}")
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return StorageError(f"{doing}: no connection to PostgreSQL within {POOL_WAIT_S} s: {exc}")
    return StorageError(f"{doing}: {type(exc).__name__}: {exc}")


class PostgresStorage:
    outcome_may_be_unknown = True  # the connection can drop while COMMIT is on its way

    def __init__(self, url: str, *, sync: bool, readonly: bool) -> None:
        conninfo, schema, pool_max = split_url(url)
        self.where = _redact(url)
        self.readonly = readonly
        self._sync = sync
        self._closed = False
        self._conninfo = conninfo
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": CONNECT_TIMEOUT_S,
            "options": f"-c lock_timeout={LOCK_TIMEOUT_MS}"
            f" -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}",
        }
        try:
            with psycopg.connect(conninfo, **self._kwargs) as conn:
                self.schema = _pg_schema.setup(conn, schema, self.readonly, self.where)
        except psycopg.Error as exc:
            raise translate(exc, f"opening {self.where}") from exc
        self.channel = f"sessionlog:{self.schema}"[:63]
        self._search_path = sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema))
        self._commit_sql = sql.SQL("NOTIFY {}; COMMIT").format(sql.Identifier(self.channel))
        self._listener: psycopg.Connection[Any] | None = None
        self._listen_lock = threading.Lock()
        self.pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = (
            psycopg_pool.ConnectionPool(
                conninfo,
                kwargs=self._kwargs,
                min_size=1,
                max_size=pool_max,
                open=False,
                timeout=POOL_WAIT_S,
                reconnect_timeout=POOL_WAIT_S,
                configure=self._configure,
                name=f"sessionlog:{self.schema}",
            )
        )
        try:
            self.pool.open(wait=True, timeout=POOL_WAIT_S)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            self.pool.close()
            raise translate(exc, f"opening {self.where}") from exc

    def keyring_slots(self) -> PostgresKeyring:
        """Where the engine keeps its wrapped data keys on this server (`_pg_keyring.py`)."""
        return PostgresKeyring(self)

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(self._search_path)

    @contextmanager
    def reader(self) -> Iterator[StorageTxn]:
        # One snapshot for the whole view, as an LMDB read transaction gives.
        txn = self._begin(b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", write=False)
        try:
            yield txn
        finally:
            txn.abort()

    def begin_write(self) -> StorageTxn:
        if self.readonly:
            raise StorageError(f"{self.where} was opened read-only")
        # The lock is taken before anything is read: from here on this transaction sees every
        # commit of every earlier writer, and no later writer gets in until it ends. One round
        # trip for all of it (a simple query may hold several statements).
        begin = b"BEGIN; LOCK TABLE events IN EXCLUSIVE MODE"
        if not self._sync:
            begin += b"; SET LOCAL synchronous_commit TO off"
        return self._begin(begin, write=True)

    def _begin(self, begin: bytes, *, write: bool) -> _PgTxn:
        self._check_open()
        failure: psycopg.Error | None = None
        for _attempt in range(BEGIN_ATTEMPTS):
            try:
                conn = self.pool.getconn()
            except psycopg_pool.PoolTimeout as exc:
                raise translate(exc, f"beginning a transaction on {self.where}") from exc
            try:
                conn.execute(begin)
            except psycopg.OperationalError as exc:
                failure = exc
                self.pool.putconn(conn)  # a closed connection is dropped and replaced
                continue
            except psycopg.Error as exc:
                _rollback_quietly(conn)
                self.pool.putconn(conn)
                raise translate(exc, f"beginning a transaction on {self.where}") from exc
            return _PgTxn(self, conn, write=write)
        assert failure is not None
        raise translate(failure, f"beginning a transaction on {self.where}") from failure

    def release(self, conn: psycopg.Connection[Any]) -> None:
        self.pool.putconn(conn)

    def wait_for_commit(self, timeout_s: float) -> None:
        """Return when another writer commits (or after `timeout_s`). Only a wake-up: callers
        read by position afterwards, so a missed or dropped notification costs one timeout."""
        try:
            with self._listen_lock:
                if self._listener is None or self._listener.closed:
                    listener = psycopg.connect(self._conninfo, **self._kwargs)
                    listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self._listener = listener
                for _note in self._listener.notifies(timeout=timeout_s, stop_after=1):
                    pass
        except psycopg.Error:  # the server is away: sleep instead; the next read reports it
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            time.sleep(timeout_s)

    def lease(self, name: str) -> Lease:
        """Hold the advisory lock of `name` on a connection of its own until released: the server
        drops it when that connection ends, so a dead holder never keeps it."""
        self._check_open()
        holder = holder_record()
        kwargs = {
            **self._kwargs,
            "options": self._kwargs["options"] + KEEPALIVE_OPTIONS,
            **CLIENT_KEEPALIVES,
            "application_name": f"sessionlog lease {holder['pid']}@{holder['host']}"[:63],
        }
        key = advisory_key(self.schema, name)
        try:
            return take_lease(self._conninfo, kwargs, key, name, self.where, holder)
        except psycopg.Error as exc:
            raise translate(exc, f"taking the `{name}` lease of {self.where}") from exc

    def size_bytes(self) -> int:
        with self.reader() as txn:
            assert isinstance(txn, _PgTxn)
            row = txn.one(
                "SELECT pg_total_relation_size('events') + pg_total_relation_size('kv')"
                " + pg_total_relation_size('idempotency') + pg_total_relation_size('stream_floors')"
            )
        return int(row[0]) if row else 0

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.pool.close()
            if self._listener is not None:
                self._listener.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"the log at {self.where} is closed")


class _PgTxn(StorageTxn):
    """A transaction on one pooled connection; a child is a savepoint on the same connection."""

    __slots__ = ("_depth", "_head", "_store", "_write", "conn")

    def __init__(
        self,
        store: PostgresStorage,
        conn: psycopg.Connection[Any],
        *,
        write: bool,
        depth: int = 0,
    ) -> None:
        self._store = store
        self.conn = conn
        self._write = write
        self._depth = depth
        self._done = False
        # The newest record, read with the head: the log reads it next to chain the first append.
        # Records never change once written, so this can only be stale by being older.
        self._head: tuple[int, bytes] | None = None

    def _run(self, query: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        try:
            return self.conn.execute(query.encode(), params, binary=True)
        except psycopg.Error as exc:
            raise translate(exc, f"running `{query.split(' WHERE', maxsplit=1)[0]}`") from exc

    def one(self, query: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._run(query, params).fetchone()
        return row

    def last_position(self) -> int:
        if not self._write:  # a reader asking for the head rarely wants the record with it
            row = self.one("SELECT position FROM events ORDER BY position DESC LIMIT 1")
        else:
            row = self.one("SELECT position, record FROM events ORDER BY position DESC LIMIT 1")
            if row is not None:
                self._head = (int(row[0]), row[1])
        if row is not None:
            return int(row[0])
        anchor = self.anchor()
        return 0 if anchor is None else anchor[0]

    def anchor(self) -> tuple[int, bytes] | None:
        row = self.one("SELECT value FROM meta WHERE key = 'anchor'")
        if row is None:
            return None
        position, _, hash_hex = str(row[0]).partition(":")
        try:
            return int(position), bytes.fromhex(hash_hex)
        except ValueError as exc:
            raise CorruptStoreError(f"the log's anchor is damaged: {row[0]!r}") from exc

    def stream_floor(self, key: bytes) -> int:
        row = self.one("SELECT version FROM stream_floors WHERE stream = %s", (_stream_of(key),))
        return int(row[0]) if row else 0

    def truncate(
        self, before: int, anchor_hash: bytes, dropped: Sequence[tuple[bytes, int]]
    ) -> None:
        # Under the append lock this transaction took at its start: no writer can interleave.
        # The rows' space is reused or returned by VACUUM, which is the operator's to run.
        self._check_write()
        floors: dict[str, int] = {}
        for key, version in dropped:
            floors[_stream_of(key)] = version
        self._run("DELETE FROM events WHERE position < %s", (before,))
        if floors:
            self._run(
                "INSERT INTO stream_floors SELECT * FROM unnest(%s::text[], %s::bigint[])"
                " ON CONFLICT (stream) DO UPDATE SET version = excluded.version",
                (list(floors), list(floors.values())),
            )
        self._run(
            "INSERT INTO meta VALUES ('anchor', %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (f"{before - 1}:{anchor_hash.hex()}",),
        )

    def record(self, position: int) -> Buffer | None:
        if self._head is not None and self._head[0] == position:
            return self._head[1]
        row = self.one("SELECT record FROM events WHERE position = %s", (position,))
        return row[0] if row else None

    def records_after(self, after: int, limit: int) -> Iterator[tuple[int, Buffer]]:
        rows = self._run(
            "SELECT position, record FROM events WHERE position > %s ORDER BY position LIMIT %s",
            (after, limit),
        ).fetchall()
        return iter([(int(position), record) for position, record in rows])

    def keys_dense(self, after: int, count: int) -> bool:
        # Positions are a primary key: unique, so the count and the ends decide.
        row = self.one(
            "SELECT count(*), min(position), max(position) FROM (SELECT position FROM events "
            "WHERE position > %s ORDER BY position LIMIT %s) AS page",
            (after, count),
        )
        if row is None or not count:
            return not count
        return (int(row[0]), row[1], row[2]) == (count, after + 1, after + count)

    def values_after(self, after: int, limit: int) -> Iterable[Buffer]:
        rows = self._run(
            "SELECT record FROM events WHERE position > %s ORDER BY position LIMIT %s",
            (after, limit),
        ).fetchall()
        return [row[0] for row in rows]

    def records_around(
        self, positions: Iterable[int]
    ) -> Iterator[tuple[Buffer | None, Buffer | None]]:
        wanted = list(positions)
        needed = {p for p in wanted if p >= 1} | {p - 1 for p in wanted if p > 1}
        rows = self._run(
            "SELECT position, record FROM events WHERE position = ANY(%s)", (sorted(needed),)
        ).fetchall()
        found: dict[int, bytes] = {int(position): record for position, record in rows}
        out: list[tuple[Buffer | None, Buffer | None]] = []
        last = -2
        for position in wanted:
            before = None if position in (last + 1, 1) else found.get(position - 1)
            out.append((before, found.get(position)))
            last = position
        return iter(out)

    def stream_version(self, key: bytes) -> int:
        row = self.one(
            "SELECT version FROM events WHERE stream = %s ORDER BY version DESC LIMIT 1",
            (_stream_of(key),),
        )
        return int(row[0]) if row else self.stream_floor(key)

    def stream_positions(self, key: bytes, after_version: int, limit: int) -> list[int]:
        rows = self._run(
            "SELECT position FROM events WHERE stream = %s AND version > %s"
            " ORDER BY version LIMIT %s",
            (_stream_of(key), after_version, limit),
        ).fetchall()
        return [int(row[0]) for row in rows]

    def stream_position(self, key: bytes, version: int) -> int | None:
        row = self.one(
            "SELECT position FROM events WHERE stream = %s AND version = %s",
            (_stream_of(key), version),
        )
        return int(row[0]) if row else None

    def stream_positions_of(self, entries: Sequence[tuple[bytes, int]]) -> list[int | None]:
        if not entries:
            return []
        rows = self._run(
            "SELECT e.position FROM unnest(%s::text[], %s::bigint[]) WITH ORDINALITY"
            " AS q(stream, version, n) LEFT JOIN events e"
            " ON e.stream = q.stream AND e.version = q.version ORDER BY q.n",
            ([_stream_of(key) for key, _ in entries], [version for _, version in entries]),
        ).fetchall()
        return [None if row[0] is None else int(row[0]) for row in rows]

    def index_size(self) -> int:
        # The (stream, version) index is part of the events table: one entry per row.
        row = self.one("SELECT count(*) FROM events")
        return int(row[0]) if row else 0

    def put_records(
        self, first_position: int, records: Sequence[Buffer], key: bytes, first_version: int
    ) -> None:
        self._check_write()
        stream = _stream_of(key)
        rows = [
            (first_position + offset, stream, first_version + offset, bytes(record))
            for offset, record in enumerate(records)
        ]
        try:
            with self.conn.cursor() as cursor:
                if len(rows) == 1:
                    cursor.execute(
                        b"INSERT INTO events VALUES (%s, %s, %s, %s)", rows[0], binary=True
                    )
                else:
                    with cursor.copy(
                        b"COPY events (position, stream, version, record) FROM STDIN"
                        b" (FORMAT BINARY)"
                    ) as copy:
                        copy.set_types(["int8", "text", "int8", "bytea"])
                        for row in rows:
                            copy.write_row(row)
        except pg_errors.UniqueViolation as exc:
            # Only a writer that skipped the append lock can get here: report what it hit.
            if (exc.diag.constraint_name or "").endswith("stream_version_key"):
                raise ConcurrencyError(stream, first_version - 1, first_version) from exc
            raise StorageError(f"writing events: position {first_position} is taken") from exc
        except psycopg.Error as exc:
            raise translate(exc, "writing events") from exc

    def idempotent_positions(self, idempotency_key: str) -> tuple[str, int, int] | None:
        """The stream and positions of the append that carried `idempotency_key`, if any."""
        row = self.one(
            "SELECT stream, first_position, last_position FROM idempotency WHERE key = %s",
            (idempotency_key,),
        )
        return None if row is None else (str(row[0]), int(row[1]), int(row[2]))

    def remember_idempotency_key(
        self, idempotency_key: str, stream: str, first: int, last: int
    ) -> None:
        self._check_write()
        self._run(
            "INSERT INTO idempotency VALUES (%s, %s, %s, %s)",
            (idempotency_key, stream, first, last),
        )

    def kv_get(self, key: bytes) -> bytes | None:
        row = self.one("SELECT value FROM kv WHERE key = %s", (key,))
        return None if row is None else bytes(row[0])

    def kv_put(self, key: bytes, value: Buffer) -> None:
        self._check_write()
        self._run(
            "INSERT INTO kv VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, bytes(value)),
        )

    def kv_put_many(self, items: Sequence[tuple[bytes, Buffer]]) -> None:
        self._check_write()
        if not items:
            return
        latest = {key: bytes(value) for key, value in items}  # one row may change once a statement
        self._run(
            "INSERT INTO kv SELECT * FROM unnest(%s::bytea[], %s::bytea[])"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (list(latest), list(latest.values())),
        )

    def kv_delete(self, key: bytes) -> bool:
        self._check_write()
        return self._run("DELETE FROM kv WHERE key = %s", (key,)).rowcount > 0

    def kv_clear(self) -> None:
        self._check_write()
        self._run("DELETE FROM kv")

    def kv_scan(
        self, start: bytes, stop: bytes | None, reverse: bool, limit: int | None
    ) -> list[tuple[bytes, bytes]]:
        # bytea compares byte by byte, shorter first on a tie: the order LMDB keeps.
        query = "SELECT key, value FROM kv WHERE key >= %s"
        params: list[Any] = [start]
        if stop is not None:
            query += " AND key < %s"
            params.append(stop)
        query += " ORDER BY key DESC" if reverse else " ORDER BY key"
        if limit is not None:
            query += " LIMIT %s"
            params.append(limit)
        return [(bytes(k), bytes(v)) for k, v in self._run(query, params).fetchall()]

    def child(self) -> StorageTxn:
        self._check_write()
        depth = self._depth + 1
        self._run(f"SAVEPOINT {_SAVEPOINT}{depth}")
        return _PgTxn(self._store, self.conn, write=True, depth=depth)

    def commit(self) -> None:
        if self._already_ended():
            return
        if self._depth:
            self._run(f"RELEASE SAVEPOINT {_SAVEPOINT}{self._depth}")
            return
        try:
            if self._write:
                self.conn.execute(self._store._commit_sql)
            else:
                self.conn.execute(b"COMMIT")
        except psycopg.OperationalError as exc:
            raise OutcomeUnknownError(
                f"committing on {self._store.where}: the connection was lost during the commit, "
                f"which may or may not have happened ({exc}); retry with an idempotency key"
            ) from exc
        except psycopg.Error as exc:
            raise translate(exc, "committing") from exc
        finally:
            self._store.release(self.conn)

    def abort(self) -> None:
        if self._already_ended():
            return
        if self._depth:
            self._run(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}{self._depth}")
            self._run(f"RELEASE SAVEPOINT {_SAVEPOINT}{self._depth}")
            return
        try:
            _rollback_quietly(self.conn)
        finally:
            self._store.release(self.conn)

    def _check_write(self) -> None:
        if not self._write:
            raise StorageError("a read-only transaction cannot write")


def _rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.execute(b"ROLLBACK")
    except psycopg.Error:  # the connection is gone, and its transaction with it
        conn.close()


def _stream_of(key: bytes) -> str:
    return key[:-1].decode()
