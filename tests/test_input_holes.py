"""Bad input at every edge gets a typed error and writes nothing: values that nest too deeply or
refer to themselves, NaN and Infinity, values that would change type on the way back (sets,
datetimes, bytes), a bundle that names another session's loop, naive times in an imported log,
and command-line numbers past any position. Each case once crashed, corrupted output or wrote
where it should not; see `test_fold_total.py` for events crafted past the edges."""

from __future__ import annotations

import base64
import json
import math
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from eventlog import NO_STREAM, IntegrityError, InvalidArgumentError, LimitExceededError, limits
from eventlog import events as ev
from eventlog._codec import BODY_START, GENESIS_HASH, HASH_START, chain_hash
from projections._runtime import load_loop
from replay import export_bundle, import_bundle, import_log
from sessions import SessionStore
from sessions._tokens import token_handle

SCRIPT = Path(sys.executable).with_name("sessionlog")


@pytest.fixture
def store(store: SessionStore) -> SessionStore:
    """The shared `store` fixture with session `s` open."""
    store.open_session("s")
    return store


def nested(depth: int) -> Any:
    """A value `depth` containers deep: dicts and lists in turn, a string inside."""
    value: Any = "leaf"
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


def refused(store: SessionStore, call: Any, error: type[Exception], match: str) -> None:
    """`call()` raises `error` matching `match`, and the log is exactly as it was."""
    head = store.log.head
    with pytest.raises(error, match=match):
        call()
    assert store.log.head == head


# One depth limit, checked at the edge


def test_the_deepest_accepted_message_exports_shows_and_imports_again(
    store: SessionStore, tmp_path: Path
) -> None:
    """A depth `inject` accepts (985 once did) must never make `export_bundle` or `show --json`
    fail: the limit leaves room for every envelope around the value."""
    depth = limits.value_depth_max - 1  # the message dict itself is the outermost level
    store.inject("s", {"role": "user", "content": "x", "payload": nested(depth)})
    assert store.messages("s")[-1]["payload"] == nested(depth)
    bundle = export_bundle(store, "s")
    json.loads(json.dumps(bundle))
    with SessionStore.open(tmp_path / "copy") as copy:
        assert import_bundle(copy, bundle) == "s"
        assert copy.messages("s")[-1]["payload"] == nested(depth)
    shown = subprocess.run(
        [SCRIPT, "--store", tmp_path / "store", "show", "s", "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    store.close()
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["transcript"][-1]["payload"] == nested(depth)


@pytest.mark.parametrize("depth", [limits.value_depth_max, 985, 1_000, 100_000])
def test_a_message_nested_past_the_limit_is_refused_with_the_limit_named(
    store: SessionStore, depth: int
) -> None:
    message = {"role": "user", "content": [nested(depth)]}
    refused(store, lambda: store.inject("s", message), LimitExceededError, "value_depth_max")


def test_a_message_that_contains_itself_is_refused(store: SessionStore) -> None:
    message: dict[str, Any] = {"role": "user", "content": "x"}
    message["self"] = message
    refused(store, lambda: store.inject("s", message), InvalidArgumentError, r"contains itself")
    block: list[Any] = []
    block.append(block)
    message = {"role": "user", "content": [block]}
    refused(store, lambda: store.inject("s", message), InvalidArgumentError, r"contains itself")


def test_the_same_depth_limit_holds_at_every_edge(store: SessionStore) -> None:
    deep = nested(limits.value_depth_max + 1)
    for call in (
        lambda: store.open_session("t", metadata={"deep": deep}),
        lambda: store.set_scratchpad("s", {"deep": deep}),
        lambda: store.tokens.create("alice", "2099-01-01T00:00:00Z", attributes={"deep": deep}),
        lambda: store.inject_many("s", [{"role": "user"}, {"role": "user", "x": deep}]),
    ):
        refused(store, call, LimitExceededError, "value_depth_max")
    shared = {"a": 1}
    store.inject("s", {"role": "user", "twice": [shared, shared]})  # shared is not circular
    assert store.messages("s")[-1]["twice"] == [{"a": 1}, {"a": 1}]


# Values that are not JSON, or would not come back as they went in


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (math.nan, "nan is not a JSON number"),
        (math.inf, "inf is not a JSON number"),
        (-math.inf, "inf is not a JSON number"),
        ({1, 2}, "a set would come back as a list"),
        (frozenset({1}), "a set would come back as a list"),
        (datetime(2026, 1, 1), "a datetime would come back as a string"),
        (datetime(2026, 1, 1, tzinfo=UTC), "a datetime would come back as a string"),
        (b"raw", "bytes would come back as a base64 string"),
        (2**64, "does not fit in 64 bits"),
        (object(), "expected JSON data"),
    ],
    ids=["nan", "inf", "-inf", "set", "frozenset", "naive", "aware", "bytes", "int", "object"],
)
def test_values_that_do_not_round_trip_are_refused_where_they_are(
    store: SessionStore, value: object, match: str
) -> None:
    places = {
        "content": {"role": "user", "content": [{"type": "text", "text": "t", "v": value}]},
        "tool_calls": {"role": "assistant", "tool_calls": [{"id": "c", "args": {"v": value}}]},
        "metadata": {"role": "user", "metadata": {"v": value}},
        "usage": {"role": "user", "usage": {"input_tokens": 1, "v": value}},
        "v": {"role": "user", "v": value},  # a field of the caller's own, kept verbatim
    }
    for place, message in places.items():
        refused(store, lambda m=message: store.inject("s", m), InvalidArgumentError, match)
        with pytest.raises(InvalidArgumentError, match=rf"inject: message\.{place}"):
            store.inject("s", message)
    refused(store, lambda: store.set_scratchpad("s", {"v": value}), InvalidArgumentError, match)
    refused(
        store,
        lambda: store.open_session("t", formation={"v": [value]}),
        InvalidArgumentError,
        match,
    )


