"""Bearer-session benchmarks (`python -m bench --suite tokens`), each against raw py-lmdb in the same run.

- ``token_get``: `store.tokens.get(token, now)`, read-only, over a store of `sessions` bearer
  sessions, vs raw py-lmdb doing one read transaction and one `get` of a value of our record's
  size per call. The engine's extra work is the token check, the blake3 handle, the record decode
  and building the returned record; the ratio says what that costs against the storage floor.
- ``token_touch``: `store.tokens.touch(token, now)` with a later `now` each time, so every call
  is one durable commit (the event, its stream index and the projection record), vs raw py-lmdb
  doing one `put` per durable write transaction (sync=True, metasync=True) with values of the
  sizes of our stored touch records. That fsync is the floor of any durable write.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench import _scaffold
from bench._timing import Result, Sample, Stopwatch, Target, compare
from bench.log_bench import _fit, _raw_env, durable_puts, record_bytes
from projections._tokens import record_key
from sessions import SessionStore
from sessions._tokens import token_handle

START = datetime(2026, 5, 1, tzinfo=UTC)


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    round_s: float  # wall time one round aims at
    sessions: int  # bearer sessions in the store
    gets: tuple[int, int]  # (fewest, most) gets per round
    touches: tuple[int, int]  # (fewest, most) touches per round


FULL = Sizes(
    rounds=9, round_s=0.3, sessions=10_000, gets=(1_000, 200_000), touches=(50, 3_000), budget_s=60
)
QUICK = Sizes(
    rounds=3, round_s=0.05, sessions=500, gets=(200, 10_000), touches=(10, 200), budget_s=15
)


Context = _scaffold.Context[Sizes]


def _store_with_sessions(path: Path, count: int) -> tuple[SessionStore, list[str]]:
    store = SessionStore.open(path)
    tokens: list[str] = []
    with store.transaction():  # setup is not measured: one commit for all the creates
        for index in range(count):
            made = store.tokens.create(
                f"user_{index}",
                START + timedelta(days=365),
                created_at=START,
                attributes={"role": "operator", "tenant": f"t{index % 16}"},
            )
            assert made.token is not None
            tokens.append(made.token)
    return store, tokens


def token_get(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    store, tokens = _store_with_sessions(ctx.tmp / "get" / "ours", sizes.sessions)
    env = _raw_env(ctx.tmp / "get" / "raw", sync=False)
    try:
        now = START + timedelta(days=1)
        record = store.tokens.get(tokens[0], now=now)
        assert record is not None
        with store.log.view() as view:
            stored = view.kv_get(record_key(record.handle))
        assert stored is not None
        value = secrets.token_bytes(len(stored))  # the size of our stored record
        keys = [token_handle(token).encode() for token in tokens]
        with env.begin(write=True) as txn:
            for key in keys:
                txn.put(key, value)

        def ours(count: int) -> Sample:
            get = store.tokens.get
            picked = [tokens[i % len(tokens)] for i in range(count)]
            with Stopwatch() as watch:
                for token in picked:
                    get(token, now)
            return watch.sample(count)

        probe = ours(sizes.gets[0])
        count = _fit(probe.rate, sizes.round_s, sizes.gets)

        def raw() -> Sample:
            picked = [keys[i % len(keys)] for i in range(count)]
            with Stopwatch() as watch:
                for key in picked:
                    with env.begin() as txn:
                        txn.get(key)
            return watch.sample(count)

        result = compare(
            name="token_get",
            description=f"store.tokens.get(token, now), read-only, {sizes.sessions:,} sessions",
            unit="gets/s",
            baseline=raw,
            subject=lambda: ours(count),
            baseline_description="py-lmdb: one read transaction and one get per call",
            rounds=sizes.rounds,
            target=None,
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )
        result.notes = {"gets_per_round": count, "sessions": sizes.sessions}
        return [result]
    finally:
        store.close()
        env.close()


def token_touch(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    store, tokens = _store_with_sessions(ctx.tmp / "touch" / "ours", sizes.sessions)
    env = _raw_env(ctx.tmp / "touch" / "raw", sync=True)
    try:
        step = 0

        def ours(count: int) -> Sample:
            nonlocal step
            touch = store.tokens.touch
            moments = [START + timedelta(seconds=step + i + 1) for i in range(count)]
            picked = [tokens[(step + i) % len(tokens)] for i in range(count)]
            step += count
            with Stopwatch() as watch:
                for token, now in zip(picked, moments, strict=True):
                    touch(token, now)
            return watch.sample(count)

        probe = ours(sizes.touches[0])
        count = _fit(probe.rate, sizes.round_s, sizes.touches)
        head = store.log.head
        ours(count)
        values = [record_bytes(e) for e in store.log.read(after=head, limit=count)]
        assert len(values) == count, "every touch of the round should have written one event"
        raw = durable_puts(env, values)

        result = compare(
            name="token_touch",
            description="store.tokens.touch(token, now), one durable commit per call",
            unit="touches/s",
            baseline=raw,
            subject=lambda: ours(count),
            baseline_description=(
                "py-lmdb: one put per durable write transaction (sync=True metasync=True), "
                "values of our stored touch record sizes"
            ),
            rounds=sizes.rounds,
            target=Target("ratio", 0.5),
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )
        result.notes = {
            "touches_per_round": count,
            "record_bytes_mean": round(sum(map(len, values)) / len(values), 1),
            "sessions": sizes.sessions,
        }
        return [result]
    finally:
        store.close()
        env.close()
        shutil.rmtree(ctx.tmp / "touch", ignore_errors=True)


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "token_get": token_get,
    "token_touch": token_touch,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    return _scaffold.run(BENCHMARKS, ctx, names)
