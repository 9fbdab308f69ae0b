"""What a caller gives an encrypted session beside its content, and what `forget` leaves of it: a
cancelled prompt's reason is sealed like an error text; an idempotency key is stored as a digest
keyed by the session's data key, so retries still find it while the session lives and nothing
tells the key's text once the key is destroyed. Close reasons stay readable, as the README's
caveats say. Events written before keys were digested still read, rebuild and deduplicate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

import projections as pj
from eventlog import events as ev
from sessions import ForgottenError, LocalKeyProvider, SessionStore
from sessions._keyring import Keyring
from sessions._seal import SEALED_TEXT
from sessions.runtime import PromptCancelledError, Runtime
from tests._runtime_providers import SlowProvider
from tests.conftest import assert_rebuild_changes_nothing

KEY = LocalKeyProvider(bytes(range(32)))


def every_byte(path: Path) -> bytes:
    """Every file of the store, concatenated (LMDB's free pages included)."""
    return b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())


def kinds_holding(store: SessionStore, sid: str, text: str) -> set[str]:
    """The kinds of the session's stored events whose payload holds `text` in the clear."""
    return {
        envelope.type
        for envelope in store.log.read_stream(sid)
        if text.encode() in msgspec.json.encode(envelope.data)
    }


def indexed(store: SessionStore, sid: str, key: str) -> bool:
    """Whether the projection's index confirms a guess of the key's text (its unkeyed digest)."""
    with store.log.view() as view:
        return view.kv_get(pj.idempotency_key(sid, key)) is not None


def test_a_cancelled_prompts_reason_is_sealed(tmp_path: Path) -> None:
    """A runtime close cancels the prompt in flight with the caller's reason: `prompt_cancelled`
    keeps it sealed (the loop record's error too); only the close itself, whose reason the
    README lists as readable, holds it in the clear."""
    path, why = tmp_path / "s", "closing-secret-7f3a"
    with SessionStore.open(path, keys=KEY) as store:

        async def body() -> str:
            slow = SlowProvider()
            async with Runtime(store, providers=[slow], default_provider="slow") as runtime:
                sid = str((await runtime.create("agent-1"))["session_id"])
                task = asyncio.create_task(runtime.prompt(sid, "long"))
                await slow.entered.wait()
                await runtime.close(sid, reason=why)
                with pytest.raises(PromptCancelledError):
                    await task
                record = await runtime.record(sid)
                assert [loop["status"] for loop in record.loops] == ["cancelled"]
                assert str(record.loops[0]["error"]).startswith(SEALED_TEXT)
                return sid

        sid = asyncio.run(body())
        [cancelled] = [e.data for e in store.log.read_stream(sid) if e.type == "prompt_cancelled"]
        assert isinstance(cancelled, ev.PromptCancelled)
        assert cancelled.reason is not None and cancelled.reason.startswith(SEALED_TEXT)
        assert kinds_holding(store, sid, why) == {"agent_session_closed"}
        store.forget(sid)
        assert store.log.verify().ok
        assert kinds_holding(store, sid, why) == {"agent_session_closed"}


def test_idempotency_keys_deduplicate_and_are_gone_after_forget(tmp_path: Path) -> None:
    """`inject`'s and `inject_many`'s keys: a retry writes nothing, before and after a rebuild;
    the events and the index hold a digest keyed by the session's key, so after `forget` no file
    holds a key's text and no unkeyed digest of a guess finds it."""
    path = tmp_path / "s"
    one, many = "one-key-secret-7f3a", "many-key-secret-7f3a"
    with SessionStore.open(path, keys=KEY) as store:
        sid = store.open_session()
        store.inject(sid, {"role": "user", "content": "a"}, idempotency_key=one)
        batch = [{"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
        assert store.inject_many(sid, batch, idempotency_key=many) == 2
        stored = [
            e.data.idempotency_key
            for e in store.log.read_stream(sid)
            if isinstance(e.data, (ev.MessageInjected, ev.MessagesInjected))
        ]
        assert len(stored) == 2 and None not in stored
        assert one not in stored and many not in stored
        assert not indexed(store, sid, one) and not indexed(store, sid, many)
        positions = [e.position for e in store.log.read_stream(sid) if e.type.endswith("injected")]
        assert [store.injected_with(sid, k) for k in (one, many, "never")] == [*positions, None]
        head = store.log.head
        store.inject(sid, {"role": "user", "content": "a"}, idempotency_key=one)
        assert store.inject_many(sid, batch, idempotency_key=many) == 0
        assert store.log.head == head
        assert_rebuild_changes_nothing(store)
        store.inject(sid, {"role": "user", "content": "a"}, idempotency_key=one)
        assert store.log.head == head and store.length(sid) == 3
        other = store.open_session()  # another session's key: the same text is not seen there
        store.inject(other, {"role": "user", "content": "a"}, idempotency_key=one)
        assert store.length(other) == 1
        store.forget(sid)
        assert store.log.verify().ok
        with pytest.raises(ForgottenError):
            store.injected_with(sid, one)
        assert kinds_holding(store, sid, one) == set() == kinds_holding(store, sid, many)
        assert not indexed(store, sid, one) and not indexed(store, sid, many)
    assert [k for k in (one, many) if k.encode() in every_byte(path)] == []


def test_plain_keys_written_before_still_read_rebuild_and_deduplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An encrypted session's key stored in the clear (as before keys were digested) still
    folds, rebuilds, and stops a retry made after the upgrade."""
    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:
        sid = store.open_session()
        with monkeypatch.context() as old:
            old.setattr(Keyring, "keyed", lambda self, slot, text, where: text)
            store.inject(sid, {"role": "user", "content": "a"}, idempotency_key="old-key")
        [kept] = [e.data for e in store.log.read_stream(sid) if e.type == "message_injected"]
        assert isinstance(kept, ev.MessageInjected) and kept.idempotency_key == "old-key"
        assert_rebuild_changes_nothing(store)
        assert indexed(store, sid, "old-key")
        head = store.log.head
        store.inject(sid, {"role": "user", "content": "a"}, idempotency_key="old-key")
        assert store.log.head == head
        assert store.messages(sid) == [{"role": "user", "content": "a"}]
