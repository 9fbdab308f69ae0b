"""What the service keeps of an idempotent write to an encrypted session, and what `forget` leaves
of it: the digest of the caller's `Idempotency-Key` and the fingerprint of the request's body are
keyed by the session's data key, so a retry is still recognised while the session lives and,
once its key is destroyed, neither confirms a guess (a typed header value, a short body such as
"yes"). Plain sessions keep the unkeyed digests, as before.

The guesses are computed here as anyone holding the store would: the service's scheme
(principal, method, path and key under SHA-256; the body under SHA-256) without its code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from service import create_app
from sessions import LocalKeyProvider, SessionStore
from tests._service import new_key, serving

KEY = LocalKeyProvider(bytes(range(32)))
PRINCIPAL = "admin"
JSON = {"content-type": "application/json"}


def scoped(method: str, path: str, key: str) -> str:
    """A guess of the stored idempotency key: the service's unkeyed digest of the request."""
    scope = f"{PRINCIPAL}\n{method}\n{path}\n{key}".encode()
    return "http:" + hashlib.sha256(scope).hexdigest()


def fingerprint(raw: bytes) -> str:
    """A guess of the stored body fingerprint: the unkeyed digest of the body."""
    return hashlib.sha256(raw).hexdigest()[:32]


def every_byte(path: Path) -> bytes:
    """Every file of the store, concatenated (LMDB's free pages included)."""
    return b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())


def confirmed(store: SessionStore, path: Path, guesses: list[str]) -> list[str]:
    """The guesses the store confirms: found in an event's meta, in the log's idempotency table,
    or anywhere in its files."""
    metas = [envelope.meta for envelope in store.log.read(limit=10_000)]
    with store.log.view() as view:
        return [
            guess
            for guess in guesses
            if any(guess in meta.values() for meta in metas)
            or view.appended_with(guess) is not None
            or guess.encode() in every_byte(path)
        ]


@contextmanager
def served(path: Path, keys: LocalKeyProvider | None = KEY) -> Iterator[tuple[httpx.Client, Any]]:
    """The service over the store at `path` on loopback: an HTTP client, and the store."""
    token = new_key()
    store = SessionStore.open(path, hot_sessions=0, keys=keys)
    try:
        with serving(create_app(store, api_keys={token: PRINCIPAL})) as url:
            headers = {"authorization": f"Bearer {token}"}
            with httpx.Client(base_url=url, headers=headers) as http:
                yield http, store
    finally:
        store.close()


def post(http: httpx.Client, path: str, raw: bytes, key: str) -> httpx.Response:
    return http.post(path, content=raw, headers={**JSON, "idempotency-key": key})


def test_after_forget_the_stored_digests_confirm_no_guess(tmp_path: Path) -> None:
    """A message written with an `Idempotency-Key` to an encrypted session: while it lives a
    retry gets the first answer and another body under the key a 409; after `forget` neither
    the key's digest nor the body's is found anywhere in the store, and a retry writes nothing."""
    path = tmp_path / "s"
    raw, key = b'{"message":{"role":"user","content":"yes"}}', "chat-turn-7f3a"
    route = "/v1/sessions/s/messages"
    with served(path) as (http, store):
        assert http.post("/v1/sessions", json={"id": "s"}).status_code == 201
        first = post(http, route, raw, key)
        assert first.status_code == 201, first.text
        again = post(http, route, raw, key)
        assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
        assert again.json() == first.json()
        other = post(http, route, b'{"message":{"role":"user","content":"no"}}', key)
        assert other.status_code == 409 and "idempotency-key-reused" in other.json()["type"]
        assert store.length("s") == 1
        store.forget("s")
        assert confirmed(store, path, [scoped("POST", route, key), fingerprint(raw)]) == []
        head = store.log.head
        late = post(http, route, raw, key)
        assert late.status_code == 410 and late.json()["type"].endswith(":forgotten")
        assert store.log.head == head


