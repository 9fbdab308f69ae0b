"""Encryption at rest and crypto-shredding, on real LMDB stores: no planted plaintext in any byte
of any file; `forget` leaves neither the data key (wrapped or not) nor the plaintext anywhere,
while the log still verifies; a wrong or missing key refuses and changes nothing."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import pytest

import projections as pj
from eventlog import events as ev
from sessions import (
    ForgottenError,
    InvalidArgumentError,
    LocalKeyProvider,
    MissingKeyError,
    SessionStore,
    UnknownSessionError,
    WrongKeyError,
)
from sessions._keyring import _RECORD, _context, _unpack
from tests.conftest import STORE_KINDS, open_store, store_target_of

KEY = LocalKeyProvider(bytes(range(32)))
OTHER = LocalKeyProvider(bytes(range(1, 33)))


def every_byte(path: Path) -> bytes:
    """Every file of the store, concatenated (LMDB's free pages included)."""
    return b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())


def plant(store: SessionStore, tag: str) -> tuple[str, list[bytes]]:
    """A session whose every encrypted field holds a marker; returns it and the markers."""
    words = [f"{tag}-{what}-7f3a" for what in ("title", "prompt", "meta", "msg", "tool", "pad")]
    sid = store.open_session(title=words[0], system_prompt=words[1], metadata={"note": words[2]})
    store.inject(sid, {"role": "user", "content": words[3]})
    store.inject_many(
        sid,
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "function": {"arguments": words[4]}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": words[4] + "-result"},
        ],
    )
    store.set_scratchpad(sid, {"plan": words[5]})
    store.attach(sid, "client-1", {"metadata": {"device": words[5] + "-device"}})
    store.update_metadata(sid, {"more": words[2] + "-2"})
    store.rename(sid, words[0] + "-renamed")
    return sid, [w.encode() for w in words]


def state_of(store: SessionStore, sid: str) -> pj.SessionState:
    with store.log.view() as view:
        state = pj.load_state(view, sid)
    assert state is not None
    return state


def raw_key(store: SessionStore, sid: str) -> tuple[bytes, bytes]:
    """The session's data key, unwrapped, and its wrapped form, as the keyring holds them."""
    slot = state_of(store, sid).key_slot
    record = store._keyring.slots.read(slot)
    assert record.startswith(_RECORD)
    digest, wrapped = _unpack(record[len(_RECORD) :], 2, "test")
    return KEY.unwrap(wrapped, _context(slot, digest)), wrapped


