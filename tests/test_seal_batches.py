"""Batch events of an encrypted session (`messages_injected`, `session_compacted`) sealed whole:
one ciphertext for the list (format 2), opened once per event, giving the same messages as a plain
store whether the whole transcript or a few of its messages are read; a list moved, cut short or
altered is refused naming its position; lists sealed a message at a time (format 1, as older
stores hold them) still read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import projections as pj
from eventlog import IntegrityError
from eventlog import events as ev
from sessions import LocalKeyProvider, SessionStore, _seal

KEY = LocalKeyProvider(bytes(range(32)))


def batch(count: int, tag: str) -> list[dict[str, Any]]:
    """Messages of every shape: plain text, tool calls and results, usage, flags."""
    out: list[dict[str, Any]] = []
    for i in range(count):
        if i % 3 == 0:
            out.append({"role": "user", "content": f"{tag}-{i}-secret"})
        elif i % 3 == 1:
            out.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": f"c{i}", "function": {"arguments": f"{tag}-{i}"}}],
                    "usage": {"input_tokens": i, "output_tokens": 2},
                }
            )
        else:
            out.append({"role": "tool", "tool_call_id": f"c{i - 1}", "content": f"{tag}-{i}"})
    return out


def fill(store: SessionStore, sid: str) -> None:
    store.inject(sid, {"role": "system", "content": "one on its own"})
    store.inject_many(sid, batch(40, "a"))
    store.inject(sid, {"role": "user", "content": "between"})
    store.inject_many(sid, batch(25, "b"))


def stored(store: SessionStore, sid: str, kind: type[ev.Event]) -> list[tuple[int, Any]]:
    """(position, event) of every `kind` event of `sid`, as stored."""
    return [(e.position, e.data) for e in store.log.read_stream(sid) if type(e.data) is kind]


def opener_of(store: SessionStore, sid: str) -> Any:
    sealer = store._sealer
    assert sealer is not None
    with store.log.view() as view:
        state = pj.load_state(view, sid)
        assert state is not None
        return sealer.opener(view, state, "test")


def reads(store: SessionStore, sid: str) -> dict[str, Any]:
    """The transcript read whole and in parts: pages, tails, the context view."""
    return {
        "all": store.messages(sid),
        "last": [store.messages(sid, last=n) for n in (1, 3, 30)],
        "pages": [store.messages(sid, after=a, limit=7) for a in (0, 5, 39, 41, 60)],
        "context": store.context(sid),
        "transcript": store.snapshot(sid)["transcript"],  # type: ignore[index]
    }


def test_a_batch_is_one_ciphertext_and_reads_like_a_plain_store(tmp_path: Path) -> None:
    with (
        SessionStore.open(tmp_path / "e", keys=KEY, hot_sessions=0) as store,
        SessionStore.open(tmp_path / "p", hot_sessions=0) as plain,
    ):
        sid, other = store.open_session("s"), plain.open_session("s")
        fill(store, sid)
        fill(plain, other)
        [(_, first), (_, second)] = stored(store, sid, ev.MessagesInjected)
        for event, count in ((first, 40), (second, 25)):
            shells = event.messages
            assert len(shells) == count
            sealed = shells[0].sealed
            assert sealed is not None and sealed[0] == 2 and b"secret" not in sealed
            assert all(shell.sealed == b"" for shell in shells[1:])
            assert all(shell.content is None and shell.tool_calls is None for shell in shells)
            # The readable part stays, for the projections to fold without a key.
            assert [shell.role for shell in shells][:3] == ["user", "assistant", "tool"]
            assert shells[1].usage == ev.Usage(input_tokens=1, output_tokens=2)
        assert reads(store, sid) == reads(plain, other)
        assert len(store.messages(sid)) == 67


def test_a_compaction_replacement_is_sealed_whole(tmp_path: Path) -> None:
    with (
        SessionStore.open(tmp_path / "e", keys=KEY, hot_sessions=0) as store,
        SessionStore.open(tmp_path / "p", hot_sessions=0) as plain,
    ):
        for each in (store, plain):
            each.open_session("s")
            fill(each, "s")
            each.compact(
                "s", compact_strategy="observation_mask", tool_output_max_chars=2, keep_last=9
            )
        [(_, compacted)] = stored(store, "s", ev.SessionCompacted)
        sealed = compacted.replacement[0].sealed
        assert len(compacted.replacement) > 40 and sealed is not None and sealed[0] == 2
        assert reads(store, "s") == reads(plain, "s")


def test_a_moved_cut_or_altered_batch_is_refused_naming_its_position(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        sid, other = store.open_session("s"), store.open_session("t")
        store.inject_many(sid, batch(12, "a"))
        store.inject_many(sid, batch(12, "b"))
        store.inject_many(other, batch(12, "c"))
        [(at, event), (later, _)] = stored(store, sid, ev.MessagesInjected)
        [(_, elsewhere)] = stored(store, other, ev.MessagesInjected)
        open_event = opener_of(store, sid)
        whole = open_event(event, at, list(range(12)))
        assert whole[0].content == "a-0-secret"
        # A few wanted are decoded alone, and are the same.
        assert open_event(event, at, [9, 11]) == [whole[9], whole[11]]
        shells = event.messages
        blob = shells[0].sealed

        def with_blob(sealed: bytes | None, messages: list[ev.Message] = shells) -> Any:
            first = msgspec.structs.replace(messages[0], sealed=sealed)
            return ev.MessagesInjected(messages=[first, *messages[1:]])

        flipped = bytearray(blob)
        flipped[-3] ^= 1
        refused = {
            "another position": (event, later),
            "another field": (
                ev.SessionCompacted(
                    strategy="truncate", replace_start=0, replace_end=12, replacement=shells
                ),
                at,
            ),
            "another session": (with_blob(elsewhere.messages[0].sealed), at),
            "another count": (ev.MessagesInjected(messages=shells[:11]), at),
            "cut short": (with_blob(blob[:-5]), at),
            "cut to its header": (with_blob(blob[:20]), at),
            "altered": (with_blob(bytes(flipped)), at),
            "taken away": (with_blob(b""), at),
        }
        for why, (data, position) in refused.items():
            for wanted in (list(range(10)), [10]):  # most of the list, or one of its messages
                with pytest.raises(IntegrityError) as caught:
                    open_event(data, position, wanted)
                assert caught.value.position == position, why
                assert f"position {position}" in str(caught.value), why


def old_format(
    aead: AESGCM, slot: int, position: int, field: str, messages: list[ev.Message]
) -> list[ev.Message]:
    """How a batch was sealed before format 2: each message its own ciphertext."""
    return [
        _seal.seal_message(aead, slot, position, index, message)
        for index, message in enumerate(messages)
    ]


def test_batches_sealed_a_message_at_a_time_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s"
    with SessionStore.open(tmp_path / "p", hot_sessions=0) as plain:
        plain.open_session("s")
        fill(plain, "s")
        plain.inject_many("s", batch(5, "new"))
        expected = reads(plain, "s")
    with monkeypatch.context() as patched:
        patched.setattr(_seal, "seal_batch", old_format)
        with SessionStore.open(path, keys=KEY) as store:
            store.open_session("s")
            fill(store, "s")
            child = store.fork_at("s", keep_first=30)
            store.inject(child, {"role": "user", "content": "the child's own"})
    with SessionStore.open(path, keys=KEY, hot_sessions=0) as store:
        old = stored(store, "s", ev.MessagesInjected)
        assert all(m.sealed is not None and m.sealed[0] == 1 for _, e in old for m in e.messages)
        store.inject_many("s", batch(5, "new"))  # new writes use format 2, beside the old ones
        newest = stored(store, "s", ev.MessagesInjected)[-1][1]
        assert newest.messages[0].sealed[0] == 2
        assert reads(store, "s") == expected
        # The same ciphertext at another index of its list does not open.
        position, event = old[0]
        swapped = [event.messages[1], event.messages[0], *event.messages[2:]]
        with pytest.raises(IntegrityError) as caught:
            opener_of(store, "s")(ev.MessagesInjected(messages=swapped), position, [0, 1, 2])
        assert caught.value.position == position
        # A destroyed parent key reads as placeholders, counted, in the old format too.
        store.forget("s")
        shown = store.messages(child)
        assert len(shown) == 31 and shown[-1]["content"] == "the child's own"
        assert all(m["metadata"] == {"forgotten": True} for m in shown[:30])
        assert [m["role"] for m in shown[:30]] == [m["role"] for m in expected["all"][:30]]
