"""The peer workloads on PostgreSQL, each as a ratio to the same workload on LMDB in the same run.

- ``pg_append_1w``, ``pg_append_4w``, ``pg_append_16w``: durable appends per second (one event per
  `append`, one commit each) from 1, 4 and 16 writer processes, each on its own stream of one log.
  LMDB serializes writers with its file lock; PostgreSQL with the append lock of `_postgres.py`.
- ``pg_batched_append``: events per second, 1,000 events per `append` call (one commit).
- ``pg_fork``: `SessionStore.fork` of a session holding 1,000 messages, one durable commit each,
  shown as time per fork.

The server comes from `SESSIONLOG_BENCH_PG` or the local one at 127.0.0.1:5432; a database of this
run's own is made and dropped. Loopback only: a remote server would measure the network instead.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench import _scaffold
from bench._timing import Result, Sample, Stopwatch, compare
from eventlog import ANY, EventLog
from eventlog.events import Message, MessageInjected
from sessions import SessionStore

CANDIDATES = (
    "postgresql://postgres@127.0.0.1:5432/postgres",
    "postgresql://root@127.0.0.1:5432/postgres",
)
_TEXT = "the agent read the file, ran the tests and wrote a short summary of what failed. " * 2


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    round_s: float  # how long each writer appends in one round of a writers benchmark
    writers: tuple[int, ...]
    batch_events: int
    batches: int  # append calls per round of `pg_batched_append`
    fork_messages: int
    forks_per_round: int


FULL = Sizes(
    rounds=5,
    round_s=1.0,
    writers=(1, 4, 16),
    batch_events=1_000,
    batches=5,
    fork_messages=1_000,
    forks_per_round=20,
)
QUICK = Sizes(
    rounds=3,
    round_s=0.3,
    writers=(1, 4, 16),
    batch_events=1_000,
    batches=2,
    fork_messages=1_000,
    forks_per_round=5,
)


@dataclass(kw_only=True)
class Context(_scaffold.Context[Sizes]):
    admin: str = ""
    database: str = ""
    made: list[str] = field(default_factory=list)

    def url(self) -> str:
        """A fresh schema in this run's database: an empty PostgreSQL log."""
        if not self.database:
            self.admin = _server()
            self.database = f"sessionlog_bench_{os.getpid()}"
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.database}"'.encode())
        base = self.admin.rsplit("/", 1)[0]
        return f"{base}/{self.database}?schema=b_{uuid.uuid4().hex[:10]}"

    def path(self) -> str:
        """A fresh LMDB directory."""
        where = self.tmp / f"lmdb-{uuid.uuid4().hex[:10]}"
        self.made.append(str(where))
        return str(where)

    def close(self) -> None:
        if self.database:
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'.encode())


def _server() -> str:
    chosen = os.environ.get("SESSIONLOG_BENCH_PG")
    for url in (chosen,) if chosen else CANDIDATES:
        try:
            with psycopg.connect(url, connect_timeout=3, autocommit=True):
                return url
        except psycopg.OperationalError:
            continue
    raise SystemExit("the postgres suite needs a server: set SESSIONLOG_BENCH_PG to a URL")


def said(index: int) -> MessageInjected:
    return MessageInjected(message=Message(role="user", content=f"{index} {_TEXT}"))


# 1. Durable appends from 1, 4 and 16 writer processes


def _writer(target: str, index: int, seconds: float, ready: Any, results: Any) -> None:
    with EventLog.open(target) as log:
        event = said(index)
        stream = f"w{index}"
        log.append(stream, [event], expected_version=ANY)  # connected and warm
        ready.wait()
        cpu = time.process_time()
        started = time.perf_counter()
        count = 0
        while time.perf_counter() - started < seconds:
            log.append(stream, [event], expected_version=ANY)
            count += 1
        results.put((count, time.perf_counter() - started, time.process_time() - cpu))


def _writers_round(target: Callable[[], str], writers: int, seconds: float) -> Callable[[], Sample]:
    context = multiprocessing.get_context("fork")

    def one_round() -> Sample:
        where = target()
        EventLog.open(where).close()  # created once, not raced by the writers
        ready = context.Barrier(writers)
        results = context.Queue()
        procs = [
            context.Process(target=_writer, args=(where, i, seconds, ready, results))
            for i in range(writers)
        ]
        for proc in procs:
            proc.start()
        got = [results.get(timeout=120 + seconds) for _ in procs]
        for proc in procs:
            proc.join()
        return Sample(
            units=sum(c for c, _, _ in got),
            wall_s=max(w for _, w, _ in got),
            cpu_s=sum(u for _, _, u in got),
        )

    return one_round


def writers(ctx: Context) -> list[Result]:
    results = []
    for count in ctx.sizes.writers:
        results.append(
            compare(
                name=f"pg_append_{count}w",
                description=f"durable appends/s, {count} writer process(es), PostgreSQL",
                unit="appends/s",
                baseline=_writers_round(ctx.path, count, ctx.sizes.round_s),
                subject=_writers_round(ctx.url, count, ctx.sizes.round_s),
                baseline_description=f"the same {count} writer(s) on one LMDB log",
                rounds=ctx.sizes.rounds,
                target=None,
                progress=ctx.progress,
            )
        )
    return results


# 2. Batched appends


def _batched_round(log: EventLog, sizes: Sizes) -> Callable[[], Sample]:
    batch = [said(i) for i in range(sizes.batch_events)]

    def one_round() -> Sample:
        with Stopwatch() as watch:
            for _ in range(sizes.batches):
                log.append("batched", batch, expected_version=ANY)
        return watch.sample(sizes.batches * sizes.batch_events)

    return one_round


def batched(ctx: Context) -> list[Result]:
    with EventLog.open(ctx.path()) as lmdb_log, EventLog.open(ctx.url()) as pg_log:
        return [
            compare(
                name="pg_batched_append",
                description=f"events/s, {ctx.sizes.batch_events} per append, PostgreSQL",
                unit="events/s",
                baseline=_batched_round(lmdb_log, ctx.sizes),
                subject=_batched_round(pg_log, ctx.sizes),
                baseline_description="the same appends on LMDB",
                rounds=ctx.sizes.rounds,
                target=None,
                progress=ctx.progress,
            )
        ]


# 3. Fork


def _fork_round(store: SessionStore, sizes: Sizes) -> Callable[[], Sample]:
    def one_round() -> Sample:
        with Stopwatch() as watch:
            for _ in range(sizes.forks_per_round):
                store.fork("source")
        return watch.sample(sizes.forks_per_round)

    return one_round


def fork(ctx: Context) -> list[Result]:
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {_TEXT}"}
        for i in range(ctx.sizes.fork_messages)
    ]
    with SessionStore.open(ctx.path()) as lmdb_store, SessionStore.open(ctx.url()) as pg_store:
        for store in (lmdb_store, pg_store):
            store.open_session("source")
            store.inject_many("source", messages)
        result = compare(
            name="pg_fork",
            description=f"fork of a {ctx.sizes.fork_messages}-message session, PostgreSQL",
            unit="forks/s",
            baseline=_fork_round(lmdb_store, ctx.sizes),
            subject=_fork_round(pg_store, ctx.sizes),
            baseline_description="the same forks on LMDB",
            rounds=ctx.sizes.rounds,
            target=None,
            progress=ctx.progress,
        )
    result.per = "fork"
    return [result]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "pg_writers": writers,
    "pg_batched_append": batched,
    "pg_fork": fork,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    try:
        return _scaffold.run(BENCHMARKS, ctx, names)
    finally:
        ctx.close()
