"""A real `sessionlog serve` in a child process on a free loopback port, for the service tests.

The server is the command a user runs (uvicorn, the CLI's flags, keys from the environment); the
tests talk to it over HTTP only, and may kill it (SIGKILL) and start it again on the same store.
`serving(app)` runs an app the test made (`create_app`) on uvicorn in a thread instead, for tests
that hold the store or the app themselves.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from service.client import Client

ROOT = Path(__file__).resolve().parent.parent


def new_key() -> str:
    return secrets.token_urlsafe(32)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """`Server(store).start()`; `url`, `admin_key`, `client()`; `stop()` (SIGTERM) or `kill()`."""

    def __init__(
        self,
        store: str | Path,
        *,
        workers: int = 1,
        port: int | None = None,
        log_path: Path | None = None,
        options: tuple[str, ...] = (),
    ) -> None:
        self.store = str(store)
        self.workers = workers
        self.port = port or free_port()
        self.admin_key = new_key()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = log_path or Path(self.store + ".server.log")
        self.options = options
        """More flags of `serve`, as the command line takes them."""

    def start(self, timeout_s: float = 30.0) -> Server:
        env = {**os.environ, "SESSIONLOG_API_KEYS": f"admin={self.admin_key}"}
        env["PYTHONPATH"] = str(ROOT)
        command = [sys.executable, "-m", "sessionlog", "--store", self.store, "serve"]
        command += ["--port", str(self.port), "--workers", str(self.workers), *self.options]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=log, cwd=ROOT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/v1/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"the server did not start: {self.log_path.read_text()[-2000:]}")

    def client(self, token: str | None = None, **options: object) -> Client:
        return Client(self.url, token or self.admin_key, **options)  # type: ignore[arg-type]

    def stop(self, timeout_s: float = 30.0) -> int:
        process = self.process
        if process is None or process.poll() is not None:
            return 0 if process is None else int(process.returncode)
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise

    def kill(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` on a uvicorn server in a thread, until the block ends; yields its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
