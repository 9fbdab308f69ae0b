"""Leases: a named claim on a store, held while its holder lives and ended by the system when the
holder's process ends, however it ends (a SIGKILL included).

LMDB: an exclusive `flock` on `<store>/<name>.lease`, which the kernel drops with the last open
descriptor; PostgreSQL: a session-level advisory lock on a connection of the lease's own, which
the server drops with the connection; memory: a name on the storage object. Nothing here reads a
clock or a pid to decide who holds a lease, so a new holder knows every earlier one is gone. Who
holds it (pid, host, since) is recorded only to say so in the refusal.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eventlog.errors import InvalidArgumentError, LeaseHeldError, LeaseLostError, StorageError

_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_HOLDER_BYTES_MAX = 1024
"""The holder record of a lease file is a short JSON line; more than this is not ours to read."""
KEEPALIVE_OPTIONS = (
    " -c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"
)
"""Server-side TCP keepalives of a lease connection: if the holder's machine vanishes without
closing the socket, the server ends the session, and so the lease, within about 25 s."""
CLIENT_KEEPALIVES: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 25_000,
}
"""The same on the holder's side (libpq's settings): if the server vanishes, a query on the lease
connection fails within about 25 s instead of waiting until TCP gives up, minutes later, so a
check of the lease never hangs the holder."""


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"lease: the name must be 1 to 32 of a-z, 0-9, _ and -, starting with a letter: {name!r}"
        )
    return name


def holder_record() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another holder"
    return f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}"


class Lease:
    """A held lease; `release()` (or leaving the `with` block) ends it. Releasing twice is fine.

    A lease can also end without its holder: a PostgreSQL lease lives on a connection, and when
    that connection drops (a network fault, a server restart, an administrator ending it) the
    server lets the lock go. `check()` asks whether it is still held; a holder that guards
    something with it checks now and then and stops when it is lost. A file lease or an in-memory
    one ends only with its process, so for them `check()` has nothing to ask."""

    def __init__(
        self,
        name: str,
        where: str,
        holder: dict[str, Any],
        release: Callable[[], None],
        probe: Callable[[], bool] | None = None,
    ) -> None:
        self.name = name
        self.where = where
        self.holder = holder
        self._release: Callable[[], None] | None = release
        self._probe = probe
        self.lost = False
        """Set once `check()` found the lease gone."""

    @property
    def held(self) -> bool:
        return self._release is not None and not self.lost

    def check(self) -> None:
        """Raise `LeaseLostError` when the lease ended without being released (and from then on);
        a released lease raises nothing. Blocks for one round trip on PostgreSQL."""
        if self._release is None:
            return
        probe = None if self.lost else self._probe
        if probe is not None and not probe():  # lost for good: a late answer never undoes it
            self.lost = True
        if self.lost:
            raise LeaseLostError(self.name, self.where)

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def file_lease(directory: Path, name: str, where: str) -> Lease:
    """An exclusive `flock` on `<directory>/<name>.lease`. A flock belongs to the open file, so a
    second claim in the same process is refused as well."""
    path = directory / f"{name}.lease"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StorageError(f"{where}: cannot open the lease file `{path.name}`: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            found = _read_holder(os.pread(fd, _HOLDER_BYTES_MAX, 0))
        finally:
            os.close(fd)
        raise LeaseHeldError(name, where, describe(found)) from None
    except OSError as exc:
        os.close(fd)
        raise StorageError(f"{where}: cannot lock `{path.name}`: {exc}") from exc
    holder = holder_record()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode() + b"\n", 0)
    except OSError as exc:
        os.close(fd)
        raise StorageError(f"{where}: cannot write the lease file `{path.name}`: {exc}") from exc

    def release() -> None:
        try:
            os.ftruncate(fd, 0)  # a later reader must not name a holder that is gone
        except OSError:
            pass  # the lock still ends with the descriptor, which is what counts
        os.close(fd)

    return Lease(name, where, holder, release)


def _read_holder(raw: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(raw)
    except ValueError:  # empty (being written) or not ours: the refusal just says less
        return None
    return found if isinstance(found, dict) else None


def memory_lease(held: set[str], lock: threading.RLock, name: str, where: str) -> Lease:
    """A name in `held`, the in-memory log's lease table (the log dies with its process)."""
    with lock:
        if name in held:
            raise LeaseHeldError(name, where, "this process")
        held.add(name)

    def release() -> None:
        with lock:
            held.discard(name)

    return Lease(name, where, holder_record(), release)


def advisory_key(schema: str, name: str) -> int:
    """The bigint key of the lease `name` of `schema`, for `pg_try_advisory_lock(bigint)`."""
    digest = hashlib.blake2b(f"sessionlog-lease:{schema}:{name}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)
