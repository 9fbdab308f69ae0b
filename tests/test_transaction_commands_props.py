"""Commands inside `store.transaction()`, savepoints and all, against the same commands each in a
commit of its own.

Inside a transaction a command reads and writes through what the transaction holds (the session's
state and transcript decoded once, its tail chunk of references, the stream index's tail chunk)
rather than what storage holds; a savepoint that raises must leave none of what it wrote behind,
and a transaction that raises none of it for the next. A random program of blocks (committed,
raised, and savepoints inside them, committed or raised) runs on one store, and only what commits
runs on another, one command per commit: both must answer every command alike, and the
transcripts of both must be what a plain model of lists says (both run the fast ways, since a
commit hands what it held to the next transaction, so agreeing with each other is not enough);
the first must verify, projections included, and rebuild to what it holds. The examples are the
cases the fast ways must tell apart: a fork and its source both appending after the fork, a run
across a chunk of 128 references with a savepoint undone inside it, a session deleted and opened
again in one transaction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sessions import LocalKeyProvider, SessionLogError, SessionStore
from tests.conftest import assert_rebuild_changes_nothing

SESSIONS = ("s0", "s1", "f0", "f1", "f2")
"""The first two are open when a program starts; the others are for forks to make."""
_sid = st.sampled_from(SESSIONS)

_inject = st.tuples(st.just("inject"), _sid, st.integers(1, 3))
_ops = st.one_of(  # opening, forking and injecting most: a fork and its source both appending
    st.tuples(st.just("open"), _sid),
    _inject,
    _inject,
    _inject,
    _inject,
    st.tuples(st.just("fork"), _sid, _sid),
    st.tuples(st.just("fork"), _sid, _sid),
    st.tuples(st.just("fork_at"), _sid, st.integers(0, 150), _sid),
    st.tuples(st.just("inject_many"), _sid, st.integers(1, 140)),
    st.tuples(st.just("fork"), _sid, _sid),
    st.tuples(st.just("fork_at"), _sid, st.integers(0, 150), _sid),
    st.tuples(st.just("trim"), _sid, st.integers(0, 150)),
    st.tuples(st.just("reset"), _sid),
    st.tuples(st.just("compact"), _sid, st.integers(0, 6)),
    st.tuples(st.just("close"), _sid),
    st.tuples(st.just("delete"), _sid),
    st.tuples(st.just("read"), _sid),
)
_savepoint = st.tuples(st.just("savepoint"), st.booleans(), st.lists(_ops, max_size=6))
_block = st.tuples(
    st.sampled_from(("commit", "abort", "plain")),
    st.lists(st.one_of(_ops, _savepoint), max_size=12),
)
programs = st.lists(_block, min_size=1, max_size=6)


class Abort(Exception):
    """Raised to abandon a transaction or a savepoint."""


class Refused(str):
    """The name of the error a command raised, told apart from what a command returns."""


def run_op(store: SessionStore, op: tuple[Any, ...], counter: list[int]) -> Any:
    """Run one command; returns what it returned, or the type of the error it raised."""
    kind, sid, *rest = op
    counter[0] += 1
    text = f"m{counter[0]}"
    try:
        if kind == "open":
            return store.open_session(sid)
        if kind == "inject":
            for i in range(rest[0]):
                store.inject(sid, {"role": "user", "content": f"{text}.{i}"})
            return None
        if kind == "inject_many":
            batch = [{"role": "user", "content": f"{text}.{i}"} for i in range(rest[0])]
            return store.inject_many(sid, batch)
        if kind == "fork":
            return store.fork(sid, rest[0])
        if kind == "fork_at":
            return store.fork_at(sid, rest[0], rest[1])
        if kind == "trim":
            return store.trim(sid, rest[0])
        if kind == "reset":
            return store.reset(sid)
        if kind == "compact":
            return store.compact(sid, keep_last=rest[0])
        if kind == "close":
            return store.close_session(sid)
        if kind == "delete":
            return store.delete(sid)
        return transcript(store, sid)
    except SessionLogError as exc:
        return Refused(type(exc).__name__)


def follow(
    model: dict[str, list[str] | None], alone: SessionStore, op: tuple[Any, ...], text: str
) -> None:
    """Apply an accepted command to the model: transcripts as lists of message texts. What a
    compaction keeps, and what closing, deleting and reopening leave, it takes from `alone`."""
    kind, sid, *rest = op
    before = model.get(sid) or []
    if kind in ("inject", "inject_many"):
        model[sid] = before + [f"{text}.{i}" for i in range(rest[0])]
    elif kind == "fork":
        model[rest[0]] = list(before)
    elif kind == "fork_at":
        model[rest[1]] = before[: rest[0]]
    elif kind == "trim":
        model[sid] = before[len(before) - rest[0] :] if rest[0] < len(before) else before
    elif kind == "reset":
        model[sid] = []
    elif kind != "read":
        model[sid] = transcript(alone, sid)


def transcript(store: SessionStore, sid: str) -> list[Any] | None:
    found = store.snapshot(sid)
    return None if found is None else [m["content"] for m in found["transcript"]]


def run_program(
    inside: SessionStore, alone: SessionStore, program: list[tuple[str, list[Any]]]
) -> None:
    c_in, c_alone = [0], [0]
    model: dict[str, list[str] | None] = {}

    def both(op: tuple[Any, ...], kept: bool) -> None:
        got = run_op(inside, op, c_in)
        if kept:
            expected = run_op(alone, op, c_alone)
            assert got == expected, (op, got, expected)
            if not isinstance(expected, Refused):  # accepted: the model follows
                follow(model, alone, op, f"m{c_alone[0]}")
        else:
            c_alone[0] += 1  # the same message texts on both sides

    def items(ops: list[Any], kept: bool) -> None:
        for op in ops:
            if op[0] != "savepoint":
                both(op, kept)
                continue
            _, raises, inner = op
            try:
                with inside.transaction():
                    items(inner, kept and not raises)
                    if raises:
                        raise Abort
            except Abort:
                pass

    for op in (("open", "s0"), ("open", "s1"), ("inject", "s0", 1)):
        both(op, True)
    for mode, ops in program:
        if mode == "plain":  # savepoints here are transactions of their own
            items(ops, True)
        else:
            try:
                with inside.transaction():
                    items(ops, mode == "commit")
                    if mode == "abort":
                        raise Abort
            except Abort:
                pass
        for sid in SESSIONS:
            expected = model.get(sid)
            assert transcript(inside, sid) == expected, (sid, mode, ops)
            assert transcript(alone, sid) == expected, (sid, mode, ops)
    report = inside.verify(projections=True)
    assert report.ok, report
    assert_rebuild_changes_nothing(inside)


EXAMPLES = (
    # A fork and its source both append after the fork, in one transaction: the source's tail
    # chunk is held by the transaction, and the fork must not take it for its own.
    [("commit", [("fork", "s0", "f0"), ("inject", "s0", 1), ("inject", "f0", 1)])],
    [("plain", [("fork", "s0", "f0"), ("inject", "s0", 2), ("inject", "f0", 1)])],
    # Across the 128-reference chunk boundary, with a savepoint undone in between.
    [
        (
            "commit",
            [
                ("inject_many", "s0", 125),
                ("savepoint", True, [("inject", "s0", 3), ("inject_many", "s0", 7)]),
                ("inject", "s0", 3),
                ("fork_at", "s0", 127, "f1"),
                ("inject", "f1", 2),
                ("inject", "s0", 1),
                ("read", "f1"),
            ],
        )
    ],
    # A transaction that raises, then the next; a session deleted and opened again in one.
    [
        ("abort", [("inject", "s0", 3), ("fork", "s0", "f2"), ("inject", "f2", 1)]),
        ("commit", [("inject", "s0", 1), ("delete", "s0"), ("open", "s0"), ("inject", "s0", 1)]),
        ("plain", [("trim", "s0", 1), ("inject", "s0", 1), ("reset", "s1"), ("inject", "s1", 1)]),
    ],
)


def with_examples(test: Any) -> Any:
    for program in EXAMPLES:
        test = example(program=program)(test)
    return test


_settings = settings(  # as many examples as the profile says (`tests/conftest.py`)
    deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.parametrize("encrypted", [False, True])
@_settings
@given(program=programs)
@with_examples
def test_commands_in_transactions_and_savepoints_agree_with_a_model(
    tmp_path_factory: Any, encrypted: bool, program: list[tuple[str, list[Any]]]
) -> None:
    base: Path = tmp_path_factory.mktemp("tx")
    keys = LocalKeyProvider(bytes(range(32))) if encrypted else None
    with (
        SessionStore.open(base / "inside", sync=False, keys=keys) as inside,
        SessionStore.open(base / "alone", sync=False) as alone,
    ):
        run_program(inside, alone, program)
