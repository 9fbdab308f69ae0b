"""Group commit: concurrent writers of one process share durable commits (`sessions/_group.py`), on
LMDB and on PostgreSQL.

What must hold: a command in a shared commit behaves as if it ran alone right after the commands
queued before it (a refusal fails only its own caller and undoes only its own savepoint; the
transcript's order, `expected_length` and idempotency keys see the earlier commands of the batch);
and nothing a caller saw acknowledged is lost when the process is SIGKILLed mid-run.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import projections as pj
import sessions._group as group_module
from sessions import LengthConflictError, SessionStore, UnknownSessionError
from tests._killer import KillPlan, kill_at_random_moment, start_writer
from tests.conftest import PROFILE, STORE_KINDS

WRITER = Path(__file__).resolve().parent / "_group_crash_writer.py"
THREADS = 16
KILLS = {"dev": 3, "ci": 8, "deep": 40}.get(PROFILE, 3)
PLAN = KillPlan(
    weights=(0, 3, 7), startup_max_s=0.0, anytime_max_s=0.3, steps=(16, 400), in_step_max_s=0.003
)


def message(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def contents(store: SessionStore, sid: str) -> list[str]:
    return [m["content"] for m in store.messages(sid)]


class Batch:
    """Holds the store's group commit after a first command, so the commands started meanwhile
    queue up and then share the next commit."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.release = threading.Event()
        self.held = threading.Event()
        self.outcomes: dict[str, Any] = {}
        self.threads: list[threading.Thread] = []

        def hold(_: object) -> None:
            if not self.held.is_set():
                self.held.set()
                assert self.release.wait(30)

        self.subscription = store.log.subscribe(hold)  # runs on the leader, after its commit

    def start(self, name: str, command: Callable[[], Any]) -> None:
        def call() -> None:
            try:
                self.outcomes[name] = ("ok", command())
            except Exception as exc:  # each outcome is checked by the test
                self.outcomes[name] = ("error", exc)

        thread = threading.Thread(target=call, daemon=True)  # a hung one fails the test, not CI
        self.threads.append(thread)
        waiting = self.store._group.waiting
        thread.start()
        deadline = time.monotonic() + 30
        while self.store._group.waiting <= waiting:  # queued in the order started
            assert time.monotonic() < deadline, f"{name} never queued"
            time.sleep(0.001)

    def finish(self) -> dict[str, Any]:
        self.release.set()
        for thread in self.threads:
            thread.join(30)
        self.subscription.close()
        return self.outcomes


def hold_first_commit(store: SessionStore) -> Batch:
    batch = Batch(store)
    first = threading.Thread(target=store.inject, args=("a", message("first")))
    first.start()
    assert batch.held.wait(30), "the first commit never happened"
    batch.threads.append(first)
    return batch


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """LMDB, and PostgreSQL, where a shared commit is one `COMMIT` round trip for the batch."""
    kind: str = request.param
    return kind


@pytest.fixture
def store(store: SessionStore) -> SessionStore:
    """The shared `store` fixture with sessions `a` and `b` open."""
    for sid in ("a", "b"):
        store.open_session(sid)
    return store


def test_a_refused_command_in_a_shared_commit_fails_only_its_caller(store: SessionStore) -> None:
    batch = hold_first_commit(store)
    batch.start("a1", lambda: store.inject("a", message("a1")))
    batch.start("ghost", lambda: store.inject("ghost", message("lost")))
    batch.start("stale", lambda: store.inject("b", message("no"), expected_length=5))
    batch.start("bad", lambda: store.inject("b", {"role": ""}))
    batch.start("b1", lambda: store.inject("b", message("b1")))
    commits = store._group.commits
    outcomes = batch.finish()
    assert store._group.commits == commits + 1, "the five queued commands did not share a commit"
    assert outcomes["a1"] == ("ok", None)
    assert outcomes["b1"] == ("ok", None)
    assert isinstance(outcomes["ghost"][1], UnknownSessionError)
    assert isinstance(outcomes["stale"][1], LengthConflictError)
    assert outcomes["bad"][0] == "error"
    assert contents(store, "a") == ["first", "a1"]
    assert contents(store, "b") == ["b1"]
    assert not store.exists("ghost")
    assert store.verify(projections=True).ok


