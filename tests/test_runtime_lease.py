"""One runtime per store, shown with real processes on LMDB and on PostgreSQL.

While a runtime's process lives, a second runtime on the same store (another process, or this
one) is refused with `LeaseHeldError` naming the holder, and the first one's prompt in flight
completes with its answer. Once the holder is SIGKILLed with a prompt in flight, a new runtime
gets the lease and fails that orphaned prompt as `interrupted`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventlog import EventLog, InvalidArgumentError, LeaseHeldError
from sessions import SessionStore
from sessions.runtime import Runtime
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
