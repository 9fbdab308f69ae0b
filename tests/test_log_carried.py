"""A write transaction starts from what this process's last commit knew (stream versions, the head
and its hash, the projection's decoded values) only when no other commit came between: another
process's commit, a rolled-back transaction or a write around the projector never leaves this
process working from stale values (`Transaction.resume`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import projections._kv
from eventlog import LogView
from projections._state import state_key, transcript_key
from sessions import LengthConflictError, SessionStore, UnknownSessionError
from tests.conftest import assert_rebuild_changes_nothing

ROOT = Path(__file__).resolve().parent.parent

OTHER_WRITER = """
import sys
from sessions import SessionStore
with SessionStore.open(sys.argv[1]) as store:
    for text in sys.argv[3:]:
        store.inject(sys.argv[2], {"role": "user", "content": text})
"""


def write_from_another_process(path: Path, session_id: str, *texts: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", OTHER_WRITER, str(path), session_id, *texts],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def texts(store: SessionStore, session_id: str) -> list[str]:
    return [message["content"] for message in store.messages(session_id)]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionStore]:
    with SessionStore.open(tmp_path / "store", hot_sessions=0) as opened:
        opened.open_session("s")
        yield opened
        assert opened.verify(projections=True).ok
        assert_rebuild_changes_nothing(opened)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The projection keys read from storage from now on (not from a transaction's cache)."""
    seen: list[bytes] = []
    original = LogView.kv_get

    def kv_get(self: LogView, key: bytes) -> bytes | None:
        seen.append(key)
        return original(self, key)

    monkeypatch.setattr(LogView, "kv_get", kv_get)
    return seen


def test_the_next_command_reads_nothing_its_last_commit_knew(
    store: SessionStore, reads: list[bytes]
) -> None:
    store.inject("s", {"role": "user", "content": "a0"})
    reads.clear()
    store.inject("s", {"role": "user", "content": "a1"}, expected_length=1)
    assert state_key("s") not in reads and transcript_key("s") not in reads
    assert texts(store, "s") == ["a0", "a1"]


def test_a_commit_by_another_process_in_between_is_read_afresh(
    store: SessionStore, reads: list[bytes], tmp_path: Path
) -> None:
    store.inject("s", {"role": "user", "content": "a0"})
    write_from_another_process(tmp_path / "store", "s", "b0", "b1", "b2")
    reads.clear()
    with pytest.raises(LengthConflictError):
        store.inject("s", {"role": "user", "content": "stale"}, expected_length=1)
    assert state_key("s") in reads and transcript_key("s") in reads
    store.inject("s", {"role": "user", "content": "a1"}, expected_length=4)
    assert texts(store, "s") == ["a0", "b0", "b1", "b2", "a1"]
    write_from_another_process(tmp_path / "store", "s", "b3")
    store.fork("s", "f")  # the fork, too, sees b3 as the parent's last message
    assert texts(store, "f") == ["a0", "b0", "b1", "b2", "a1", "b3"]


def test_a_rolled_back_transaction_hands_nothing_on(store: SessionStore) -> None:
    store.inject("s", {"role": "user", "content": "a0"})
    with pytest.raises(RuntimeError), store.transaction():
        store.inject("s", {"role": "user", "content": "rolled back"})
        store.open_session("gone")
        raise RuntimeError("abandon the transaction")
    store.inject("s", {"role": "user", "content": "a1"}, expected_length=1)
    assert texts(store, "s") == ["a0", "a1"]
    assert not store.exists("gone")
    assert store.log.stream_version("s") == 3


def test_a_projection_key_written_around_the_projector_is_not_shadowed(
    store: SessionStore,
) -> None:
    store.inject("s", {"role": "user", "content": "a0"})
    with store.log.transaction() as tx:
        tx.kv_delete(state_key("s"))  # as a repair tool might
    with pytest.raises(UnknownSessionError):  # the store is read, not what was decoded before
        store.inject("s", {"role": "user", "content": "a1"})
    store.rebuild()
    assert texts(store, "s") == ["a0"]


def test_a_transaction_that_wrote_nothing_hands_nothing_on(
    store: SessionStore, tmp_path: Path
) -> None:
    # LMDB commits a transaction with nothing to write without taking a place in its sequence,
    # so the next one's place could follow on from it even with another process's commit between.
    store.inject("s", {"role": "user", "content": "a0"})
    with store.transaction():
        assert store.summary("s") is not None  # read, nothing written
    write_from_another_process(tmp_path / "store", "s", "b0")
    with pytest.raises(LengthConflictError):
        store.inject("s", {"role": "user", "content": "stale"}, expected_length=1)
    store.inject("s", {"role": "user", "content": "a1"}, expected_length=2)
    assert texts(store, "s") == ["a0", "b0", "a1"]
    assert store.log.stream_version("s") == 4


def test_a_retried_command_that_wrote_nothing_hands_nothing_on(
    store: SessionStore, tmp_path: Path
) -> None:
    store.inject("s", {"role": "user", "content": "a0"}, idempotency_key="k")
    store.inject("s", {"role": "user", "content": "a0"}, idempotency_key="k")  # already stored
    write_from_another_process(tmp_path / "store", "s", "b0")
    store.inject("s", {"role": "user", "content": "a1"})
    assert texts(store, "s") == ["a0", "b0", "a1"]
    assert store.log.stream_version("s") == 4


def test_a_cache_that_decoded_past_its_byte_bound_is_not_carried(
    store: SessionStore, reads: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(projections._kv, "CARRIED_BYTES_MAX", 4_000)
    store.inject("s", {"role": "user", "content": "a0"})
    reads.clear()
    store.inject("s", {"role": "user", "content": "a1"})
    assert state_key("s") not in reads  # small: carried
    store.set_scratchpad("s", {"notes": "x" * 5_000})  # decoded and written: past the bound
    store.inject("s", {"role": "user", "content": "a2"})
    reads.clear()
    store.inject("s", {"role": "user", "content": "a3"})
    assert state_key("s") in reads  # the big cache was dropped; the state is read again
    assert texts(store, "s") == ["a0", "a1", "a2", "a3"]
