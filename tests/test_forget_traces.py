"""What a caller gives an encrypted session beside its content, and what `forget` leaves of it: a
cancelled prompt's reason is sealed like an error text; an idempotency key is stored as a digest
keyed by the session's data key, so retries still find it while the session lives and nothing
tells the key's text once the key is destroyed. Close reasons stay readable, as the README's
caveats say. Events written before keys were digested still read, rebuild and deduplicate. The
digests a stamp names (the HTTP service's) are kept the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

import projections as pj
from eventlog import events as ev
from sessions import (
    ForgottenError,
    InvalidArgumentError,
    LocalKeyProvider,
    MissingKeyError,
    SessionStore,
)
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


def test_a_stamps_digests_are_kept_keyed_by_the_session_they_mark(tmp_path: Path) -> None:
    """The digests a stamp names (a service's request key and body fingerprint) are stored keyed
    by the key of the encrypted session whose event they mark (a session the write creates too),
    as `keyed_digest` keys them for a retry, in this store instance or another; a plain session
    and a session other than the one the stamp names keep them as they are; after `forget` no
    file holds them and none can be made."""
    path = tmp_path / "s"
    with SessionStore.open(path) as plain_store:
        plain_store.open_session("p")  # written before the store had keys: stays plain
    key_text, body_text = "req-key-secret-7f3a", "req-body-secret-7f3a"

    def stamped(
        store: SessionStore,
        key: str,
        stream: str | None,
        write: Callable[[], object],
        digests: tuple[str, ...] = ("idempotency_key", "request_sha256"),
    ) -> dict[str, object]:
        with store.transaction():
            tx = store.log.current_transaction()
            assert tx is not None
            stamp = {"idempotency_key": key, "request_sha256": body_text}
            tx.stamp_next_append(stamp, digests=digests, stream=stream)
            head = tx.head
            write()
        [first] = store.log.read(after=head, limit=1)
        return dict(first.meta)

    said = {"role": "user", "content": "a"}
    with SessionStore.open(path, keys=KEY) as store:
        sid = store.open_session("e")
        meta = stamped(store, key_text, "e", lambda: store.inject(sid, said))
        assert meta == {
            "idempotency_key": store.keyed_digest(sid, key_text),
            "request_sha256": store.keyed_digest(sid, body_text),
        }
        assert body_text not in meta.values()
        made = stamped(store, "k2", None, lambda: store.open_session("n"), ("request_sha256",))
        assert made["idempotency_key"] == "k2"  # not named: left as it is
        assert made["request_sha256"] == store.keyed_digest("n", body_text)
        assert made["request_sha256"] != meta["request_sha256"]  # another session, another key
        elsewhere = stamped(store, "k3", "e", lambda: store.inject("n", said))
        assert elsewhere["request_sha256"] == body_text  # not the named session: left as it is
        assert stamped(store, "k4", "p", lambda: store.inject("p", said)) == {
            "idempotency_key": "k4",
            "request_sha256": body_text,
        }
        assert [store.keyed_digest(s, body_text) for s in ("p", "none", " bad")] == [None] * 3
        with pytest.raises(InvalidArgumentError):
            store.keyed_digest(sid, "")
        kept = store.keyed_digest(sid, body_text)
    with SessionStore.open(path, keys=KEY) as again:  # another instance derives the same key
        assert again.keyed_digest(sid, body_text) == kept
    with SessionStore.open(path) as keyless, pytest.raises(MissingKeyError):
        keyless.keyed_digest(sid, body_text)
    with SessionStore.open(path, keys=KEY) as store:
        store.forget(sid)
        store.forget("n")
        with pytest.raises(ForgottenError):
            store.keyed_digest(sid, body_text)
        assert store.log.verify().ok
        left = [e.stream for e in store.log.read() if body_text in e.meta.values()]
        assert left == ["n", "p"]  # the two stamps left as they were
    assert key_text.encode() not in every_byte(path)
