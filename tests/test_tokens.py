"""Durable bearer sessions (`store.tokens`), issue 5: each semantic as a test with explicit times,
the token's absence from every byte of the store, and a state machine against a plain model."""

from __future__ import annotations

import base64
import secrets
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import blake3
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import projections as pj
from eventlog import events as ev
from sessions import (
    BearerSession,
    InvalidArgumentError,
    LimitExceededError,
    SessionExistsError,
    SessionStore,
)
from sessions._tokens import HANDLE_CONTEXT, entropy_problem, token_handle
from tests.conftest import assert_rebuild_changes_nothing

T0 = "2026-05-01T00:00:00Z"
T_EXPIRY = "2026-06-01T00:00:00Z"


def at(days: float) -> str:
    """T0 plus `days`, as RFC 3339."""
    moment = datetime(2026, 5, 1, tzinfo=UTC) + timedelta(days=days)
    return moment.isoformat().replace("+00:00", "Z")


@pytest.fixture(params=["lmdb", "memory"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """Every test here runs on LMDB and on the in-memory reference store."""
    return str(request.param)


def create(store: SessionStore, **options: Any) -> BearerSession:
    options.setdefault("created_at", T0)
    return store.tokens.create(options.pop("principal", "user_123"), T_EXPIRY, **options)


# Creating


def test_create_returns_the_token_once_and_the_record_in_rfc3339(store: SessionStore) -> None:
    made = create(store, attributes={"role": "operator", "tenant": "acme"})
    assert made.token is not None
    assert made.principal == "user_123"
    assert made.created_at == "2026-05-01T00:00:00+00:00"
    assert made.last_seen_at == made.created_at
    assert made.expires_at == "2026-06-01T00:00:00+00:00"
    assert made.attributes == {"role": "operator", "tenant": "acme"}
    assert made.handle == token_handle(made.token)
    assert made.token not in repr(made)
    assert "token" not in made.as_dict()
    found = store.tokens.get(made.token, now=at(1))
    assert found is not None
    assert found.token is None  # the token is returned by create and nowhere else
    assert found.as_dict() == made.as_dict()


def test_generated_tokens_carry_256_random_bits(store: SessionStore) -> None:
    tokens = [create(store).token for _ in range(20)]
    assert len(set(tokens)) == 20
    for token in tokens:
        assert token is not None
        assert len(base64.urlsafe_b64decode(token + "=")) * 8 >= 256
        assert entropy_problem(token) is None


def test_the_handle_is_blake3_derive_key_with_the_versioned_context(store: SessionStore) -> None:
    made = create(store)
    assert made.token is not None
    expected = blake3.blake3(
        made.token.encode(), derive_key_context="sessionlog 2026 bearer handle v1"
    ).hexdigest()
    assert HANDLE_CONTEXT == "sessionlog 2026 bearer handle v1"
    assert made.handle == expected
    [envelope] = store.log.read_stream(f"$bearer/{expected}")
    assert isinstance(envelope.data, ev.BearerSessionCreated)
    assert envelope.data.handle == expected


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("a" * 40, "different characters"),
        ("ab" * 20, "different characters"),
        ("0123456789" * 4, "estimated entropy"),
        ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKL", "same step"),
        ("acegikmoqsuwyACEGIKMOQSUWY02468", "characters, got 31"),
        ("Zq3Ls9Vx0Kd7Rt2M" * 3, "estimated entropy"),  # 16 characters, three times
        ("acegikmoqsuwyACEGIKMOQSUWYbdfhjlnprtvxz", "same step"),
        (secrets.token_hex(16), "estimated entropy"),  # 128 bits, but the estimate is stricter
        ("x" * 600, "characters, got 600"),
        ("has spaces " + secrets.token_urlsafe(32), "may only hold"),
        ("é" + secrets.token_urlsafe(32), "may only hold"),
    ],
)
def test_weak_or_malformed_supplied_tokens_are_refused(
    store: SessionStore, token: str, why: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=why) as caught:
        create(store, id=token)
    assert token not in str(caught.value)
    assert token[:12] not in str(caught.value)
    assert store.log.head == 0


