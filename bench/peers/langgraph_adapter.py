"""LangGraph's `SqliteSaver`: one thread per session, one checkpoint per append.

A one-node `StateGraph` over `MessagesState` (the `add_messages` reducer) is compiled with the
saver; appending is `update_state` with the new messages, which writes one checkpoint, as a graph
step would. The saver stores each checkpoint with the whole message list in it.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

from bench.peers._adapter import Adapter, Message, sqlite_durability

_NODE = "agent"


def _config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


class LanggraphAdapter(Adapter):
    name = "langgraph"
    title = "LangGraph SqliteSaver"
    distributions = ("langgraph", "langgraph-checkpoint-sqlite")
    fork_method = (
        "no cross-thread fork: the parent's messages written as the first checkpoint of a new "
        "thread (one `update_state`); an in-thread fork from a checkpoint writes the same full "
        "checkpoint"
    )
    batch_method = "one `update_state` with the batch's messages: one checkpoint"

    _conn: sqlite3.Connection | None = None

    def open(self) -> None:
        # As the library's own `from_conn_string` connects.
        self._conn = sqlite3.connect(
            str(self.directory / "checkpoints.sqlite"), check_same_thread=False
        )
        self._saver = SqliteSaver(self._conn)
        builder = StateGraph(MessagesState)
        builder.add_node(_NODE, lambda state: {})
        builder.add_edge(START, _NODE)
        builder.add_edge(_NODE, END)
        self._graph = builder.compile(checkpointer=self._saver)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def create(self) -> str:
        return str(uuid.uuid4())  # a thread exists from its first checkpoint on

    def append(self, session_id: str, message: Message) -> None:
        self._graph.update_state(_config(session_id), {"messages": [message]}, as_node=_NODE)

    def append_batch(self, session_id: str, messages: Sequence[Message]) -> None:
        self._graph.update_state(_config(session_id), {"messages": list(messages)}, as_node=_NODE)

    def read(self, session_id: str) -> list[Any]:
        values = self._graph.get_state(_config(session_id)).values
        return list(values.get("messages", []))

    def contents(self, transcript: list[Any]) -> list[str]:
        return [message.content for message in transcript]

    def fork(self, session_id: str) -> str:
        child = str(uuid.uuid4())
        self._graph.update_state(_config(child), {"messages": self.read(session_id)}, as_node=_NODE)
        return child

    def durability(self) -> dict[str, Any]:
        assert self._conn is not None, "open() first"
        self._saver.setup()  # the saver sets its journal mode on first use
        mode = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
        level = self._conn.execute("PRAGMA synchronous").fetchone()[0]
        return sqlite_durability({"journal_mode": mode, "synchronous": level})
