"""Session bundles v1: the envelope rules, validation failures, the published JSON Schema, import
(round trip, idempotence, conflict, atomicity) and the three Harn sample bundles."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay import (
    BundleConflictError,
    BundleError,
    export_bundle,
    import_bundle,
    validate_bundle,
)
from replay._validate import _REQUIRED, bundle_id
from sessions import (
    InvalidArgumentError,
    SessionExistsError,
    SessionStore,
    UnknownSessionError,
)
from sessions.testing import messages as message_dicts
from sessions.testing import tool_exchanges

HARN = Path(__file__).parent / "fixtures" / "harn" / "spec"
SCHEMA = json.loads((HARN / "schemas" / "session-bundle.v1.schema.json").read_text())
SAMPLES = HARN / "session-bundles" / "fixtures"
SAMPLE_NAMES = [
    "sample-local.bundle.json",
    "sample-sanitized.bundle.json",
    "sample-replay-only.bundle.json",
]
MODES = ["local", "sanitized", "replay_only"]
IMPORT_KEYS = ("imported_from", "imported_lineage")


def schema_check(bundle: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(bundle)


def sample(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SAMPLES / name).read_text())
    return data


def rich_session(store: SessionStore) -> tuple[str, str]:
    """A root session with tool calls, usage, live clients, a permission route, a scratchpad and
    a workspace, and a child forked from it; returns (root id, child id)."""
    sid = store.open_session(
        "root",
        system_prompt="Answer briefly.",
        tool_format="native",
        title="Deploy check",
        agent_id="agent-7",
        workspace_anchor={"root": "/repo", "anchored_at": "2026-05-01T00:00:00Z"},
        workspace_policy={"default_mount_mode": "read_only"},
        metadata={"provider": "mock", "tool_schemas": [{"name": "open_file"}]},
    )
    store.inject_many(
        sid,
        [
            {"role": "user", "content": "Why did it fail?"},
            {
                "role": "assistant",
                "model": "mock-1",
                "usage": {"input_tokens": 10, "output_tokens": 3, "cache_read_tokens": 2},
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {"name": "open_file", "arguments": '{"path": "deploy.log"}'},
                    },
                    {"id": "call-2", "name": "grep", "input": {"pattern": "ERR"}},
                ],
            },
            {"role": "tool", "tool_call_id": "call-1", "content": "stale config"},
            {
                "role": "assistant",
                "model": "mock-2",
                "content": "Stale config.",
                "usage": {"input_tokens": 5, "output_tokens": 7},
            },
        ],
    )
    store.add_root(sid, "/data")
    store.set_scratchpad(sid, {"plan": "check canary"})
    store.attach(sid, "tui", {"mode": "controller"})
    store.attach(sid, "web")
    store.route_permission(sid, "tui", {"request_id": "perm-1", "tool": "open_file"})
    store.heartbeat(sid, "web")
    child = store.fork_at(sid, 2, "child")
    store.inject(child, {"role": "user", "content": "And now?"})
    return sid, child


# The envelope (REPLAY.md, "Session bundle v1")


def test_the_envelope_has_every_required_field_and_its_constants(store: SessionStore) -> None:
    sid, _ = rich_session(store)
    bundle = export_bundle(store, sid)
    assert bundle["_type"] == "harn_session_bundle"
    assert bundle["schema_version"] == 1
    assert bundle["producer"]["name"] == "sessionlog"
    assert bundle["producer"]["version"] == "0.1.0"
    assert bundle["producer"]["schema_id"] == SCHEMA["$id"]
    assert bundle["redaction"]["mode"] == "sanitized"  # the default mode
    assert bundle["redaction"]["placeholder"] == "[redacted]"
    assert bundle["bundle_id"].startswith("bundle_")
    assert bundle["created_at"].endswith("Z")
    last = store.log.read_stream(sid, after=store.log.stream_version(sid) - 1)[0]
    assert bundle["created_at"] == last.recorded_at.isoformat().replace("+00:00", "Z")
    for keys, _kinds in _REQUIRED:
        node: Any = bundle
        for key in keys:
            assert key in node, keys
            node = node[key]


def test_the_section_carries_messages_events_and_metadata(store: SessionStore) -> None:
    sid, _ = rich_session(store)
    bundle = export_bundle(store, sid, "local")
    (section,) = bundle["transcript"]["sections"]
    assert (section["id"], section["scope"], section["label"]) == (
        "root",
        "session",
        "Session Deploy check",
    )
    assert section["messages"] == store.messages(sid)
    envelopes = store.log.read_stream(sid)
    assert [e["position"] for e in section["events"]] == [e.position for e in envelopes]
    assert [e["version"] for e in section["events"]] == list(range(1, len(envelopes) + 1))
    assert [e["hash"] for e in section["events"]] == [e.hash.hex() for e in envelopes]
    assert [e["type"] for e in section["events"]][:2] == ["session_opened", "messages_injected"]
    meta = section["metadata"]
    assert meta["system_prompt"] == "Answer briefly."
    assert meta["tool_format"] == "native"
    assert meta["scratchpad"] == {"plan": "check canary"}
    assert [c["client_id"] for c in meta["live_clients"]] == ["tui", "web"]


def test_the_replay_section_points_at_every_event_by_position_version_and_hash(
    store: SessionStore,
) -> None:
    sid, _ = rich_session(store)
    replay = export_bundle(store, sid, "local")["replay"]
    envelopes = store.log.read_stream(sid)
    values = [entry["value"] for entry in replay["deterministic_events"]]
    assert [(v["position"], v["version"], v["hash"]) for v in values] == [
        (e.position, e.version, e.hash.hex()) for e in envelopes
    ]
    assert [entry["index"] for entry in replay["deterministic_events"]] == list(
        range(len(envelopes))
    )
    (pointer,) = replay["event_log_pointers"]
    assert pointer["last_hash"] == envelopes[-1].hash.hex()
    assert pointer["stream_version"] == len(envelopes)
    actions = [(c["client_id"], c["action"]) for c in replay["live_client_events"]]
    assert actions == [("tui", "attached"), ("web", "attached"), ("web", "heartbeat")]


def test_tool_calls_are_paired_with_their_results(store: SessionStore) -> None:
    sid, _ = rich_session(store)
    calls = export_bundle(store, sid, "local")["tools"]["calls"]
    assert [(c["tool_name"], c["tool_use_id"], c["result"]) for c in calls] == [
        ("open_file", "call-1", "stale config"),
        ("grep", "call-2", None),
    ]
    assert calls[0]["arguments"] == '{"path": "deploy.log"}'
    assert calls[1]["arguments"] == {"pattern": "ERR"}
    assert (calls[0]["message_index"], calls[0]["result_message_index"]) == (1, 2)
    assert len(calls[0]["args_hash"]) == 64


def test_permissions_workspace_usage_and_schemas(store: SessionStore) -> None:
    sid, _ = rich_session(store)
    bundle = export_bundle(store, sid, "local")
    (route,) = bundle["permissions"]
    assert (route["kind"], route["request_id"], route["agent"]) == (
        "permission_route",
        "perm-1",
        "tui",
    )
    assert route["payload"]["request"] == {"request_id": "perm-1", "tool": "open_file"}
    workspace = bundle["workspace"]
    assert workspace["primary"] == "/repo"
    assert [r["path"] for r in workspace["additional_roots"]] == ["/data"]
    assert workspace["mount_policy"] == {"default_mount_mode": "read_only"}
    usage = bundle["runtime"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["cache_read_tokens"]) == (
        15,
        10,
        2,
    )
    assert usage["call_count"] == 2
    assert bundle["runtime"]["provider_models"] == ["mock-1", "mock-2"]
    assert bundle["tools"]["schemas"] == [
        {"source": "session.metadata.tool_schemas", "index": 0, "value": {"name": "open_file"}}
    ]


def test_lineage_of_a_fork_is_in_the_source(store: SessionStore) -> None:
    sid, child = rich_session(store)
    parent_source = export_bundle(store, sid, "local")["source"]
    child_source = export_bundle(store, child, "local")["source"]
    assert parent_source["lineage"] == {
        "parent_id": None,
        "root_id": "root",
        "branched_at_event_index": None,
        "child_ids": ["child"],
    }
    assert child_source["lineage"] == {
        "parent_id": "root",
        "root_id": "root",
        "branched_at_event_index": 2,
        "child_ids": [],
    }
    assert (child_source["parent_run_id"], child_source["root_run_id"]) == ("root", "root")
    assert parent_source["child_run_count"] == 1


def test_export_is_deterministic_and_each_mode_gets_its_own_id(store: SessionStore) -> None:
    sid, _ = rich_session(store)
    bundles = {mode: export_bundle(store, sid, mode) for mode in MODES}
    assert {mode: export_bundle(store, sid, mode) for mode in MODES} == bundles
    assert len({b["bundle_id"] for b in bundles.values()}) == 3
    store.inject(sid, {"role": "user", "content": "more"})
    assert export_bundle(store, sid, "local")["bundle_id"] != bundles["local"]["bundle_id"]


def test_local_mode_changes_nothing_and_has_no_entries(store: SessionStore) -> None:
    sid, _ = rich_session(store)
    redaction = export_bundle(store, sid, "local")["redaction"]
    assert redaction == {
        "mode": "local",
        "policy": "none",
        "placeholder": "[redacted]",
        "entries": [],
        "unsafe_secret_markers_rejected": False,
    }


def test_sanitized_and_replay_only_record_every_change(store: SessionStore) -> None:
    sid, _ = rich_session(store)
    sanitized = export_bundle(store, sid, "sanitized")
    entries = sanitized["redaction"]["entries"]
    assert {e["class"] for e in entries} == {"sensitive_field"}
    assert "$.workspace.primary" in {e["path"] for e in entries}
    assert sanitized["workspace"]["primary"] == "[redacted]"
    replay_only = export_bundle(store, sid, "replay_only")
    withheld = [e for e in replay_only["redaction"]["entries"] if e["action"] == "withheld"]
    assert "$.transcript.sections[0].messages[0].content" in {e["path"] for e in withheld}
    assert replay_only["transcript"]["sections"][0]["messages"][0]["content"] == "[withheld]"
    assert replay_only["redaction"]["unsafe_secret_markers_rejected"] is True


def test_bad_arguments_raise_typed_errors(store: SessionStore) -> None:
    sid, _ = rich_session(store)
    with pytest.raises(InvalidArgumentError, match="`mode` must be one of"):
        export_bundle(store, sid, "public")
    with pytest.raises(UnknownSessionError, match="export_bundle: no session `nope`"):
        export_bundle(store, "nope")


def test_a_past_state_exports_from_an_as_of_view(store: SessionStore) -> None:
    sid = store.open_session("then")
    store.inject(sid, {"role": "user", "content": "first"})
    head = store.log.head
    store.inject(sid, {"role": "user", "content": "second"})
    bundle = export_bundle(store.as_of(head), sid, "local")
    section = bundle["transcript"]["sections"][0]
    assert [m["content"] for m in section["messages"]] == ["first"]
    assert [e["position"] for e in section["events"]][-1] == head
    schema_check(bundle)


# Every export validates against the published schema


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("which", ["root", "child"])
def test_every_export_validates_against_the_json_schema(
    store: SessionStore, mode: str, which: str
) -> None:
    rich_session(store)
    bundle = export_bundle(store, which, mode)
    schema_check(bundle)
    assert validate_bundle(bundle) == []


def test_an_empty_session_exports_too(store: SessionStore) -> None:
    sid = store.open_session("empty")
    for mode in MODES:
        bundle = export_bundle(store, sid, mode)
        schema_check(bundle)
        assert bundle["workspace"] is None
        assert bundle["transcript"]["sections"][0]["messages"] == []


# Validation failures


@pytest.mark.parametrize("keys", [k for k, _ in _REQUIRED], ids=".".join)
def test_a_missing_required_field_is_named_by_its_path(store: SessionStore, keys: Any) -> None:
    sid, _ = rich_session(store)
    bundle = export_bundle(store, sid)
    node = bundle
    for key in keys[:-1]:
        node = node[key]
    del node[keys[-1]]
    issues = validate_bundle(bundle)
    path = "$." + ".".join(keys)
    assert [(i.path, i.code, str(i)) for i in issues] == [
        (path, "missing", f"{path}: required field is missing")
    ]


def test_a_wrong_type_name_is_refused(store: SessionStore) -> None:
    sid, _ = rich_session(store)
    bundle = export_bundle(store, sid)
    bundle["_type"] = "run_record"
    (issue,) = validate_bundle(bundle)
    assert str(issue) == "$._type: expected 'harn_session_bundle', got 'run_record'"


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (2, "expected schema version 1, got 2"),
        (0, "expected schema version 1, got 0"),
        ("1", "expected an integer, got a string"),
        (True, "expected an integer, got a boolean"),
    ],
)
def test_a_schema_version_other_than_1_is_refused(
    store: SessionStore, version: object, message: str
) -> None:
    sid, _ = rich_session(store)
    bundle = export_bundle(store, sid)
    bundle["schema_version"] = version
    assert [str(i) for i in validate_bundle(bundle)] == [f"$.schema_version: {message}"]


def test_leftover_secrets_are_refused_unless_allowed(store: SessionStore) -> None:
    sid, _ = rich_session(store)
    bundle = export_bundle(store, sid)
    bundle["transcript"]["sections"][0]["messages"][2]["content"] = "key AKIAABCDEFGHIJKLMNOP"
    bundle["bundle_id"] = bundle_id(bundle)  # as if exported so
    (issue,) = validate_bundle(bundle)
    assert str(issue) == (
        "$.transcript.sections[0].messages[2].content: looks like a secret (aws_access_key_id)"
    )
    assert validate_bundle(bundle, allow_secrets=True) == []


def test_other_shapes_are_refused_with_their_paths(store: SessionStore) -> None:
    assert [str(i) for i in validate_bundle([])] == ["$: expected an object, got an array"]
    sid, _ = rich_session(store)
    bundle = export_bundle(store, sid)
    del bundle["transcript"]["sections"][0]["events"]
    bundle["redaction"]["mode"] = "public"
    bundle["tools"]["calls"] = {}
    assert [str(i) for i in validate_bundle(bundle)] == [
        "$.tools.calls: expected an array, got an object",
        "$.transcript.sections[0].events: required field is missing",
        "$.redaction.mode: expected one of local, sanitized, replay_only, got 'public'",
    ]


# Import


def strip_import_keys(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metadata.items() if k not in IMPORT_KEYS}


@pytest.mark.parametrize("which", ["root", "child"])
def test_a_local_bundle_round_trips(tmp_path: Path, which: str) -> None:
    with SessionStore.open(tmp_path / "a") as source, SessionStore.open(tmp_path / "b") as target:
        rich_session(source)
        bundle = export_bundle(source, which, "local")
        assert import_bundle(target, bundle) == which
        before, after = source.snapshot(which), target.snapshot(which)
        assert before is not None and after is not None
        for key in ("transcript", "system_prompt", "tool_format", "title", "agent_id"):
            assert after[key] == before[key], key
        for key in ("workspace_anchor", "workspace_policy", "roots", "scratchpad"):
            assert after[key] == before[key], key
        assert strip_import_keys(after["metadata"]) == before["metadata"]
        assert after["metadata"]["imported_from"]["bundle_id"] == bundle["bundle_id"]
        again = export_bundle(target, which, "local")
        assert again["source"]["lineage"] == bundle["source"]["lineage"]
        assert (
            again["transcript"]["sections"][0]["messages"]
            == (bundle["transcript"]["sections"][0]["messages"])
        )


def test_importing_the_same_bundle_twice_writes_nothing_the_second_time(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "a") as source, SessionStore.open(tmp_path / "b") as target:
        sid, _ = rich_session(source)
        bundle = export_bundle(source, sid, "local")
        import_bundle(target, bundle)
        head = target.log.head
        assert import_bundle(target, copy.deepcopy(bundle)) == sid
        assert target.log.head == head


def test_a_different_bundle_under_the_same_id_is_a_conflict(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "a") as source, SessionStore.open(tmp_path / "b") as target:
        sid, _ = rich_session(source)
        first = export_bundle(source, sid, "local")
        import_bundle(target, first)
        source.inject(sid, {"role": "user", "content": "one more"})
        second = export_bundle(source, sid, "local")
        head = target.log.head
        with pytest.raises(BundleConflictError, match="differs in: transcript") as caught:
            import_bundle(target, second)
        assert isinstance(caught.value, SessionExistsError)
        assert target.log.head == head


def test_an_invalid_bundle_is_refused_and_writes_nothing(store: SessionStore) -> None:
    bundle = sample("sample-local.bundle.json")
    del bundle["replay"]
    head = store.log.head
    with pytest.raises(BundleError, match=r"\$\.replay: required field is missing") as caught:
        import_bundle(store, bundle)
    assert isinstance(caught.value, InvalidArgumentError)
    assert [i.path for i in caught.value.issues] == ["$.replay"]
    assert store.log.head == head


def test_a_bundle_failing_half_way_writes_nothing(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "a") as source, SessionStore.open(tmp_path / "b") as target:
        sid, _ = rich_session(source)
        bundle = export_bundle(source, sid, "local")
        messages = bundle["transcript"]["sections"][0]["messages"]
        messages[3]["files"] = [f"f{n}" for n in range(11)]  # over files_per_message_max
        bundle["bundle_id"] = bundle_id(bundle)  # as if exported so
        with pytest.raises(BundleError, match="files_per_message_max") as caught:
            import_bundle(target, bundle)
        assert [i.path for i in caught.value.issues] == ["$.transcript.sections[0].messages[3]"]
        messages[3] = {"content": "no role"}
        bundle["bundle_id"] = bundle_id(bundle)
        with pytest.raises(BundleError, match=r"messages\[3\]: expected a message object"):
            import_bundle(target, bundle)
        assert target.log.head == 0
        assert not target.exists(sid)


def test_a_sanitized_bundle_with_leftover_secrets_is_refused(store: SessionStore) -> None:
    bundle = sample("sample-sanitized.bundle.json")
    bundle["transcript"]["sections"][0]["messages"][0]["content"] = "sk-" + "L" * 30
    with pytest.raises(BundleError, match="looks like a secret"):
        import_bundle(store, bundle)
    assert import_bundle(store, bundle, allow_secrets=True) == "run_fixture_session_bundle"


@pytest.mark.parametrize("mode", ["sanitized", "replay_only"])
def test_shared_bundles_import_with_their_placeholder_text(tmp_path: Path, mode: str) -> None:
    with SessionStore.open(tmp_path / "a") as source, SessionStore.open(tmp_path / "b") as target:
        sid, _ = rich_session(source)
        import_bundle(target, export_bundle(source, sid, mode))
        snapshot = target.snapshot(sid)
        assert snapshot is not None
        assert snapshot["workspace_anchor"]["root"] == "[redacted]"
        assert [m["role"] for m in snapshot["transcript"]] == [
            m["role"] for m in source.messages(sid)
        ]
        expected = "[withheld]" if mode == "replay_only" else "Answer briefly."
        assert snapshot["system_prompt"] == expected
        assert snapshot["transcript"][0]["content"] == (
            "[withheld]" if mode == "replay_only" else "Why did it fail?"
        )


# The three Harn sample bundles


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_the_harn_samples_validate(name: str) -> None:
    bundle = sample(name)
    schema_check(bundle)
    assert validate_bundle(bundle, allow_secrets=True) == []
    found = [(issue.path, issue.code) for issue in validate_bundle(bundle)]
    if name == "sample-local.bundle.json":
        # the local sample keeps its `api_key` values, as a local bundle may
        assert found == [
            ("$.permissions[1].payload.arguments.api_key", "secret"),
            ("$.replay.run_record.transcript.events[1].arguments.api_key", "secret"),
            ("$.transcript.sections[0].events[1].arguments.api_key", "secret"),
        ]
    else:
        assert found == []


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_the_harn_samples_import(tmp_path: Path, name: str) -> None:
    bundle = sample(name)
    with SessionStore.open(tmp_path / "s") as store:
        sid = import_bundle(store, bundle)
        assert sid == "run_fixture_session_bundle"
        snapshot = store.snapshot(sid)
        assert snapshot is not None
        withheld = name == "sample-replay-only.bundle.json"
        contents = (
            ["[withheld]"] * 2
            if withheld
            else [
                "Why did the canary deploy fail?",
                "The canary health check used stale config.",
            ]
        )
        assert [(m["role"], m["content"]) for m in snapshot["transcript"]] == list(
            zip(["user", "assistant"], contents, strict=True)
        )
        assert snapshot["system_prompt"] == (
            "[withheld]" if withheld else "Use local logs and explain the deployment failure."
        )
        primary = "/workspace/example" if name == "sample-local.bundle.json" else "[redacted]"
        assert snapshot["workspace_anchor"] == {
            "root": primary,
            "anchored_at": "2026-05-01T00:00:00Z",
        }
        assert snapshot["title"] == "Session bundle fixture"
        metadata = snapshot["metadata"]
        assert metadata["tool_schemas"] == [{"name": "read_file"}]
        assert metadata["imported_from"]["source_kind"] == "run_record"
        assert metadata["imported_lineage"]["parent_id"] is None
        head = store.log.head
        assert import_bundle(store, bundle) == sid
        assert store.log.head == head
        schema_check(export_bundle(store, sid, "replay_only"))


# Generated sessions


def flatten(groups: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [message for group in groups for message in group]


transcripts = st.lists(
    st.one_of(message_dicts().map(lambda m: [m]), tool_exchanges()), max_size=6
).map(flatten)


@given(transcripts=transcripts, keep=st.none() | st.integers(0, 8))
def test_generated_sessions_export_in_every_mode_and_round_trip(
    transcripts: list[dict[str, Any]], keep: int | None
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        with SessionStore.open(base / "a", sync=False) as source:
            sid = source.open_session("gen", system_prompt="sys")
            if transcripts:
                source.inject_many(sid, transcripts)
            if keep is not None:
                sid = source.fork_at(sid, keep, "gen-child")
                source.inject(sid, {"role": "user", "content": "after the fork"})
            bundles = {mode: export_bundle(source, sid, mode) for mode in MODES}
            expected = source.messages(sid)
        for mode, bundle in bundles.items():
            schema_check(bundle)
            assert validate_bundle(bundle, allow_secrets=mode == "local") == [], mode
        with SessionStore.open(base / "b", sync=False) as target:
            assert import_bundle(target, bundles["local"]) == sid
            assert target.messages(sid) == expected
            again = export_bundle(target, sid, "local")
            assert again["source"]["lineage"] == bundles["local"]["source"]["lineage"]
            head = target.log.head
            import_bundle(target, bundles["local"])
            assert target.log.head == head


@pytest.mark.parametrize("mode", MODES)
def test_export_reports_progress_as_it_goes(mode: str) -> None:
    store = SessionStore.memory()
    try:
        sid = store.open_session("big")
        for i in range(2_500):  # one event each: pages of events to read
            store.inject(sid, {"role": "user", "content": f"note {i}"})
        events = store.log.stream_version(sid)
        calls: list[tuple[int, int]] = []
        export_bundle(store, sid, mode, progress=lambda done, total: calls.append((done, total)))
    finally:
        store.close()
    total = 2 * events + 2_500
    assert {t for _, t in calls} == {total}
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and dones[-1] == total
    # every page of events read, then (when redacting) every thousand items walked
    assert [d for d in dones if 0 < d <= events] == [1_000, 2_000, events]
    if mode != "local":
        walked = [d for d in dones if events < d < total]
        assert len(walked) >= 5, calls


# A session longer than one page of the export's reads, in every kind the bundle carries

PAST_A_PAGE = 1_050  # export reads 1,000 events a page


def long_session(store: SessionStore) -> str:
    """Over a page each of messages, tool calls, live-client events and permission routes."""
    sid = store.open_session("long", system_prompt="work")
    store.attach(sid, "tui", {"mode": "controller"})
    with store.transaction():
        for turn in range(PAST_A_PAGE):
            call = f"call-{turn}"
            store.inject(sid, {"role": "user", "content": f"step {turn}"})
            store.inject(
                sid,
                {"role": "assistant", "tool_calls": [{"id": call, "name": "grep", "args": {}}]},
            )
            store.inject(sid, {"role": "tool", "tool_call_id": call, "content": f"out {turn}"})
            store.heartbeat(sid, "tui")
            store.route_permission(sid, "tui", {"request_id": f"r-{turn}", "tool": "shell"})
    return sid


def test_a_session_longer_than_a_page_exports_and_imports_whole(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "source", sync=False) as source:
        sid = long_session(source)
        version = source.log.stream_version(sid)
        assert version > 5 * PAST_A_PAGE
        bundle = export_bundle(source, sid)
        section = bundle["transcript"]["sections"][0]
        assert section["messages"] == source.messages(sid)
        assert len(section["messages"]) == 3 * PAST_A_PAGE
        assert [e["version"] for e in section["events"]] == list(range(1, version + 1))
        positions = [e.position for e in source.log.read_stream(sid, limit=10_000)]
        assert [e["position"] for e in section["events"]] == positions
        assert len(bundle["tools"]["calls"]) == PAST_A_PAGE
        assert len(bundle["permissions"]) == PAST_A_PAGE
        replay = bundle["replay"]
        assert len(replay["deterministic_events"]) == version
        assert replay["event_log_pointers"][0]["last_position"] == positions[-1]
        assert len(replay["live_client_events"]) == PAST_A_PAGE + 1  # the attach, each heartbeat
        with SessionStore.open(tmp_path / "target", sync=False) as target:
            assert import_bundle(target, bundle) == sid
            assert target.messages(sid) == source.messages(sid)
