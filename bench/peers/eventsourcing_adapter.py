"""The `eventsourcing` library on SQLite: one aggregate per session, one event per message.

The application keeps each aggregate it wrote in memory between appends (as a long-lived process
serving a session would), so an append is `save()` of the new events and no replay; a cold read
is `repository.get()`, which replays the aggregate's events (snapshotting is off by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from bench.peers._adapter import Adapter, Message, sqlite_durability


class Conversation(Aggregate):
    @event("Started")
    def __init__(self, messages: list[Message]) -> None:
        self.messages = list(messages)

    @event("MessageAdded")
    def add_message(self, message: Message) -> None:
        self.messages.append(message)


class Conversations(Application):
    pass


class EventsourcingAdapter(Adapter):
    name = "eventsourcing"
    title = "eventsourcing (SQLite)"
    distributions = ("eventsourcing",)
    fork_method = (
        "no fork: a new aggregate whose creation event carries the parent's messages "
        "(one event, one commit)"
    )
    batch_method = "the batch's events triggered on the aggregate, then one `save()`"

    _app: Conversations | None = None

    def open(self) -> None:
        self._app = Conversations(
            env={
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": str(self.directory / "events.sqlite"),
            }
        )
        self._live: dict[str, Conversation] = {}

    @property
    def app(self) -> Conversations:
        assert self._app is not None, "open() first"
        return self._app

    def close(self) -> None:
        if self._app is not None:
            self._app.close()
            self._app = None

    def _aggregate(self, session_id: str) -> Conversation:
        found = self._live.get(session_id)
        if found is None:
            found = self.app.repository.get(UUID(session_id))
            self._live[session_id] = found
        return found

    def create(self) -> str:
        conversation = Conversation(messages=[])
        self.app.save(conversation)
        self._live[str(conversation.id)] = conversation
        return str(conversation.id)

    def append(self, session_id: str, message: Message) -> None:
        conversation = self._aggregate(session_id)
        conversation.add_message(message)
        self.app.save(conversation)

    def append_batch(self, session_id: str, messages: Sequence[Message]) -> None:
        conversation = self._aggregate(session_id)
        for message in messages:
            conversation.add_message(message)
        self.app.save(conversation)

    def read(self, session_id: str) -> list[Any]:
        conversation: Conversation = self.app.repository.get(UUID(session_id))
        return conversation.messages

    def contents(self, transcript: list[Any]) -> list[str]:
        return [message["content"] for message in transcript]

    def fork(self, session_id: str) -> str:
        child = Conversation(messages=self._aggregate(session_id).messages)
        self.app.save(child)
        self._live[str(child.id)] = child
        return str(child.id)

    def durability(self) -> dict[str, Any]:
        datastore = self.app.factory.datastore  # type: ignore[attr-defined]
        with datastore.transaction(commit=False) as cursor:
            cursor.execute("PRAGMA journal_mode")
            mode = cursor.fetchone()[0]
            cursor.execute("PRAGMA synchronous")
            level = cursor.fetchone()[0]
        return sqlite_durability({"journal_mode": mode, "synchronous": level})
