"""Redaction of session bundles: each class of the manifest, the Harn renderings reproduced from the
local sample, and secrets or prompt text planted in every corner of a session never leaving it."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from replay import export_bundle, import_bundle, validate_bundle
from replay._redact import (
    PAYLOAD_KEYS,
    REDACTED,
    WITHHELD,
    find_secrets,
    redact,
    scrub_string,
)
from replay._secret_names import credential_name
from sessions import SessionStore

SAMPLES = Path(__file__).parent / "fixtures" / "harn" / "spec" / "session-bundles" / "fixtures"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SAMPLES / name).read_text())
    return data


def body_of(bundle: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in bundle.items() if k != "redaction"}


def entries_of(entries: list[Any]) -> list[dict[str, str]]:
    return [entry.as_dict() for entry in entries]


# The sensitive_field class


@pytest.mark.parametrize(
    "key",
    [
        "api_key",
        "API_KEY",
        "Authorization",
        "cookie",
        "set-cookie",
        "token",
        "access_token",
        "github_token",
        "password",
        "db_password",
        "client_secret",
        "private_key",
        "openai_api_key",
        "cwd",
        "project_root",
        "workspace_root",
        "home",
        "home_dir",
        "primary",
        "persisted_path",
        "root",
    ],
)
def test_sensitive_field_names_are_replaced_with_a_manifest_entry(key: str) -> None:
    out, entries = redact({"outer": {key: "value-1", "keep": "plain"}}, "sanitized")
    assert out["outer"] == {key: REDACTED, "keep": "plain"}
    path = f"$.outer.{key}" if key.replace("_", "").isalnum() else f'$.outer["{key}"]'
    assert entries_of(entries) == [
        {"path": path, "class": "sensitive_field", "action": "replaced", "replacement": REDACTED}
    ]


def test_a_sensitive_field_holding_an_object_is_replaced_whole_and_null_is_left_alone() -> None:
    out, entries = redact({"credentials": {"user": "u", "pw": "p"}, "secret": None}, "sanitized")
    assert out == {"credentials": REDACTED, "secret": None}
    assert [e.path for e in entries] == ["$.credentials"]


def test_paths_are_local_only_inside_files_and_roots() -> None:
    data = {
        "files": [{"path": "notes.txt", "name": "n"}],
        "workspace": {"additional_roots": [{"path": "/srv/data", "mount_mode": "read_only"}]},
        "tool_args": {"path": "src/main.py"},
    }
    out, entries = redact(data, "sanitized")
    assert out["files"][0] == {"path": REDACTED, "name": "n"}
    assert out["workspace"]["additional_roots"][0]["path"] == REDACTED
    assert out["tool_args"] == {"path": "src/main.py"}
    assert [e.path for e in entries] == [
        "$.files[0].path",
        "$.workspace.additional_roots[0].path",
    ]


def test_odd_keys_get_quoted_jsonpath_segments() -> None:
    _, entries = redact({"my headers": {"x-api-key": "k"}}, "sanitized")
    assert [e.path for e in entries] == ['$["my headers"]["x-api-key"]']


# The secret_pattern_or_url class

PLANTS = {
    "openai_api_key": "sk-proj-" + "A1b2C3d4" * 4,
    "anthropic_api_key": "sk-ant-api03-" + "Zz9_" * 6,
    "aws_access_key_id": "AKIA" + "ABCDEFGHIJKLMNOP",
    "github_token": "ghp_" + "a1B2" * 9,
    "slack_token": "xoxb-1234567890-abcdefghij",
    "stripe_key": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N",
    "bearer_token": "Bearer abc.def-ghi_jkl~mno",
    "credential_assignment": "password=hunter2!",
    "private_key_block": "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
    "home_directory": "/home/alice",
    "url_with_credentials": "https://bob:s3cret@db.example.com/x",
}


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_secret_patterns_become_named_placeholders_inside_longer_text(name: str) -> None:
    secret = PLANTS[name]
    text = f"before {secret} after"
    out, entries = redact({"note": text}, "sanitized")
    placeholder = f"<redacted:{name}:{len(secret.encode())}>"
    assert out["note"] == f"before {placeholder} after"
    assert secret not in json.dumps(out)
    assert entries_of(entries) == [
        {
            "path": "$.note",
            "class": "secret_pattern_or_url",
            "action": "replaced",
            "replacement": placeholder,
        }
    ]
    assert find_secrets({"note": text}) == [("$.note", [name])]
    assert find_secrets(out) == []


def test_home_directories_keep_the_rest_of_the_path() -> None:
    out, _ = scrub_string("open /Users/carol/project/main.py now")
    assert out == "open <redacted:home_directory:12>/project/main.py now"


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/docs?page=2",
        "https://harnlang.com/schemas/session-bundle.v1.json",
        "http://localhost:8080/",
    ],
)
def test_plain_urls_are_kept(url: str) -> None:
    out, entries = redact({"link": f"see {url}"}, "sanitized")
    assert out == {"link": f"see {url}"}
    assert entries == []


def test_urls_with_secret_query_parameters_are_replaced() -> None:
    url = "https://api.example.com/v1?api_key=abc123&x=1"
    out, entries = redact({"link": url}, "sanitized")
    assert out == {"link": f"<redacted:url_with_credentials:{len(url)}>"}
    assert [e.cls for e in entries] == ["secret_pattern_or_url"]


def test_the_manifest_names_placeholders_not_the_text_around_them() -> None:
    text = "the MARKER-WORD prompt carries sk-" + "x" * 24
    _, entries = redact({"content": text}, "replay_only")
    assert "MARKER-WORD" not in json.dumps(entries_of(entries))
    assert {e.cls for e in entries} == {"secret_pattern_or_url", "prompt_or_tool_payload"}


def test_redaction_is_deterministic_idempotent_and_leaves_its_input_alone() -> None:
    data = {"a": [{"token": "t"}, "key sk-" + "q" * 30], "b": {"content": "x"}}
    snapshot = json.dumps(data)
    first = redact(data, "replay_only")
    assert redact(data, "replay_only") == first
    assert json.dumps(data) == snapshot
    again, entries = redact(first[0], "sanitized")
    assert again == first[0]
    assert entries == []


def test_local_changes_nothing() -> None:
    data = {"api_key": "sk-" + "z" * 30, "content": "hi"}
    assert redact(data, "local") == (data, [])


# The prompt_or_tool_payload class


@pytest.mark.parametrize("key", sorted(PAYLOAD_KEYS))
def test_replay_only_withholds_each_payload_key(key: str) -> None:
    out, entries = redact({"x": {key: {"deep": "words"}, "role": "user"}}, "replay_only")
    assert out == {"x": {key: WITHHELD, "role": "user"}}
    assert entries_of(entries) == [
        {
            "path": f"$.x.{key}",
            "class": "prompt_or_tool_payload",
            "action": "withheld",
            "replacement": WITHHELD,
        }
    ]


def test_replay_only_leaves_null_payloads_and_keeps_earlier_sanitized_entries() -> None:
    out, entries = redact({"summary": None, "arguments": {"api_key": "k"}}, "replay_only")
    assert out == {"summary": None, "arguments": WITHHELD}
    assert [(e.path, e.cls) for e in entries] == [
        ("$.arguments", "prompt_or_tool_payload"),
        ("$.arguments.api_key", "sensitive_field"),
    ]


# The Harn renderings, reproduced from the local sample


@pytest.mark.parametrize(
    ("mode", "name"),
    [
        ("sanitized", "sample-sanitized.bundle.json"),
        ("replay_only", "sample-replay-only.bundle.json"),
    ],
)
def test_redacting_the_local_sample_reproduces_the_harn_rendering(mode: str, name: str) -> None:
    local, expected = load("sample-local.bundle.json"), load(name)
    out, entries = redact(body_of(local), mode)
    assert out == body_of(expected)
    assert entries_of(entries) == expected["redaction"]["entries"]


# Secrets and prompt text planted in a session

SECRETS = {
    "content_key": "sk-" + "C0ntentKey" * 3,
    "tool_arg_token": "ghp_" + "T00lArg" * 6,
    "metadata_key": "metadata-plain-value-41",
    "bearer": "Bearer eyBearerTokenValue0123456789",
    "aws": "AKIAPLANTEDKEY123456",
    "password": "hunter2-in-scratchpad",
    "anchor": "/home/dana/private-project",
    "root": "/srv/mounted/secret-root",
    "route_token": "route-token-plain-value-77",
    "file_path": "/home/dana/notes/secret.txt",
    "url": "https://dana:pw-in-url@git.example.com/repo.git",
}
MARKERS = [f"MARKER{n:02d}" for n in range(10)]


def planted_session(store: SessionStore) -> str:
    sid = store.open_session(
        "planted",
        system_prompt=f"You are careful {MARKERS[0]}",
        workspace_anchor={"root": SECRETS["anchor"], "cwd": SECRETS["anchor"] + "/src"},
        metadata={"api_key": SECRETS["metadata_key"], "note": f"clone {SECRETS['url']}"},
    )
    store.inject(
        sid,
        {
            "role": "user",
            "content": f"{MARKERS[1]} use {SECRETS['content_key']} with {SECRETS['bearer']}",
            "files": [{"path": SECRETS["file_path"]}],
        },
    )
    arguments = json.dumps({"cmd": MARKERS[2], "auth": SECRETS["tool_arg_token"]})
    store.inject(
        sid,
        {
            "role": "assistant",
            "content": [{"type": "text", "text": MARKERS[3]}],
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "sh", "arguments": arguments},
                },
                {"id": "c2", "name": "read", "input": {"file": MARKERS[4], "key": SECRETS["aws"]}},
            ],
        },
    )
    store.inject(sid, {"role": "tool", "tool_call_id": "c1", "content": f"out {MARKERS[5]}"})
    store.inject(sid, {"role": "tool", "tool_call_id": "c2", "content": f"read {MARKERS[6]}"})
    store.set_scratchpad(sid, {"plan": f"password: {SECRETS['password']}", "step": MARKERS[7]})
    store.add_root(sid, SECRETS["root"])
    store.attach(sid, "tui", {"mode": "controller"})
    request = {"request_id": "r1", "tool": "sh", "arguments": {"token": SECRETS["route_token"]}}
    request["prompt"] = f"Allow {MARKERS[8]}?"
    store.route_permission(sid, "tui", request)
    store.client_inject_prompt(sid, "tui", f"go on {MARKERS[9]}")
    return sid


@pytest.mark.parametrize("mode", ["sanitized", "replay_only"])
def test_planted_secrets_never_reach_a_shared_bundle(tmp_path: Path, mode: str) -> None:
    with SessionStore.open(tmp_path / "s") as store:
        sid = planted_session(store)
        local = json.dumps(export_bundle(store, sid, "local"))
        bundle = export_bundle(store, sid, mode)
    text = json.dumps(bundle)
    for name, secret in SECRETS.items():
        assert secret in local, name  # the plant is really there to be found
        assert secret not in text, name
    assert validate_bundle(bundle) == []
    assert validate_bundle(json.loads(local)) != []


def test_replay_only_carries_no_prompt_or_tool_payload_text(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "s") as store:
        sid = planted_session(store)
        local = json.dumps(export_bundle(store, sid, "local"))
        sanitized = json.dumps(export_bundle(store, sid, "sanitized"))
        replay_only = export_bundle(store, sid, "replay_only")
    text = json.dumps(replay_only)
    for marker in MARKERS:
        assert marker in local and marker in sanitized, marker
        assert marker not in text, marker
    # what replay needs is still there: roles, tool names, ids, event types and hashes
    section = replay_only["transcript"]["sections"][0]
    assert [m["role"] for m in section["messages"]] == ["user", "assistant", "tool", "tool", "user"]
    assert [c["tool_name"] for c in replay_only["tools"]["calls"]] == ["sh", "read"]
    assert all(len(e["hash"]) == 64 for e in section["events"])


# Names decided by a rule, and what stays


def test_env_and_header_dicts_are_judged_by_their_names() -> None:
    data = {
        "env": {"AWS_SECRET_ACCESS_KEY": "plain-value-1", "PATH": "/usr/bin", "PGPASSWORD": "pw"},
        "headers": {"X-Goog-Api-Key": "plain-value-2", "Accept": "application/json"},
        "usage": {"input_tokens": 12, "max_tokens": 100},
    }
    assert [path for path, _ in find_secrets(data)] == [
        "$.env.AWS_SECRET_ACCESS_KEY",
        "$.env.PGPASSWORD",
        '$.headers["X-Goog-Api-Key"]',
    ]
    out, entries = redact(data, "sanitized")
    assert out["env"] == {
        "AWS_SECRET_ACCESS_KEY": REDACTED,
        "PATH": "/usr/bin",
        "PGPASSWORD": REDACTED,
    }
    assert out["headers"] == {"X-Goog-Api-Key": REDACTED, "Accept": "application/json"}
    assert out["usage"] == data["usage"]
    assert len(entries) == 3
    assert find_secrets(out) == []


@pytest.mark.parametrize(
    "text",
    [
        "The session token expires after an hour; ask the user for a new key.",
        "def get_token(self) -> str:\n    return self._token",
        "token = getpass()\nkey = os.environ.get('API_KEY')",
        "token_count = 5; max_tokens: 1000; sort_key=created_at",
        "2026-11-25T14:05:22.123456Z 0b3f9c1e-6a2d-4f5e-9c8b-7a6d5e4f3c2b",
        "sha256 " + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "git@github.com:example/repo.git and bob@example.com",
        "see src/replay/_redact.py:120 and tests/test_replay_redaction.py::test_x",
        "https://example.com/search?q=session+token&page=2",
        "CamelCaseIdentifierWithoutDigits and snake_case_identifier_that_is_long_enough",
        "meet at 12:30@home, ratio 3:4",
        "A basic example of bearer authentication, with Basic understanding.",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    out, entries = redact({"note": text}, "sanitized")
    assert out == {"note": text}
    assert entries == []


def test_every_credential_word_holds_a_hint() -> None:
    # assignments in text are looked for only where a hint occurs: a word or stem of the name
    # rule without one would never be found in `NAME=value`
    from replay import _secret_assignments, _secret_names

    words = set(_secret_names._NAME_WORDS) | set(_secret_names._NAME_STEMS)
    assert [w for w in sorted(words) if not any(h in w for h in _secret_assignments._HINTS)] == []
    for word in sorted(words):
        text = f"export {word.upper()}=v4lue-{word}"
        found = find_secrets({"line": text})
        assert len(found) == 1 and found[0][0] == "$.line", word
        assert scrub_string(text)[0] == "export " + scrub_string(text)[1][0], word


# Fixes from the redaction review: each test names the defect it guards.

KEY = "sk-ant-api03-" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"


def test_a_secret_in_bytes_that_are_not_utf8_is_replaced_whole(tmp_path: Path) -> None:
    # a protobuf-framed body: field 1, a two-byte varint length (not UTF-8), then the key
    blob = b"\x0a\x8c\x01" + KEY.encode()
    with SessionStore.open(tmp_path / "s") as store:
        sid = store.open_session("s")
        store.inject(sid, {"role": "item", "item": {"request_body": blob}})
        bundle = export_bundle(store, sid, "sanitized")
    text = json.dumps(bundle)
    # Bytes inside an item travel marked as {"~bytes": base64}; the base64 is what is scanned
    # (decoded), and it is replaced whole.
    (placeholder,) = bundle["transcript"]["sections"][0]["messages"][0]["item"][
        "request_body"
    ].values()
    assert placeholder.startswith("<redacted:") and "anthropic_api_key" in placeholder
    assert KEY not in text and base64.b64encode(blob).decode() not in text
    assert any(
        entry["path"].startswith("$.transcript.sections[0].messages[0].item.request_body")
        and (entry["action"], entry["replacement"]) == ("replaced", placeholder)
        for entry in bundle["redaction"]["entries"]
    )
    # A bytes value outside an item (the walk's own) is replaced whole as well.
    from replay._redact import redact

    walked, entries = redact({"blob": blob}, "sanitized")
    assert walked == {"blob": f"<redacted:anthropic_api_key:{len(blob)}>"} and entries


@pytest.mark.parametrize("mode", ["sanitized", "replay_only"])
def test_args_hash_is_of_the_exported_arguments(tmp_path: Path, mode: str) -> None:
    def digest(value: Any) -> str:
        canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    original = json.dumps({"user": "admin", "password": "Summer2024!"})
    with SessionStore.open(tmp_path / "s") as store:
        sid = store.open_session("s")
        calls = [
            {"id": f"c{i}", "function": {"name": "login", "arguments": original}} for i in (1, 2)
        ]
        store.inject(sid, {"role": "assistant", "content": "", "tool_calls": calls})
        bundle = export_bundle(store, sid, mode)
    first, second = bundle["tools"]["calls"]
    assert first["args_hash"] == second["args_hash"] == digest(first["arguments"])
    assert digest(original) not in json.dumps(bundle)  # no offline check of a guessed password
    assert "Summer2024!" not in json.dumps(bundle)
    if mode == "sanitized":  # the redacted arguments are still JSON, the name kept
        assert json.loads(first["arguments"]) == {
            "user": "admin",
            "password": "<redacted:credential_assignment:11>",
        }


@pytest.mark.parametrize(
    "name",
    [
        "server.ssl.key-store-password",
        "-Djavax.net.ssl.trustStorePassword",
        "storePassword",
        "DB_PRIMARY_PASSWORD",
        "CACHE_PASSWORD",
        "primaryKey",
        "secondaryKey",
        "join_token",
        "provider_api_key",
        "key1",
        "AWS_SECRET_ACCESS_KEY",
        "X-Goog-Api-Key",
    ],
)
def test_a_qualifier_before_a_strong_credential_word_does_not_veto(name: str) -> None:
    assert credential_name(name.strip("-"))
    text = f"{name}=Xk29vLmQ7pz"
    assert "Xk29vLmQ7pz" not in scrub_string(text)[0]
    out, entries = redact({"cfg": {name: "Xk29vLmQ7pz"}}, "sanitized")
    assert out == {"cfg": {name: REDACTED}} and len(entries) == 1


@pytest.mark.parametrize(
    "name",
    [
        "input_tokens",
        "max_tokens",
        "max_token",
        "token_count",
        "token_type",
        "public_key",
        "publicKey",
        "key_path",
        "sort_key",
        "cache_key",
        "join_key",
        "idempotency_key",
        "partition_key",
        "cookie_name",
        "secret_name",
        "api_key_env",
        "client_secret_expires_at",
        "password_min_length",
        "auth_method",
        "session_id",
        "keyboard",
    ],
)
def test_a_qualifier_after_a_credential_word_or_before_a_weak_one_still_vetoes(name: str) -> None:
    assert not credential_name(name)


def test_name_value_pairs_are_judged_by_their_name() -> None:
    data = {
        "env": [
            {"name": "DB_PASSWORD", "value": "q7Xk29vLmPz4Rt8w"},
            {"name": "MODE", "value": "production"},
        ],
        "headers": [{"Name": "X-Api-Key", "Value": "abcd1234efgh5678ijkl"}],
    }
    out, entries = redact(data, "sanitized")
    assert out["env"] == [
        {"name": "DB_PASSWORD", "value": REDACTED},
        {"name": "MODE", "value": "production"},
    ]
    assert out["headers"] == [{"Name": "X-Api-Key", "Value": REDACTED}]
    assert [(e.path, e.cls) for e in entries] == [
        ("$.env[0].value", "sensitive_field"),
        ("$.headers[0].Value", "sensitive_field"),
    ]
    assert [path for path, _ in find_secrets(data)] == ["$.env[0].value", "$.headers[0].Value"]
    assert find_secrets(out) == []
    # the same pairs inside a text: a JSON tool argument, a YAML manifest
    manifest = json.dumps({"env": data["env"]})
    yaml = (
        "env:\n  - name: DB_PASSWORD\n    value: my dog has fleas\n  - name: MODE\n    value: prod"
    )
    for text in (manifest, yaml):
        scrubbed, used = scrub_string(text)
        assert "q7Xk29vLmPz4Rt8w" not in scrubbed and "fleas" not in scrubbed, text
        assert "production" in scrubbed or "prod" in scrubbed
        assert len(used) == 1
    assert json.loads(scrub_string(manifest)[0])["env"][0]["name"] == "DB_PASSWORD"


@pytest.mark.parametrize(
    ("text", "gone", "kept"),
    [
        (
            "Server=tcp:db,1433;User ID=sa;Password=correct horse battery staple;Encrypt=True",
            "correct horse battery staple",
            ["Server=tcp:db,1433;User ID=sa;", ";Encrypt=True"],
        ),
        (
            "smtp:\n  password: my dog has fleas 42\n  port: 25",
            "my dog has fleas 42",
            ["smtp:\n  ", "\n  port: 25"],
        ),
        ("export DB_PASSWORD=two words", "two words", ["export "]),
        ("password=ab", "ab", []),
        ("before password=hunter2! after", "hunter2!", ["before ", " after"]),
    ],
)
def test_a_strong_names_value_runs_to_the_end_of_its_line(
    text: str, gone: str, kept: list[str]
) -> None:
    out, used = scrub_string(text)
    assert len(used) == 1 and gone not in out, out
    assert all(part in out for part in kept), out


@pytest.mark.parametrize(
    "text",
    [
        "password: str = ''",
        "password = getpass()  # asked once",
        "secret_key: Optional[str] = None",
        "Enter the token: ok",
    ],
)
def test_code_after_a_strong_name_is_still_left_alone(text: str) -> None:
    assert scrub_string(text) == (text, [])


def test_finding_assignments_reads_each_name_once() -> None:
    # `pw_` repeated: one name holding thousands of hints; each used to be read again from
    # every hint, quadratic in the name's length (seconds for 40k characters, hours for 4 MB)
    from replay import _secret_assignments

    reads = 0
    original = _secret_assignments._ident_end

    def counting(text: str, at: int) -> int:
        nonlocal reads
        reads += 1
        return original(text, at)

    text = "pw_" * 10_000 + " and password=x1 here"
    try:
        _secret_assignments._ident_end = counting  # type: ignore[assignment]
        found = list(_secret_assignments.assignments(text, text.lower()))
    finally:
        _secret_assignments._ident_end = original  # type: ignore[assignment]
    assert reads <= 4  # two runs of name characters, each read forwards and backwards once
    assert found == [(len(text) - len("password=x1 here"), len(text) - len(" here"))]


def test_a_token_cut_across_adjacent_text_blocks_is_replaced() -> None:
    blocks = [
        {"type": "text", "text": "your key is " + KEY[:10]},
        {"type": "text", "text": KEY[10:] + " keep it safe"},
        {"type": "text", "text": "unrelated"},
    ]
    data = {"content": blocks}
    out, entries = redact(data, "sanitized")
    text = json.dumps(out)
    assert KEY[:10] not in text and KEY[10:] not in text
    assert out["content"][2] == blocks[2]
    assert [e.path for e in entries] == ["$.content[0].text", "$.content[1].text"]
    assert [p for p, _ in find_secrets(data)] == ["$.content[0].text", "$.content[1].text"]
    assert find_secrets(out) == []


def test_replay_only_withholds_the_title_and_items(tmp_path: Path) -> None:
    prompt = "PRIVATE PROMPT: summarize the merger memo"
    with SessionStore.open(tmp_path / "s") as store:
        sid = store.open_session("s", title=prompt)
        store.inject(sid, {"role": "user", "content": prompt})
        store.inject(sid, {"role": "item", "item": "PRIVATE item text"})
        store.inject(sid, {"role": "item", "item": ["PRIVATE tool output", "line 2"]})
        local = export_bundle(store, sid, "local")
        bundle = export_bundle(store, sid, "replay_only")
    text = json.dumps(bundle)
    assert "PRIVATE" not in text and "merger" not in text
    section = bundle["transcript"]["sections"][0]
    assert section["label"] == f"Session {sid}"
    assert bundle["source"]["workflow_name"] == section["metadata"]["title"] == WITHHELD
    assert [m.get("item") for m in section["messages"]] == [None, WITHHELD, WITHHELD]
    paths = {e["path"] for e in bundle["redaction"]["entries"]}
    assert {"$.source.workflow_name", "$.transcript.sections[0].label"} <= paths
    assert validate_bundle(bundle) == []
    # a replay_only bundle that kept them is refused
    leaky = json.loads(json.dumps(local))
    leaky["redaction"]["mode"] = "replay_only"
    codes = {(i.path, i.code) for i in validate_bundle(leaky)}
    for path in (
        "$.source.workflow_name",
        "$.transcript.sections[0].label",
        "$.transcript.sections[0].metadata.title",
        "$.transcript.sections[0].messages[1].item",
    ):
        assert (path, "withheld") in codes, path


def test_replay_only_keeps_flags_and_numbers_under_payload_keys(tmp_path: Path) -> None:
    out, entries = redact({"summary": True, "result": 3, "content": "words"}, "replay_only")
    assert out == {"summary": True, "result": 3, "content": WITHHELD}
    assert [e.path for e in entries] == ["$.content"]
    with SessionStore.open(tmp_path / "s") as store:
        store.open_session("s1")
        store.inject("s1", {"role": "system", "content": "Summary so far", "summary": True})
        store.inject("s1", {"role": "user", "content": "go on"})
        bundle = json.loads(json.dumps(export_bundle(store, "s1", "replay_only")))
    assert bundle["transcript"]["sections"][0]["messages"][0]["summary"] is True
    assert validate_bundle(bundle) == []
    with SessionStore.open(tmp_path / "t") as other:
        assert import_bundle(other, bundle) == "s1"
        assert other.messages("s1")[0]["summary"] is True
