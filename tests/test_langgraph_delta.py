"""`SessionlogSaver` under LangGraph's `DeltaChannel`, which stores a snapshot of its value only
every few updates and otherwise rebuilds it from the writes of the checkpoint's ancestors.

A real `StateGraph` runs the same turns through `SessionlogSaver` and through LangGraph's own
`InMemorySaver`, and every reading (the head, each older checkpoint, a branch resumed from one,
the ancestor history itself) must agree. The graph feeds each value to the delta channel `log`
and to the plain reducer channel `plain` alike, so `plain` is an oracle too: they must always be
equal. Two nodes write `log` in one step, so the replayed order of writes matters."""

from __future__ import annotations

import asyncio
import json
import operator
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from integrations.langgraph import SessionlogSaver
from sessions import SessionStore

SNAPSHOT_EVERY = 3
TURNS = 4  # four updates of `log` a turn: sixteen, so the head is no snapshot (15 is)


def extend(current: list[str] | None, writes: Sequence[Any]) -> list[str]:
    """The delta reducer: every write (a list) appended, in order."""
    out = list(current or [])
    for write in writes:
        out.extend(write if isinstance(write, list) else [write])
    return out


class State(TypedDict):
    log: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=SNAPSHOT_EVERY)]
    plain: Annotated[list[str], operator.add]
    n: int


class SlowState(TypedDict):
    """`State` with a snapshot every ten updates: under `durability="exit"`, which stores one
    checkpoint a turn, `State` would store a snapshot in each."""

    log: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=10)]
    plain: Annotated[list[str], operator.add]
    n: int


def build(saver: BaseCheckpointSaver[Any], schema: type[Any] = State) -> Any:
    """Each turn: `step`, then `left` and `right` side by side, then `step` again."""

    def step(state: Any) -> dict[str, Any]:
        n = state["n"]
        return {"log": [f"s{n}"], "plain": [f"s{n}"], "n": n + 1}

    def left(state: Any) -> dict[str, Any]:
        return {"log": [f"L{state['n']}"], "plain": [f"L{state['n']}"]}

    def right(state: Any) -> dict[str, Any]:
        return {"log": [f"R{state['n']}"], "plain": [f"R{state['n']}"]}

    def route(state: Any) -> Any:
        return END if state["n"] % 3 == 0 else ["left", "right"]

    builder = StateGraph(schema)
    builder.add_node("step", step)
    builder.add_node("left", left)
    builder.add_node("right", right)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", route, ["left", "right", END])
    builder.add_edge("left", "step")
    builder.add_edge("right", "step")
    return builder.compile(checkpointer=saver)


def thread(thread_id: str, run_id: str | None = None) -> Any:
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
    if run_id is not None:
        config["metadata"] = {"run_id": run_id}
    return config


def turn(index: int, tag: str = "in") -> dict[str, Any]:
    return {"log": [f"{tag}{index}"], "plain": [f"{tag}{index}"], "n": 3 * index + 1}


