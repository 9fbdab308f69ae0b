"""One runtime per store, shown with real processes on LMDB and on PostgreSQL.

While a runtime's process lives, a second runtime on the same store (another process, or this
one) is refused with `LeaseHeldError` naming the holder, and the first one's prompt in flight
completes with its answer. Once the holder is SIGKILLed with a prompt in flight, a new runtime
gets the lease and fails that orphaned prompt as `interrupted`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from eventlog import EventLog, InvalidArgumentError, Lease, LeaseHeldError, LeaseLostError
from sessions import RetentionPolicy, SessionStore
from sessions.runtime import Runtime
from sessions.runtime import _lease as runtime_lease
from sessions.runtime._recorder import read_record
from tests import _pg

ROOT = Path(__file__).resolve().parent.parent
HOLDER = Path(__file__).resolve().parent / "_runtime_lease_holder.py"
WAIT_S = 60.0


class Holder:
    """A `hold` process and the lines it has printed."""

    def __init__(self, target: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HOLDER), target, "hold"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            text=True,
        )

    def expect(self, word: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(word + " "), f"expected `{word}`, the holder said {line!r}"
        body: dict[str, Any] = json.loads(line.partition(" ")[2])
        return body

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()


def attempt(target: str) -> tuple[str, dict[str, Any]]:
    """Start a runtime in a fresh process; what it reported."""
    done = subprocess.run(
        [sys.executable, str(HOLDER), target, "try"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    word, _, body = done.stdout.strip().partition(" ")
    return word, json.loads(body)


@pytest.fixture(params=["lmdb", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return _pg.fresh_schema_url("lease")
    return str(tmp_path / "store")


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for holder in made:
        if holder.proc.poll() is None:
            holder.proc.kill()
        holder.proc.wait(WAIT_S)
        for pipe in (holder.proc.stdin, holder.proc.stdout):
            if pipe is not None:
                pipe.close()


def loop_of(target: str, sid: str, rid: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with SessionStore.open(target) as store:
        with store.log.view() as view:
            record = read_record(view, sid)
        assert record is not None
        loops = [loop for loop in record.loops if loop["request_id"] == rid]
        assert len(loops) == 1
        return loops[0], store.messages(sid)


def test_a_second_runtime_is_refused_while_the_first_lives(
    target: str, holders: list[Holder]
) -> None:
    first = Holder(target)
    holders.append(first)
    pid = first.expect("ready")["pid"]
    inflight = first.expect("inflight")
    word, body = attempt(target)  # another process
    assert word == "refused", body
    assert body["type"] == "LeaseHeldError"
    assert "`runtime` lease is held by" in body["message"]
    assert str(pid) in body["message"]  # the refusal names the holder
    # and this process, on its own connection to the store
    with SessionStore.open(target) as store, pytest.raises(LeaseHeldError, match=str(pid)):
        asyncio.run(Runtime(store).start())
    first.say("go")
    assert first.expect("ack") == {"text": "answer to r1"}  # the answer was kept, not discarded
    loop, messages = loop_of(target, inflight["sid"], "r1")
    assert loop["status"] == "completed"
    assert (messages[-1]["role"], messages[-1]["content"]) == ("assistant", "answer to r1")
    first.say("stop")
    assert first.proc.wait(WAIT_S) == 0
    word, body = attempt(target)  # a runtime that stopped released the store
    assert (word, body) == ("started", {"recovered": []})


def test_after_the_holder_is_killed_a_new_runtime_fails_its_orphaned_prompt(
    target: str, holders: list[Holder]
) -> None:
    first = Holder(target)
    holders.append(first)
    first.expect("ready")
    inflight = first.expect("inflight")  # prompt_started is durable, the provider is waiting
    assert attempt(target)[0] == "refused"
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    word, body = attempt(target)
    while word == "refused" and time.monotonic() < deadline:
        time.sleep(0.1)  # a server notices a dead client's connection a moment later
        word, body = attempt(target)
    assert (word, body) == ("started", {"recovered": [inflight["sid"]]})
    loop, messages = loop_of(target, inflight["sid"], "r1")
    assert loop["status"] == "failed"
    assert loop["error_kind"] == "interrupted"
    assert messages[-1]["role"] == "user"  # no answer was invented for it


def test_the_lease_is_one_per_store_and_in_process_too(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "a") as first, SessionStore.open(tmp_path / "b") as other:

        async def run() -> None:
            async with Runtime(first):
                with pytest.raises(LeaseHeldError, match="`runtime` lease"):
                    await Runtime(first).start()
                async with Runtime(other):  # another store is another lease
                    pass
            async with Runtime(first):  # released by stop
                pass

        asyncio.run(run())


def test_log_leases_on_every_backend(log_factory: Any, log_kind: str) -> None:
    log, other = log_factory(log_kind), None
    if log_kind == "memory":
        other = log  # the in-memory log has no other handle
    elif log_kind == "lmdb":
        other = log  # one environment per path per process: the same handle again
    else:
        other = EventLog.open(log.description.removeprefix("postgresql:"))
    try:
        with log.lease("runtime") as held:
            assert held.held
            with pytest.raises(LeaseHeldError, match="`runtime` lease is held by") as refused:
                other.lease("runtime")
            assert refused.value.name == "runtime"
            other.lease("another").release()  # names are independent
        assert not held.held
        other.lease("runtime").release()  # released: free again
        for bad in ("", "Runtime", "a/b", "x" * 33, 7):
            with pytest.raises(InvalidArgumentError):
                log.lease(bad)  # type: ignore[arg-type]
    finally:
        if other is not log:
            other.close()


def end_lease_connections() -> int:
    """End this process's lease connections from the server side, as a network fault or an
    administrator would; how many there were."""
    with _pg.connect(_pg.database_url(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
            (f"sessionlog lease {os.getpid()}@%",),
        ).fetchall()
    return len(rows)


@pytest.mark.needs("POSTGRES")
def test_a_lease_whose_connection_ended_is_found_lost() -> None:
    with EventLog.open(_pg.fresh_schema_url("lost")) as log:
        lease = log.lease("runtime")
        lease.check()  # held: asks the server, raises nothing
        assert lease.held
        assert end_lease_connections() == 1
        with pytest.raises(LeaseLostError, match="`runtime` lease was lost"):
            lease.check()
        assert lease.lost and not lease.held
        with pytest.raises(LeaseLostError):
            lease.check()  # and stays lost
        log.lease("runtime").release()  # the server let it go: another holder gets it
        lease.release()
    with EventLog.open(_pg.fresh_schema_url("kept")) as log, log.lease("runtime") as kept:
        kept.release()
        kept.check()  # released by its holder: not lost


@pytest.mark.needs("POSTGRES")
def test_a_lease_connection_gives_up_on_a_silent_server_and_a_released_lease_is_not_lost() -> None:
    with EventLog.open(_pg.fresh_schema_url("keepalive")) as log:
        lease = log.lease("runtime")
        conn = lease._release.__self__  # type: ignore[union-attr]  # the lease's connection
        parameters = conn.info.get_parameters()
        assert parameters["tcp_user_timeout"] == "25000"
        assert parameters["keepalives_idle"] == "10"
        assert end_lease_connections() == 1
        with pytest.raises(LeaseLostError):
            lease.check()
        lease.release()
        lease.check()  # released by its holder: nothing to report any more


def test_a_file_lease_cannot_be_lost_under_its_holder(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "store") as log, log.lease("runtime") as lease:
        lease.check()
        assert lease.held and not lease.lost


class StuckProvider:
    """Never answers: a prompt through it stays in flight until it is cancelled."""

    name = "stuck"
    defaults: Mapping[str, Any] = {}

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Any:
        self.entered.set()
        await asyncio.Event().wait()


@pytest.mark.needs("POSTGRES")
def test_a_runtime_that_lost_its_lease_stops_writing(monkeypatch: pytest.MonkeyPatch) -> None:
    # The lease connection ends under a live runtime with a prompt in flight: the runtime notices,
    # cancels the prompt without recording an end for it, and refuses every write; the next
    # runtime finds the prompt orphaned and fails it as interrupted, as after a crash.
    monkeypatch.setattr(runtime_lease, "CHECK_S", 0.05)
    url = _pg.fresh_schema_url("runtime-lost")

    async def run() -> None:
        with SessionStore.open(url) as store:
            provider = StuckProvider()
            runtime = Runtime(store, providers=[provider], default_provider="stuck")
            await runtime.start()
            sid = (await runtime.create("agent"))["session_id"]
            prompt = asyncio.create_task(runtime.prompt(sid, "hello", request_id="r1"))
            await asyncio.wait_for(provider.entered.wait(), WAIT_S)
            assert end_lease_connections() == 1
            outcome = await asyncio.wait_for(asyncio.gather(prompt, return_exceptions=True), WAIT_S)
            assert isinstance(outcome[0], BaseException), outcome  # never answered
            assert any(lease.lost for lease in runtime._lease.held)
            with pytest.raises(LeaseLostError):
                await runtime.create("agent")  # refused before anything is written
            with SessionStore.open(url) as other:
                async with Runtime(other) as successor:  # the store is free for another one
                    assert successor.recovered == [sid]
            await runtime.stop()
            listed = store.list_sessions()["sessions"]
            assert [s["session_id"] for s in listed] == [sid]
        loop, _ = loop_of(url, sid, "r1")
        assert (loop["status"], loop["error_kind"]) == ("failed", "interrupted")

    asyncio.run(run())


def test_a_runtime_that_fails_to_start_lets_the_lease_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Starting takes the lease and starts the lease watcher before it recovers the prompts left
    # in flight; when that recovery fails, the runtime has not started, so it must hold nothing:
    # no lease that keeps every later runtime out, no watcher task left running.
    from sessions.runtime import _jobs

    def failing(store: SessionStore) -> list[str]:
        raise OSError("disk gone")

    async def run() -> None:
        with SessionStore.open(tmp_path / "store") as store:
            runtime = Runtime(store)
            with monkeypatch.context() as patch:
                patch.setattr(_jobs, "recover", failing)
                with pytest.raises(OSError, match="disk gone"):
                    await runtime.start()
            assert runtime._lease._watcher is None and not runtime._lease.held
            watchers = [t for t in asyncio.all_tasks() if "_watch" in repr(t.get_coro())]
            assert all(t.cancelling() or t.done() for t in watchers), watchers
            async with Runtime(store) as successor:  # the store is free for another runtime
                assert successor.recovered == []
            await runtime.start()  # and the first can start again
            await runtime.stop()

    asyncio.run(run())


def test_a_lease_check_left_unanswered_counts_as_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    # A PostgreSQL check on a connection whose peer vanished (a network partition) gets no answer
    # until TCP gives up, many minutes, while the server lets the lease go in about 25 s. The
    # watcher must not wait that out: a check unanswered for `ANSWER_S` is a lost lease, and an
    # answer that comes late does not make it held again.
    monkeypatch.setattr(runtime_lease, "CHECK_S", 0.01)
    monkeypatch.setattr(runtime_lease, "ANSWER_S", 0.05)
    answer = threading.Event()

    def stuck_probe() -> bool:
        answer.wait(WAIT_S)
        return True  # held, says the late answer

    class Prompt:
        def __init__(self) -> None:
            self.cancelled = asyncio.Event()

        def cancel(self, reason: str) -> None:
            assert reason == "lease_lost"
            self.cancelled.set()

    async def run() -> None:
        lease = Lease("runtime", "pg", {}, lambda: None, stuck_probe)
        watched = runtime_lease.RuntimeLease()
        watched.held.append(lease)
        prompt = Prompt()
        watched.watch({"s": prompt})
        try:
            await asyncio.wait_for(prompt.cancelled.wait(), WAIT_S)
            assert lease.lost
            with pytest.raises(LeaseLostError):
                watched.lost()
        finally:
            answer.set()
        await asyncio.sleep(0.05)  # the late answer arrives
        assert lease.lost and not lease.held
        watched.release()

    asyncio.run(run())


def test_a_runtime_that_lost_its_lease_ends_its_reaper_before_it_sweeps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The reaper's sweep deletes closed sessions: once the lease is lost (another runtime may
    # hold the store) it must write nothing, and end instead of failing every interval.
    async def run() -> None:
        with SessionStore.open(tmp_path / "store") as store:
            sid = store.open_session()
            store.close_session(sid)
            swept: list[object] = []
            real_sweep = store.sweep

            def sweep(policy: Any) -> Any:
                swept.append(policy)
                return real_sweep(policy)

            store.sweep = sweep  # type: ignore[method-assign]
            policy = RetentionPolicy(
                max_age=timedelta(days=365)
            )  # nothing due: the sweep only looks
            runtime = Runtime(store, reap_interval_s=0.01, retention=policy)
            await runtime.start()
            reaper = runtime._reaper
            assert reaper is not None
            while not swept:  # it sweeps while it holds the lease
                await asyncio.sleep(0.01)
            for lease in runtime._lease.held:
                lease.lost = True
            await asyncio.wait_for(asyncio.shield(reaper), 5)  # it ends by itself
            assert reaper.exception() is None
            rounds = len(swept)
            await asyncio.sleep(0.1)
            assert len(swept) == rounds  # and sweeps no more
            await runtime.stop()

    with caplog.at_level(logging.ERROR, logger="sessionlog.runtime"):
        asyncio.run(run())
    assert not [r for r in caplog.records if "reaper failed" in r.getMessage()]


def test_after_a_lost_lease_the_context_policy_writes_nothing(tmp_path: Path) -> None:
    # A turn's context policy may summarize and prune, which are writes: once the lease is lost
    # it is refused like every other write of the runtime.
    async def run() -> None:
        with SessionStore.open(tmp_path / "store") as store:
            async with Runtime(store) as runtime:
                sid = (await runtime.create("agent"))["session_id"]
                assert await runtime._maintain(store, sid) is not None  # held: it runs
                for lease in runtime._lease.held:
                    lease.lost = True
                head = store.log.head
                with pytest.raises(LeaseLostError):
                    await runtime._maintain(store, sid)
                assert store.log.head == head

    asyncio.run(run())
