"""Errors carry their facts as fields (`index`, `where`, `expected`, `got`), so a caller reads
them instead of parsing the message; the message keeps its wording. Real stores in tmp dirs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eventlog import (
    NO_STREAM,
    ConcurrencyError,
    EventLog,
    InvalidArgumentError,
    LengthConflictError,
    LimitExceededError,
    SessionLogError,
    UnknownSessionError,
    limits,
)
from eventlog.events import Message, MessageInjected
from replay import seed_from_jsonl
from sessions import SessionStore


@pytest.fixture
def store(store: SessionStore) -> SessionStore:
    """The shared `store` fixture with session `s` open."""
    store.open_session("s")
    return store


def said(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_a_plain_error_has_no_facts() -> None:
    error = InvalidArgumentError("something")
    assert (error.index, error.where, error.expected, error.got) == (None, None, None, None)
    assert str(error) == "something"


def test_inject_many_names_the_failing_message_by_index(store: SessionStore) -> None:
    batch = [said("a"), said("b"), {"role": "user", "content": {"not": "text"}}, said("d")]
    with pytest.raises(InvalidArgumentError, match=r"inject_many: messages\[2\]") as caught:
        store.inject_many("s", batch)
    assert caught.value.index == 2
    assert caught.value.where == "inject_many: messages[2]"
    assert str(caught.value).startswith(caught.value.where)
    assert store.length("s") == 0


def test_a_limit_inside_one_message_carries_index_expected_and_got(store: SessionStore) -> None:
    files = [f"f{i}" for i in range(limits.files_per_message_max + 1)]
    batch = [said("a"), {"role": "user", "content": "x", "files": files}]
    with pytest.raises(LimitExceededError) as caught:
        store.inject_many("s", batch)
    error = caught.value
    assert (error.index, error.expected, error.got) == (1, limits.files_per_message_max, len(files))
    assert error.limit == error.expected and error.actual == error.got


def test_a_batch_past_the_transcript_bound_names_the_first_message_that_does_not_fit(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "messages_per_transcript_max", 3)
    store.inject("s", said("already"))
    with pytest.raises(LimitExceededError, match="messages_per_transcript_max = 3") as caught:
        store.inject_many("s", [said("a"), said("b"), said("c"), said("d")])
    assert (caught.value.index, caught.value.where) == (2, "inject_many")
    assert (caught.value.expected, caught.value.got) == (3, 5)
    assert store.length("s") == 1


def test_a_message_too_big_for_its_event_is_named_by_index(store: SessionStore) -> None:
    batch = [said("a"), said("b"), said("x" * (limits.event_bytes_max + 1)), said("d")]
    with pytest.raises(LimitExceededError, match="event_bytes_max") as caught:
        store.inject_many("s", batch)
    assert caught.value.index == 2
    assert store.length("s") == 0


def test_an_expected_version_conflict_carries_expected_and_got(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        log.append("a", [MessageInjected(message=Message(role="user"))], expected_version=NO_STREAM)
        with pytest.raises(ConcurrencyError, match="expected version 0 for stream `a`, got 1") as c:
            log.append("a", [MessageInjected(message=Message(role="user"))], expected_version=0)
    assert (c.value.expected, c.value.got) == (0, 1)
    assert (c.value.expected, c.value.actual) == (c.value.expected, c.value.got)


def test_the_failing_event_of_an_append_is_named_by_index(tmp_path: Path) -> None:
    bad = MessageInjected(message=Message(role=5))  # type: ignore[arg-type]
    good = MessageInjected(message=Message(role="user"))
    with EventLog.open(tmp_path / "log") as log:
        with pytest.raises(InvalidArgumentError, match=r"event 1 \(MessageInjected\)") as caught:
            log.append("a", [good, bad], expected_version=NO_STREAM)
        assert caught.value.index == 1
        assert log.head == 0


def test_a_length_conflict_carries_where_expected_and_got(store: SessionStore) -> None:
    store.inject("s", said("a"))
    with pytest.raises(LengthConflictError, match="holds 1 entries, not the expected 0") as caught:
        store.inject("s", said("b"), expected_length=0)
    error = caught.value
    assert (error.where, error.expected, error.got) == ("inject", 0, 1)


def test_an_unknown_session_carries_the_verb_as_where(store: SessionStore) -> None:
    with pytest.raises(UnknownSessionError) as caught:
        store.inject("nope", said("a"))
    assert caught.value.where == "inject"
    assert str(caught.value) == "inject: no session `nope`"


def test_the_seeder_names_the_line_from_the_errors_index_across_batches(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "messages_per_event_max", 2)  # several batches
    rows = [said(str(i)) for i in range(6)]
    rows.insert(4, {"role": "user", "content": {"not": "text"}})
    path = tmp_path / "transcript.jsonl"
    path.write_text("".join(json.dumps({"type": "message", **row}) + "\n" for row in rows))
    before = store.list_sessions()
    result = seed_from_jsonl(store, path)
    assert not result.ok
    assert result.error is not None
    assert result.error.startswith(f"{path}:5: the session engine refused this message: ")
    assert "inject_many" not in result.error
    assert store.list_sessions() == before


def test_every_error_of_the_tree_accepts_the_facts() -> None:
    error = SessionLogError("x", index=3, where="here", expected=1, got=2)
    assert (error.index, error.where, error.expected, error.got) == (3, "here", 1, 2)


def test_the_runtime_owns_its_errors_in_the_one_tree() -> None:
    import eventlog.errors
    from sessions import runtime

    for name in ("SessionBusyError", "SessionFailedError", "InputRejectedError", "ProviderError"):
        cls = getattr(runtime, name)
        assert cls.__module__ == "sessions.runtime._errors"
        assert issubclass(cls, SessionLogError)
        assert not hasattr(eventlog.errors, name)
    busy = runtime.SessionBusyError("s", "r1")
    assert (
        str(busy)
        == "prompt: session `s` is busy with request `r1`; wait for it or cancel it, then prompt again"
    )
