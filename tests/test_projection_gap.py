"""Events appended by a bare `EventLog` (no projector) while a `SessionStore` is open on the same
log, in another process: the store's next commit folds them before its own, so the projection
neither skips them nor marks them seen (`projections._queries.catch_up_before`)."""

from __future__ import annotations

import pytest

from eventlog import EventLog, LengthConflictError, UnknownSessionError
from eventlog import events as ev
from projections import projected_position
from sessions import SessionStore
from tests.conftest import STORE_KINDS, run_processes


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """LMDB, and PostgreSQL, where the bare writer is another connection."""
    kind: str = request.param
    return kind


def append_bare(target: str, sid: str, texts: list[str]) -> None:
    """In a process of its own: append `texts` to the session's stream with no projector."""
    with EventLog.open(target) as log:
        for text in texts:
            message = ev.Message(role="user", content=text)
            log.append(
                sid, [ev.MessageInjected(message=message)], expected_version=log.stream_version(sid)
            )


def contents(store: SessionStore, sid: str) -> list[str]:
    return [m["content"] for m in store.messages(sid)]


def test_the_next_commit_folds_what_a_bare_log_appended_meanwhile(
    store: SessionStore, store_target: str
) -> None:
    sid = store.open_session()
    store.inject(sid, {"role": "user", "content": "a"})
    run_processes(append_bare, [(store_target, sid, ["bare 1", "bare 2"])])
    store.inject(sid, {"role": "user", "content": "b"})
    assert contents(store, sid) == ["a", "bare 1", "bare 2", "b"]
    assert store.verify(projections=True).ok


def test_a_transaction_of_several_commands_folds_the_gap_once(
    store: SessionStore, store_target: str
) -> None:
    sid, other = store.open_session(), store.open_session()
    run_processes(append_bare, [(store_target, sid, ["bare"])])
    with store.transaction():
        store.inject(other, {"role": "user", "content": "x"})
        store.inject(sid, {"role": "user", "content": "y"})
    assert contents(store, sid) == ["bare", "y"]
    assert contents(store, other) == ["x"]
    assert store.verify(projections=True).ok


def test_a_refused_command_does_not_take_back_the_fold_before_it(
    store: SessionStore, store_target: str
) -> None:
    sid = store.open_session()
    store.inject(sid, {"role": "user", "content": "a"})  # its segment, held: folding more
    run_processes(append_bare, [(store_target, sid, ["bare"])])  # only defers its values
    with pytest.raises(UnknownSessionError):
        store.inject("nobody", {"role": "user", "content": "x"})
    with store.log.view() as view:
        assert projected_position(view) == view.head  # folded in a commit of its own
    assert contents(store, sid) == ["a", "bare"]


def delete_bare(target: str, sid: str) -> None:
    """In a process of its own: delete the session with no projector."""
    with EventLog.open(target) as log:
        log.append(
            sid, [ev.SessionDeleted(reason="bare")], expected_version=log.stream_version(sid)
        )


def test_a_command_decides_on_what_a_bare_log_appended(
    store: SessionStore, store_target: str
) -> None:
    """The bare writer's events are folded as the store's next write transaction starts, before
    its command reads the transcript: the length it checks counts them."""
    sid = store.open_session()
    store.inject(sid, {"role": "user", "content": "a"})
    run_processes(append_bare, [(store_target, sid, ["bare"])])
    with pytest.raises(LengthConflictError):
        store.inject(sid, {"role": "user", "content": "stale"}, expected_length=1)
    store.inject(sid, {"role": "user", "content": "b"}, expected_length=2)
    assert contents(store, sid) == ["a", "bare", "b"]
    assert store.verify(projections=True).ok


def test_a_session_a_bare_log_deleted_refuses_the_next_command(
    store: SessionStore, store_target: str
) -> None:
    sid = store.open_session()
    store.inject(sid, {"role": "user", "content": "a"})
    run_processes(delete_bare, [(store_target, sid)])
    with pytest.raises(UnknownSessionError):
        store.inject(sid, {"role": "user", "content": "after"})
    assert store.verify(projections=True).ok
    assert sid not in store.list_sessions()