def test_a_command_that_raises_after_writing_is_undone_alone(store: SessionStore) -> None:
    # The engine's commands refuse before they write, so a batch runs them without savepoints;
    # one that breaks that rule must still fail alone, its own writes undone.
    def half_done() -> None:
        store.inject("b", message("half"))
        raise ValueError("refused after writing")

    batch = hold_first_commit(store)
    batch.start("a1", lambda: store.inject("a", message("a1")))
    batch.start("half", lambda: store._group.run(half_done))
    batch.start("b1", lambda: store.inject("b", message("b1")))
    commits = store._group.commits
    outcomes = batch.finish()
    assert isinstance(outcomes["half"][1], ValueError)
    assert outcomes["a1"] == ("ok", None)
    assert outcomes["b1"] == ("ok", None)
    assert store._group.commits == commits + 1, "the others did not still share one commit"
    assert contents(store, "a") == ["first", "a1"]
    assert contents(store, "b") == ["b1"]
    assert store.verify(projections=True).ok


def test_order_expected_length_and_idempotency_keys_hold_within_a_batch(
    store: SessionStore,
) -> None:
    batch = hold_first_commit(store)
    batch.start("x", lambda: store.inject("b", message("x"), expected_length=0))
    batch.start("x-again", lambda: store.inject("b", message("x2"), expected_length=0))
    batch.start("y", lambda: store.inject("b", message("y"), idempotency_key="k"))
    batch.start("y-again", lambda: store.inject("b", message("y2"), idempotency_key="k"))
    batch.start("z", lambda: store.inject("b", message("z"), expected_length=2))
    batch.start("many", lambda: store.inject_many("b", [message("m1"), message("m2")]))
    commits = store._group.commits
    outcomes = batch.finish()
    assert store._group.commits == commits + 1
    assert isinstance(outcomes["x-again"][1], LengthConflictError)
    assert outcomes["y-again"] == ("ok", None)
    assert outcomes["many"] == ("ok", 2)
    assert contents(store, "b") == ["x", "y", "z", "m1", "m2"]
    with store.log.view() as view:
        assert pj.projected_position(view) == view.head
    assert store.verify(projections=True).ok


def test_threads_and_coroutines_share_one_queue(store: SessionStore) -> None:
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()

    async def from_coroutine(text: str) -> None:
        await store._group.submit(lambda: store.inject("b", message(text)))

    def awaited(text: str) -> Callable[[], Any]:
        return lambda: asyncio.run_coroutine_threadsafe(from_coroutine(text), loop).result(30)

    try:
        batch = hold_first_commit(store)
        batch.start("t1", lambda: store.inject("b", message("t1")))
        batch.start("c1", awaited("c1"))
        batch.start("c2", awaited("c2"))
        batch.start("t2", lambda: store.inject("b", message("t2")))
        commits = store._group.commits
        outcomes = batch.finish()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(30)
        loop.close()
    assert store._group.commits == commits + 1, "threads and coroutines did not share a commit"
    assert all(outcome == ("ok", None) for outcome in outcomes.values()), outcomes
    assert contents(store, "b") == ["t1", "c1", "c2", "t2"]


def test_a_solo_command_gets_a_commit_of_its_own(store: SessionStore) -> None:
    batch = hold_first_commit(store)
    batch.start("a1", lambda: store.inject("b", message("a1")))
    batch.start("a2", lambda: store.inject("b", message("a2")))
    batch.start(
        "solo", lambda: store._group.run(lambda: store.inject("b", message("solo")), solo=True)
    )
    batch.start("b1", lambda: store.inject("b", message("b1")))
    batch.start("b2", lambda: store.inject("b", message("b2")))
    commits, shared = store._group.commits, store._group.shared
    outcomes = batch.finish()
    assert all(outcome[0] == "ok" for outcome in outcomes.values()), outcomes
    # Two shared commits of two commands each, around the solo one.
    assert (store._group.commits - commits, store._group.shared - shared) == (2, 4)
    assert contents(store, "b") == ["a1", "a2", "solo", "b1", "b2"]