@pytest.mark.parametrize(
    "token",
    [
        secrets.token_hex(32),
        secrets.token_urlsafe(32),
        secrets.token_urlsafe(24),
        base64.b64encode(secrets.token_bytes(48)).decode(),
        "sk_live_" + secrets.token_urlsafe(32),
    ],
)
def test_high_entropy_supplied_tokens_are_accepted(store: SessionStore, token: str) -> None:
    if entropy_problem(token) is not None:  # 32-character random tokens miss one time in 20,000
        token = secrets.token_urlsafe(32)
    made = create(store, id=token)
    assert made.token == token
    found = store.tokens.get(token, now=at(1))
    assert found is not None
    assert found.handle == made.handle


def test_a_non_str_token_is_refused(store: SessionStore) -> None:
    with pytest.raises(InvalidArgumentError, match="`id` must be a str, got bytes"):
        create(store, id=secrets.token_bytes(32))


def test_two_creates_of_one_token_exactly_one_wins(store: SessionStore) -> None:
    token = secrets.token_urlsafe(32)
    create(store, id=token)
    with pytest.raises(SessionExistsError, match="already exists") as caught:
        create(store, id=token, principal="someone_else")
    assert token not in str(caught.value)
    assert token_handle(token)[:16] in str(caught.value)
    found = store.tokens.get(token, now=at(1))
    assert found is not None
    assert found.principal == "user_123"
    assert store.log.head == 1


def test_a_revoked_or_expired_token_cannot_be_created_again(store: SessionStore) -> None:
    token = secrets.token_urlsafe(32)
    create(store, id=token)
    assert store.tokens.expire(token, now=at(1))
    with pytest.raises(SessionExistsError):
        create(store, id=token)
    assert store.tokens.get(token, now=at(2)) is None


