"""A corpus of secret shapes planted in every place a session bundle carries: none of them may
reach a sanitized or replay_only bundle, each must be listed in its manifest, `validate_bundle`
must find each in a local bundle, and `import_bundle` must refuse a shared bundle carrying one.

Every fake secret is built here at run time from a seeded generator, so nothing in this file looks
like a credential to a scanner and every run plants the same values.
"""

from __future__ import annotations

import base64
import json
import random
import string
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from replay import BundleError, export_bundle, import_bundle, validate_bundle
from replay._secrets import credential_name, scrub
from sessions import SessionStore
from sessions._tokens import GENERATED_TOKEN_BYTES, could_be_token, entropy_problem

UPPER, LOWER, DIGITS = string.ascii_uppercase, string.ascii_lowercase, string.digits
ALNUM = UPPER + LOWER + DIGITS
URLSAFE = ALNUM + "-_"
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"


def pick(rng: random.Random, alphabet: str, n: int) -> str:
    """`n` characters of `alphabet`, with at least one digit where the alphabet has digits (a
    real generator can make a token without one; a test must not depend on that chance)."""
    out = "".join(rng.choice(alphabet) for _ in range(n))
    if n > 4 and any(c.isdigit() for c in alphabet) and not any(c.isdigit() for c in out):
        out = out[:-1] + "7"
    return out


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def pem(kind: str, rng: random.Random, lines: int = 6) -> str:
    dashes = "-" * 5
    body = "\n".join(pick(rng, B64, 64) for _ in range(lines))
    return f"{dashes}BEGIN {kind}{dashes}\n{body}\n{dashes}END {kind}{dashes}"


def jwt(rng: random.Random) -> str:
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps({"sub": pick(rng, DIGITS, 8), "name": "fixture"}).encode())
    return f"{header}.{payload}.{pick(rng, URLSAFE, 43)}"


def our_bearer(rng: random.Random) -> str:
    """A token of the shape `tokens.create` generates (43 URL-safe base64 characters)."""
    while True:
        token = pick(rng, URLSAFE, 43)
        if could_be_token(token) and entropy_problem(token) is None:
            assert len(token) == len(b64url(bytes(GENERATED_TOKEN_BYTES)))
            return token


