"""Credential names: whether a field, variable or header NAME is a credential's, decided by a
rule on the name's parts (a credential word or stem, and no qualifier), not by a list of names.
"""

from __future__ import annotations

import re
from functools import lru_cache

# A redaction placeholder, or a value already withheld: names nothing, holds nothing.
_PLACEHOLDER = re.compile(r"<redacted:[a-z0-9_]+:\d+>|\[redacted\]|\[withheld\]")

# A name part that is one of these words names a credential (`api_key`, `X-Auth-Token`, `pass`).
_NAME_WORDS = frozenset(
    (
        "token",
        "key",
        "keys",
        "auth",
        "authorization",
        "authentication",
        "pass",
        "pwd",
        "pw",
        "creds",
        "cred",
        "jwt",
        "otp",
        "totp",
        "mfa",
        "dsn",
        "sessid",
        "sessionid",
        "phpsessid",
        "jsessionid",
        "bearer",
        "signing",
        "privkey",
    )
)
# A name part that contains one of these names a credential (`PGPASSWORD`, `clientsecret`).
_NAME_STEMS = (
    "password",
    "passwd",
    "passphrase",
    "passcode",
    "secret",
    "credential",
    "cookie",
    "apikey",
    "accesskey",
    "privatekey",
    "secretkey",
    "authtoken",
    "accesstoken",
    "refreshtoken",
    "idtoken",
    "sessiontoken",
    "bearertoken",
    "csrftoken",
    "xsrftoken",
    "pgpass",
)
# ...unless another part says the value is about the credential, not the credential itself
# (`max_token`, `key_path`, `public_key`, `token_type`, `sort_key`, `cookie_name`).
_NAME_QUALIFIERS = frozenset(
    (
        "count",
        "limit",
        "max",
        "min",
        "length",
        "len",
        "size",
        "type",
        "kind",
        "format",
        "name",
        "names",
        "url",
        "uri",
        "endpoint",
        "path",
        "file",
        "env",
        "var",
        "hint",
        "policy",
        "prefix",
        "expiry",
        "expires",
        "expiration",
        "ttl",
        "timeout",
        "usage",
        "estimated",
        "public",
        "primary",
        "foreign",
        "sort",
        "partition",
        "cache",
        "idempotency",
        "dedup",
        "dedupe",
        "lookup",
        "row",
        "hot",
        "shortcut",
        "group",
        "routing",
        "shard",
        "index",
        "unique",
        "composite",
        "order",
        "join",
        "required",
        "enabled",
        "method",
        "scheme",
        "mode",
        "provider",
        "header",
        "counter",
        "counters",
        "factory",
        "schema",
        "pattern",
        "regex",
        "store",
        "handler",
        "budget",
        "estimate",
        "estimator",
        "encoder",
        "decoder",
    )
)
_NAME_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


@lru_cache(maxsize=65_536)
def credential_name(name: str) -> bool:
    """Whether a field, variable or header called `name` holds a credential, whatever its
    value looks like. Case and separators do not matter: `AWS_SECRET_ACCESS_KEY`,
    `X-Goog-Api-Key`, `databasePassword` and `PGPASSWORD` all do; `input_tokens`,
    `public_key`, `session_id` and `keyboard` do not."""
    if len(name) > 128:
        return False
    if "<redacted:" in name:
        name = _PLACEHOLDER.sub(" ", name)  # a key already redacted names nothing
    parts = [p.lower() for p in _NAME_SPLIT.split(name) if p]
    if not parts or any(p in _NAME_QUALIFIERS for p in parts):
        return False
    return any(p in _NAME_WORDS or any(s in p for s in _NAME_STEMS) for p in parts)