def test_finite_floats_and_plain_json_still_round_trip(store: SessionStore) -> None:
    message = {
        "role": "tool",
        "content": [{"type": "text", "text": "ok"}],
        "metadata": {"score": 0.25, "n": -(2**63), "big": 2**64 - 1, "ok": True, "none": None},
        "pair": (1, "two"),  # a tuple comes back as a list: both are JSON arrays
    }
    store.inject("s", message)
    back = store.messages("s")[-1]
    assert back["metadata"] == message["metadata"]
    assert back["pair"] == [1, "two"]
    assert "NaN" not in json.dumps(export_bundle(store, "s"))


# Imports: a bundle touches nothing but its own session; a log brings no naive time


def loop_of(store: SessionStore, session_id: str, loop_id: str) -> Any:
    with store.log.view() as view:
        return load_loop(view, session_id, loop_id)


def test_importing_a_bundle_that_names_an_existing_loop_touches_nothing_else(
    tmp_path: Path,
) -> None:
    """A sub-agent session's `parent_spawn_ref` names a loop of the store it was exported from.
    Imported elsewhere, that loop id may belong to another session: it must not be linked."""
    spawn_ref = {"session_id": "parent", "loop_id": "loop-1", "tool_call_id": "call-9"}
    with SessionStore.open(tmp_path / "target") as target:
        target.open_session("parent", metadata={"provider": "mock"})
        target.log.append(
            "parent",
            [ev.PromptStarted(request_id="r1", loop_id="loop-1", prompt=ev.Message(role="user"))],
            expected_version=1,
        )
        before = (loop_of(target, "parent", "loop-1"), target.snapshot("parent"))
        assert before[0] is not None and before[0].child_loop_refs == []
        with SessionStore.open(tmp_path / "source") as source:
            source.open_session("child", metadata={"provider": "mock"}, parent_spawn_ref=spawn_ref)
            source.inject("child", {"role": "user", "content": "sub-task"})
            bundle = export_bundle(source, "child")
        assert import_bundle(target, bundle) == "child"
        assert (loop_of(target, "parent", "loop-1"), target.snapshot("parent")) == before
        assert target.messages("child") == [{"role": "user", "content": "sub-task"}]
        again = export_bundle(target, "child")
        section = again["transcript"]["sections"][0]["metadata"]
        assert section["parent_spawn_ref"] == spawn_ref  # the lineage is kept, not acted on