def shapes() -> dict[str, str]:
    rng = random.Random(1313)
    word = lambda n: pick(rng, LOWER, n)  # noqa: E731
    basic = base64.b64encode(f"{word(6)}:{pick(rng, ALNUM, 14)}".encode()).decode()
    return {
        "aws_access_key_id": "AK" + "IA" + pick(rng, UPPER + DIGITS, 16),
        "aws_secret_env": "AWS_SECRET_ACCESS_KEY=" + pick(rng, B64, 40),
        "gcp_api_key": "AI" + "za" + pick(rng, URLSAFE, 35),
        "gcp_oauth_token": "ya" + "29." + pick(rng, URLSAFE, 80),
        "gcp_service_account_key": pem("PRIVATE KEY", rng),
        "azure_storage_connection": "DefaultEndpointsProtocol=https;AccountName=fixture;Account"
        + "Key="
        + pick(rng, B64, 86)
        + "==;EndpointSuffix=core.windows.net",
        "azure_client_secret": pick(rng, ALNUM, 3) + "8Q" + "~" + pick(rng, URLSAFE, 34),
        "github_classic_token": "gh" + "p_" + pick(rng, ALNUM, 36),
        "github_fine_grained": "github"
        + "_pat_"
        + pick(rng, ALNUM, 22)
        + "_"
        + pick(rng, ALNUM, 59),
        "gitlab_token": "gl" + "pat-" + pick(rng, URLSAFE, 20),
        "npm_token": "np" + "m_" + pick(rng, ALNUM, 36),
        "pypi_token": "py" + "pi-AgEIcHlwaS5vcmc" + pick(rng, URLSAFE, 80),
        "slack_bot_token": "xo"
        + "xb-"
        + pick(rng, DIGITS, 11)
        + "-"
        + pick(rng, DIGITS, 13)
        + "-"
        + pick(rng, LOWER + DIGITS, 24),
        "slack_webhook": "https://hooks.slack.com/services/T"
        + pick(rng, UPPER + DIGITS, 8)
        + "/B"
        + pick(rng, UPPER + DIGITS, 8)
        + "/"
        + pick(rng, ALNUM, 24),
        "stripe_secret_key": "sk" + "_live_" + pick(rng, ALNUM, 24),
        "stripe_restricted_key": "rk" + "_live_" + pick(rng, ALNUM, 24),
        "sendgrid_key": "S" + "G." + pick(rng, URLSAFE, 22) + "." + pick(rng, URLSAFE, 43),
        "twilio_key": "S" + "K" + pick(rng, HEX, 32),
        "telegram_bot_token": pick(rng, DIGITS, 9) + ":" + pick(rng, URLSAFE, 35),
        "mailchimp_key": pick(rng, HEX, 32) + "-us" + "12",
        "openai_project_key": "sk" + "-proj-" + pick(rng, URLSAFE, 48),
        "anthropic_key": "sk" + "-ant-api03-" + pick(rng, URLSAFE, 90),
        "jwt": jwt(rng),
        "rsa_private_key": pem("RSA PRIVATE KEY", rng),
        "ec_private_key": pem("EC PRIVATE KEY", rng, 3),
        "openssh_private_key": pem("OPENSSH PRIVATE KEY", rng),
        "pgp_private_key": pem("PGP PRIVATE KEY BLOCK", rng).replace(
            "BLOCK-----\n", "BLOCK-----\nVersion: fixture\n\n", 1
        ),
        "putty_private_key": "PuTTY-User-Key-File-2: ssh-rsa\nEncryption: none\n"
        + "Private-Lines: 2\n"
        + pick(rng, B64, 64)
        + "\n"
        + pick(rng, B64, 40)
        + "\nPrivate-MAC: "
        + pick(rng, HEX, 40),
        "postgres_url": f"postgresql://{word(6)}:{pick(rng, ALNUM, 16)}@db.internal:5432/app",
        "mysql_url": f"mysql://{word(5)}:{pick(rng, ALNUM, 16)}@mysql.internal/app",
        "mongodb_url": f"mongodb+srv://{word(5)}:{pick(rng, ALNUM, 16)}@cluster0.example.net/db",
        "redis_url": f"redis://:{pick(rng, ALNUM, 20)}@cache.internal:6379/0",
        "userinfo_without_scheme": f"{word(5)}:{pick(rng, ALNUM, 14)}@db.internal:5432",
        "basic_auth_header": "Authorization: Basic " + basic,
        "basic_auth_bare": "Basic " + basic,
        "database_password_env": "DATABASE_PASSWORD=" + pick(rng, ALNUM, 18),
        "pgpassword_env": "PGPASSWORD=" + pick(rng, ALNUM, 18),
        "goog_api_key_header": "X-Goog-Api-Key: " + pick(rng, ALNUM, 18),
        "json_password_field": '{"db_password": "' + word(5) + " " + word(7) + '"}',
        "cli_password_flag": "--password " + pick(rng, ALNUM, 14),
        "sessionlog_bearer_raw": our_bearer(rng),
        "sessionlog_bearer_header": "Bearer " + our_bearer(rng),
        "base64_encoded_token": base64.b64encode(
            ("token=" + "gh" + "p_" + pick(rng, ALNUM, 36)).encode()
        ).decode(),
        "hex_encoded_password": ("password=" + pick(rng, ALNUM, 16)).encode().hex(),
    }


SHAPES = shapes()
# Where only a quoted value is the secret, sanitizing keeps the field's name and quotes, so that a
# JSON text stays JSON: what must not survive is the value.
SECRET_PARTS = {"json_password_field": json.loads(SHAPES["json_password_field"])["db_password"]}
SINGLE_WORD = {name for name, secret in SHAPES.items() if not any(c.isspace() for c in secret)}


