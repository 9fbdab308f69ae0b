"""`import_bundle` refusing what it cannot import faithfully: an edited or self-contradicting
bundle, a field of the wrong type, an engine refusal (as a `BundleError` naming the bundle's path),
and a secret on an error's path. Every refusal writes nothing."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from replay import BundleError, export_bundle, import_bundle, validate_bundle
from replay._validate import bundle_id
from sessions import InvalidArgumentError, SessionStore

HARN = Path(__file__).parent / "fixtures" / "harn" / "spec" / "session-bundles" / "fixtures"
SECTION = "$.transcript.sections[0]"
TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"


def exported(mode: str = "local", **extra: Any) -> dict[str, Any]:
    """A small session's bundle, as a file would hold it (JSON through and back)."""
    with SessionStore.memory() as source:
        sid = source.open_session("s1", title="t", system_prompt="sp")
        source.inject(sid, {"role": "user", "content": "transfer $10 to bob", **extra})
        source.inject(sid, {"role": "assistant", "content": "done"})
        source.set_scratchpad(sid, {"a": 1})
        bundle = export_bundle(source, sid, mode)
    loaded: dict[str, Any] = json.loads(json.dumps(bundle))
    return loaded


def signed(bundle: dict[str, Any]) -> dict[str, Any]:
    """`bundle` with the id export would give its content: as if exported so."""
    bundle["bundle_id"] = bundle_id(bundle)
    return bundle


def refused(bundle: dict[str, Any], **options: Any) -> BundleError:
    """The `BundleError` importing `bundle` raises, after checking it wrote nothing."""
    with SessionStore.memory() as store:
        with pytest.raises(BundleError) as caught:
            import_bundle(store, bundle, **options)
        assert store.log.head == 0
        assert store.list_sessions()["sessions"] == []
    return caught.value


