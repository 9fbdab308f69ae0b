"""What every integration shares: one asyncio face per store, and a clear error for a missing
framework."""

from __future__ import annotations

import importlib.util
import os
import weakref

from sessions import InvalidArgumentError, SessionStore
from sessions.aio import AsyncSessionStore


def require(module: str, extra: str) -> None:
    """Raise a clear `ImportError` when the framework behind `extra` is not installed."""
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent package is missing
        found = None
    if found is None:
        raise ImportError(
            f"this integration needs `{module}`: pip install 'sessionlog-engine[{extra}]'"
        )


_faces: weakref.WeakKeyDictionary[SessionStore, AsyncSessionStore] = weakref.WeakKeyDictionary()
_by_path: dict[str, SessionStore] = {}


def async_store(
    store: SessionStore | AsyncSessionStore | str | os.PathLike[str],
) -> AsyncSessionStore:
    """The one asyncio face of `store` (made once per store, so every session on it shares one
    worker thread). A path opens the store there once per process (a store can be open only once
    in a process); closing it (`face.store.close()`) lets the next user open it again."""
    if isinstance(store, AsyncSessionStore):
        return store
    if isinstance(store, (str, os.PathLike)):
        where = os.path.realpath(os.fspath(store))  # one face per store, however it is reached
        opened = _by_path.get(where)
        if opened is None or opened.log.closed:
            opened = _by_path[where] = SessionStore.open(where)
        store = opened
    if not isinstance(store, SessionStore):
        raise InvalidArgumentError(
            f"`store` must be a SessionStore, an AsyncSessionStore or a path, "
            f"got {type(store).__name__}"
        )
    face = _faces.get(store)
    if face is None:
        face = _faces[store] = AsyncSessionStore(store)
    return face