def test_the_corpus_is_large_and_varied() -> None:
    assert len(SHAPES) >= 30
    assert len(set(SHAPES.values())) == len(SHAPES)
    assert credential_name("AWS_SECRET_ACCESS_KEY") and credential_name("X-Goog-Api-Key")
    assert not credential_name("input_tokens") and not credential_name("session_id")


def escaped(text: str) -> str:
    """`text` as it appears inside a JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def fragments(secret: str) -> list[str]:
    """What must not survive of `secret`: itself, each long line of it, its halves, and its
    base64 and hex encodings (a value planted as bytes travels as base64)."""
    raw = secret.encode()
    parts = [secret, base64.b64encode(raw).decode(), raw.hex()]
    parts += [line for line in secret.splitlines() if len(line) >= 20]
    half = len(secret) // 2
    if half >= 12:
        parts += [secret[:half], secret[half:]]
    return parts


def plant(store: SessionStore, secret: str) -> tuple[str, list[str]]:
    """A session carrying `secret` in every place a bundle carries, and the local-bundle paths
    (below the section) where it must be found."""
    half = len(secret) // 2
    lines = secret.splitlines() if "\n" in secret else [secret[:half], secret[half:]]
    keyed = secret if secret in SINGLE_WORD_SECRETS else "k-" + secret.replace("\n", "|")
    sid = store.open_session(
        "corpus",
        system_prompt=f"You help. Config: {secret} (keep it safe)",
        metadata={"note": f"see {secret}", "nested": {"deep": {keyed: "value"}}, "lines": lines},
    )
    store.inject(sid, {"role": "user", "content": f"use {secret} please"})
    arguments = json.dumps({"cmd": "deploy", "value": secret})
    store.inject(
        sid,
        {
            "role": "assistant",
            "content": [{"type": "text", "text": f"calling with {secret}"}],
            "reasoning": f"the user gave {secret}",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "sh", "arguments": arguments},
                },
                {"id": "c2", "name": "read", "input": {"args": [secret], "opts": {keyed: 1}}},
            ],
        },
    )
    store.inject(sid, {"role": "tool", "tool_call_id": "c1", "content": f"ok {secret}"})
    store.inject(
        sid,
        {
            "role": "tool",
            "tool_call_id": "c2",
            "content": "read",
            "item": {"blob": secret.encode()},  # an item is kept verbatim: bytes stay bytes
        },
    )
    multiline = secret.splitlines()
    if len(multiline) > 1:  # a key one line per content block, then one line per message
        store.inject(
            sid, {"role": "user", "content": [{"type": "text", "text": t} for t in multiline]}
        )
        for line in multiline:
            store.inject(sid, {"role": "user", "content": line})
    store.set_scratchpad(sid, {"plan": f"remember {secret}", "items": ["a", secret, "b"]})
    section = "$.transcript.sections[0]"
    expected = [
        f"{section}.metadata.system_prompt",
        f"{section}.metadata.metadata.note",
        f"{section}.metadata.metadata.lines",
        f"{section}.metadata.metadata.nested.deep",
        f"{section}.metadata.scratchpad.plan",
        f"{section}.metadata.scratchpad.items[1]",
        f"{section}.messages[0].content",
        f"{section}.messages[1].content[0].text",
        f"{section}.messages[1].reasoning",
        f"{section}.messages[1].tool_calls[0].function.arguments",
        f"{section}.messages[1].tool_calls[1].input.args[0]",
        f"{section}.messages[1].tool_calls[1].input.opts",
        f"{section}.messages[2].content",
        f"{section}.messages[3].item.blob",
        "$.tools.calls[0].result",
    ]
    if len(multiline) > 1:
        expected += [
            f"{section}.messages[4].content[{j}].text"
            for j, line in enumerate(multiline)
            if line.strip()
        ]
        expected += [
            f"{section}.messages[{5 + j}].content"
            for j, line in enumerate(multiline)
            if line.strip()
        ]
    return sid, expected


SINGLE_WORD_SECRETS = {SHAPES[name] for name in SINGLE_WORD}


def covered(path: str, paths: list[str]) -> bool:
    """Whether `path` or one of its ancestors (or, for a dict holding a replaced key, one of its
    members) is in `paths`."""
    for other in paths:
        if other == path or path.startswith((other + ".", other + "[")):
            return True
        if other.startswith((path + ".", path + "[")):
            return True
    return False


def members(value: Any, path: str = "$") -> Iterator[tuple[str, Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from members(child, f"{path}[{json.dumps(key)}]")
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from members(child, f"{path}[{i}]")


@pytest.fixture(scope="module")
def exported() -> Callable[[str], dict[str, Any]]:
    """The bundles of one planted session per shape, built once per module."""
    cache: dict[str, dict[str, Any]] = {}

    def get(name: str) -> dict[str, Any]:
        if name not in cache:
            store = SessionStore.memory()
            try:
                sid, expected = plant(store, SHAPES[name])
                cache[name] = {
                    "expected": expected,
                    **{mode: export_bundle(store, sid, mode) for mode in MODES},
                }
            finally:
                store.close()
        return cache[name]

    return get


MODES = ("local", "sanitized", "replay_only")


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_plant_is_really_there_in_a_local_bundle(
    name: str, exported: Callable[[str], dict[str, Any]]
) -> None:
    text = json.dumps(exported(name)["local"], ensure_ascii=False)
    secret = SHAPES[name]
    assert escaped(secret) in text
    assert base64.b64encode(secret.encode()).decode() in text  # the bytes plant


@pytest.mark.parametrize("mode", ["sanitized", "replay_only"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_no_shape_reaches_a_shared_bundle(
    name: str, mode: str, exported: Callable[[str], dict[str, Any]]
) -> None:
    bundle = exported(name)[mode]
    text = json.dumps(bundle, ensure_ascii=False)
    for fragment in fragments(SECRET_PARTS.get(name, SHAPES[name])):
        assert escaped(fragment) not in text, fragment[:40]
    assert validate_bundle(bundle) == []


@pytest.mark.parametrize("mode", ["sanitized", "replay_only"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_plant_is_listed_in_the_manifest(
    name: str, mode: str, exported: Callable[[str], dict[str, Any]]
) -> None:
    record = exported(name)
    paths = [entry["path"] for entry in record[mode]["redaction"]["entries"]]
    missing = [path for path in record["expected"] if not covered(path, paths)]
    assert missing == []
    if mode == "replay_only":
        reasoning = "$.transcript.sections[0].messages[1].reasoning"
        assert record[mode]["transcript"]["sections"][0]["messages"][1]["reasoning"] == "[withheld]"
        assert any(
            e["path"] == reasoning and e["action"] == "withheld"
            for e in record[mode]["redaction"]["entries"]
        )


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_validate_finds_each_plant_and_import_refuses_it(
    name: str, exported: Callable[[str], dict[str, Any]]
) -> None:
    record = exported(name)
    local = json.loads(json.dumps(record["local"]))
    found = [issue.path for issue in validate_bundle(local) if issue.code == "secret"]
    missing = [path for path in record["expected"] if not covered(path, found)]
    assert missing == []
    local["redaction"]["mode"] = "sanitized"  # a shared bundle that kept its secrets
    store = SessionStore.memory()
    try:
        with pytest.raises(BundleError, match="looks like a secret"):
            import_bundle(store, local)
        assert store.list_sessions()["sessions"] == []
        assert (
            import_bundle(store, record["sanitized"]) == record["sanitized"]["source"]["session_id"]
        )
    finally:
        store.close()


@pytest.mark.parametrize("name", sorted(SINGLE_WORD))
def test_a_secret_used_as_a_dict_key_is_replaced_in_the_key(name: str) -> None:
    out, used = scrub(SHAPES[name])
    assert used and out.count("<redacted:") == len(used)
    assert all(fragment not in out for fragment in fragments(SHAPES[name]))
