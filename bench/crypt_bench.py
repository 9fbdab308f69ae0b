"""Encryption-at-rest benchmarks (`python -m bench --suite crypt`): the engine on an encrypted
store against the same engine on a plain store, in the same run (target: at least 0.8x).

- ``inject_encrypted``: `inject`, one durable commit per call, into a session of an encrypted
  store (`keys=`: the message sealed with AES-256-GCM under the session's data key) vs the same
  into a plain store. The fsync dominates both; sealing adds a few microseconds per message.
- ``open_session_encrypted`` (information): `open_session`, one durable commit each, encrypted vs
  plain: a new session's data key is written and synced to the keyring before its event commits
  (a key must be on disk before anything is sealed with it), one more sync per new session.
- ``snapshot_encrypted``: `snapshot()` of a 1,000-message session read cold (`hot_sessions=0`:
  every message read, hash-checked and, when encrypted, opened) on an encrypted store vs on a
  plain one, in messages/s. The session is written by one `inject_many`, whose list is sealed
  whole: opening it is one AES-GCM call and one decoding of the list for the 1,000 messages
  (sealed one by one, as before, each message cost a call of about 2 us, most of it the call,
  not the bytes).
- ``snapshot_encrypted_warm``: the same with the engine's hot cache (`hot_sessions=8`): the
  transcript was opened once, and snapshots hand out copies of what is cached.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from bench import _scaffold
from bench._timing import Result, Sample, Stopwatch, Target, compare
from bench.engine_bench import make_messages
from bench.log_bench import _fit
from sessions import LocalKeyProvider, SessionStore

KEYS = LocalKeyProvider(bytes(range(32)))


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    round_s: float  # wall time one round aims at
    injects: tuple[int, int]  # (fewest, most) injects per round
    messages: int  # messages in the snapshot's session


FULL = Sizes(rounds=9, round_s=0.4, injects=(20, 2_000), messages=1_000, budget_s=90)
QUICK = Sizes(rounds=3, round_s=0.1, injects=(10, 200), messages=1_000, budget_s=20)

Context = _scaffold.Context[Sizes]


@contextmanager
def _stores(
    ctx: Context, name: str, **options: object
) -> Iterator[tuple[SessionStore, SessionStore]]:
    """(encrypted, plain) stores under `ctx.tmp / name`, closed and removed when the block ends."""
    base = ctx.tmp / name
    encrypted = SessionStore.open(base / "encrypted", keys=KEYS, **options)  # type: ignore[arg-type]
    plain = SessionStore.open(base / "plain", **options)  # type: ignore[arg-type]
    try:
        yield encrypted, plain
    finally:
        encrypted.close()
        plain.close()
        shutil.rmtree(base, ignore_errors=True)


def _side_by_side(
    ctx: Context,
    stores: tuple[SessionStore, SessionStore],
    measure: Callable[[SessionStore], Sample],
    *,
    name: str,
    description: str,
    unit: str,
    target: Target | None,
    notes: dict[str, object],
) -> list[Result]:
    """`measure` on the encrypted store against the same on the plain one, in alternating rounds."""
    encrypted, plain = stores
    result = compare(
        name=name,
        description=description,
        unit=unit,
        baseline=lambda: measure(plain),
        subject=lambda: measure(encrypted),
        baseline_description="the same on a plain store",
        rounds=ctx.sizes.rounds,
        target=target,
        budget_s=ctx.sizes.budget_s,
        progress=ctx.progress,
    )
    result.notes = notes
    return [result]


def inject_encrypted(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    messages = make_messages(4_096, seed=7)
    with _stores(ctx, "inject") as stores:
        sids = {id(store): store.open_session() for store in stores}
        step = 0

        def injecting(store: SessionStore, count: int) -> Sample:
            nonlocal step
            sid = sids[id(store)]
            picked = [messages[(step + i) % len(messages)] for i in range(count)]
            step += count
            with Stopwatch() as watch:
                for message in picked:
                    store.inject(sid, message)
            return watch.sample(count)

        count = _fit(injecting(stores[1], sizes.injects[0]).rate, sizes.round_s, sizes.injects)
        return _side_by_side(
            ctx,
            stores,
            lambda store: injecting(store, count),
            name="inject_encrypted",
            description="inject, one durable commit per call, encrypted store",
            unit="injects/s",
            target=Target("ratio", 0.8),
            notes={"injects_per_round": count},
        )


def open_session_encrypted(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    with _stores(ctx, "open") as stores:

        def opening(store: SessionStore, count: int) -> Sample:
            with Stopwatch() as watch:
                for _ in range(count):
                    store.open_session()
            return watch.sample(count)

        count = _fit(opening(stores[1], sizes.injects[0]).rate, sizes.round_s, sizes.injects)
        return _side_by_side(
            ctx,
            stores,
            lambda store: opening(store, count),
            name="open_session_encrypted",
            description="open_session, one durable commit per call, encrypted store",
            unit="sessions/s",
            target=None,
            notes={"sessions_per_round": count},
        )


def snapshot_encrypted(ctx: Context) -> list[Result]:
    return _snapshot(ctx, "snapshot_encrypted", hot=False)


def snapshot_encrypted_warm(ctx: Context) -> list[Result]:
    return _snapshot(ctx, "snapshot_encrypted_warm", hot=True)


def _snapshot(ctx: Context, name: str, *, hot: bool) -> list[Result]:
    sizes = ctx.sizes
    messages = make_messages(sizes.messages, seed=11)
    with _stores(ctx, name, hot_sessions=8 if hot else 0) as stores:
        sids: dict[int, str] = {}
        for store in stores:
            sid = sids[id(store)] = store.open_session()
            store.inject_many(sid, messages)

        def reading(store: SessionStore) -> Sample:
            sid = sids[id(store)]
            with Stopwatch() as watch:
                for _ in range(5):
                    snap = store.snapshot(sid)
                    assert snap is not None and snap["length"] == len(messages)
            return watch.sample(5 * len(messages))

        return _side_by_side(
            ctx,
            stores,
            reading,
            name=name,
            description=(
                f"snapshot() of {sizes.messages:,} messages, {'cached' if hot else 'cold'}, "
                "encrypted store"
            ),
            unit="messages/s",
            target=Target("ratio", 0.8),
            notes={"messages": sizes.messages},
        )


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "inject_encrypted": inject_encrypted,
    "open_session_encrypted": open_session_encrypted,
    "snapshot_encrypted": snapshot_encrypted,
    "snapshot_encrypted_warm": snapshot_encrypted_warm,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    return _scaffold.run(BENCHMARKS, ctx, names)