def drive(
    graph: Any, config: Any, turns: range, tag: str = "in", durability: str = "async"
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for index in turns:
        out = graph.invoke(turn(index, tag), config, durability=durability)
    return out


def history(graph: Any, config: Any) -> list[tuple[Any, ...]]:
    """What a caller sees at every checkpoint, newest first, without the saver's own ids."""
    return [(s.metadata["step"], s.values, s.next) for s in graph.get_state_history(config)]


def snapshot_steps(saver: BaseCheckpointSaver[Any], config: Any) -> list[int]:
    return [
        found.metadata["step"]
        for found in saver.list(config)
        if isinstance(found.checkpoint["channel_values"].get("log"), _DeltaSnapshot)
    ]


def consistent(values: dict[str, Any]) -> dict[str, Any]:
    assert values["log"] == values["plain"], values
    return values


def open_saver(path: Path) -> SessionlogSaver:
    return SessionlogSaver(SessionStore.open(path))


@pytest.mark.parametrize(
    ("durability", "schema"), [("sync", State), ("async", State), ("exit", SlowState)]
)
def test_every_checkpoint_reads_back_as_the_reference_saver_reads_it(
    tmp_path: Path, durability: str, schema: type[Any]
) -> None:
    ours, ref = open_saver(tmp_path / "store"), InMemorySaver()
    graph, reference = build(ours, schema), build(ref, schema)
    final = drive(graph, thread("t"), range(TURNS), durability=durability)
    assert final == drive(reference, thread("t"), range(TURNS), durability=durability)
    assert len(consistent(final)["log"]) == 5 * TURNS
    found = history(graph, thread("t"))
    assert found == history(reference, thread("t"))
    assert snapshot_steps(ours, thread("t")) == snapshot_steps(ref, thread("t"))
    assert len(snapshot_steps(ours, thread("t"))) >= (1 if durability == "exit" else 4)
    head = ours.get_tuple(thread("t"))
    assert head is not None and "log" not in head.checkpoint["channel_values"]
    # Time travel: each older checkpoint on its own, through `get_state`.
    for state in graph.get_state_history(thread("t")):
        assert consistent(graph.get_state(state.config).values) == state.values
    ours.store.close()


def test_a_branch_resumed_from_an_older_checkpoint_replays_only_its_own_writes(
    tmp_path: Path,
) -> None:
    ours, ref = open_saver(tmp_path / "store"), InMemorySaver()
    results = []
    for graph in (build(ours), build(ref)):
        drive(graph, thread("t"), range(TURNS))
        states = list(graph.get_state_history(thread("t")))
        # A checkpoint in the third turn, past a snapshot and before the next one.
        base = next(s for s in states if s.metadata["step"] == 9)
        assert "log" not in (graph.checkpointer.get_tuple(base.config).checkpoint["channel_values"])
        branched = graph.invoke(turn(9, "fork"), base.config)
        later = drive(graph, thread("t"), range(10, 12), "after")
        results.append((consistent(branched), consistent(later), history(graph, thread("t"))))
    assert results[0] == results[1]
    assert not any(v.startswith("in3") for v in results[0][1]["log"])  # the abandoned turn
    ours.store.close()


def test_update_state_at_an_older_checkpoint_forks_as_the_reference_saver_does(
    tmp_path: Path,
) -> None:
    ours, ref = open_saver(tmp_path / "store"), InMemorySaver()
    results = []
    for graph in (build(ours), build(ref)):
        drive(graph, thread("t"), range(TURNS))
        base = next(s for s in graph.get_state_history(thread("t")) if s.metadata["step"] == 7)
        forked = graph.update_state(base.config, {"log": ["patched"], "plain": ["patched"]}, "step")
        patched = consistent(graph.get_state(forked).values)
        later = drive(graph, thread("t"), range(TURNS, TURNS + 1), "after")
        results.append((patched, consistent(later), history(graph, thread("t"))))
    assert results[0] == results[1]
    assert results[0][0]["log"][-1] == "patched"
    ours.store.close()


def delta_history_as_values(found: Any) -> dict[str, Any]:
    """A delta history without task ids (each saver's checkpoints have their own)."""
    return {
        channel: (entry.get("seed", "-"), [(w[1], w[2]) for w in entry["writes"]])
        for channel, entry in found.items()
    }


def test_the_delta_history_matches_the_reference_sync_and_async(tmp_path: Path) -> None:
    ours, ref = open_saver(tmp_path / "store"), InMemorySaver()
    drive(build(ours), thread("t"), range(TURNS))
    drive(build(ref), thread("t"), range(TURNS))
    pairs = list(zip(ours.list(thread("t")), ref.list(thread("t")), strict=True))
    channels = ["log", "plain", "n", "branch:to:step", "never-written"]
    for mine, theirs in pairs:
        found = ours.get_delta_channel_history(config=mine.config, channels=channels)
        walked = BaseCheckpointSaver.get_delta_channel_history(
            ours, config=mine.config, channels=channels
        )
        assert found == walked  # the default walk, task ids and all
        again = asyncio.run(ours.aget_delta_channel_history(config=mine.config, channels=channels))
        assert again == found
        expected = ref.get_delta_channel_history(config=theirs.config, channels=channels)
        assert delta_history_as_values(found) == delta_history_as_values(expected)
    latest = ours.get_delta_channel_history(config=thread("t"), channels=["log"])
    assert latest == ours.get_delta_channel_history(config=pairs[0][0].config, channels=["log"])
    assert ours.get_delta_channel_history(config=thread("t"), channels=[]) == {}
    assert ours.get_delta_channel_history(config=thread("none"), channels=["log"]) == {
        "log": {"writes": []}
    }
    ours.store.close()


def test_copy_thread_carries_the_whole_chain_and_both_sides_go_on(tmp_path: Path) -> None:
    ours, ref = open_saver(tmp_path / "store"), InMemorySaver()
    graph, reference = build(ours), build(ref)
    drive(graph, thread("source"), range(TURNS))
    ours.copy_thread("source", "copy")
    assert history(graph, thread("copy")) == history(graph, thread("source"))
    copy = drive(graph, thread("copy"), range(TURNS, TURNS + 2), "copy")
    source = drive(graph, thread("source"), range(TURNS, TURNS + 1), "source")
    # The reference has no copy_thread: it runs each side's turns from the start.
    drive(reference, thread("copy"), range(TURNS))
    assert copy == drive(reference, thread("copy"), range(TURNS, TURNS + 2), "copy")
    drive(reference, thread("source"), range(TURNS))
    assert source == drive(reference, thread("source"), range(TURNS, TURNS + 1), "source")
    assert history(graph, thread("copy")) == history(reference, thread("copy"))
    assert history(graph, thread("source")) == history(reference, thread("source"))
    ours.prune(["copy"])  # pruning the copy leaves the source's history whole
    assert consistent(graph.get_state(thread("copy")).values) == copy
    assert history(graph, thread("source")) == history(reference, thread("source"))
    ours.store.close()


def test_prune_keep_latest_leaves_the_delta_state_whole(tmp_path: Path) -> None:
    ours, ref = open_saver(tmp_path / "store"), InMemorySaver()
    graph, reference = build(ours), build(ref)
    before = drive(graph, thread("t"), range(TURNS))
    drive(reference, thread("t"), range(TURNS))
    ours.prune(["t"], strategy="keep_latest")
    assert len(list(ours.list(thread("t")))) == 1
    assert graph.get_state(thread("t")).values == before  # not an empty `log`
    found = ours.get_delta_channel_history(config=thread("t"), channels=["log"])["log"]
    assert isinstance(found.get("seed"), _DeltaSnapshot)
    after = drive(graph, thread("t"), range(TURNS, TURNS + 2))
    assert consistent(after) == drive(reference, thread("t"), range(TURNS, TURNS + 2))
    asyncio.run(ours.aprune(["t"]))
    assert asyncio.run(build(ours).aget_state(thread("t"))).values == after
    ours.store.close()


def test_delete_for_runs_hides_a_run_and_leaves_the_other_runs_state_whole(
    tmp_path: Path,
) -> None:
    """Deleting a run hides its checkpoints and their writes from every reader, as the base
    class says; a checkpoint of another run still reads back the state it had, even when the
    run deleted was its ancestor (its delta history walks through the hidden checkpoints)."""
    ours = open_saver(tmp_path / "store")
    graph = build(ours)
    for index in range(TURNS):
        graph.invoke(turn(index), thread("t", f"run-{index}"))
    before = {
        s.config["configurable"]["checkpoint_id"]: s for s in graph.get_state_history(thread("t"))
    }
    ours.delete_for_runs(["run-1"])
    left = list(graph.get_state_history(thread("t")))
    assert {s.metadata["run_id"] for s in left} == {"run-0", "run-2", "run-3"}
    deleted = [s for s in before.values() if s.metadata["run_id"] == "run-1"]
    assert len(deleted) == 5 and len(left) == len(before) - len(deleted)
    assert all(ours.get_tuple(s.config) is None for s in deleted)
    for state in left:
        assert state.values == before[state.config["configurable"]["checkpoint_id"]].values
        assert consistent(graph.get_state(state.config).values) == state.values
    after = graph.invoke(turn(TURNS), thread("t", f"run-{TURNS}"))
    assert consistent(after) == drive(build(InMemorySaver()), thread("t"), range(TURNS + 1))
    ours.store.close()


def test_an_async_graph_reads_back_as_the_reference_saver_reads_it(tmp_path: Path) -> None:
    async def main() -> list[Any]:
        ours, ref = open_saver(tmp_path / "store"), InMemorySaver()
        seen = []
        for graph in (build(ours), build(ref)):
            for index in range(TURNS):
                await graph.ainvoke(turn(index), thread("t"))
            states = [s async for s in graph.aget_state_history(thread("t"))]
            older = await graph.aget_state(states[5].config)
            seen.append(([(s.metadata["step"], s.values) for s in states], older.values))
        await ours.face.aclose()
        return seen

    mine, theirs = asyncio.run(main())
    assert mine == theirs


class Inner(TypedDict):
    log: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=2)]
    k: int