def section(bundle: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = bundle["transcript"]["sections"][0]
    return found


# An edited or self-contradicting bundle


def test_a_bundle_edited_after_export_is_refused_by_its_id() -> None:
    bundle = exported()
    section(bundle)["messages"][0]["content"] = "transfer $10000 to mallory"
    error = refused(bundle)
    assert [issue.path for issue in error.issues] == ["$.bundle_id"]
    assert "does not match the bundle's content" in str(error)
    with SessionStore.memory() as store:  # the bundle as exported imports
        assert import_bundle(store, signed(bundle)) == "s1"


def test_a_bundle_exported_before_the_digest_changed_spelling_still_imports() -> None:
    # Until 2026-11-25 the id digested JSON written by the standard library, which spells small
    # and large floats otherwise: such a bundle was not edited, and is not refused as edited.
    bundle = exported(metadata={"temperature": 1e-07, "budget": 1e22})
    content = json.dumps(
        {**bundle, "bundle_id": ""}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    bundle["bundle_id"] = f"bundle_{hashlib.sha256(content.encode()).hexdigest()[:32]}"
    assert bundle["bundle_id"] != bundle_id(bundle)
    assert validate_bundle(bundle) == []
    with SessionStore.memory() as store:
        assert import_bundle(store, bundle) == "s1"
    section(bundle)["messages"][0]["content"] = "transfer $10000 to mallory"
    assert [issue.path for issue in refused(bundle).issues] == ["$.bundle_id"]


@pytest.mark.parametrize("mode", ["local", "sanitized", "replay_only"])
def test_validate_reports_a_bundle_edited_after_export(mode: str) -> None:
    """`validate_bundle` checks the digest `import_bundle` checks: an edited bundle of ours is
    not reported valid, an unedited one is, and the issue is the one import refuses with."""
    bundle = exported(mode)
    assert validate_bundle(bundle) == []
    section(bundle)["messages"][1]["role"] = "user"  # an answer made the user's words
    issues = validate_bundle(bundle)
    assert [(issue.path, issue.code) for issue in issues] == [("$.bundle_id", "digest")]
    assert str(issues[0]).startswith("$.bundle_id: does not match the bundle's content")
    assert f"got {bundle['bundle_id']!r}" in str(issues[0])
    assert refused(bundle).issues == issues
    assert validate_bundle(signed(bundle)) == []


def test_validate_names_a_value_json_cannot_carry() -> None:
    bundle = exported()
    section(bundle)["metadata"]["metadata"] = {"when": 1j}
    assert [(i.path, i.code) for i in validate_bundle(bundle)] == [("$", "digest")]


def test_session_ids_that_disagree_are_refused_naming_each_path() -> None:
    bundle = exported()
    bundle["source"]["session_id"] = "other-id"
    section(bundle)["id"] = "third-id"
    error = refused(signed(bundle))
    assert {issue.path for issue in error.issues} == {
        "$.source.run_record_id",
        "$.source.session_id",
        f"{SECTION}.metadata.session_id",
        f"{SECTION}.id",
    }


def test_a_bundle_of_another_producer_needs_no_id_of_ours() -> None:
    bundle = json.loads((HARN / "sample-local.bundle.json").read_text())
    bundle["transcript"]["sections"][0]["messages"][0]["content"] = "edited"
    with SessionStore.memory() as store:
        assert import_bundle(store, bundle) == "run_fixture_session_bundle"


def test_a_bundle_with_no_section_is_refused() -> None:
    bundle = exported()
    bundle["transcript"]["sections"] = []
    error = refused(signed(bundle))
    assert [issue.path for issue in error.issues] == ["$.transcript.sections"]


# Engine refusals as BundleErrors naming the bundle


def test_a_replay_only_summary_message_is_refused_as_a_bundle_error() -> None:
    bundle = exported("replay_only", summary=True)
    # Exports before the redaction fixes withheld the summary flag as text; such a bundle,
    # signed, must be refused as a bundle error at its message, not as the engine's error.
    assert section(bundle)["messages"][0]["summary"] is True
    section(bundle)["messages"][0]["summary"] = "[withheld]"
    error = refused(signed(bundle))
    assert [issue.path for issue in error.issues] == [f"{SECTION}.messages[0]"]
    assert str(error).startswith(f"import_bundle: {SECTION}.messages[0]: ")
    assert "inject_many" not in str(error)
    assert isinstance(error.__cause__, InvalidArgumentError)
    assert not isinstance(error.__cause__, BundleError)


def _set(path: tuple[Any, ...], value: object) -> Callable[[dict[str, Any]], None]:
    def mutate(bundle: dict[str, Any]) -> None:
        node: Any = section(bundle)
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "path", "words"),
    [
        (_set(("messages", 1, "files"), [{"path": "a"}] * 11), "messages[1]", "files_per_message"),
        (_set(("messages", 0, "metadata"), {"n": float("nan")}), "messages[0]", "not a JSON"),
        (_set(("metadata", "scratchpad"), {"a": "x" * 70_000}), "metadata.scratchpad", "bytes"),
        (
            _set(("metadata", "workspace_policy"), {"default_mount_mode": 5}),
            "metadata.workspace_policy",
            "default_mount_mode",
        ),
    ],
    ids=["files", "nan", "scratchpad", "policy"],
)
def test_engine_refusals_name_the_bundle_path(
    mutate: Callable[[dict[str, Any]], None], path: str, words: str
) -> None:
    bundle = exported()
    mutate(bundle)
    error = refused(signed(bundle))
    assert [issue.path for issue in error.issues] == [f"{SECTION}.{path}"]
    assert words in str(error)
    assert isinstance(error.__cause__, InvalidArgumentError)


def test_a_foreign_producers_unencodable_tool_schema_names_its_path() -> None:
    bundle = json.loads((HARN / "sample-local.bundle.json").read_text())
    bundle["tools"]["schemas"] = [{"value": {"a": float("inf")}}]
    error = refused(bundle)
    assert [issue.path for issue in error.issues] == ["$.tools.schemas"]


# A lone surrogate in a dict key


def test_inject_many_refuses_a_lone_surrogate_key_naming_the_message() -> None:
    with SessionStore.memory() as store:
        store.open_session("x")
        bad = {"role": "user", "content": "c", "metadata": {"\udc80": 1}}
        with pytest.raises(InvalidArgumentError, match=r"inject_many: messages\[1\]") as caught:
            store.inject_many("x", [{"role": "user", "content": "fine"}, bad])
        assert caught.value.index == 1
        assert store.messages("x") == []


def test_a_lone_surrogate_key_in_a_bundle_is_a_bundle_error() -> None:
    bundle = json.loads((HARN / "sample-local.bundle.json").read_text())
    bundle["transcript"]["sections"][0]["messages"][0]["metadata"] = {"\udc80": 1}
    error = refused(bundle)
    assert [issue.path for issue in error.issues] == [f"{SECTION}.messages[0]"]
    ours = exported()  # ours cannot even be digested: refused before anything is read
    section(ours)["messages"][0]["metadata"] = {"\udc80": 1}
    assert [issue.path for issue in refused(ours).issues] == ["$"]


# Lineage