def test_the_loser_of_a_create_race_sees_the_stream_even_without_a_record(
    store: SessionStore,
) -> None:
    token = secrets.token_urlsafe(32)
    stream = f"$bearer/{token_handle(token)}"
    # A stream whose first event is not a create: the projection keeps no record for it, and the
    # log's NO_STREAM check is what refuses the second create.
    from eventlog import NO_STREAM

    store.log.append(
        stream,
        [ev.BearerSessionTouched(last_seen_at=datetime.now(UTC))],
        expected_version=NO_STREAM,
    )
    with pytest.raises(SessionExistsError, match="already exists"):
        create(store, id=token)
    assert store.log.head == 1


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"principal": ""}, InvalidArgumentError, "non-empty str"),
        ({"principal": 7}, InvalidArgumentError, "non-empty str"),
        ({"principal": "p" * 257}, LimitExceededError, "principal_chars_max"),
        ({"attributes": ["role"]}, InvalidArgumentError, "JSON object"),
        ({"attributes": {"n": float("nan")}}, InvalidArgumentError, "not a JSON number"),
        ({"attributes": {"s": {1, 2}}}, InvalidArgumentError, "a set would come back as a list"),
        ({"attributes": {"d": {1: "x"}}}, InvalidArgumentError, "keys must be str"),
        ({"attributes": {"big": "x" * 5000}}, LimitExceededError, "bearer_attributes_bytes_max"),
        ({"created_at": T_EXPIRY}, InvalidArgumentError, "must be after `created_at`"),
    ],
)
def test_bad_create_arguments_raise_and_write_nothing(
    store: SessionStore, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        create(store, **options)
    assert store.log.head == 0


def test_attributes_are_copied_not_shared(store: SessionStore) -> None:
    labels: dict[str, Any] = {"roles": ["reader"]}
    made = create(store, attributes=labels)
    labels["roles"].append("admin")
    assert made.attributes == {"roles": ["reader"]}
    made.attributes["roles"].append("writer")
    assert made.token is not None
    found = store.tokens.get(made.token, now=at(1))
    assert found is not None
    assert found.attributes == {"roles": ["reader"]}


# Times


@pytest.mark.parametrize(
    "value",
    [
        "2026-06-01T00:00:00",  # no offset: naive
        "2026-06-01",  # a date, not a date-time
        "2026-13-01T00:00:00Z",  # no 13th month
        "2026-06-01T00:00:60Z",
        "June 1st 2026",
        "",
        datetime(2026, 6, 1),  # a naive datetime
        1780272000,
    ],
)
def test_naive_or_invalid_times_are_refused(store: SessionStore, value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="expires_at"):
        store.tokens.create("user", value, created_at=T0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="now"):
        store.tokens.get(secrets.token_urlsafe(32), now=value)  # type: ignore[arg-type]
    assert store.log.head == 0


def test_times_with_offsets_and_aware_datetimes_come_out_in_utc(store: SessionStore) -> None:
    plus_two = timezone(timedelta(hours=2))
    made = store.tokens.create(
        "user",
        datetime(2026, 6, 1, 2, 0, tzinfo=plus_two),
        created_at="2026-05-01T02:00:00.250+02:00",
    )
    assert made.created_at == "2026-05-01T00:00:00.250000+00:00"
    assert made.expires_at == "2026-06-01T00:00:00+00:00"
    assert made.token is not None
    assert store.tokens.get(made.token, now="2026-06-01T01:59:59.999999+02:00") is not None
    assert store.tokens.get(made.token, now="2026-06-01t00:00:00z") is None


# get, touch, expire


def test_unknown_tokens_and_non_tokens_are_none(store: SessionStore) -> None:
    create(store)
    for probe in [secrets.token_urlsafe(32), "short", "x" * 10_000, "bad token with spaces" * 3]:
        assert store.tokens.get(probe, now=at(1)) is None
        assert store.tokens.touch(probe, now=at(1)) is None
        assert store.tokens.expire(probe, now=at(1)) is False
    assert store.log.head == 1


def test_expired_means_expires_at_at_or_before_now(store: SessionStore) -> None:
    made = create(store)
    assert made.token is not None
    assert store.tokens.get(made.token, now="2026-05-31T23:59:59.999999Z") is not None
    assert store.tokens.get(made.token, now=T_EXPIRY) is None
    assert store.tokens.touch(made.token, now=T_EXPIRY) is None
    assert store.tokens.get(made.token, now=at(40)) is None


def test_touch_moves_last_seen_forward_only_and_never_extends_expiry(store: SessionStore) -> None:
    made = create(store)
    token = made.token
    assert token is not None
    touched = store.tokens.touch(token, now=at(3))
    assert touched is not None
    assert touched.last_seen_at == "2026-05-04T00:00:00+00:00"
    assert touched.expires_at == made.expires_at
    head = store.log.head
    earlier = store.tokens.touch(token, now=at(2))  # a late arrival changes nothing
    assert earlier is not None
    assert earlier.last_seen_at == "2026-05-04T00:00:00+00:00"
    assert store.log.head == head  # and writes nothing
    later = store.tokens.touch(token, now=at(30.5))
    assert later is not None
    assert later.last_seen_at == "2026-05-31T12:00:00+00:00"
    assert later.expires_at == made.expires_at
    found = store.tokens.get(token, now=at(30.6))
    assert found is not None
    assert found.last_seen_at == later.last_seen_at


def test_an_expired_session_is_never_revived(store: SessionStore) -> None:
    made = create(store)
    token = made.token
    assert token is not None
    head = store.log.head
    assert store.tokens.touch(token, now=at(31)) is None
    assert store.log.head == head  # the refused touch wrote nothing
    assert store.tokens.get(token, now=at(31)) is None
    assert store.tokens.get(token, now=at(40)) is None


def test_expire_revokes_for_good(store: SessionStore) -> None:
    made = create(store)
    token = made.token
    assert token is not None
    assert store.tokens.expire(token, now=at(5)) is True
    assert store.tokens.expire(token, now=at(6)) is False  # already revoked: nothing written
    assert store.tokens.get(token, now=at(6)) is None
    assert store.tokens.get(token, now=at(1)) is None  # revocation does not depend on `now`
    assert store.tokens.touch(token, now=at(6)) is None
    events = store.log.read_stream(f"$bearer/{made.handle}")
    assert [type(e.data) for e in events] == [ev.BearerSessionCreated, ev.BearerSessionExpired]
    revoked = events[-1].data
    assert isinstance(revoked, ev.BearerSessionExpired)
    assert revoked.expired_at == datetime(2026, 5, 6, tzinfo=UTC)


def test_now_defaults_to_the_clock(store: SessionStore) -> None:
    soon = datetime.now(UTC) + timedelta(hours=1)
    made = store.tokens.create("user", soon)
    assert made.token is not None
    assert store.tokens.get(made.token) is not None
    touched = store.tokens.touch(made.token)
    assert touched is not None
    assert datetime.fromisoformat(touched.last_seen_at) >= datetime.fromisoformat(made.created_at)
    past = store.tokens.create("user", soon, created_at=soon - timedelta(days=2))
    assert past.token is not None
    assert store.tokens.get(past.token, now=soon + timedelta(seconds=1)) is None


def test_bearer_sessions_are_not_sessions(store: SessionStore) -> None:
    made = create(store)
    assert store.list_sessions()["sessions"] == []
    assert not store.exists(f"$bearer/{made.handle}")
    assert store.snapshot(f"$bearer/{made.handle}") is None


def test_commands_join_a_store_transaction_and_abort_with_it(store: SessionStore) -> None:
    class Stop(Exception):
        pass

    with pytest.raises(Stop), store.transaction():
        made = create(store)
        raise Stop
    assert made.token is not None
    assert store.tokens.get(made.token, now=at(1)) is None
    assert store.log.head == 0


# Records are a projection


def test_records_survive_a_restart_and_equal_a_rebuild(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "store") as store:
        made = create(store, attributes={"role": "operator"})
        token = made.token
        assert token is not None
        other = create(store)
        assert other.token is not None
        store.tokens.touch(token, now=at(2))
        store.tokens.expire(other.token, now=at(3))
        with store.log.view() as view:
            incremental = pj.dump(view)
    with SessionStore.open(tmp_path / "store") as store:
        found = store.tokens.get(token, now=at(4))
        assert found is not None
        assert found.last_seen_at == "2026-05-03T00:00:00+00:00"
        assert found.attributes == {"role": "operator"}
        assert store.tokens.get(other.token, now=at(4)) is None
        store.rebuild()
        with store.log.view() as view:
            assert pj.dump(view) == incremental
        assert any(key.startswith(b"b/") for key, _ in incremental)


def test_as_of_shows_a_past_record_and_refuses_writes(store: SessionStore) -> None:
    made = create(store)
    token = made.token
    assert token is not None
    store.tokens.touch(token, now=at(2))
    store.tokens.expire(token, now=at(3))
    past = store.as_of(2)
    found = past.tokens.get(token, now=at(2.5))
    assert found is not None
    assert found.last_seen_at == "2026-05-03T00:00:00+00:00"
    assert past.as_of(1).tokens.get(token, now=at(2.5)) is not None
    with pytest.raises(InvalidArgumentError, match="read-only"):
        past.tokens.touch(token, now=at(2.6))
    with pytest.raises(InvalidArgumentError, match="read-only"):
        past.tokens.create("user", T_EXPIRY, created_at=T0)


def test_the_fold_ignores_what_makes_no_sense(store: SessionStore) -> None:
    from eventlog import ANY

    handle = "f" * 64
    stream = f"$bearer/{handle}"
    late = datetime(2026, 5, 2, tzinfo=UTC)
    store.log.append(stream, [ev.BearerSessionTouched(last_seen_at=late)], expected_version=ANY)
    wrong = ev.BearerSessionCreated(
        handle="0" * 64, principal="p", created_at=late, expires_at=late + timedelta(days=1)
    )
    store.log.append(stream, [wrong], expected_version=ANY)
    with store.log.view() as view:
        assert pj.load_record(view, handle) is None
        assert pj.load_record(view, "0" * 64) is None


# The raw token is never stored


def encodings(token: str) -> dict[str, bytes]:
    """The token as the bytes a careless writer would leave: UTF-8, hex (both cases), and
    standard and URL-safe base64 at each of the three byte alignments inside a longer value."""
    raw = token.encode()
    found = {
        "utf-8": raw,
        "utf-16-le": token.encode("utf-16-le"),
        "hex": raw.hex().encode(),
        "HEX": raw.hex().upper().encode(),
    }
    for name, encode in (("base64", base64.b64encode), ("urlsafe", base64.urlsafe_b64encode)):
        for shift in range(3):
            text = encode(b"\x00" * shift + raw)
            # Drop the characters that also depend on the neighbouring bytes.
            found[f"{name}+{shift}"] = text[4:-4]
    return found


def test_no_file_of_the_store_holds_a_token_in_any_common_encoding(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    tokens: list[str] = []
    with SessionStore.open(directory) as store:
        sid = store.open_session()
        for index in range(30):
            supplied = secrets.token_urlsafe(32) if index % 3 == 0 else None
            made = store.tokens.create(
                f"user_{index}", T_EXPIRY, created_at=T0, id=supplied, attributes={"i": index}
            )
            assert made.token is not None
            tokens.append(made.token)
            store.inject(sid, {"role": "user", "content": f"request {index}"})
        for step, token in enumerate(tokens * 3):
            store.tokens.touch(token, now=at(1 + step / 100))
            store.tokens.get(token, now=at(2))
        for token in tokens[::4]:
            store.tokens.expire(token, now=at(3))
        for token in tokens[:5]:  # the loser of a duplicate create must leave no trace either
            with pytest.raises(SessionExistsError):
                store.tokens.create("mallory", T_EXPIRY, created_at=T0, id=token)
        store.rebuild()
    files = [path for path in directory.rglob("*") if path.is_file()]
    assert {path.name for path in files} >= {"data.mdb"}
    contents = {path: path.read_bytes() for path in files}
    assert sum(map(len, contents.values())) > 100_000
    for token in tokens:
        handle = token_handle(token).encode()
        assert any(handle in data for data in contents.values())  # the scan does see records
        for name, needle in encodings(token).items():
            for path, data in contents.items():
                assert needle not in data, f"{path.name} holds the token ({name})"


# A state machine: the store against a plain model, with explicit times and restarts


class TokenMachine(RuleBasedStateMachine):
    tokens = Bundle("tokens")

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.directory = tempfile.mkdtemp(prefix="tokens-")
        self.store = SessionStore.open(self.directory)
        self.model: dict[str, dict[str, Any]] = {}
        self.now = 0.0

    @initialize()
    def start(self) -> None:
        self.now = 0.0

    @rule(target=tokens, lifetime=st.floats(0.5, 10), principal=st.sampled_from(["a", "b"]))
    def create(self, lifetime: float, principal: str) -> str:
        made = self.store.tokens.create(principal, at(self.now + lifetime), created_at=at(self.now))
        assert made.token is not None
        self.model[made.token] = {
            "principal": principal,
            "last_seen": self.now,
            "expires": self.now + lifetime,
            "revoked": False,
        }
        return made.token

    @rule(step=st.floats(0, 3))
    def tick(self, step: float) -> None:
        self.now += step

    @rule(token=tokens, back=st.floats(0, 2))
    def touch(self, token: str, back: float) -> None:
        when = max(self.now - back, 0.0)
        record = self.model[token]
        got = self.store.tokens.touch(token, now=at(when))
        live = not record["revoked"] and record["expires"] > when
        assert (got is not None) == live
        if live:
            record["last_seen"] = max(record["last_seen"], when)

    @rule(token=tokens)
    def expire(self, token: str) -> None:
        record = self.model[token]
        assert self.store.tokens.expire(token, now=at(self.now)) == (not record["revoked"])
        record["revoked"] = True

    @rule(token=tokens)
    def duplicate(self, token: str) -> None:
        with pytest.raises(SessionExistsError):
            self.store.tokens.create("c", at(self.now + 1), created_at=at(self.now), id=token)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = SessionStore.open(self.directory)

    @precondition(lambda self: bool(self.model))
    @rule()
    def rebuild_equals_incremental(self) -> None:
        assert_rebuild_changes_nothing(self.store)

    @invariant()
    def agrees_with_the_model(self) -> None:
        for token, record in self.model.items():
            got = self.store.tokens.get(token, now=at(self.now))
            live = not record["revoked"] and record["expires"] > self.now
            assert (got is not None) == live
            if got is not None:
                assert got.principal == record["principal"]
                assert got.last_seen_at == _iso(record["last_seen"])

    def teardown(self) -> None:
        import shutil

        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def _iso(days: float) -> str:
    return (datetime(2026, 5, 1, tzinfo=UTC) + timedelta(days=days)).isoformat()


TestTokenMachine = TokenMachine.TestCase
