"""Process bodies for the multi-process bearer-session tests, importable by the spawn start.

Each worker opens its own `SessionStore` after it starts (never one inherited across a fork), waits
at a barrier so all of them write at once, and writes what it saw to a JSON file.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from sessions import SessionExistsError, SessionStore

EPOCH = datetime(2026, 5, 1, tzinfo=UTC)
EXPIRES_AT = "2026-07-01T00:00:00Z"


def moment(seconds: float) -> str:
    return (EPOCH + timedelta(seconds=seconds)).isoformat()


def create_worker(path: str, worker: int, tokens: list[str], barrier: Any, out: str) -> None:
    """Tries to create a session for every token; records which ones it won and lost."""
    won: list[str] = []
    lost: list[str] = []
    with SessionStore.open(path) as store:
        barrier.wait()
        for token in tokens:
            try:
                store.tokens.create(f"worker-{worker}", EXPIRES_AT, created_at=moment(0), id=token)
            except SessionExistsError as exc:
                assert token not in str(exc)
                lost.append(token)
            else:
                won.append(token)
    with open(out, "w") as file:
        json.dump({"won": won, "lost": lost}, file)


def touch_worker(
    path: str, worker: int, seed: int, tokens: list[str], touches: int, barrier: Any, out: str
) -> None:
    """Touches the shared sessions at random times, in random order (a late request can arrive
    after a newer one); records each time it used and what each touch returned."""
    rng = random.Random(seed)
    latest: dict[str, float] = {}
    with SessionStore.open(path) as store:
        barrier.wait()
        for _ in range(touches):
            token = rng.choice(tokens)
            # Whole microseconds, distinct per worker, so every time survives the round trip.
            seconds = rng.randrange(1, 5_000_000) + worker / 10
            record = store.tokens.touch(token, now=moment(seconds))
            assert record is not None, "a live session was not found"
            assert datetime.fromisoformat(record.last_seen_at) >= EPOCH + timedelta(seconds=seconds)
            latest[token] = max(latest.get(token, 0.0), seconds)
    with open(out, "w") as file:
        json.dump({"latest": latest}, file)
