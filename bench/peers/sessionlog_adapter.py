"""sessionlog through its public engine, `sessions.SessionStore`, with its default durable commits.

Each verb is the one a caller uses: `inject` (one durable commit), `inject_many` (one commit for
the batch), `messages` (the transcript as dicts), `fork` (a child sharing the parent's prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.peers._adapter import Adapter, Message
from sessions import SessionStore


class SessionlogAdapter(Adapter):
    name = "sessionlog"
    title = "sessionlog"
    distributions = ("sessionlog-engine", "lmdb")
    fork_method = "native `fork`: one event; the child shares the parent's prefix"
    batch_method = "`inject_many`: one durable commit per batch"
    concurrent = True  # threads calling `inject` share durable commits (group commit)

    _store: SessionStore | None = None

    def open(self) -> None:
        self._store = SessionStore.open(self.directory)  # durable by default: sync=True

    @property
    def store(self) -> SessionStore:
        assert self._store is not None, "open() first"
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def create(self) -> str:
        return self.store.open_session()

    def append(self, session_id: str, message: Message) -> None:
        self.store.inject(session_id, message)

    def append_batch(self, session_id: str, messages: Sequence[Message]) -> None:
        self.store.inject_many(session_id, messages)

    def read(self, session_id: str) -> list[Any]:
        return self.store.messages(session_id)

    def contents(self, transcript: list[Any]) -> list[str]:
        return [message["content"] for message in transcript]

    def fork(self, session_id: str) -> str:
        return self.store.fork(session_id)

    def durability(self) -> dict[str, Any]:
        return {
            "settings": "LMDB sync=True, metasync=True, no writemap (the default `open`)",
            "durable": True,
            "note": "",
        }
