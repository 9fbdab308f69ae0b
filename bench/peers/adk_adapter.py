"""Google ADK's `DatabaseSessionService` on SQLite (SQLAlchemy with the aiosqlite driver).

A message is an ADK `Event` (author and `Content` with one text part); `append_event` commits one
event. ADK has no batch verb and no fork. The service's verbs are coroutines; one event loop runs
them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from google.adk.events import Event
from google.adk.sessions import DatabaseSessionService, Session
from google.genai import types
from sqlalchemy import text

from bench.peers._adapter import Adapter, Message, sqlite_durability

_APP = "bench"
_USER = "user-1"


def _event(message: Message) -> Event:
    role = "user" if message["role"] == "user" else "model"
    return Event(
        author=role,
        invocation_id=Event.new_id(),
        content=types.Content(role=role, parts=[types.Part(text=message["content"])]),
    )


class AdkAdapter(Adapter):
    name = "google-adk"
    title = "Google ADK DatabaseSessionService"
    distributions = ("google-adk", "sqlalchemy", "aiosqlite")
    fork_method = (
        "no fork: `get_session` of the parent, `create_session`, then `append_event` of each "
        "event (one commit each; there is no batch verb)"
    )
    batch_method = "no batch verb: one `append_event` (one commit) per message"

    _runner: asyncio.Runner | None = None

    def open(self) -> None:
        self._runner = asyncio.Runner()
        url = f"sqlite+aiosqlite:///{self.directory / 'sessions.sqlite'}"
        self._service = DatabaseSessionService(db_url=url)
        self._sessions: dict[str, Session] = {}

    def _run(self, coroutine: Any) -> Any:
        assert self._runner is not None, "open() first"
        return self._runner.run(coroutine)

    def close(self) -> None:
        if self._runner is not None:
            self._run(self._service.close())
            self._runner.close()
            self._runner = None

    async def _get(self, session_id: str) -> Session:
        found = self._sessions.get(session_id)
        if found is None:
            found = await self._service.get_session(
                app_name=_APP, user_id=_USER, session_id=session_id
            )
            assert found is not None, f"no session {session_id}"
            self._sessions[session_id] = found
        return found

    def create(self) -> str:
        session = self._run(self._service.create_session(app_name=_APP, user_id=_USER))
        self._sessions[session.id] = session
        return str(session.id)

    def append(self, session_id: str, message: Message) -> None:
        self.append_batch(session_id, [message])

    def append_batch(self, session_id: str, messages: Sequence[Message]) -> None:
        async def go() -> None:
            session = await self._get(session_id)
            for message in messages:
                await self._service.append_event(session, _event(message))

        self._run(go())

    def read(self, session_id: str) -> list[Any]:
        session = self._run(
            self._service.get_session(app_name=_APP, user_id=_USER, session_id=session_id)
        )
        return list(session.events)

    def contents(self, transcript: list[Any]) -> list[str]:
        return [event.content.parts[0].text for event in transcript]

    def fork(self, session_id: str) -> str:
        async def go() -> str:
            parent = await self._service.get_session(
                app_name=_APP, user_id=_USER, session_id=session_id
            )
            assert parent is not None, f"no session {session_id}"
            child = await self._service.create_session(app_name=_APP, user_id=_USER)
            for old in parent.events:
                copy = old.model_copy(update={"id": Event.new_id()})
                await self._service.append_event(child, copy)
            self._sessions[child.id] = child
            return str(child.id)

        return str(self._run(go()))

    def durability(self) -> dict[str, Any]:
        async def go() -> tuple[str, int]:
            async with self._service.db_engine.connect() as conn:
                mode = (await conn.execute(text("PRAGMA journal_mode"))).scalar_one()
                level = (await conn.execute(text("PRAGMA synchronous"))).scalar_one()
            return str(mode), int(level)

        mode, level = self._run(go())
        return sqlite_durability({"journal_mode": mode, "synchronous": level})