def test_writes_that_create_a_session_key_their_bodys_digest_by_its_new_key(tmp_path: Path) -> None:
    """No key exists before a create or a fork: the body's digest is keyed at the append, by the
    new session's key, and a retry, found by its key's digest, keys its own body by the session
    it made. That digest stays unkeyed (the documented limit): a retry must find the first
    attempt before it knows which session that made, and the id a body names may differ between
    the two when a key is reused (which must still be a 409, not a second session)."""
    path = tmp_path / "s"
    named = b'{"id":"c","title":"divorce-7f3a"}'
    minted = b'{"title":"divorce-7f3a"}'
    forked = b'{"child_id":"c2"}'
    requests = (
        ("/v1/sessions", named, "create-named"),
        ("/v1/sessions", minted, "create-minted"),
        ("/v1/sessions/c/fork", forked, "fork-named"),
    )
    with served(path) as (http, store):
        made = []
        for route, raw, key in requests:
            first = post(http, route, raw, key)
            again = post(http, route, raw, key)
            assert first.status_code == again.status_code == 201, first.text
            assert again.headers["idempotent-replayed"] == "true"
            assert again.json()["id"] == first.json()["id"]
            other = post(http, route, raw.replace(b"7f3a", b"0000").replace(b"c2", b"c3"), key)
            assert other.status_code == 409, other.text
            made.append(first.json()["id"])
        assert made[0] == "c" and made[2] == "c2"
        assert store.ancestry("c")["child_ids"] == ["c2"]
        assert len(store.list_sessions()["sessions"]) == 3
        for sid in made:
            store.forget(sid)
        assert confirmed(store, path, [fingerprint(raw) for _, raw, _ in requests]) == []
        with store.log.view() as view:
            found = [view.appended_with(scoped("POST", r, key)) for r, _, key in requests]
        assert [where and where[0] for where in found] == made


def test_plain_sessions_keep_the_unkeyed_digests(tmp_path: Path) -> None:
    """A session written before the store had keys, and any session of a store without keys,
    keep the digests as the service always stored them; an encrypted one beside them does not."""
    path, raw = tmp_path / "s", b'{"message":{"role":"user","content":"yes"}}'
    with served(path, keys=None) as (http, store):
        assert http.post("/v1/sessions", json={"id": "p"}).status_code == 201
        assert post(http, "/v1/sessions/p/messages", raw, "k-1").status_code == 201
    with served(path) as (http, store):
        assert http.post("/v1/sessions", json={"id": "e"}).status_code == 201
        for sid in ("p", "e"):
            assert post(http, f"/v1/sessions/{sid}/messages", raw, "k-2").status_code == 201
        stamped = [(e.stream, e.meta) for e in store.log.read() if e.meta]
    plain = [
        {
            "idempotency_key": scoped("POST", "/v1/sessions/p/messages", key),
            "request_sha256": fingerprint(raw),
        }
        for key in ("k-1", "k-2")
    ]
    assert [meta for stream, meta in stamped if stream == "p"] == plain
    [(_, encrypted)] = [(stream, meta) for stream, meta in stamped if stream == "e"]
    assert set(encrypted) == {"idempotency_key", "request_sha256"}
    assert scoped("POST", "/v1/sessions/e/messages", "k-2") not in encrypted.values()
    assert fingerprint(raw) not in encrypted.values()


def test_retries_of_requests_stored_before_digests_were_keyed_are_recognised(
    tmp_path: Path,
) -> None:
    """An encrypted session's write stamped with the unkeyed digests (as the service did before)
    still answers its retry, and refuses another body under its key."""
    path, raw = tmp_path / "s", b'{"message":{"role":"user","content":"old"}}'
    route = "/v1/sessions/s/messages"
    with served(path) as (http, store):
        assert http.post("/v1/sessions", json={"id": "s"}).status_code == 201
        with store.transaction():
            tx = store.log.current_transaction()
            assert tx is not None
            old = {
                "idempotency_key": scoped("POST", route, "old-key"),
                "request_sha256": fingerprint(raw),
            }
            tx.stamp_next_append(old)
            store.inject("s", {"role": "user", "content": "old"})
        position = store.log.head
        again = post(http, route, raw, "old-key")
        assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
        assert again.json()["first_event_id"] == position
        other = post(http, route, b'{"message":{"role":"user","content":"new"}}', "old-key")
        assert other.status_code == 409, other.text
        assert store.log.head == position and store.length("s") == 1


def test_another_store_instance_recognises_a_retry_and_one_without_keys_refuses(
    tmp_path: Path,
) -> None:
    """The digest key is derived from the session's data key, so the service over another
    instance of the store (a restart, another worker) keys a retry the same way; one opened
    without the store's keys cannot key it, and refuses the write instead of storing a digest
    anyone could check."""
    path, raw = tmp_path / "s", b'{"message":{"role":"user","content":"yes"}}'
    route = "/v1/sessions/s/messages"
    with served(path) as (http, store):
        assert http.post("/v1/sessions", json={"id": "s"}).status_code == 201
        first = post(http, route, raw, "k")
        assert first.status_code == 201
    with served(path, keys=None) as (http, store):
        head = store.log.head
        for sent, key in ((raw, "k"), (raw, "k-new")):
            refused = post(http, route, sent, key)
            assert refused.status_code == 503 and refused.json()["type"].endswith("key-unavailable")
        assert store.log.head == head
    with served(path) as (http, store):
        again = post(http, route, raw, "k")
        assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
        assert again.json() == first.json()
        assert post(http, route, raw.replace(b"yes", b"no"), "k").status_code == 409
        assert store.log.head == head and store.length("s") == 1