@pytest.mark.parametrize(
    ("key", "value", "path"),
    [
        ("child_ids", 5, "child_ids"),
        ("child_ids", "abc", "child_ids"),
        ("child_ids", ["a", 7], "child_ids[1]"),
        ("parent_id", 3, "parent_id"),
        ("root_id", ["r"], "root_id"),
        ("branched_at_event_index", "2", "branched_at_event_index"),
        ("branched_at_event_index", -1, "branched_at_event_index"),
    ],
)
def test_lineage_of_a_wrong_type_is_refused(key: str, value: object, path: str) -> None:
    bundle = exported()
    bundle["source"]["lineage"][key] = value
    error = refused(signed(bundle))
    assert [issue.path for issue in error.issues] == [f"$.source.lineage.{path}"]
    bundle["source"]["lineage"] = "root"
    assert [i.path for i in refused(signed(bundle)).issues] == ["$.source.lineage"]


def test_export_leaves_out_imported_lineage_of_a_wrong_type() -> None:
    junk = {"parent_id": 5, "root_id": [], "branched_at_event_index": "x", "child_ids": "abc"}
    with SessionStore.memory() as store:
        store.open_session("s1", metadata={"imported_lineage": junk})
        lineage = export_bundle(store, "s1", "local")["source"]["lineage"]
    assert lineage == {
        "parent_id": None,
        "root_id": "s1",
        "branched_at_event_index": None,
        "child_ids": [],
    }


# Secrets on an error's path


def test_a_secret_in_a_key_stays_out_of_the_error() -> None:
    bundle = exported("sanitized")
    section(bundle)["messages"][1]["metadata"] = {TOKEN: True}
    error = refused(bundle)
    assert TOKEN not in str(error)
    assert TOKEN[:12] not in str(error)
    (issue,) = error.issues
    assert issue.path == f'{SECTION}.messages[1].metadata["<redacted:github_token:40>"]'
    assert all(TOKEN not in i.path for i in validate_bundle(bundle))


# Wrong types are refused, not dropped or defaulted


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("metadata", [1, 2], "expected an object or null, got an array"),
        ("system_prompt", 5, "expected a string or null, got an integer"),
        ("formation", "x", "expected an object or null, got a string"),
        ("parent_spawn_ref", "x", "expected an object or null, got a string"),
        ("scope", "weird", "expected persistent or ephemeral, got 'weird'"),
        ("roots", {"root": "/x"}, "expected an array or null, got an object"),
    ],
)
def test_session_fields_of_a_wrong_type_are_refused(key: str, value: object, message: str) -> None:
    bundle = exported()
    section(bundle)["metadata"][key] = value
    error = refused(signed(bundle))
    assert [str(issue) for issue in error.issues] == [f"{SECTION}.metadata.{key}: {message}"]


def test_a_malformed_workspace_anchor_is_refused() -> None:
    bundle = exported()
    section(bundle)["metadata"]["workspace_anchor"] = {"root": 5}
    error = refused(signed(bundle))
    assert [issue.path for issue in error.issues] == [f"{SECTION}.metadata.workspace_anchor.root"]


@pytest.mark.parametrize("count", [-1, "3", 1.5, None])
def test_a_usage_count_that_is_no_count_is_refused(count: object) -> None:
    bundle = exported()
    section(bundle)["messages"][0]["usage"] = {"input_tokens": count}
    error = refused(signed(bundle))
    assert [issue.path for issue in error.issues] == [f"{SECTION}.messages[0].usage.input_tokens"]


def test_placeholders_of_a_shared_bundle_still_import() -> None:
    bundle = exported("sanitized")
    section(bundle)["metadata"]["scratchpad"] = "[withheld]"  # a value withheld whole
    with SessionStore.memory() as store:
        assert import_bundle(store, signed(bundle)) == "s1"


# Types inside `item`


def test_a_local_bundle_keeps_bytes_and_datetimes_inside_an_item() -> None:
    item = {
        "audio": b"\x00\x01RIFF",
        "at": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        "list": [b"x", {"deep": b"y"}],
        "~key": "a real key that starts with the marker",
        "text": "plain",
    }
    with SessionStore.memory() as source, SessionStore.memory() as target:
        source.open_session("s1")
        source.inject("s1", {"role": "item", "item": copy.deepcopy(item)})
        bundle = json.loads(json.dumps(export_bundle(source, "s1", "local")))
        import_bundle(target, bundle)
        assert target.messages("s1") == source.messages("s1")
        (entry,) = target.messages("s1")
        assert entry["item"] == item
        assert isinstance(entry["item"]["audio"], bytes)
        assert isinstance(entry["item"]["at"], datetime)
