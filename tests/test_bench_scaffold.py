"""`bench/_scaffold.py`: a benchmark run in a child process of its own hands back its results,
its failures, and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import _scaffold
from bench._timing import Result

BUILT: list[int] = []


def _result(name: str) -> Result:
    return Result(
        name=name,
        description="a row",
        unit="ops/s",
        ours=2.0,
        baseline=1.0,
        baseline_description="half",
        target=None,
        rounds=1,
        ours_rounds=[2.0],
        baseline_rounds=[1.0],
    )


def test_a_row_in_a_child_returns_its_results_and_leaves_nothing_behind() -> None:
    def row() -> list[Result]:
        BUILT.extend(range(1000))  # what the row builds lives in the child only
        return [_result("first"), _result("second")]

    results = _scaffold.in_child(row)
    assert [r.name for r in results] == ["first", "second"]
    assert results[0].ours == 2.0 and results[0].baseline_rounds == [1.0]
    assert BUILT == []


def test_a_row_that_raises_in_its_child_raises_here_with_the_childs_traceback() -> None:
    def row() -> list[Result]:
        raise ValueError("the fixture could not be built")

    with pytest.raises(_scaffold.ChildFailed, match="ValueError: the fixture could not be built"):
        _scaffold.in_child(row)


def test_a_child_that_dies_without_results_is_reported() -> None:
    def row() -> list[Result]:
        os._exit(3)

    with pytest.raises(_scaffold.ChildFailed, match=r"ended \(3\) without sending its results"):
        _scaffold.in_child(row)


def test_isolated_rows_run_in_order_each_in_its_own_process() -> None:
    parent = os.getpid()

    def make(name: str) -> _scaffold.Benchmark:
        def row(ctx: _scaffold.Context[_scaffold.Sizes]) -> list[Result]:
            result = _result(name)
            result.notes = {"pid": os.getpid()}
            return [result]

        return row

    ctx = _scaffold.Context(tmp=Path("."), sizes=_scaffold.Sizes(rounds=1), progress=False)
    results = _scaffold.run({"a": make("a"), "b": make("b")}, ctx, ["b", "a"], isolated=True)
    assert [r.name for r in results] == ["b", "a"]
    pids = [r.notes["pid"] for r in results]
    assert parent not in pids
    assert pids[0] != pids[1]