def crafted_log(path: Path, event: dict[str, Any], stream: str) -> Path:
    """A one-event log export whose record holds `event` as given (hash chain intact), as a
    tool other than ours, or an older version, could have written it."""
    encoder = msgspec.msgpack.Encoder(order="deterministic")
    recorded_at = datetime(2026, 1, 1, tzinfo=UTC)
    record = bytearray(encoder.encode([GENESIS_HASH, 1, stream, 1, recorded_at, {}, event]))
    record[HASH_START:BODY_START] = digest = chain_hash(GENESIS_HASH, record)
    header = {
        "_type": "sessionlog_log_export",
        "format_version": 1,
        "events": 1,
        "head_hash": digest.hex(),
    }
    line = {
        "position": 1,
        "stream": stream,
        "version": 1,
        "type": event["type"],
        "recorded_at": "2026-01-01T00:00:00Z",
        "meta": {},
        "data": event,
        "hash": digest.hex(),
        "record": base64.b64encode(record).decode(),
    }
    path.write_text(json.dumps(header) + "\n" + json.dumps(line) + "\n")
    return path


def test_naive_times_in_imported_bearer_events_are_refused_at_import(tmp_path: Path) -> None:
    """They once imported, and `tokens.get` then raised `TypeError` (a 500 behind the
    middleware) comparing them with the aware time of the request."""
    token = "tok_" + "Zq8w3LmP0vXc7RtY2nBk5HgJ9sDf4AeU"
    handle = token_handle(token)
    event = {
        "type": "bearer_session_created",
        "handle": handle,
        "principal": "alice",
        "created_at": "2026-01-01T00:00:00",
        "expires_at": "2099-01-01T00:00:00",
    }
    source = crafted_log(tmp_path / "log.jsonl", event, f"$bearer/{handle}")
    with SessionStore.open(tmp_path / "store") as store:
        with pytest.raises(IntegrityError, match=r"log\.jsonl:2: .*timezone"):
            import_log(store, source)
        assert store.log.head == 0
        assert store.tokens.get(token) is None
        with pytest.raises(InvalidArgumentError, match="timezone"):
            store.log.append(
                f"$bearer/{handle}",
                [
                    ev.BearerSessionCreated(
                        handle=handle,
                        principal="alice",
                        created_at=datetime(2026, 1, 1),
                        expires_at=datetime(2099, 1, 1, tzinfo=UTC),
                    )
                ],
                expected_version=NO_STREAM,
            )
        assert store.log.head == 0


# The command line: bad input is never an internal error


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [SCRIPT, *map(str, args)], capture_output=True, text=True, check=False, timeout=60
    )
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    return done


def test_tail_after_a_position_past_any_log_is_a_usage_error(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "store") as store:
        store.open_session("s")
    done = cli("--store", tmp_path / "store", "tail", "--after", "99999999999999999999999")
    assert done.returncode == 2
    assert "--after" in done.stderr and str(limits.position_max) in done.stderr
    with SessionStore.open(tmp_path / "store") as store:
        with pytest.raises(InvalidArgumentError, match="`after` must be an int from 0"):
            list(store.log.tail(after=10**23))
        with pytest.raises(InvalidArgumentError, match="`after` must be an int from 0"):
            store.log.read_stream("s", after=2**64)


def test_import_log_of_a_deeply_nested_line_is_bad_input(tmp_path: Path) -> None:
    header = {"_type": "sessionlog_log_export", "format_version": 1, "events": 1}
    header["head_hash"] = "00" * 32
    source = tmp_path / "deep.jsonl"
    source.write_text(json.dumps(header) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    done = cli("--store", tmp_path / "store", "import-log", source)
    assert done.returncode == 5, done.stderr
    assert "deep.jsonl:2: nested deeper" in done.stderr
    with SessionStore.open(tmp_path / "store") as store:
        assert store.log.head == 0
