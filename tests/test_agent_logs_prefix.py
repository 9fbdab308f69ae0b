"""Importing a grown log checks that the file still begins with the bytes an earlier import read,
and compares the messages the earlier import stored with a fresh reading of the grown file, to
find the first that differs. Both are slow (a 50 MB log to hash, tens of thousands of messages to
read and decode) and happen before the import's write transaction opens: the store has one writer
at a time, and every other writer would wait for it. Inside, only digests and the sessions'
stream versions are compared with what the store holds then; an earlier import changed by
another writer meanwhile is hashed or compared again, outside, and the import tried again. The
tests watch the hasher and the reading of stored messages, ask the log whether a transaction is
open, let a second writer commit while they run, and change the session between the reading and
the transaction to show the outcome is the one the change made first would give."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replay import _limits
from replay.agentlogs import AgentLogConflictError, _write
from sessions import IntegrityError, SessionStore
from tests.test_agent_logs_growth import (
    CODEX,
    IDS,
    LINE_SAMPLES,
    fresh,
    lines_of,
    one,
    state,
)

_WRITER_WAIT_S = 10.0  # how long a second writer may take while the hashing runs
_VOLATILE = ("created_at", "last_activity_at", "version")


def watch_hashing(
    monkeypatch: pytest.MonkeyPatch,
    store: SessionStore,
    before: Callable[[], None] = lambda: None,
) -> list[bool]:
    """Whether a write transaction was open each time the prefix check made a hasher; `before`
    runs first each time (a second writer, an import racing this one)."""
    seen: list[bool] = []
    real = _write.blake3

    def watched(*args: Any) -> Any:
        seen.append(store.log.in_transaction)
        before()
        return real(*args)

    monkeypatch.setattr(_write, "blake3", watched)
    return seen


def watch_reading(
    monkeypatch: pytest.MonkeyPatch,
    store: SessionStore,
    before: Callable[[], None] = lambda: None,
) -> list[bool]:
    """Whether a write transaction was open each time a session's stored messages were read;
    `before` runs first each time (a second writer, someone changing the session)."""
    seen: list[bool] = []
    real = store.message_structs

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen.append(store.log.in_transaction)
        before()
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "message_structs", watched)
    return seen


def once_outside(store: SessionStore, change: Callable[[], None]) -> Callable[[], None]:
    """`change`, run the first time it is called outside a transaction only: what another
    writer does to the session while an import compares its messages."""
    done: list[bool] = []

    def racing() -> None:
        if not done and not store.log.in_transaction:
            done.append(True)
            change()

    return racing


def import_all_first(store: SessionStore, live: Path, lines: list[bytes]) -> Callable[[], None]:
    """What races an import that has read part of the log at `live`: the first time it runs
    outside a transaction, the log grows to all its `lines` and that is imported, committing
    first."""
    raced: list[bool] = []

    def racing() -> None:
        if not raced and not store.log.in_transaction:
            raced.append(True)
            live.write_bytes(b"".join(lines))
            one(store, live)

    return racing


def grown_codex(store: SessionStore, tmp_path: Path) -> tuple[list[bytes], Path]:
    """The Codex log's lines, and its file: the first half imported into `store`, then the file
    grown to the whole log."""
    lines, live = lines_of(CODEX), tmp_path / CODEX.name
    live.write_bytes(b"".join(lines[: len(lines) // 2]))
    one(store, live)
    live.write_bytes(b"".join(lines))
    return lines, live


def second_writer(store: SessionStore, during: str) -> tuple[Callable[[], None], list[str]]:
    """A call that opens session `other` from a thread of its own and asserts it committed within
    `_WRITER_WAIT_S` (it would wait instead for the import's transaction, were one open), and the
    list of the sessions it committed."""
    committed: list[str] = []

    def another_writer() -> None:
        thread = threading.Thread(target=lambda: committed.append(store.open_session("other")))
        thread.start()
        thread.join(_WRITER_WAIT_S)
        assert committed == ["other"], f"a second writer waited for {during}"

    return another_writer, committed


def test_a_grown_log_is_hashed_before_the_write_transaction(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines, live = grown_codex(store, tmp_path)
    writer, committed = second_writer(store, "the prefix's hashing")
    seen = watch_hashing(monkeypatch, store, lambda: None if committed else writer())
    grown = one(store, live)
    assert grown.updated and seen and not any(seen)
    assert committed == ["other"]
    expected = fresh(tmp_path, live)
    assert {sid: got for sid, got in state(store).items() if sid != "other"} == expected
    seen.clear()
    live.write_bytes(b"".join(lines[:40]))  # rewritten (cut shorter): refused as before
    with pytest.raises(AgentLogConflictError, match="rewritten"):
        one(store, live)
    assert seen and not any(seen)


def test_a_grown_subagent_file_is_hashed_before_the_write_transaction(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_agent_logs_subagents import partly_written

    _, files, main, agent = partly_written(tmp_path)
    one(store, main)
    agent.write_bytes(files["b0a1"].read_bytes())  # only the subagent's file grew
    seen = watch_hashing(monkeypatch, store)
    read = watch_reading(monkeypatch, store)
    grown = one(store, main)
    assert grown.updated and len(seen) >= 2 and not any(seen)  # the session's file, the agent's
    assert read and not any(read)
    assert state(store) == fresh(tmp_path, main)


def test_an_earlier_import_that_changes_after_the_hashing_is_hashed_again(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the hashing and the transaction another import of more of the log commits: the
    import finds the earlier import it hashed for gone, hashes again, and writes nothing, as
    for two imports racing (`test_an_import_of_less_of_a_log_than_one_that_came_first...`)."""
    lines, live = lines_of(CODEX), tmp_path / CODEX.name
    live.write_bytes(b"".join(lines[:20]))
    one(store, live)
    live.write_bytes(b"".join(lines[: len(lines) // 2]))
    racing = import_all_first(store, live, lines)
    seen = watch_hashing(monkeypatch, store, racing)
    late = one(store, live)
    assert not late.written and not late.updated
    assert not any(seen)
    assert state(store) == fresh(tmp_path, live)


def test_an_earlier_import_that_keeps_changing_is_hashed_inside_at_the_last_try(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one try the import cannot go back for a prefix it did not hash before: it hashes it
    in the transaction, as every import did before, and its result is the same."""
    monkeypatch.setattr(_limits, "agent_log_prefix_tries_max", 1)
    lines, live = lines_of(CODEX), tmp_path / CODEX.name
    live.write_bytes(b"".join(lines[:20]))
    one(store, live)
    live.write_bytes(b"".join(lines[: len(lines) // 2]))
    racing = import_all_first(store, live, lines)
    seen = watch_hashing(monkeypatch, store, racing)
    late = one(store, live)
    assert not late.written and not late.updated and any(seen)
    assert state(store) == fresh(tmp_path, live)


@pytest.mark.parametrize(("fmt", "path"), LINE_SAMPLES, ids=IDS)
def test_a_grown_logs_messages_are_compared_before_the_write_transaction(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, path: Path
) -> None:
    """At a third, a half and the whole of every line-format fixture, as the growth tests."""
    lines, live = lines_of(path), tmp_path / path.name
    read, updated = watch_reading(monkeypatch, store), []
    cuts = sorted({max(1, len(lines) // 3), max(1, len(lines) // 2), len(lines)})
    for cut in cuts:
        live.write_bytes(b"".join(lines[:cut]))
        read.clear()
        found = one(store, live)
        assert not any(read), f"{fmt}: stored messages read in the write transaction"
        assert state(store) == fresh(tmp_path, live)
        if found.updated:
            updated.append(cut)
            assert read  # compared, outside
    assert updated or len(cuts) == 1  # a log of one line only is imported once


def test_a_second_writer_commits_while_the_messages_are_compared(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, live = grown_codex(store, tmp_path)
    writer, committed = second_writer(store, "the messages' comparison")
    read = watch_reading(monkeypatch, store, once_outside(store, writer))
    grown = one(store, live)
    assert grown.updated and grown.sessions[0].appended > 0
    assert read and not any(read) and committed == ["other"]
    assert {sid: got for sid, got in state(store).items() if sid != "other"} == fresh(
        tmp_path, live
    )


def snapshots(store: SessionStore) -> dict[str, Any]:
    """Every session's snapshot, times and stream versions left out: `state` without the kept
    records, which `agent_log_records` cannot list for a session holding a message of its own."""
    found: dict[str, Any] = {}
    for item in store.list_sessions(limit=200)["sessions"]:
        snapshot = store.snapshot(item["session_id"]) or {}
        found[item["session_id"]] = {k: v for k, v in snapshot.items() if k not in _VOLATILE}
    return found


def _grown_after(
    where: Path, live: Path, lines: list[bytes], change: Callable[[SessionStore, str], None]
) -> tuple[Any, dict[str, Any]]:
    """What importing half of the log, `change`-ing its session, then importing the whole log
    makes in a store of its own: the import's result (or the error it raised), and the store."""
    with SessionStore.open(where) as other:
        live.write_bytes(b"".join(lines[: len(lines) // 2]))
        (session,) = one(other, live).sessions
        change(other, session.session_id)
        live.write_bytes(b"".join(lines))
        try:
            got: Any = one(other, live)
        except AgentLogConflictError as exc:
            got = str(exc)
        return got, snapshots(other)


def _own_message(store: SessionStore, sid: str) -> None:
    store.inject(sid, {"role": "user", "content": "and now, in the engine"})


def _rewound(store: SessionStore, sid: str) -> None:
    store.rewind(sid, store.length(sid) - 3, reason="someone went back")


@pytest.mark.parametrize("change", [_own_message, _rewound], ids=["own-message", "rewound"])
@pytest.mark.parametrize("tries", [1, _limits.agent_log_prefix_tries_max])
def test_a_session_changed_while_its_messages_are_compared_ends_as_if_changed_first(
    store: SessionStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[SessionStore, str], None],
    tries: int,
) -> None:
    """Someone writes to the session between the import's reading of its messages and its
    transaction: an own message (the import is refused, as a session continued after its
    import), or a rewind (the import brings the shorter session up to date). The import sees
    the session's stream version moved, and compares again: outside, or inside when it has no
    try left; either way it ends as when the change came before the import began."""
    monkeypatch.setattr(_limits, "agent_log_prefix_tries_max", tries)
    lines, live = lines_of(CODEX), tmp_path / CODEX.name
    expected, expected_state = _grown_after(tmp_path / "expected", live, lines, change)
    live.write_bytes(b"".join(lines[: len(lines) // 2]))
    (session,) = one(store, live).sessions
    live.write_bytes(b"".join(lines))
    read = watch_reading(monkeypatch, store, once_outside(store, lambda: change(store, sid)))
    sid = session.session_id
    try:
        got: Any = one(store, live)
    except AgentLogConflictError as exc:
        got = str(exc)
    assert got == expected
    assert snapshots(store) == expected_state
    assert read[0] is False and any(read) == (tries == 1)  # compared again: inside on the last try
    if change is _own_message:
        assert "continued after its import" in got


def test_a_session_that_keeps_changing_is_compared_inside_at_the_last_try(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every time the import compares the session's messages, someone rewinds it by one: each
    try finds it changed, and the last compares it inside the transaction. The result is the
    one those rewinds made before the import would give."""
    lines, live = lines_of(CODEX), tmp_path / CODEX.name
    tries = _limits.agent_log_prefix_tries_max
    live.write_bytes(b"".join(lines[: len(lines) // 2]))
    (session,) = one(store, live).sessions
    sid = session.session_id

    def cut_one() -> None:
        if not store.log.in_transaction:
            store.rewind(sid, store.length(sid) - 1, reason="someone went back")

    def cut_all(other: SessionStore, sid: str) -> None:
        for _ in range(tries):
            other.rewind(sid, other.length(sid) - 1, reason="someone went back")

    expected, expected_state = _grown_after(tmp_path / "expected", live, lines, cut_all)
    live.write_bytes(b"".join(lines))
    read = watch_reading(monkeypatch, store, cut_one)
    grown = one(store, live)
    assert read == [False] * tries + [True]
    assert grown == expected and grown.updated
    assert snapshots(store) == expected_state


def test_an_import_racing_in_while_the_messages_are_compared_is_caught_up_with(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the comparison and the transaction another import, of more of the log than the
    earlier one but less than this, commits: the prefix and the messages the import worked on
    are gone, and it hashes and compares again, outside, and brings that import up to date."""
    lines, live = lines_of(CODEX), tmp_path / CODEX.name
    live.write_bytes(b"".join(lines[:20]))
    one(store, live)
    middle = tmp_path / "middle" / CODEX.name
    middle.parent.mkdir()
    middle.write_bytes(b"".join(lines[: len(lines) // 2]))
    live.write_bytes(b"".join(lines))

    def another_import() -> None:  # the same log, read when it had half its lines
        live.write_bytes(middle.read_bytes())
        one(store, live)
        live.write_bytes(b"".join(lines))

    read = watch_reading(monkeypatch, store, once_outside(store, another_import))
    hashed = watch_hashing(monkeypatch, store)
    grown = one(store, live)
    assert grown.updated and not any(read) and not any(hashed)
    assert len(read) >= 3  # this import's reading, the racing one's, this one's again
    assert state(store) == fresh(tmp_path, live)


def test_a_session_that_cannot_be_read_before_the_transaction_is_compared_inside(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reading of the stored messages that fails before the transaction (the store refused
    it) is not an outcome: the transaction reads them again, as every import did before, and
    raises or goes on as that reading does."""
    _, live = grown_codex(store, tmp_path)
    real, inside = store.message_structs, []

    def refused_outside(*args: Any, **kwargs: Any) -> Any:
        inside.append(store.log.in_transaction)
        if not store.log.in_transaction:
            raise IntegrityError("not now", 1)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "message_structs", refused_outside)
    grown = one(store, live)
    assert grown.updated and inside == [False, True]
    assert state(store) == fresh(tmp_path, live)
