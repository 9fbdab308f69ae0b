"""Projection layout 7: what a commit rewrites for a session sits under its own cluster keys.

The transcript keeps the chunk of references the session is filling (`Transcript.held`), and the
position folded is kept per stream, so an inject rewrites two projection keys, both the session's
own. A chunk goes out under `g/` when it fills, when the session moves to another segment, and when
a fork shares it; only the session holding a segment grows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import eventlog
import projections as pj
from projections import _keys, _state
from projections._queries import read_refs
from sessions import SessionStore


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def dump(store: SessionStore) -> dict[bytes, bytes]:
    with store.log.view() as view:
        return dict(pj.dump(view))


def changed(before: dict[bytes, bytes], after: dict[bytes, bytes]) -> set[bytes]:
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


def transcript(store: SessionStore, sid: str) -> pj.Transcript:
    with store.log.view() as view:
        found = pj.load_transcript(view, sid)
    assert found is not None
    return found


def contents(store: SessionStore, sid: str) -> list[str]:
    snap = store.snapshot(sid)
    assert snap is not None
    return [message["content"] for message in snap["transcript"]]


def refs_keys(store: SessionStore) -> list[bytes]:
    return sorted(key for key in dump(store) if key.startswith(_keys.REF_PREFIX))


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore.open(tmp_path / "s", hot_sessions=0)


def test_an_inject_rewrites_two_keys_both_under_its_sessions_cluster(store: SessionStore) -> None:
    for sid in ("a", "b"):
        store.open_session(sid)
        store.inject(sid, user("first"))
    before = dump(store)
    store.inject("a", user("second"))
    assert changed(before, dump(store)) == {_state.transcript_key("a"), _state.folded_key("a")}
    assert dump(store)[_state.folded_key("a")] == store.log.head.to_bytes(8, "big")


def test_a_session_holds_its_chunk_until_it_fills(store: SessionStore) -> None:
    size = _state.REFS_PER_CHUNK
    store.open_session("a")
    store.inject_many("a", [user(f"m{i}") for i in range(size)])
    held = transcript(store, "a")
    assert refs_keys(store) == [] and len(held.tail) == size * _state.REF_BYTES
    assert (held.held, held.held_chunk) == (held.ranges[-1][0], 0)
    store.inject("a", user("one more"))
    held = transcript(store, "a")
    assert refs_keys(store) == [_state.ref_chunk_key(held.held, 0)]
    assert held.held_chunk == 1 and len(held.tail) == _state.REF_BYTES
    assert contents(store, "a") == [f"m{i}" for i in range(size)] + ["one more"]


def test_a_fork_writes_the_held_chunk_out_and_only_the_first_to_append_grows_it(
    store: SessionStore,
) -> None:
    store.open_session("a")
    for i in range(5):
        store.inject("a", user(f"m{i}"))
    store.fork("a", "b")
    [(segment, _, _)] = transcript(store, "a").ranges
    assert transcript(store, "a").held == 0 and transcript(store, "b").held == 0
    assert dump(store)[_state.ref_chunk_key(segment, 0)] == b"".join(
        _state.pack_ref(position, 0) for position, _ in _refs_of(store, "a")
    )
    store.inject("b", user("b5"))  # grows the shared segment in place, and holds it
    assert transcript(store, "b").ranges == ((segment, 0, 6),)
    assert transcript(store, "b").held == segment
    assert len(dump(store)[_state.ref_chunk_key(segment, 0)]) == 6 * _state.REF_BYTES
    store.inject("a", user("a5"))  # the segment goes on past its end: a new one
    assert [r[0] for r in transcript(store, "a").ranges] == [segment, segment + 1]
    store.inject("b", user("b6"))
    assert contents(store, "a") == ["m0", "m1", "m2", "m3", "m4", "a5"]
    assert contents(store, "b") == ["m0", "m1", "m2", "m3", "m4", "b5", "b6"]
    before = dump(store)
    store.rebuild()
    assert dump(store) == before


def test_a_session_that_went_back_starts_a_new_segment_and_writes_the_old_chunk_out(
    store: SessionStore,
) -> None:
    store.open_session("a")
    store.inject_many("a", [user(f"m{i}") for i in range(4)])
    [(segment, _, _)] = transcript(store, "a").ranges
    store.rewind("a", 2)
    store.inject("a", user("x"))
    after = transcript(store, "a")
    assert after.ranges == ((segment, 0, 2), (segment + 1, 0, 1)) and after.held == segment + 1
    assert len(dump(store)[_state.ref_chunk_key(segment, 0)]) == 4 * _state.REF_BYTES
    assert contents(store, "a") == ["m0", "m1", "x"]


def test_the_projections_cluster_keys_are_the_logs() -> None:
    assert _state.transcript_key("s-1") == eventlog.cluster_key("s-1", b"t")
    assert _state.folded_key("$bearer") == eventlog.cluster_key("$bearer", b"P")


def test_the_position_folded_is_found_from_the_newest_event(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "s") as store:
        store.open_session("a")
        store.open_session("b")
        store.inject("a", user("x"))
        store.inject("b", user("y"))
        head = store.log.head
        with store.log.view() as view:
            assert pj.projected_position(view) == head
            assert pj.projected_position(view, below=head - 1) == head - 1
            a_folded = view.kv_get(_state.folded_key("a"))
        assert a_folded == (head - 1).to_bytes(8, "big")


def _refs_of(store: SessionStore, sid: str) -> list[tuple[int, int]]:
    with store.log.view() as view:
        found = pj.load_transcript(view, sid)
        assert found is not None
        segment, start, end = found.ranges[0]
        return read_refs(view, segment, start, end, found)


def test_a_projection_folded_from_a_longer_log_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SessionStore.open(path) as store:
        store.open_session("a")
        store.inject("a", user("x"))
        head = store.log.head
        with store.log.transaction(fold=False) as tx:  # as a restore of an older log would be
            tx.kv_put(_state.folded_key("a"), (head + 5).to_bytes(8, "big"))
    with pytest.raises(eventlog.IntegrityError, match=f"but the log ends at {head}"):
        SessionStore.open(path)
