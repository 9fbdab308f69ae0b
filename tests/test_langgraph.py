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