def test_sixteen_threads_all_land_in_order(store: SessionStore) -> None:
    sids = [f"t{k}" for k in range(THREADS)]
    for sid in sids:
        store.open_session(sid)

    def write(sid: str) -> None:
        for index in range(25):
            store.inject(sid, message(f"{sid}:{index}"))

    threads = [threading.Thread(target=write, args=(sid,)) for sid in sids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for sid in sids:
        assert contents(store, sid) == [f"{sid}:{index}" for index in range(25)]
    assert store.log.head == 2 + THREADS + THREADS * 25
    assert store.verify(projections=True).ok


def test_a_leader_waits_for_the_last_batchs_writers_before_it_runs_a_command(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four writers share a commit, then each writes again: the first back leads and must not run
    # its command until the other three (held back here) have queued theirs. A command run while
    # writers are still on their way back competes with them for the interpreter's lock.
    monkeypatch.setattr(group_module, "GATHER_S", 10.0)  # the wait ends when all are back
    sids = [f"g{k}" for k in range(4)]
    for sid in sids:
        store.open_session(sid)
    queued: list[str] = []
    seen: dict[str, int] = {}

    def twice(k: int, sid: str) -> Callable[[], Any]:
        def second() -> None:
            seen[sid] = len(queued)  # how many of the second round had queued when this ran
            store.inject(sid, message("second"))

        def run() -> None:
            store.inject(sid, message("first"))
            if k:
                time.sleep(0.05)  # the first of them is back well before the others
            queued.append(sid)
            store._group.run(second)

        return run

    batch = hold_first_commit(store)
    for k, sid in enumerate(sids):
        batch.start(sid, twice(k, sid))
    commits, shared = store._group.commits, store._group.shared
    outcomes = batch.finish()
    assert all(outcome == ("ok", None) for outcome in outcomes.values()), outcomes
    assert seen == dict.fromkeys(sids, 4), seen
    assert (store._group.commits - commits, store._group.shared - shared) == (2, 8)
    for sid in sids:
        assert contents(store, sid) == ["first", "second"]


def acknowledged(lines: list[str]) -> dict[int, int]:
    """Per writer thread, how many injects it saw return."""
    done: dict[int, int] = {}
    for line in lines:
        if line.startswith("ack "):
            body = json.loads(line[4:])
            done[body["t"]] = max(done.get(body["t"], 0), body["i"] + 1)
    return done


@pytest.mark.parametrize("mode", ["threads", "tasks"])
def test_sigkilled_group_writers_lose_nothing_acknowledged(tmp_path: Path, mode: str) -> None:
    # 16 writer threads calling the store, or 16 asyncio tasks awaiting `sessions.aio`.
    path = tmp_path / "store"
    rng = random.Random(20_261_125)
    total = 0
    for round_no in range(KILLS):
        args = [str(path), str(round_no), mode]
        writer = start_writer(WRITER, "cmd", args, tmp_path / "stderr")
        kill_at_random_moment(writer, rng, PLAN)
        acked = acknowledged(writer.lines)
        total += sum(acked.values())
        issued = {t: 0 for t in range(THREADS)}
        for line in writer.lines:
            if line.startswith("cmd "):
                body = json.loads(line[4:])
                issued[body["t"]] = max(issued[body["t"]], body["i"] + 1)
        with SessionStore.open(path) as store:
            for thread in range(THREADS):
                mine = [
                    text
                    for text in contents(store, f"t{thread}")
                    if text.startswith(f"{round_no}:{thread}:")
                ]
                # In order, from the first, every acknowledged one, and none never issued.
                expected = [f"{round_no}:{thread}:{i}" for i in range(len(mine))]
                assert mine == expected, f"round {round_no} thread {thread}: out of order"
                assert acked.get(thread, 0) <= len(mine) <= issued[thread], (
                    f"round {round_no} thread {thread}: acknowledged {acked.get(thread, 0)}, "
                    f"issued {issued[thread]}, stored {len(mine)}"
                )
            report = store.log.verify()
            assert report.ok, f"round {round_no}: {report}"
            assert store.verify(projections=True).ok
    assert total > 0, "no round acknowledged anything: the kills tested nothing"


def test_asyncio_tasks_share_commits_in_the_order_they_awaited(tmp_path: Path) -> None:
    from sessions.aio import AsyncSessionStore

    async def main() -> tuple[list[str], list[list[str]], int, int]:
        async with await AsyncSessionStore.open(tmp_path / "store") as astore:
            await astore.open_session("shared")
            sids = [await astore.open_session(f"task{k}") for k in range(THREADS)]
            commits = astore.store._group.commits

            async def writer(sid: str) -> None:
                for index in range(10):
                    await astore.inject(sid, message(f"{sid}:{index}"))

            await asyncio.gather(*(writer(sid) for sid in sids))
            # Awaited together: queued, and so committed, in the order they were awaited.
            await asyncio.gather(*(astore.inject("shared", message(str(k))) for k in range(40)))
            shared = await astore.messages("shared")
            each = [await astore.messages(sid) for sid in sids]
            return (
                [m["content"] for m in shared],
                [[m["content"] for m in got] for got in each],
                astore.store._group.commits - commits,
                astore.store.log.head,
            )

    shared, each, commits, head = asyncio.run(main())
    assert shared == [str(k) for k in range(40)]
    for k, got in enumerate(each):
        assert got == [f"task{k}:{index}" for index in range(10)]
    assert commits >= 1, "concurrent tasks never shared a commit"
    assert head == 1 + THREADS + THREADS * 10 + 40


class _Interrupted(Exception):
    """Raised in the main thread by a signal, as Ctrl-C raises KeyboardInterrupt."""


def test_a_caller_interrupted_while_it_waits_still_commits_and_hangs_nobody(
    store: SessionStore,
) -> None:
    # The main thread queues a command behind a held commit and is interrupted by a signal while
    # it waits: its command must still commit before the interruption reaches it, and the caller
    # queued after it (woken by it, or led by it) must not wait forever.
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        batch = hold_first_commit(store)
        main = threading.get_ident()

        def later() -> None:
            deadline = time.monotonic() + 30
            while store._group.waiting < 1:  # the main thread has queued
                assert time.monotonic() < deadline
                time.sleep(0.001)
            batch.start("after", lambda: store.inject("b", message("after")))
            signal.pthread_kill(main, signal.SIGUSR1)
            time.sleep(0.05)
            batch.release.set()

        helper = threading.Thread(target=later, daemon=True)
        helper.start()
        with pytest.raises(_Interrupted):
            store.inject("a", message("interrupted"))
        helper.join(30)
        outcomes = batch.finish()
        assert not any(thread.is_alive() for thread in batch.threads), "a caller hangs"
        assert outcomes["after"] == ("ok", None)
        assert contents(store, "a") == ["first", "interrupted"]
        assert contents(store, "b") == ["after"]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_command_that_raises_after_truncating_is_undone_alone(store: SessionStore) -> None:
    # A truncation is a write too: a command of a batch that cut the log and then raised must
    # not leave its cut in the shared commit its neighbours commit.
    def cut_then_fail() -> None:
        with store.log.transaction() as tx:
            tx.truncate(before=2)
        raise RuntimeError("after the cut")

    batch = hold_first_commit(store)
    batch.start("cut", lambda: store._group.run(cut_then_fail))
    batch.start("b1", lambda: store.inject("b", message("b1")))
    outcomes = batch.finish()
    assert outcomes["b1"] == ("ok", None)
    assert isinstance(outcomes["cut"][1], RuntimeError)
    assert store.log.anchor[0] == 0, "the refused command's truncation was committed"
    assert contents(store, "b") == ["b1"]


def test_a_forked_child_gets_the_fork_error_not_a_hang(store: SessionStore) -> None:
    # fork() while a batch is being led copies a queue whose leader does not exist in the child:
    # a write there must be refused as any use of the log after fork() is, not wait forever.
    import os

    from eventlog import StorageError

    batch = hold_first_commit(store)
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only when the write is refused with the fork error
            try:
                store.inject("b", message("from the child"))
            except StorageError as exc:
                os._exit(0 if "forked" in str(exc) else 2)
            except BaseException:
                os._exit(3)
            os._exit(4)
        deadline = time.monotonic() + 20
        while (status := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if status[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's write hung")
        assert os.waitstatus_to_exitcode(status[1]) == 0
    finally:
        batch.finish()
    assert contents(store, "a") == ["first"]


@pytest.mark.needs("POSTGRES")
def test_a_batch_whose_commit_outcome_is_unknown_is_not_run_again() -> None:
    # On PostgreSQL the connection can drop while COMMIT is on its way: the batch may have been
    # committed, and running its commands again would write them twice. Each caller must hear
    # that the outcome is unknown, as a caller committing alone does. The server here ends the
    # first batch's connection from inside its COMMIT (a deferred trigger), once.
    from eventlog import OutcomeUnknownError
    from tests import _pg

    url = _pg.fresh_schema_url()
    schema = url.rsplit("schema=", 1)[1]
    with SessionStore.open(url) as store:
        for sid in ("a", "b"):
            store.open_session(sid)
        batch = hold_first_commit(store)
        with _pg.connect(_pg.database_url(), autocommit=True) as conn:
            conn.execute(
                f"""CREATE SEQUENCE "{schema}".once;
                CREATE FUNCTION "{schema}".drop_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF nextval('"{schema}".once') = 1 THEN
                        PERFORM pg_terminate_backend(pg_backend_pid());
                    END IF;
                    RETURN NULL;
                END $$;
                CREATE CONSTRAINT TRIGGER drop_at_commit AFTER INSERT ON "{schema}".events
                    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
                    EXECUTE FUNCTION "{schema}".drop_at_commit();""".encode()
            )
        batch.start("a1", lambda: store.inject("a", message("a1")))
        batch.start("b1", lambda: store.inject("b", message("b1")))
        outcomes = batch.finish()
        assert isinstance(outcomes["a1"][1], OutcomeUnknownError), outcomes["a1"]
        assert isinstance(outcomes["b1"][1], OutcomeUnknownError), outcomes["b1"]
        assert contents(store, "a") == ["first"]
        assert contents(store, "b") == []
