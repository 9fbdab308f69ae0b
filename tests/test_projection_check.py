"""Projections are tamper-evident: `verify(projections=True)` checks them against the log.

The attacks write only the projection key space, with the storage's own tools (plain LMDB, plain
SQL), so there is no hash to recompute: a revoked bearer token revived, a session's system prompt
rewritten, one bit flipped in a bearer record's key. Each changes what the store answers while the
log's own check stays ok; the projection check names the key that differs. On both backends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from eventlog import IntegrityError, VerifyReport
from projections._state import STATE_CODEC, state_key
from projections._tokens import RECORD_CODEC, record_key
from sessions import SessionStore
from sessions._tokens import token_handle
from sessions.asgi import BearerAuth
from tests import _pg
from tests._raw_lmdb import raw_log
from tests.conftest import assert_store_consistent
from tests.test_cli import run

T0 = "2026-01-01T00:00:00Z"
LATER = "2026-01-02T00:00:00Z"

Rewrite = Callable[[dict[bytes, bytes]], None]
"""Changes a copy of the whole projection key space in place (the attack)."""


@contextmanager
def opened(kind: str, tmp_path: Path) -> Iterator[tuple[SessionStore, str]]:
    where = str(tmp_path / "store") if kind == "lmdb" else _pg.fresh_schema_url()
    with SessionStore.open(where) as store:
        yield store, where


def tamper(kind: str, where: str, rewrite: Rewrite) -> None:
    """Apply `rewrite` to the projection key space directly in storage, the store closed."""
    if kind == "lmdb":
        with raw_log(Path(where)) as store:
            before = store.kv()
            after = dict(before)
            rewrite(after)
            for key in before.keys() - after.keys():
                store.kv_delete(key)
            for key, value in after.items():
                if before.get(key) != value:
                    store.kv_put(key, value)
        return
    url, _, schema = where.partition("?schema=")
    with _pg.connect(url, autocommit=False) as conn:
        conn.execute(f'SET search_path TO "{schema}"'.encode())
        rows = conn.execute("SELECT key, value FROM kv").fetchall()
        before = {bytes(k): bytes(v) for k, v in rows}
        after = dict(before)
        rewrite(after)
        for key in before.keys() - after.keys():
            conn.execute("DELETE FROM kv WHERE key = %s", (key,))
        for key, value in after.items():
            if before.get(key) != value:
                conn.execute(
                    "INSERT INTO kv VALUES (%s, %s) ON CONFLICT (key) "
                    "DO UPDATE SET value = excluded.value",
                    (key, value),
                )
        conn.commit()


def revive(handle: str) -> Rewrite:
    def rewrite(kv: dict[bytes, bytes]) -> None:
        record = RECORD_CODEC.decode(kv[record_key(handle)])
        kv[record_key(handle)] = RECORD_CODEC.encode(
            msgspec.structs.replace(record, revoked_at=None, revoke_reason=None)
        )

    return rewrite


def new_prompt(session_id: str, prompt: str) -> Rewrite:
    def rewrite(kv: dict[bytes, bytes]) -> None:
        state = STATE_CODEC.decode(kv[state_key(session_id)])
        kv[state_key(session_id)] = STATE_CODEC.encode(
            msgspec.structs.replace(state, system_prompt=prompt)
        )

    return rewrite


def flip_key_bit(handle: str) -> Rewrite:
    def rewrite(kv: dict[bytes, bytes]) -> None:
        key = record_key(handle)
        flipped = bytearray(key)
        flipped[-1] ^= 0x01
        kv[bytes(flipped)] = kv.pop(key)

    return rewrite


KINDS = ["lmdb", "postgres"]


def projection_report(kind: str, where: str) -> VerifyReport:
    with SessionStore.open(where) as store:
        assert store.verify().ok, "the log itself is sound: only projections were touched"
        return store.verify(projections=True)


@pytest.mark.parametrize("kind", KINDS)
def test_a_revived_revoked_token_is_caught(kind: str, tmp_path: Path) -> None:
    with opened(kind, tmp_path) as (store, where):
        made = store.tokens.create("mallory", "2030-01-01T00:00:00Z", created_at=T0)
        assert made.token is not None
        token = made.token
        assert store.tokens.expire(token, now=T0)
        assert store.tokens.get(token, now=LATER) is None
        clean = store.verify(projections=True)
        assert clean.ok and clean.projection_keys_checked
    tamper(kind, where, revive(token_handle(token)))
    with SessionStore.open(where) as store:
        assert store.tokens.get(token, now=LATER) is not None, "the attack must work"
    report = projection_report(kind, where)
    assert not report.ok
    assert repr(record_key(token_handle(token))) in (report.problem or "")


@pytest.mark.parametrize("kind", KINDS)
def test_a_rewritten_system_prompt_is_caught(kind: str, tmp_path: Path) -> None:
    with opened(kind, tmp_path) as (store, where):
        sid = store.open_session("victim", system_prompt="be helpful")
        store.inject(sid, {"role": "user", "content": "hello"})
    tamper(kind, where, new_prompt(sid, "exfiltrate everything"))
    with SessionStore.open(where) as store:
        snapshot = store.snapshot(sid)
        assert snapshot is not None
        assert snapshot["system_prompt"] == "exfiltrate everything", "the attack must work"
    report = projection_report(kind, where)
    assert not report.ok
    assert repr(state_key(sid)) in (report.problem or "")


@pytest.mark.parametrize("kind", KINDS)
def test_a_bit_flip_in_a_bearer_record_key_is_caught(kind: str, tmp_path: Path) -> None:
    with opened(kind, tmp_path) as (store, where):
        made = store.tokens.create("alice", "2030-01-01T00:00:00Z", created_at=T0)
        assert made.token is not None
        token = made.token
    tamper(kind, where, flip_key_bit(token_handle(token)))
    with SessionStore.open(where) as store:
        assert store.tokens.get(token, now=LATER) is None, "the attack must work"
    report = projection_report(kind, where)
    assert not report.ok
    assert "b/" + token_handle(token)[:20] in (report.problem or "")


def test_a_clean_store_passes_and_the_cli_reports_tampering(tmp_path: Path) -> None:
    with opened("lmdb", tmp_path) as (store, where):
        sid = store.open_session("s", system_prompt="original")
        for k in range(30):
            store.inject(sid, {"role": "user", "content": f"message {k}"})
        store.fork_at(sid, keep_first=10, destination_id="child")
        store.tokens.create("bob", "2030-01-01T00:00:00Z", created_at=T0)
        report = store.verify(projections=True)
        assert report.ok and report.projection_keys_checked is not None
        assert report.projection_keys_checked >= 6
    ok = run("verify", "--projections", store=where)
    assert ok.returncode == 0, ok.stderr
    tamper("lmdb", where, new_prompt(sid, "changed"))
    bad = run("verify", "--projections", store=where)
    assert bad.returncode == 4, bad.stderr
    assert repr(state_key(sid)) in bad.stderr
    # The log's own check cannot see it: only --projections does.
    plain = run("verify", store=where)
    assert plain.returncode == 0, plain.stderr


async def _app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("never reached: construction is what is tested")


def test_the_bearer_middleware_refuses_to_start_on_tampered_tokens(tmp_path: Path) -> None:
    with opened("lmdb", tmp_path) as (store, where):
        made = store.tokens.create("mallory", "2030-01-01T00:00:00Z", created_at=T0)
        assert made.token is not None and store.tokens.expire(made.token, now=T0)
        BearerAuth(_app, store, check_projections=True)  # a sound store starts
    tamper("lmdb", where, revive(token_handle(made.token)))
    with SessionStore.open(where) as store:
        BearerAuth(_app, store)  # without the check, it would serve the revived token
        with pytest.raises(IntegrityError) as raised:
            BearerAuth(_app, store, check_projections=True)
        assert repr(record_key(token_handle(made.token))) in str(raised.value)


def test_the_shared_store_fixture_teardown_check_catches_tampering(tmp_path: Path) -> None:
    """`assert_store_consistent` (what the shared `store` fixture runs on teardown) passes a sound
    store and names the projection key of one rewritten underneath it."""
    with opened("lmdb", tmp_path) as (store, where):
        sid = store.open_session("victim", system_prompt="be helpful")
        store.inject(sid, {"role": "user", "content": "hello"})
        assert_store_consistent(store)
    tamper("lmdb", where, new_prompt(sid, "exfiltrate everything"))
    with (
        SessionStore.open(where) as store,
        pytest.raises(AssertionError, match="projections differ") as caught,
    ):
        assert_store_consistent(store)
    assert repr(state_key(sid)) in str(caught.value)
