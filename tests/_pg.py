"""Where the PostgreSQL tests get a server: `SESSIONLOG_TEST_PG`, the local one, or a private one.

A test run makes one database of its own and drops it at the end; each test takes a schema in it.
Tests that stop or replicate a server use `PrivateServer`, a cluster made with `initdb` in a temp dir
(run as an unprivileged user when the tests run as root), never the shared one.

When no server can be reached or started (or the driver is missing, or `SESSIONLOG_TEST_PG=none`),
`probe` says why and the PostgreSQL tests are deselected, with one line at the end saying how to
run them (`tests/_require.py`); with `SESSIONLOG_REQUIRE_POSTGRES=1` (what CI sets) they run and
fail instead, so CI always runs every test. psycopg is imported on first use, never when the test
suite loads.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests import _require

CANDIDATES = (
    "postgresql://postgres@127.0.0.1:5432/postgres",
    "postgresql://root@127.0.0.1:5432/postgres",
)
CONNECT_TIMEOUT_S = 3
_state: dict[str, Any] = {}
HOW_TO_RUN = (
    "to run them, start a PostgreSQL server on 127.0.0.1:5432 (user postgres or root), or set "
    "SESSIONLOG_TEST_PG=postgresql://user@host:port/db, or put PostgreSQL's initdb and pg_ctl on "
    "PATH so the tests start a private server"
)


def unavailable(reason: str) -> NoReturn:
    """Fail the calling test for want of PostgreSQL (remembering why, so later tests and `probe`
    need not look again)."""
    _state.setdefault("missing", reason)
    _require.missing("POSTGRES", f"no PostgreSQL: {reason}")


def probe() -> str | None:
    """None when this run has a server (found, or started here); else why not, and how to run
    the PostgreSQL tests."""
    try:
        admin_url()
    except pytest.fail.Exception:
        return f"{_state['missing']}; {HOW_TO_RUN}"
    return None


def driver() -> ModuleType:
    """psycopg, imported on first use; a missing driver is `unavailable`."""
    try:
        import psycopg
    except ModuleNotFoundError as exc:
        unavailable(f"the driver is not installed (no module `{exc.name}`)")
    return psycopg


def connect(url: str, **kwargs: Any) -> Any:
    """`psycopg.connect`, for tests that talk to the server directly."""
    return driver().connect(url, **kwargs)


def pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for path in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        return path
    unavailable(f"no server answers and PostgreSQL's `{name}` is not installed")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def with_database(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def reachable(url: str) -> bool:
    psycopg = driver()
    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False


class PrivateServer:
    """A throwaway PostgreSQL cluster on a free loopback port, stopped by `destroy()`."""

    def __init__(self, name: str = "pg", port: int | None = None) -> None:
        self.base = Path(tempfile.mkdtemp(prefix=f"sessionlog-{name}-"))
        self.data = self.base / "data"
        self.port = port or free_port()
        self.log_file = self.base / "server.log"
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:  # the server refuses to run as root
            self._as = {"user": "nobody", "group": "nogroup"}
            self.base.chmod(0o755)
            shutil.chown(self.base, "nobody", "nogroup")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            cwd=self.base,
            check=check,
            capture_output=True,
            text=True,
            timeout=120,
            **self._as,
        )

    def init(self, **settings: str) -> PrivateServer:
        self.run(pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E",
                 "UTF8", "--no-sync")  # fmt: skip
        self.configure(port=str(self.port), listen_addresses="'127.0.0.1'",
                       unix_socket_directories=f"'{self.base}'", **settings)  # fmt: skip
        return self

    def configure(self, **settings: str) -> None:
        lines = "".join(f"{key} = {value}\n" for key, value in settings.items())
        conf = self.data / "postgresql.auto.conf"
        with conf.open("a") as out:
            out.write(lines)

    def start(self) -> None:
        done = self.run(pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log_file), "-w",
                        "-t", "60", "start", check=False)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"starting PostgreSQL failed: {done.stderr}\n{self.server_log()}")

    def stop(self, mode: str = "fast") -> None:
        self.run(pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def server_log(self) -> str:
        try:
            return self.log_file.read_text()[-4000:]
        except OSError:
            return ""

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


def admin_url() -> str:
    """A superuser URL of a server for this test run: found, or started here."""
    if "admin" in _state:
        return str(_state["admin"])
    if "missing" in _state:
        unavailable(str(_state["missing"]))
    chosen = os.environ.get("SESSIONLOG_TEST_PG")
    if chosen == "none":
        unavailable("SESSIONLOG_TEST_PG=none")
    if chosen:
        if not reachable(chosen):
            raise RuntimeError(f"SESSIONLOG_TEST_PG={chosen} does not answer")
    else:
        chosen = next((url for url in CANDIDATES if reachable(url)), None)
    if chosen is None:
        server = PrivateServer("tests")
        atexit.register(server.destroy)
        try:
            server.init().start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            unavailable(f"no server answers and starting a private one failed: {exc}")
        _state["server"] = server
        chosen = server.url()
    _state["admin"] = chosen
    return chosen


def database_url() -> str:
    """The URL of this run's own database, created on first use and dropped by `drop_database`."""
    if "database" not in _state:
        admin = admin_url()
        name = f"sessionlog_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        with driver().connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        _state["database"] = name
    return with_database(admin_url(), _state["database"])


def fresh_schema_url(label: str = "t") -> str:
    """A URL naming a schema nobody has used: an empty log for one test."""
    return f"{database_url()}?schema={label}_{uuid.uuid4().hex[:12]}"


def drop_database() -> None:
    name = _state.pop("database", None)
    if name is not None:
        with driver().connect(admin_url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
