"""Importing a grown log checks that the file still begins with the bytes an earlier import read.
Reading and hashing that prefix (up to a whole 50 MB log) happens before the import's write
transaction opens: the store has one writer at a time, and every other writer would wait for
it. Inside, only the digests are compared with what the store holds then; an earlier import
changed by another import meanwhile has its prefix hashed again, outside, and the import tried
again. The tests watch the hasher the check uses and ask the log whether a transaction is open,
and let a second writer commit while the hashing runs."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replay import _limits
from replay.agentlogs import AgentLogConflictError, _write
from sessions import SessionStore
from tests.test_agent_logs_growth import CODEX, fresh, lines_of, one, state

_WRITER_WAIT_S = 10.0  # how long a second writer may take while the hashing runs


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


def test_a_grown_log_is_hashed_before_the_write_transaction(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines, live = lines_of(CODEX), tmp_path / CODEX.name
    live.write_bytes(b"".join(lines[: len(lines) // 2]))
    one(store, live)
    live.write_bytes(b"".join(lines))
    committed: list[str] = []

    def another_writer() -> None:  # would wait for the import's transaction, were one open
        if committed:
            return
        thread = threading.Thread(target=lambda: committed.append(store.open_session("other")))
        thread.start()
        thread.join(_WRITER_WAIT_S)
        assert committed == ["other"], "a second writer waited for the prefix's hashing"

    seen = watch_hashing(monkeypatch, store, another_writer)
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
    from tests.test_agent_logs_subagents import SESSION, split_session

    whole = tmp_path / "whole"
    files = split_session(whole, nested=True, name_agents=True)
    live = tmp_path / "live"
    shutil.copytree(whole, live)
    main, agent = live / f"{SESSION}.jsonl", live / files["b0a1"].relative_to(whole)
    agent.write_bytes(b"".join(lines_of(files["b0a1"])[:3]))
    one(store, main)
    agent.write_bytes(files["b0a1"].read_bytes())  # only the subagent's file grew
    seen = watch_hashing(monkeypatch, store)
    grown = one(store, main)
    assert grown.updated and len(seen) >= 2 and not any(seen)  # the session's file, the agent's
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
