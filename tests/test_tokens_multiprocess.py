"""Bearer sessions written by several processes at once, each with its own `SessionStore`.

LMDB serialises the writers; each command reads the record and appends in one write transaction,
so two creates of one token cannot both win, and a touch is max(last_seen_at, now) whatever order
the processes' commits land in.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import secrets
from pathlib import Path

import pytest

import projections as pj
from eventlog import events as ev
from sessions import SessionStore
from sessions._tokens import token_handle
from tests._token_workers import EXPIRES_AT, create_worker, moment, touch_worker
from tests.conftest import PROFILE, assert_rebuild_changes_nothing, run_processes

WORKERS = 4
TOUCHES = {"dev": 150, "ci": 300, "deep": 3_000}.get(PROFILE, 150)


@pytest.mark.slow
def test_four_processes_creating_the_same_tokens_one_wins_each(tmp_path: Path) -> None:
    path = tmp_path / "store"
    SessionStore.open(path).close()
    tokens = [secrets.token_urlsafe(32) for _ in range(40)]
    barrier = multiprocessing.get_context("spawn").Barrier(WORKERS)
    outs = [tmp_path / f"create-{worker}.json" for worker in range(WORKERS)]
    run_processes(
        create_worker,
        [
            (str(path), worker, tokens[worker:] + tokens[:worker], barrier, str(outs[worker]))
            for worker in range(WORKERS)
        ],
    )
    results = [json.loads(out.read_text()) for out in outs]
    winners: dict[str, list[int]] = {}
    for worker, result in enumerate(results):
        assert len(result["won"]) + len(result["lost"]) == len(tokens)
        for token in result["won"]:
            winners.setdefault(token, []).append(worker)
    assert {token: len(found) for token, found in winners.items()} == dict.fromkeys(tokens, 1)
    with SessionStore.open(path) as store:
        assert store.log.verify().ok
        assert store.log.head == len(tokens)  # one create event per token, none for a loser
        for token, [worker] in winners.items():
            record = store.tokens.get(token, now=moment(1))
            assert record is not None
            assert record.principal == f"worker-{worker}"


@pytest.mark.slow
def test_four_processes_touching_the_same_sessions_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with SessionStore.open(path) as store:
        tokens = []
        for index in range(6):
            made = store.tokens.create(f"user_{index}", EXPIRES_AT, created_at=moment(0))
            assert made.token is not None
            tokens.append(made.token)
    barrier = multiprocessing.get_context("spawn").Barrier(WORKERS)
    rng = random.Random(5_005)
    outs = [tmp_path / f"touch-{worker}.json" for worker in range(WORKERS)]
    run_processes(
        touch_worker,
        [
            (str(path), worker, rng.randrange(2**32), tokens, TOUCHES, barrier, str(outs[worker]))
            for worker in range(WORKERS)
        ],
    )
    latest: dict[str, float] = {}
    for out in outs:
        for token, seconds in json.loads(out.read_text())["latest"].items():
            latest[token] = max(latest.get(token, 0.0), seconds)
    assert set(latest) == set(tokens)

    with SessionStore.open(path) as store:
        assert store.log.verify().ok
        for token in tokens:
            record = store.tokens.get(token, now=moment(1))
            assert record is not None
            assert record.last_seen_at == moment(latest[token])
            # The log agrees: its newest touch of the stream is the latest time anyone used, and
            # the touches it kept only ever move forward.
            stream = pj.bearer_stream(token_handle(token))
            seen = [
                e.data.last_seen_at
                for e in store.log.read_stream(stream)
                if isinstance(e.data, ev.BearerSessionTouched)
            ]
            assert seen == sorted(seen)
            assert seen[-1].isoformat() == moment(latest[token])
        assert_rebuild_changes_nothing(store)
