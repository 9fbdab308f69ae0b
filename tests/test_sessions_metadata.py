"""`SessionStore.update_metadata`: keys set and removed as one event, folded by the projection
(and by a rebuild to the same state), refused whole on bad input, on a real LMDB store."""

from __future__ import annotations

import pytest

from sessions import InvalidArgumentError, SessionStore, UnknownSessionError


def test_set_and_remove_in_one_event(store: SessionStore) -> None:
    store.open_session("a", metadata={"keep": 1, "stale": 2})
    after = store.update_metadata("a", {"team": "red", "keep": 3}, remove=["stale", "absent"])
    assert after == {"keep": 3, "team": "red"}
    assert store.summary("a")["metadata"] == after  # type: ignore[index]
    last = store.log.read_stream("a")[-1]
    assert last.type == "session_metadata_set"
    store.rebuild()
    assert store.summary("a")["metadata"] == after  # type: ignore[index]
    assert store.verify(projections=True).ok


def test_forks_keep_their_own_metadata(store: SessionStore) -> None:
    store.open_session("p", metadata={"k": "v"})
    child = store.fork("p", "c")
    store.update_metadata("p", {"k": "parent only"})
    assert store.summary(child)["metadata"] == {"k": "v"}  # type: ignore[index]


def test_bad_changes_write_nothing(store: SessionStore) -> None:
    store.open_session("a")
    head = store.log.head
    for metadata, remove in (({"x": 1}, ["x"]), ("text", ()), ({"x": object()}, ()), (None, "x")):
        with pytest.raises(InvalidArgumentError):
            store.update_metadata("a", metadata, remove=remove)  # type: ignore[arg-type]
    with pytest.raises(UnknownSessionError):
        store.update_metadata("nobody", {"x": 1})
    assert store.log.head == head
