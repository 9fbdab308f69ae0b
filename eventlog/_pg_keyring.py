"""The keyring of a PostgreSQL store: one row per slot in table `keyring` of the store's schema.

The engine's keyring (`sessions/_keyring.py`) keeps wrapped data keys in fixed slots; here each
slot is a row. Zeroing a slot (a forgotten session's key) and replacing them all (a rotation)
end with `VACUUM FULL keyring`, which rewrites the small table into new files and drops the old
ones, so the dead row versions that held the key leave the table's files at once. The server's
write-ahead log still holds them until its segments are recycled (see docs/postgres.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

if TYPE_CHECKING:
    from eventlog._postgres import PostgresStorage

T = TypeVar("T")

_CREATE = "CREATE TABLE IF NOT EXISTS keyring (slot bigint PRIMARY KEY, record bytea NOT NULL)"


class PostgresKeyring:
    """The keyring's slots as rows (see the module's text); every call is its own commit."""

    def __init__(self, storage: PostgresStorage) -> None:
        self._storage = storage

    def _run(self, doing: str, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        from eventlog._postgres import translate

        try:
            with self._storage.pool.connection() as conn:
                return work(conn)
        except psycopg.Error as exc:
            raise translate(exc, f"keyring: {doing}") from exc

    def exists(self) -> bool:
        def work(conn: psycopg.Connection[Any]) -> bool:
            found = conn.execute("SELECT to_regclass('keyring') IS NOT NULL").fetchone()
            if not (found and found[0]):
                return False
            row = conn.execute("SELECT 1 FROM keyring WHERE slot = 0").fetchone()
            return row is not None

        return self._run("looking for the keyring", work)

    def read(self, slot: int) -> bytes:
        def work(conn: psycopg.Connection[Any]) -> bytes:
            if not self._table(conn):
                return b""
            row = conn.execute("SELECT record FROM keyring WHERE slot = %s", (slot,)).fetchone()
            return b"" if row is None else bytes(row[0])

        return self._run(f"reading slot {slot}", work)

    def count(self) -> int:
        def work(conn: psycopg.Connection[Any]) -> int:
            if not self._table(conn):
                return 0
            row = conn.execute("SELECT coalesce(max(slot) + 1, 0) FROM keyring").fetchone()
            return int(row[0]) if row else 0

        return self._run("counting slots", work)

    def write(self, slot: int, record: bytes) -> None:
        def work(conn: psycopg.Connection[Any]) -> None:
            conn.execute(_CREATE)
            conn.execute(
                "INSERT INTO keyring (slot, record) VALUES (%s, %s) "
                "ON CONFLICT (slot) DO UPDATE SET record = excluded.record",
                (slot, record),
            )
            if not record.strip(b"\x00"):
                conn.execute("VACUUM FULL keyring")

        self._run(f"writing slot {slot}", work)

    def replace(self, records: list[bytes]) -> None:
        def work(conn: psycopg.Connection[Any]) -> None:
            conn.execute(_CREATE)
            with conn.transaction():
                conn.execute("DELETE FROM keyring")
                with conn.cursor() as cursor:
                    cursor.executemany(
                        "INSERT INTO keyring (slot, record) VALUES (%s, %s)",
                        list(enumerate(records)),
                    )
            conn.execute("VACUUM FULL keyring")

        self._run("replacing the keyring", work)

    def tidy(self) -> None:
        """Nothing to tidy: a replacement is one transaction."""

    @staticmethod
    def _table(conn: psycopg.Connection[Any]) -> bool:
        found = conn.execute("SELECT to_regclass('keyring') IS NOT NULL").fetchone()
        return bool(found and found[0])
