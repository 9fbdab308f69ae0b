"""Shared test set-up: hypothesis profiles, the log fixtures every conformance test runs on, and the
`store` fixture the engine tests share.

`HYPOTHESIS_PROFILE` picks the profile: `dev` (default, quick), `ci` (bounded so CI stays well
under 15 minutes), `deep` (a long soak, run by hand).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import projections as pj
from eventlog import EventLog
from sessions import SessionStore
from tests import _browser, _pg, _require

settings.register_profile(
    "dev",
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "deep",
    max_examples=2_000,
    stateful_step_count=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")

JOIN_TIMEOUT_S = 300
"""How long `run_processes` waits for a worker process."""

LOG_KINDS = ["memory", "lmdb", "postgres"]
STORE_KINDS = ["lmdb", "postgres"]
"""The durable backends a `SessionStore` runs on; `memory` is the reference they are compared to."""


def make_log(kind: str, path: Path) -> EventLog:
    if kind == "memory":
        return EventLog.memory()
    if kind == "postgres":
        return EventLog.open(_pg.fresh_schema_url())
    return EventLog.open(path / "log")


def run_processes(target: Callable[..., None], args: Sequence[tuple[Any, ...]]) -> None:
    """Run `target(*one)` for each `one` of `args`, each in a process of its own (spawned, so no
    log or store is inherited), all at once; every one must exit with status 0."""
    ctx = multiprocessing.get_context("spawn")
    processes = [ctx.Process(target=target, args=one) for one in args]
    for process in processes:
        process.start()
    for process in processes:
        process.join(JOIN_TIMEOUT_S)
    codes = [process.exitcode for process in processes]
    assert codes == [0] * len(processes), f"worker exit codes {codes}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Drop this run's PostgreSQL database (made on first use by `tests/_pg.py`)."""
    _pg.drop_database()


def _tmpfs() -> str | None:
    """None when this process can mount a tmpfs (the full-disk tests); else why not."""
    with tempfile.TemporaryDirectory() as where:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", where],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            return f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}"
        subprocess.run(["umount", "-l", where], check=False)
    return None


MACHINE_PROBES: dict[str, Callable[[], str | None]] = {
    "POSTGRES": _pg.probe,
    "BROWSER": _browser.probe,
    "STRACE": lambda: (
        None if shutil.which("strace") else "strace is not installed (the Debian package `strace`)"
    ),
    "TMPFS": _tmpfs,
}
_deselected: dict[str, tuple[int, str]] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(what): the test needs POSTGRES, BROWSER, STRACE or TMPFS"
    )


DEEP_TIMEOUT_S = 6 * 3600
"""A test's time limit under the `deep` profile: its thousands of examples, each up to 200 steps
long, take far longer than the 900 s that catch a hung test in the other profiles (the session
state machine ran into that limit mid-example)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests needing what this machine lacks and the run does not require; under the
    `deep` profile, give every test that did not set its own limit `DEEP_TIMEOUT_S`."""
    _deselected.update(_require.deselect_missing(config, items, MACHINE_PROBES))
    if PROFILE == "deep":
        for item in items:
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(DEEP_TIMEOUT_S))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One loud line for each thing whose tests were deselected, saying how to run them."""
    for what, (count, reason) in sorted(_deselected.items()):
        terminalreporter.write_line(
            f"{count} tests needing {what} DESELECTED: {reason}; "
            f"SESSIONLOG_REQUIRE_{what}=1 makes that a failure",
            yellow=True,
            bold=True,
        )


@pytest.fixture(params=LOG_KINDS)
def log_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def log(log_kind: str, tmp_path: Path) -> Iterator[EventLog]:
    """An empty log of each kind: the in-memory reference, LMDB in a temp dir, and PostgreSQL in a
    schema of its own."""
    with make_log(log_kind, tmp_path) as opened:
        yield opened


@pytest.fixture
def log_factory(tmp_path: Path) -> Iterator[Callable[[str], EventLog]]:
    opened: list[EventLog] = []

    def factory(kind: str) -> EventLog:
        made = make_log(kind, tmp_path / f"{kind}-{len(opened)}")
        opened.append(made)
        return made

    yield factory
    for item in opened:
        item.close()


def store_target_of(kind: str, path: Path) -> str:
    """Where a new empty store on `kind` lives: directory `path` for LMDB, a schema of its own for
    PostgreSQL, nothing (the empty string) for the in-memory reference store."""
    if kind == "postgres":
        return _pg.fresh_schema_url("s")
    if kind == "lmdb":
        return str(path)
    if kind == "memory":
        return ""
    raise ValueError(
        f"store_target_of: kind must be one of {STORE_KINDS} or 'memory', got {kind!r}"
    )


def open_store(kind: str, target: str, **options: Any) -> SessionStore:
    """The store on `kind` at `target` (see `store_target_of`)."""
    if kind == "memory":
        return SessionStore.memory(**options)
    return SessionStore.open(target, **options)


def assert_store_consistent(store: SessionStore) -> None:
    """The store's log verifies and every projection equals what a rebuild from the log derives.

    Runs in this process (`store.verify(projections=True)` walks an LMDB store in a child process,
    which costs a process start per test)."""
    report = store.log.verify(isolated=False)
    assert report.ok, f"the log does not verify: {report.problem}"
    _, problem = pj.check(store.log)
    assert problem is None, f"the projections differ from a rebuild: {problem}"


def refused(
    store: SessionStore, error: type[BaseException], text: str, call: Callable[[], object]
) -> BaseException:
    """`call` raises `error` mentioning `text`, and writes nothing."""
    head = store.log.head
    with pytest.raises(error, match=re.escape(text)) as caught:
        call()
    assert store.log.head == head
    return caught.value


def assert_rebuild_changes_nothing(store: SessionStore) -> None:
    """`store.rebuild()` leaves every projection key as the incremental fold had it."""
    with store.log.view() as view:
        before = pj.dump(view)
    store.rebuild()
    with store.log.view() as view:
        assert pj.dump(view) == before


@pytest.fixture
def store_kind() -> str:
    """The backend of `store`: LMDB. A module that overrides this fixture with
    `params=STORE_KINDS` runs its tests on every backend (`"memory"` adds the reference store)."""
    return "lmdb"


@pytest.fixture
def store_options() -> dict[str, Any]:
    """Keyword arguments `store` is opened with; a module overrides this fixture to change them."""
    return {}


@pytest.fixture
def store_target(store_kind: str, tmp_path: Path) -> str:
    """Where `store` lives, for a test that opens it again (in another process, say)."""
    return store_target_of(store_kind, tmp_path / "store")


@pytest.fixture
def store(
    store_kind: str, store_target: str, store_options: dict[str, Any]
) -> Iterator[SessionStore]:
    """An empty `SessionStore` on `store_kind`. On teardown, unless the test closed it, its log
    must verify and its projections must equal a rebuild from the log."""
    with open_store(store_kind, store_target, **store_options) as opened:
        yield opened
        if not opened.log.closed:
            assert_store_consistent(opened)


@pytest.fixture
def make_store(store_kind: str, tmp_path: Path) -> Iterator[Callable[..., SessionStore]]:
    """Opens more empty stores on `store_kind` (keyword arguments go to the constructor); each is
    checked on teardown like `store`."""
    opened: list[SessionStore] = []
    with ExitStack() as stack:

        def make(**options: Any) -> SessionStore:
            target = store_target_of(store_kind, tmp_path / f"store-{len(opened)}")
            opened.append(stack.enter_context(open_store(store_kind, target, **options)))
            return opened[-1]

        yield make
        for made in opened:
            if not made.log.closed:
                assert_store_consistent(made)