def test_no_planted_plaintext_in_any_file(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:
        sid, words = plant(store, "plain")
        child = store.fork_at(sid, keep_first=2)
        store.inject(child, {"role": "user", "content": "child-own-7f3a"})
        assert store.context(sid)[0]["content"] == "plain-msg-7f3a"  # context views are built
        snap = store.snapshot(sid)
        assert snap is not None and snap["title"] == "plain-title-7f3a-renamed"
        assert snap["system_prompt"] == "plain-prompt-7f3a"
        assert snap["metadata"] == {"note": "plain-meta-7f3a", "more": "plain-meta-7f3a-2"}
        assert snap["scratchpad"] == {"plan": "plain-pad-7f3a"}
        assert snap["live_clients"][0]["metadata"] == {"device": "plain-pad-7f3a-device"}
        assert store.heartbeat(sid, "client-1")["metadata"] == {"device": "plain-pad-7f3a-device"}
        assert [m.get("content") for m in snap["transcript"]] == [
            "plain-msg-7f3a",
            None,
            "plain-tool-7f3a-result",
        ]
        assert store.messages(child)[2]["content"] == "child-own-7f3a"
        assert store.log.verify().ok
    data = every_byte(path)
    for word in [*words, b"child-own-7f3a"]:
        assert word not in data, word


def test_the_same_store_without_keys_holds_the_plaintext(tmp_path: Path) -> None:
    # The scan above can fail: without keys the words are there to be found.
    path = tmp_path / "s"
    with SessionStore.open(path) as store:
        _, words = plant(store, "open")
    data = every_byte(path)
    assert all(word in data for word in words)


def test_verify_ancestry_and_paging_need_no_key(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:
        sid, _ = plant(store, "v")
        child = store.fork(sid, "kid")
    with SessionStore.open(path) as store:
        assert store.log.verify().ok
        assert store.ancestry(child) == {"parent_id": sid, "child_ids": [], "root_id": sid}
        assert store.length(sid) == 3
        kinds = [e.type for e in store.log.read_stream(sid, after=0, limit=100)]
        assert kinds[:2] == ["session_opened", "message_injected"]
        store.rebuild()
        with pytest.raises(MissingKeyError):
            store.snapshot(sid)
        with pytest.raises(MissingKeyError):
            store.open_session("new")  # nothing plain is written into an encrypted store
        assert store.log.head == len(store.log.read(after=0, limit=1000))


def test_a_wrong_key_refuses_everything_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:
        sid, _ = plant(store, "w")
        expected = store.snapshot(sid)
    before = {p.name: p.read_bytes() for p in path.iterdir() if p.name != "lock.mdb"}
    with SessionStore.open(path, keys=OTHER) as store:
        head = store.log.head
        for read in (store.snapshot, store.messages, store.context, store.scratchpad):
            with pytest.raises(WrongKeyError) as caught:
                read(sid)
            assert caught.value.expected == KEY.key_id and caught.value.got == OTHER.key_id
        for write in (
            lambda: store.inject(sid, {"role": "user", "content": "x"}),
            lambda: store.open_session("another"),
            lambda: store.fork(sid),
            lambda: store.forget(sid, "no"),
            lambda: store.rotate_keys(KEY),
        ):
            with pytest.raises(WrongKeyError):
                write()
        assert store.log.head == head
    after = {p.name: p.read_bytes() for p in path.iterdir() if p.name != "lock.mdb"}
    assert after["keyring"] == before["keyring"]
    with SessionStore.open(path, keys=KEY) as store:
        assert store.snapshot(sid) == expected


def test_forget_leaves_no_key_and_no_plaintext_and_the_log_verifies(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:
        sid, words = plant(store, "gone")
        keep, _ = plant(store, "kept")
        key, wrapped = raw_key(store, sid)
        data = every_byte(path)
        assert wrapped in data and key not in data
        store.forget(sid, "erasure request")
        with pytest.raises(ForgottenError) as caught:
            store.snapshot(sid)
        assert caught.value.session_id == sid and caught.value.reason == "erasure request"
        for read in (store.messages, store.context, store.scratchpad):
            with pytest.raises(ForgottenError):
                read(sid)
        with pytest.raises(ForgottenError):
            store.inject(sid, {"role": "user", "content": "more"})
        assert store.ancestry(sid) == {"parent_id": None, "child_ids": [], "root_id": sid}
        kinds = [e.type for e in store.log.read_stream(sid, after=0, limit=100)]
        assert kinds[-1] == "session_forgotten" and kinds[1] == "message_injected"
        assert store.log.verify().ok
        store.forget(sid)  # again: nothing more to do
        assert store.snapshot(keep)["system_prompt"] == "kept-prompt-7f3a"
    data = every_byte(path)
    assert key not in data and wrapped not in data
    for word in words:
        assert word not in data
    with SessionStore.open(path, keys=KEY) as store:
        assert store.log.verify().ok
        store.rebuild()
        with pytest.raises(ForgottenError):
            store.messages(sid)


def test_forks_made_before_a_forget_keep_their_own_messages(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        parent = store.open_session(title="parent-title")
        store.inject_many(parent, [{"role": "user", "content": f"p{i}"} for i in range(3)])
        child = store.fork_at(parent, keep_first=2)
        store.inject(child, {"role": "assistant", "content": "mine"})
        store.forget(parent, "asked")
        shown = store.messages(child)
        # The shared prefix went with the parent's key: still there, counted, marked; never
        # skipped, never readable.
        assert shown == [
            {"role": "user", "metadata": {"forgotten": True}},
            {"role": "user", "metadata": {"forgotten": True}},
            {"role": "assistant", "content": "mine"},
        ]
        snap = store.snapshot(child)
        assert snap is not None and snap["title"] is None and snap["length"] == 3
        store.inject(child, {"role": "user", "content": "still writable"})
        assert store.messages(child, last=1)[0]["content"] == "still writable"
        store.forget(child)
        with pytest.raises(ForgottenError):
            store.messages(child)


def test_what_this_process_cached_goes_when_another_forgets_the_parent(tmp_path: Path) -> None:
    """A fork's whole transcript and a kept page of it, cached in this process (the second read
    of a page keeps it), are not shown once the parent they share is forgotten elsewhere."""
    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        parent = store.open_session()
        store.inject_many(parent, [{"role": "user", "content": f"p{i}"} for i in range(3)])
        child = store.fork(parent)
        for _ in range(2):
            assert [m["content"] for m in store.messages(child, last=2)] == ["p1", "p2"]
        assert len(store.messages(child)) == 3
        assert [m["content"] for m in store.messages(child, after=1, limit=1)] == ["p1"]
        elsewhere = SessionStore(store.log, keys=KEY, hot_sessions=0)  # another process's view
        elsewhere.forget(parent, "asked")
        gone = {"role": "user", "metadata": {"forgotten": True}}
        assert store.messages(child, last=2) == [gone, gone]
        assert store.messages(child, after=1, limit=1) == [gone]
        assert store.messages(child) == [gone, gone, gone]


def test_rotation_rewraps_the_keys_and_the_old_key_opens_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:
        sid, _ = plant(store, "r")
        expected = store.snapshot(sid)
        head = store.log.head
        assert store.rotate_keys(OTHER) == 1
        assert store.log.head == head
        assert store.snapshot(sid) == expected
    with SessionStore.open(path, keys=KEY) as store, pytest.raises(WrongKeyError):
        store.snapshot(sid)
    with SessionStore.open(path, keys=OTHER) as store:
        assert store.snapshot(sid) == expected
        store.forget(sid)


def test_a_sealed_message_moved_to_another_event_does_not_open(tmp_path: Path) -> None:
    from eventlog import IntegrityError

    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        sid = store.open_session()
        store.inject(sid, {"role": "user", "content": "a"})
        store.inject_many(sid, [{"role": "user", "content": "b"}, {"role": "user", "content": "c"}])
        lone, listed = (e.data for e in store.log.read_stream(sid, after=1, limit=2))
        assert isinstance(lone, ev.MessageInjected) and isinstance(listed, ev.MessagesInjected)
        sealer = store._sealer
        assert sealer is not None
        with store.log.view() as view:
            opener = sealer.opener(view, state_of(store, sid), "test")
        assert opener(lone, 2, [0])[0].content == "a"
        assert [m.content for m in opener(listed, 3, [0, 1])] == ["b", "c"]
        with pytest.raises(IntegrityError):
            opener(lone, 5, [0])  # the same ciphertext at another position
        with pytest.raises(IntegrityError):  # or put in a list
            opener(ev.MessagesInjected(messages=[lone.message, listed.messages[1]]), 3, [0, 1])


def test_forget_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "p") as store:
        sid = store.open_session()
        with pytest.raises(InvalidArgumentError):
            store.forget(sid)  # a plain session has no key to destroy
        with pytest.raises(UnknownSessionError):
            store.forget("nobody")
    with SessionStore.open(tmp_path / "e", keys=KEY) as store:
        sid = store.open_session()
        with store.transaction(), pytest.raises(InvalidArgumentError):
            store.forget(sid)


def test_key_providers_read_files_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = LocalKeyProvider.new_key()
    (tmp_path / "kek").write_text(text + "\n")
    monkeypatch.setenv("SESSIONLOG_KEK", text)
    assert LocalKeyProvider.from_file(tmp_path / "kek").key_id == LocalKeyProvider.from_env().key_id
    with pytest.raises(MissingKeyError):
        LocalKeyProvider.from_file(tmp_path / "missing")
    (tmp_path / "short").write_text("abcd")
    with pytest.raises(InvalidArgumentError) as caught:
        LocalKeyProvider.from_file(tmp_path / "short")
    assert caught.value.expected == 64 and caught.value.got == 4
    monkeypatch.delenv("SESSIONLOG_KEK")
    with pytest.raises(MissingKeyError):
        LocalKeyProvider.from_env()
    assert os.environ.get("SESSIONLOG_KEK") is None


def test_the_service_answers_forgotten_and_missing_keys_as_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests._service import Server

    path = tmp_path / "s"
    text = "ab" * 32
    keys = LocalKeyProvider.from_text(text, "test")
    with SessionStore.open(path, keys=keys) as store:
        gone = store.open_session("gone")
        store.inject(gone, {"role": "user", "content": "bye"})
        kept = store.open_session("kept")
        store.inject(kept, {"role": "user", "content": "hello"})
        store.forget(gone, "asked")

    def messages_of(sid: str, kek: str) -> httpx.Response:
        """GET the messages of `sid` from a server started with `kek` in $SESSIONLOG_KEK."""
        monkeypatch.setenv("SESSIONLOG_KEK", kek)
        server = Server(path).start()
        try:
            with httpx.Client(base_url=server.url) as http:
                headers = {"authorization": f"Bearer {server.admin_key}"}
                return http.get(f"/v1/sessions/{sid}/messages", headers=headers)
        finally:
            server.stop()

    assert [m["content"] for m in messages_of("kept", text).json()["data"]] == ["hello"]
    answer = messages_of("gone", text)
    assert answer.status_code == 410
    assert answer.json()["type"].endswith(":forgotten")
    answer = messages_of("kept", "cd" * 32)
    assert answer.status_code == 503
    assert answer.json()["type"].endswith(":key-unavailable")


def test_bundles_and_log_exports_of_a_forgotten_session_carry_no_plaintext(
    tmp_path: Path,
) -> None:
    from replay import export_bundle, export_log

    with SessionStore.open(tmp_path / "s", keys=KEY) as store:
        sid, words = plant(store, "export")
        assert "export-msg-7f3a" in json.dumps(export_bundle(store, sid, mode="local"))
        store.forget(sid)
        with pytest.raises(ForgottenError):
            export_bundle(store, sid, mode="local")
        out = tmp_path / "log.jsonl"
        export_log(store, out)
        text = out.read_bytes()
    assert not any(word in text for word in words)


@pytest.mark.parametrize("kind", [*STORE_KINDS, "memory"])
def test_every_backend_seals_forgets_and_rotates_alike(kind: str, tmp_path: Path) -> None:
    target = store_target_of(kind, tmp_path / "s")
    store = open_store(kind, target, keys=KEY)
    try:
        sid, _ = plant(store, kind)
        child = store.fork_at(sid, keep_first=1)
        store.inject(child, {"role": "user", "content": "own"})
        raw = store.log.read_stream(sid, after=1, limit=1)[0].data
        assert isinstance(raw, ev.MessageInjected) and raw.message.content is None
        assert store.rotate_keys(OTHER) == 2
        snap = store.snapshot(sid)
        assert snap is not None and snap["system_prompt"] == f"{kind}-prompt-7f3a"
        slot = state_of(store, sid).key_slot
        store.forget(sid, "asked")
        assert not store._keyring.slots.read(slot).strip(b"\x00")
        with pytest.raises(ForgottenError):
            store.messages(sid)
        assert [m.get("content") for m in store.messages(child)] == [None, "own"]
        assert store.log.verify(isolated=False).ok
    finally:
        store.close()
    if kind == "memory":
        return
    with open_store(kind, target, keys=KEY) as reopened, pytest.raises(WrongKeyError):
        reopened.messages(child)
    with open_store(kind, target) as reopened:
        with pytest.raises(MissingKeyError):
            reopened.messages(child)
        assert reopened.log.verify(isolated=False).ok
    with open_store(kind, target, keys=OTHER) as reopened:
        assert reopened.messages(child)[1] == {"role": "user", "content": "own"}


def test_a_log_imported_without_its_keyring_is_refused_not_shown_as_forgotten(
    tmp_path: Path,
) -> None:
    from replay import export_log, import_log

    with SessionStore.open(tmp_path / "a", keys=KEY) as store:
        sid, _ = plant(store, "moved")
        export_log(store, tmp_path / "log.jsonl")
    with SessionStore.open(tmp_path / "b", keys=KEY) as other:
        import_log(other, tmp_path / "log.jsonl")
        assert other.log.verify().ok
        with pytest.raises(MissingKeyError) as caught:
            other.messages(sid)
        assert caught.value.got == state_of(other, sid).key_slot


def test_the_runtime_drives_an_encrypted_session_and_stores_no_plaintext(tmp_path: Path) -> None:
    import asyncio

    from sessions.runtime import Runtime

    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:

        async def body() -> str:
            async with Runtime(store) as runtime:
                sid = str((await runtime.create("agent-1"))["session_id"])
                result = await runtime.prompt(sid, "runtime-question-7f3a")
                assert result["text"] == "mock reply to: runtime-question-7f3a"
                assert (await runtime.status(sid))["status"] == "idle"
                return sid

        sid = asyncio.run(body())
        assert [m["content"] for m in store.messages(sid)] == [
            "runtime-question-7f3a",
            "mock reply to: runtime-question-7f3a",
        ]
    assert b"runtime-question-7f3a" not in every_byte(path)


def test_the_command_line_forgets_and_rotates(tmp_path: Path) -> None:
    from tests.test_cli import run

    path = tmp_path / "s"
    text = "ab" * 32
    with SessionStore.open(path, keys=LocalKeyProvider.from_text(text, "test")) as store:
        gone, _ = plant(store, "cli")
        kept, _ = plant(store, "cli-kept")
    env = {"SESSIONLOG_KEK": text}
    stale = run("forget", gone, "--expected-version", "1", store=path, env=env)
    assert stale.returncode != 0 and "expected version 1 for stream" in stale.stderr
    done = run("forget", gone, "--reason", "erasure request", store=path, env=env)
    assert done.returncode == 0 and f"forgot `{gone}`" in done.stdout
    (tmp_path / "new.kek").write_text("cd" * 32)
    done = run("rotate-keys", "--new-key-file", tmp_path / "new.kek", store=path, env=env)
    assert done.returncode == 0 and "re-wrapped 1 data keys" in done.stdout
    done = run("forget", kept, store=path, env=env)  # the old key opens nothing now
    assert done.returncode != 0 and "WrongKeyError" not in done.stderr
    assert "wrapped by" in done.stderr
    with SessionStore.open(path, keys=LocalKeyProvider.from_text("cd" * 32, "new")) as store:
        assert store.snapshot(kept)["system_prompt"] == "cli-kept-prompt-7f3a"
        with pytest.raises(ForgottenError):
            store.snapshot(gone)


def test_the_async_face_forgets_rotates_and_sweeps(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from sessions import ConcurrencyError, RetentionPolicy
    from sessions.aio import AsyncSessionStore

    async def main() -> None:
        path = tmp_path / "aio"
        async with await AsyncSessionStore.open(path, keys=KEY) as store:
            gone = await store.open_session(title="gone-7f3a")
            await store.inject(gone, {"role": "user", "content": "gone-msg-7f3a"})
            with pytest.raises(ConcurrencyError):
                await store.forget(gone, "stale", expected_version=1)
            assert (await store.messages(gone))[0]["content"] == "gone-msg-7f3a"
            await store.forget(gone, "erasure", expected_version=2)
            with pytest.raises(ForgottenError):
                await store.messages(gone)
            closed = await store.open_session(title="closed-7f3a")
            await store.close_session(closed)
            later = datetime.now(UTC) + timedelta(days=30)
            report = await store.sweep(RetentionPolicy(max_age=timedelta(days=1)), later)
            assert report.forgotten == [closed]
            kept = await store.open_session(title="kept-7f3a")
            assert await store.rotate_keys(OTHER) == 1  # the one key not destroyed
        with SessionStore.open(path, keys=OTHER) as reopened:
            assert reopened.verify().ok
            assert reopened.snapshot(kept)["title"] == "kept-7f3a"
            with pytest.raises(ForgottenError):
                reopened.snapshot(closed)

    asyncio.run(main())


def test_a_rotation_by_another_process_stops_this_one_wrapping_under_the_old_key(
    tmp_path: Path,
) -> None:
    from tests.test_cli import run

    path = tmp_path / "s"
    text, new_text = "ab" * 32, "cd" * 32
    with SessionStore.open(path, keys=LocalKeyProvider.from_text(text, "old")) as store:
        first = store.open_session(title="first")
        (tmp_path / "new.kek").write_text(new_text)
        done = run(
            "rotate-keys",
            "--new-key-file",
            tmp_path / "new.kek",
            store=path,
            env={"SESSIONLOG_KEK": text},
        )
        assert done.returncode == 0, done.stderr
        keyring = (path / "keyring").read_bytes()
        with pytest.raises(WrongKeyError):
            store.open_session("second")
        assert (path / "keyring").read_bytes() == keyring
    with SessionStore.open(path, keys=LocalKeyProvider.from_text(new_text, "new")) as store:
        assert store.snapshot(first)["title"] == "first"
        assert not store.exists("second")
        store.open_session("second")


def test_a_fork_read_before_another_process_forgot_its_parent_shows_placeholders_after(
    tmp_path: Path,
) -> None:
    from tests.test_cli import run

    path = tmp_path / "s"
    text = "ab" * 32
    with SessionStore.open(path, keys=LocalKeyProvider.from_text(text, "k")) as store:
        parent = store.open_session()
        store.inject(parent, {"role": "user", "content": "shared"})
        child = store.fork(parent)
        assert store.messages(child)[0]["content"] == "shared"  # now in this process's caches
        assert store.context(child)[0]["content"] == "shared"
        done = run("forget", parent, store=path, env={"SESSIONLOG_KEK": text})
        assert done.returncode == 0, done.stderr
        gone = {"role": "user", "metadata": {"forgotten": True}}
        assert store.messages(child) == [gone]
        assert store.snapshot(child)["transcript"] == [gone]
        assert store.context(child) == [gone]


def test_a_rejection_reason_quoting_the_prompt_is_sealed(tmp_path: Path) -> None:
    """A filter's reason (or a failing filter's exception text) is made from the prompt, which
    the `input_rejected` event keeps: it is sealed like the prompt."""
    import asyncio

    from sessions.runtime import InputRejectedError, Runtime, Verdict, reject

    def quoting(prompt: str) -> Verdict:
        return reject(f"refused: {prompt}") if "quote" in prompt else Verdict()

    def parsing(prompt: str) -> Verdict:
        int(prompt)  # a broken filter: its error message holds the prompt
        return Verdict()

    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:

        async def body() -> str:
            async with Runtime(store, input_filters=[quoting, parsing]) as runtime:
                sid = str((await runtime.create("agent-1"))["session_id"])
                for prompt in ("quote rejected-secret-7f3a", "failing-secret-7f3a"):
                    with pytest.raises(InputRejectedError, match="secret-7f3a"):
                        await runtime.prompt(sid, prompt)
                return sid

        sid = asyncio.run(body())
        rejected = [e.data for e in store.log.read_stream(sid) if e.type == "input_rejected"]
        assert len(rejected) == 2
        assert all(r.reason.startswith("\x00sealed:") for r in rejected)
        assert b"secret-7f3a" not in every_byte(path)


def test_a_warning_quoting_the_prompt_is_sealed(tmp_path: Path) -> None:
    """A filter's warning is kept with the loop (`prompt_started`, the runtime's loop record):
    made from the prompt, its reason is sealed like the prompt; the filter's name stays readable."""
    import asyncio

    from sessions.runtime import Runtime, Verdict, warn

    def quoting(prompt: str) -> Verdict:
        return warn(f"looks odd: {prompt}")

    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:

        async def body() -> str:
            async with Runtime(store, input_filters=[quoting]) as runtime:
                sid = str((await runtime.create("agent-1"))["session_id"])
                await runtime.prompt(sid, "warned-secret-7f3a")
                return sid

        sid = asyncio.run(body())
        started = [e.data for e in store.log.read_stream(sid) if e.type == "prompt_started"]
        assert [w["filter"] for w in started[0].warnings] == ["quoting"]
        assert started[0].warnings[0]["reason"].startswith("\x00sealed:")
    assert b"warned-secret-7f3a" not in every_byte(path)


_ROTATE_ON_A_FULL_DISK = """
import resource, signal, sys
from sessions import LocalKeyProvider, SessionStore
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
with SessionStore.open(sys.argv[1], keys=LocalKeyProvider(bytes(range(32)))) as store:
    # Files may not grow past 8 KiB from here: a write crossing it is cut short, then refused
    # (EFBIG), as a full disk cuts a write short and then refuses it (ENOSPC).
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, resource.RLIM_INFINITY))
    try:
        store.rotate_keys(LocalKeyProvider(bytes(range(1, 33))))
    except Exception as exc:
        print(type(exc).__name__, exc)
    else:
        print("rotated")
"""


def test_a_rotation_that_cannot_write_the_whole_keyring_keeps_the_old_one(tmp_path: Path) -> None:
    """The re-wrapped keyring (here 41 slots of 512 bytes) does not fit: the rotation fails
    with a storage error and every session still opens with the old key; a keyring cut short
    and put in place would have lost the keys of the sessions in its missing slots."""
    import subprocess
    import sys

    path = tmp_path / "s"
    with SessionStore.open(path, keys=KEY) as store:
        sids = [store.open_session(title=f"t{n}") for n in range(40)]
    assert (path / "keyring").stat().st_size > 8192
    done = subprocess.run(
        [sys.executable, "-c", _ROTATE_ON_A_FULL_DISK, str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.stdout.startswith("StorageError"), done.stdout + done.stderr
    with SessionStore.open(path, keys=KEY) as store:
        assert [store.snapshot(sid)["title"] for sid in sids] == [f"t{n}" for n in range(40)]


def test_a_session_opened_beside_a_log_without_its_keyring_takes_a_slot_no_event_names(
    tmp_path: Path,
) -> None:
    """The imported sessions name keyring slots this keyring never had: a session opened here
    afterwards gets a slot above them all, so they still read as missing keys (the keyring can be
    brought back), not as altered, and bringing it back takes no key of the new session."""
    from replay import export_log, import_log

    with SessionStore.open(tmp_path / "a", keys=KEY) as store:
        sid, _ = plant(store, "moved")
        export_log(store, tmp_path / "log.jsonl")
    with SessionStore.open(tmp_path / "b", keys=KEY) as other:
        import_log(other, tmp_path / "log.jsonl")
        fresh = other.open_session(title="opened here")
        assert state_of(other, fresh).key_slot > state_of(other, sid).key_slot
        with pytest.raises(MissingKeyError):
            other.messages(sid)
        assert other.snapshot(fresh)["title"] == "opened here"


def test_the_reasons_and_sources_a_caller_gives_are_sealed_and_gone_after_forget(
    tmp_path: Path,
) -> None:
    """A rewind's reason, a scratchpad change's source and reason, and a live client's reason are
    free text a caller gives (they may quote the conversation): sealed like the rest, and gone
    from every file once the session is forgotten."""
    path = tmp_path / "s"
    words = {
        what: f"{what}-secret-7f3a"
        for what in ("rewind", "set-src", "set-why", "clear-src", "clear-why", "take", "leave")
    }
    with SessionStore.open(path, keys=KEY) as store:
        sid = store.open_session()
        store.inject_many(sid, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        store.rewind(sid, 1, reason=words["rewind"])
        store.set_scratchpad(
            sid, {"k": 1}, {"source": words["set-src"], "reason": words["set-why"]}
        )
        store.clear_scratchpad(sid, {"source": words["clear-src"], "reason": words["clear-why"]})
        store.takeover(sid, "client-1", {"reason": words["take"]})
        store.detach(sid, "client-1", {"reason": words["leave"]})
        kinds = {"session_rewound", "scratchpad_set", "scratchpad_cleared", "live_session_client"}
        texts = [
            value
            for envelope in store.log.read_stream(sid)
            if envelope.type in kinds
            for name in ("reason", "source")
            if (value := getattr(envelope.data, name, None)) is not None
        ]
        assert len(texts) == 7
        assert all(text.startswith("\x00sealed:") for text in texts)
        assert store.scratchpad(sid) is None
        store.forget(sid)
        assert store.log.verify().ok
    stored = every_byte(path)
    assert [w for w in words.values() if w.encode() in stored] == []
