"""`integrations.langgraph.SessionlogSaver`: LangGraph's own checkpointer conformance suite with
every capability, and a real `StateGraph` with a messages channel and a tool node through it."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from integrations.langgraph import SessionlogSaver, thread_key
from sessions import SessionStore
from tests._held_worker import cancel_while_held, held_worker

_counter = itertools.count()


@checkpointer_test(name="SessionlogSaver")
async def sessionlog_saver() -> AsyncGenerator[SessionlogSaver, None]:
    with tempfile.TemporaryDirectory(prefix="sessionlog-conformance-") as where:
        store = SessionStore.open(Path(where) / f"store-{next(_counter)}")
        saver = SessionlogSaver(store)
        yield saver
        await saver.face.aclose()


def test_the_conformance_suite_passes_every_capability() -> None:
    report = asyncio.run(validate(sessionlog_saver))
    failures = {name: result.failures for name, result in report.results.items() if result.failures}
    assert not failures, failures
    assert {name for name, result in report.results.items() if result.passed} == {
        cap.value for cap in ALL_CAPABILITIES
    }
    assert report.conformance_level() == "FULL"
    assert all(result.tests_passed > 0 for result in report.results.values())
    assert sum(result.tests_passed for result in report.results.values()) >= 80


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph(saver: SessionlogSaver) -> Any:
    """An agent loop: the model node asks for a tool once per user turn, the tool answers."""

    def model(state: State) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, HumanMessage):
            call = {"name": "lookup", "args": {"q": last.content}, "id": f"call-{last.id}"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        return {"messages": [AIMessage(content=f"answer after {last.content}")]}

    def tool(state: State) -> dict[str, Any]:
        call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
        result = ToolMessage(content=f"found {call['args']['q']}", tool_call_id=call["id"])
        return {"messages": [result]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tool" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(State)
    builder.add_node("model", model)
    builder.add_node("tool", tool)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tool", END])
    builder.add_edge("tool", "model")
    return builder.compile(checkpointer=saver)


def _turn(graph: Any, thread: str, text: str, index: int) -> list[AnyMessage]:
    config = {"configurable": {"thread_id": thread}}
    human = HumanMessage(content=text, id=f"h-{index}")
    return graph.invoke({"messages": [human]}, config)["messages"]  # type: ignore[no-any-return]


def test_a_state_graph_with_a_tool_node_runs_resumes_and_travels_in_time(
    tmp_path: Path,
) -> None:
    saver = SessionlogSaver(SessionStore.open(tmp_path / "store"))
    graph = build_graph(saver)
    first = _turn(graph, "t", "alpha", 0)
    assert [type(m).__name__ for m in first] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    second = _turn(graph, "t", "beta", 1)
    assert len(second) == 8 and second[:4] == first
    history = list(graph.get_state_history({"configurable": {"thread_id": "t"}}))
    assert len(history) == len(list(saver.list({"configurable": {"thread_id": "t"}})))
    # Time travel: resume from the checkpoint right after the first turn ended.
    after_first = next(h for h in history if len(h.values["messages"]) == 4 and not h.next)
    branched = graph.invoke(
        {"messages": [HumanMessage(content="gamma", id="h-2")]}, after_first.config
    )["messages"]
    assert len(branched) == 8 and branched[:4] == first
    assert branched[4].content == "gamma"
    latest = graph.get_state({"configurable": {"thread_id": "t"}}).values["messages"]
    assert [m.content for m in latest][4] == "gamma"  # the branch is now the thread's head
    saver.face.store.close()
    reopened = SessionlogSaver(SessionStore.open(tmp_path / "store"))
    again = build_graph(reopened).get_state({"configurable": {"thread_id": "t"}})
    assert again.values["messages"] == latest
    reopened.face.store.close()


def test_a_list_channel_stores_only_what_was_appended(tmp_path: Path) -> None:
    saver = SessionlogSaver(SessionStore.open(tmp_path / "store"))
    graph = build_graph(saver)
    for index in range(30):
        _turn(graph, "long", f"question {index} " + "x" * 200, index)
    entries = [e["item"] for e in saver.store.messages(thread_key("long"))]
    blobs = [b for e in entries if e["k"] == "cp" for b in e["blobs"] if b[0] == "messages"]
    suffixes = [b for b in blobs if b[2] == "x"]
    assert len(suffixes) >= len(blobs) - 1  # every step after the first stores a suffix
    sizes = [len(b[-1]) for b in blobs[-20:]]
    assert max(sizes) < 2_000  # one or two messages each, not the whole 120-message list
    state = graph.get_state({"configurable": {"thread_id": "long"}}).values["messages"]
    assert len(state) == 120
    saver.face.store.close()


def test_copy_thread_is_a_fork_and_both_sides_go_on(tmp_path: Path) -> None:
    saver = SessionlogSaver(SessionStore.open(tmp_path / "store"))
    graph = build_graph(saver)
    _turn(graph, "source", "alpha", 0)
    saver.copy_thread("source", "copy")
    store = saver.store
    assert store.ancestry(thread_key("copy"))["parent_id"] == thread_key("source")  # type: ignore[index]
    copied = [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "copy"}})]
    original = [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "source"}})]
    assert copied == original
    _turn(graph, "copy", "beta", 1)
    assert len(_turn(graph, "source", "gamma", 2)) == 8
    copy_state = graph.get_state({"configurable": {"thread_id": "copy"}}).values["messages"]
    assert [m.content for m in copy_state][4] == "beta"
    store.close()


def test_async_methods_run_off_the_loop(tmp_path: Path) -> None:
    async def main() -> None:
        saver = SessionlogSaver(SessionStore.open(tmp_path / "store"))
        graph = build_graph(saver)
        config = {"configurable": {"thread_id": "a"}}
        out = await graph.ainvoke({"messages": [HumanMessage(content="hi", id="h")]}, config)
        assert len(out["messages"]) == 4
        found = [t async for t in saver.alist(config, limit=2)]
        assert len(found) == 2 and found[0].checkpoint["id"] > found[1].checkpoint["id"]
        await saver.aprune(["a"])
        assert len([t async for t in saver.alist(config)]) == 1
        assert (await saver.aget_tuple(config)).checkpoint["channel_values"]["messages"] == out[  # type: ignore[union-attr]
            "messages"
        ]
        await saver.face.aclose()

    asyncio.run(main())


def test_a_bad_prune_strategy_is_refused(tmp_path: Path) -> None:
    saver = SessionlogSaver(SessionStore.open(tmp_path / "store"))
    with pytest.raises(ValueError, match="strategy"):
        saver.prune(["t"], strategy="shrink")
    saver.store.close()


def test_two_savers_on_one_store_see_each_other_and_never_lose_a_write(tmp_path: Path) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    store = SessionStore.open(tmp_path / "store")
    one, two = SessionlogSaver(store), SessionlogSaver(store)

    def put(saver: SessionlogSaver, parent: Any, step: int) -> Any:
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"n": step}
        checkpoint["channel_versions"] = {"n": step}
        return saver.put(parent, checkpoint, {"source": "loop", "step": step}, {"n": step})

    root = {"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}
    first = put(one, root, 1)
    assert two.get_tuple(first).checkpoint["channel_values"] == {"n": 1}  # type: ignore[union-attr]
    second = put(two, first, 2)  # `one` has not seen it: its next append must read it first
    third = put(one, second, 3)
    for saver in (one, two):
        steps = [t.metadata["step"] for t in saver.list(root)]
        assert steps == [3, 2, 1]
        latest = saver.get_tuple(root)
        assert latest is not None and latest.config == third
    assert store.length(thread_key("shared")) == 3
    store.close()


# Defects found in review: each test below failed on the saver as it was.


def _cp(checkpoint_id: str, values: dict[str, Any], versions: dict[str, Any]) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    checkpoint["id"] = checkpoint_id
    checkpoint["channel_values"] = dict(values)
    checkpoint["channel_versions"] = dict(versions)
    return checkpoint


def _at(thread: str, checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _values(saver: SessionlogSaver, config: Any) -> dict[str, Any]:
    found = saver.get_tuple(config)
    assert found is not None
    return found.checkpoint["channel_values"]


def test_time_travel_never_rewrites_the_abandoned_branch(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "store")
    saver = SessionlogSaver(store)
    graph = build_graph(saver)
    _turn(graph, "t", "one", 0)
    _turn(graph, "t", "two", 1)
    config = {"configurable": {"thread_id": "t"}}

    def contents(reader: SessionlogSaver) -> dict[str, list[str]]:
        return {
            t.checkpoint["id"]: [m.content for m in t.checkpoint["channel_values"]["messages"]]
            for t in reader.list(config)
            if "messages" in t.checkpoint["channel_values"]
        }

    before = contents(saver)
    after_first = next(
        h for h in graph.get_state_history(config) if len(h.values["messages"]) == 4 and not h.next
    )
    graph.invoke({"messages": [HumanMessage(content="branch", id="h-2")]}, after_first.config)
    for reader in (saver, SessionlogSaver(store)):
        now = contents(reader)
        assert {cid: now[cid] for cid in before} == before
    # Versions a caller chose (or integer versions of a thread written before) may still
    # collide: the later branch keeps its own value, and the earlier branch its own.
    first = saver.put(_at("ints"), _cp("1", {"xs": [1]}, {"xs": 1}), {}, {"xs": 1})
    saver.put(first, _cp("2", {"xs": [1, 2]}, {"xs": 2}), {}, {"xs": 2})
    saver.put(first, _cp("3", {"xs": [1, 9, 9]}, {"xs": 2}), {}, {"xs": 2})
    saver.put(_at("ints", "3"), _cp("4", {"xs": [1, 9, 9]}, {"xs": 2}), {}, {})
    for reader in (saver, SessionlogSaver(store)):
        assert _values(reader, _at("ints", "2")) == {"xs": [1, 2]}
        assert _values(reader, _at("ints", "3")) == {"xs": [1, 9, 9]}
        assert _values(reader, _at("ints", "4")) == {"xs": [1, 9, 9]}
    versions = {saver.get_next_version(None, None) for _ in range(3)}
    assert len(versions) == 3 and saver.get_next_version(4, None) == 5
    store.close()


def test_a_channel_at_its_parents_version_reads_back_and_a_cycle_is_an_error(
    tmp_path: Path,
) -> None:
    import threading

    store = SessionStore.open(tmp_path / "store")
    saver = SessionlogSaver(store)
    first = saver.put(_at("t"), _cp("1", {"m": ["a"]}, {"m": 1}), {}, {"m": 1})
    second = saver.put(first, _cp("2", {"m": ["a", "b"]}, {"m": 2}), {}, {"m": 2})
    # A copy that names every channel version as new: "m" keeps the version its parent has.
    saver.put(second, _cp("3", {"m": ["a", "b"], "n": 1}, {"m": 2, "n": 1}), {}, {"m": 2, "n": 1})
    got: list[Any] = []
    reader = SessionlogSaver(store)
    worker = threading.Thread(target=lambda: got.append(reader.get_tuple(_at("t"))), daemon=True)
    worker.start()
    worker.join(10)
    assert got and got[0].checkpoint["channel_values"] == {"m": ["a", "b"], "n": 1}
    # An item whose value extends itself (as the saver used to write it) is refused, not
    # followed forever.
    suffix = list(saver.serde.dumps_typed(["z"]))
    rest = {k: v for k, v in _cp("1", {}, {"m": 1}).items() if k != "channel_values"}
    item = {
        "k": "cp",
        "ns": "",
        "id": "1",
        "parent": None,
        "cp": list(saver.serde.dumps_typed(rest)),
        "md": list(saver.serde.dumps_typed({})),
        "blobs": [["m", 1, "x", 1, *suffix]],
    }
    store.open_session(thread_key("loop"))
    store.inject(thread_key("loop"), {"item": item})
    errors: list[BaseException] = []

    def read() -> None:
        try:
            SessionlogSaver(store).get_tuple(_at("loop"))
        except BaseException as exc:  # handed over to the test's thread
            errors.append(exc)

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(10)
    from integrations.langgraph import CyclicValueError

    assert errors and isinstance(errors[0], CyclicValueError)
    store.close()


def test_no_caller_reaches_the_values_or_metadata_the_saver_keeps(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "store")
    saver = SessionlogSaver(store)
    item = {"status": "pending"}
    first = saver.put(
        _at("t"), _cp("1", {"items": [item]}, {"items": 1}), {"step": 1}, {"items": 1}
    )
    item["status"] = "done"  # a node updates an element in place, then the graph goes on
    second = saver.put(
        first, _cp("2", {"items": [item, {"n": 2}]}, {"items": 2}), {"step": 2}, {"items": 2}
    )
    assert _values(saver, first) == {"items": [{"status": "pending"}]}
    for reader in (saver, SessionlogSaver(store)):
        assert _values(reader, second) == {"items": [{"status": "done"}, {"n": 2}]}
    read = saver.get_tuple(first)
    assert read is not None
    read.checkpoint["channel_values"]["items"][0]["status"] = "changed by a reader"
    read.metadata["step"] = 42
    again = saver.get_tuple(first)
    assert again is not None and again.checkpoint["channel_values"]["items"] == [
        {"status": "pending"}
    ]
    assert again.metadata["step"] == 1
    assert [t.checkpoint["id"] for t in saver.list(_at("t"), filter={"step": 1})] == ["1"]
    store.close()


def test_a_list_value_comes_back_exactly_as_put_not_merely_equal(tmp_path: Path) -> None:
    import datetime as dt

    utc = dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC)
    paris = utc.astimezone(dt.timezone(dt.timedelta(hours=1)))
    cases = {
        "floats": ([1, 2], [1.0, 2.0, 2.5]),
        "bools": ([1, 0], [True, False, True]),
        "zones": ([utc], [paris, utc]),
        "key order": ([{"a": 1, "b": 2}], [{"b": 2, "a": 1}, {}]),
    }
    store = SessionStore.open(tmp_path / "store")
    saver = SessionlogSaver(store)
    for name, (old, new) in cases.items():
        first = saver.put(_at(name), _cp("1", {"xs": old}, {"xs": 1}), {}, {"xs": 1})
        saver.put(first, _cp("2", {"xs": new}, {"xs": 2}), {}, {"xs": 2})
    for reader in (saver, SessionlogSaver(store)):
        for name, (_, new) in cases.items():
            assert repr(_values(reader, _at(name))["xs"]) == repr(new), name
    store.close()


_WRITER = """
import sys, time
from integrations.langgraph import SessionlogSaver
from sessions import SessionStore
from tests._held_worker import cancel_while_held, held_worker
from langgraph.checkpoint.base import empty_checkpoint
path, who, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = SessionStore.open(path)
saver = SessionlogSaver(store)
time.sleep(max(start - time.time(), 0))  # every writer starts at once
for i in range(40):
    checkpoint = empty_checkpoint()
    checkpoint["id"] = f"{who}-{i:03d}"
    checkpoint["channel_values"] = {"a": [who, i]}
    checkpoint["channel_versions"] = {"a": 1}
    config = {"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}
    saver.put(config, checkpoint, {"who": who}, {"a": 1})
store.close()
"""


def test_writers_in_other_processes_never_make_a_put_fail(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys
    import time

    path = str(tmp_path / "store")
    SessionStore.open(path).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    start = str(time.time() + 3)  # once every writer has imported LangGraph
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, path, who, start], env=env, stderr=subprocess.PIPE
        )
        for who in "ABCD"
    ]
    errors = [writer.communicate(timeout=120)[1].decode() for writer in writers]
    assert all(writer.returncode == 0 for writer in writers), errors
    store = SessionStore.open(path)
    assert len(list(SessionlogSaver(store).list(_at("shared")))) == 160
    store.close()


def test_prune_keeps_the_newest_checkpoint_another_writer_just_added(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "store")
    saver, other = SessionlogSaver(store), SessionlogSaver(store)
    first = saver.put(_at("t"), _cp("1", {"a": 1}, {"a": 1}), {}, {"a": 1})
    saver.put(first, _cp("2", {"a": 2}, {"a": 2}), {}, {"a": 2})
    hide = saver._hide

    def racing(thread_id: str, doomed: Any) -> None:  # another writer puts "3" right now
        other._put(_at("t", "2"), _cp("3", {"a": 3}, {"a": 3}), {}, {"a": 3})
        hide(thread_id, doomed)

    saver._hide = racing  # type: ignore[method-assign]
    saver.prune(["t"])
    assert [t.checkpoint["id"] for t in saver.list(_at("t"))] == ["3"]
    store.close()


def test_a_refused_put_writes_nothing_and_names_the_limit(tmp_path: Path) -> None:
    from sessions import LimitExceededError

    store = SessionStore.open(tmp_path / "store")
    saver = SessionlogSaver(store)
    big = {"doc": b"x" * (5 << 20)}
    with pytest.raises(LimitExceededError, match="event_bytes_max") as refused:
        saver.put(_at("big"), _cp("1", big, {"doc": 1}), {}, {"doc": 1})
    assert refused.value.limit_name == "event_bytes_max"
    assert not store.exists(thread_key("big"))
    assert saver.get_tuple(_at("big")) is None
    long_id = "t" * 130
    with pytest.raises(LimitExceededError, match="session_id_bytes_max"):
        saver.put(_at(long_id), _cp("1", {"a": 1}, {"a": 1}), {}, {"a": 1})
    assert saver.get_tuple(_at(long_id)) is None
    saver.put(_at("big"), _cp("1", {"doc": b"small"}, {"doc": 1}), {}, {"doc": 1})
    assert _values(SessionlogSaver(store), _at("big")) == {"doc": b"small"}
    store.close()


def test_the_empty_thread_id_is_listed_and_its_runs_deleted(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "store")
    saver = SessionlogSaver(store)
    saver.put(_at(""), _cp("1", {"a": 1}, {"a": 1}), {"run_id": "R"}, {"a": 1})
    saver.put(_at("x"), _cp("2", {"a": 1}, {"a": 1}), {"run_id": "R"}, {"a": 1})
    assert sorted(t.config["configurable"]["thread_id"] for t in saver.list(None)) == ["", "x"]
    saver.delete_for_runs(["R"])
    assert list(saver.list(_at(""))) == [] and list(saver.list(None)) == []
    store.close()


def test_a_cancelled_aput_raises_once_the_checkpoint_is_stored(tmp_path: Path) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    async def main() -> None:
        saver = SessionlogSaver(SessionStore.open(tmp_path / "store", sync=False))
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": [HumanMessage(content="hi", id="h")]}
        checkpoint["channel_versions"] = {"messages": 1}
        metadata = {"source": "input", "step": -1, "parents": {}}
        async with held_worker(saver.face) as release:
            task = asyncio.ensure_future(
                saver.aput(config, checkpoint, metadata, {"messages": 1})  # type: ignore[arg-type]
            )
            await cancel_while_held(task, release)
        found = await saver.aget_tuple(config)  # type: ignore[arg-type]
        assert found is not None and found.checkpoint["id"] == checkpoint["id"]
        await saver.face.aclose()

    asyncio.run(main())