def build_nested(saver: BaseCheckpointSaver[Any]) -> Any:
    """An outer graph whose subgraph (a namespace of its own) asks for input three times."""

    def work(state: Any) -> dict[str, Any]:
        return {"log": [f"a{state.get('k', 0)}"], "k": state.get("k", 0) + 1}

    def ask(state: Any) -> dict[str, Any]:
        return {"log": [f"answer-{interrupt('more?')}"], "k": state.get("k", 0) + 1}

    inner = StateGraph(Inner)
    inner.add_node("work", work)
    inner.add_node("ask", ask)
    inner.add_edge(START, "work")
    inner.add_edge("work", "ask")
    inner.add_conditional_edges("ask", lambda s: END if s["k"] >= 5 else "work", ["work", END])
    outer = StateGraph(Inner)
    outer.add_node("inner", inner.compile())
    outer.add_node("tail", lambda state: {"log": ["tail"]})
    outer.add_edge(START, "inner")
    outer.add_edge("inner", "tail")
    return outer.compile(checkpointer=saver)


def test_a_subgraph_resumed_after_interrupts_reads_back_as_the_reference_saver_reads_it(
    tmp_path: Path,
) -> None:
    """Ours is pruned while the subgraph waits: every namespace keeps only its newest
    checkpoint, and the subgraph's resumed state must still hold what it had."""
    ours = open_saver(tmp_path / "store")
    seen = []
    for saver in (ours, InMemorySaver()):
        graph = build_nested(saver)
        waiting = [graph.invoke({"log": ["start"]}, thread("t"))]
        for answer in range(3):
            if answer == 2:
                paused = graph.get_state(thread("t"), subgraphs=True).tasks[0].state.values
                if saver is ours:
                    saver.prune(["t"])
                assert graph.get_state(thread("t"), subgraphs=True).tasks[0].state.values == paused
            waiting.append(graph.invoke(Command(resume=f"r{answer}"), thread("t")))
        seen.append(([w["log"] for w in waiting], paused, graph.get_state(thread("t")).values))
    assert seen[0] == seen[1]
    assert seen[0][1]["log"] == ["start", "a0", "answer-r0", "a2", "answer-r1", "a4"]
    assert seen[0][2]["log"][-3:] == ["a4", "answer-r2", "tail"]
    ours.store.close()


_READER = """
import json, sys
from integrations.langgraph import SessionlogSaver
from sessions import SessionStore
from tests.test_langgraph_delta import build, thread
store = SessionStore.open(sys.argv[1])
graph = build(SessionlogSaver(store))
states = [[s.metadata["step"], s.values] for s in graph.get_state_history(thread("t"))]
print(json.dumps({"head": graph.get_state(thread("t")).values, "history": states}))
store.close()
"""


def test_a_new_process_reopening_the_store_reads_the_same_state(tmp_path: Path) -> None:
    ours = open_saver(tmp_path / "store")
    graph = build(ours)
    drive(graph, thread("t"), range(TURNS))
    ours.prune(["t"])
    drive(graph, thread("t"), range(TURNS, TURNS + 1))
    expected = {
        "head": graph.get_state(thread("t")).values,
        "history": [[s.metadata["step"], s.values] for s in graph.get_state_history(thread("t"))],
    }
    assert expected["head"] == drive(build(InMemorySaver()), thread("t"), range(TURNS + 1))
    ours.store.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", _READER, str(tmp_path / "store")],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout) == expected
