"""The OpenAI Agents SDK's `SQLiteSession`: one session object per conversation, one file.

Messages are the SDK's input items in their simplest form (`{"role", "content"}`); `add_items`
writes a list of them in one commit. The SDK's verbs are coroutines; one event loop runs them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from agents import SQLiteSession

from bench.peers._adapter import Adapter, Message, sqlite_durability


class OpenaiAgentsAdapter(Adapter):
    name = "openai-agents"
    title = "OpenAI Agents SQLiteSession"
    distributions = ("openai-agents",)
    fork_method = (
        "no fork: `get_items` of the parent, then `add_items` of them all to a new session"
    )
    batch_method = "one `add_items` call with the batch: one commit"

    _runner: asyncio.Runner | None = None

    def open(self) -> None:
        self._runner = asyncio.Runner()
        self._sessions: dict[str, SQLiteSession] = {}

    def _run(self, coroutine: Any) -> Any:
        assert self._runner is not None, "open() first"
        return self._runner.run(coroutine)

    def _session(self, session_id: str) -> SQLiteSession:
        found = self._sessions.get(session_id)
        if found is None:
            found = SQLiteSession(session_id, self.directory / "sessions.sqlite")
            self._sessions[session_id] = found
        return found

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions = {}
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def create(self) -> str:
        session_id = str(uuid.uuid4())
        self._session(session_id)  # creates the tables; the row comes with the first item
        return session_id

    def append(self, session_id: str, message: Message) -> None:
        self._run(self._session(session_id).add_items([message]))  # type: ignore[list-item]

    def append_batch(self, session_id: str, messages: Sequence[Message]) -> None:
        self._run(self._session(session_id).add_items(list(messages)))  # type: ignore[arg-type]

    def read(self, session_id: str) -> list[Any]:
        return list(self._run(self._session(session_id).get_items()))

    def contents(self, transcript: list[Any]) -> list[str]:
        return [item["content"] for item in transcript]

    def fork(self, session_id: str) -> str:
        child = self.create()
        self._run(self._session(child).add_items(self.read(session_id)))
        return child

    def durability(self) -> dict[str, Any]:
        probe = self._session(str(uuid.uuid4()))
        # The connection the SDK opens and configures for this thread.
        conn = probe._get_connection()
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        level = conn.execute("PRAGMA synchronous").fetchone()[0]
        return sqlite_durability({"journal_mode": mode, "synchronous": level})
