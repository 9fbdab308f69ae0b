"""Credential names: whether a field, variable or header NAME is a credential's, decided by a
rule on the name's parts, not by a list of names. A name is read as an English compound whose last
word is its head: a qualifier after the credential word makes it about the credential
(`token_type`, `key_path`), one before it only says whose credential it is (`store_password`).
"""

from __future__ import annotations

import re
from functools import lru_cache

# A redaction placeholder, or a value already withheld: names nothing, holds nothing.
_PLACEHOLDER = re.compile(r"<redacted:[a-z0-9_]+:\d+>|\[redacted\]|\[withheld\]")

# A name part that is one of these words names a credential (`api_key`, `X-Auth-Token`, `pass`),
# and so does `key` with a number (`key1`); these are weak: a qualifier before them vetoes too.
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
# A name part, or two adjacent parts read as one, that contains one of these names a credential
# (`PGPASSWORD`, `clientsecret`, `api_key`); these are strong: only a qualifier after them vetoes.
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
# ...unless a part after the credential word says the value is about the credential, not the
# credential itself (`key_path`, `token_type`, `cookie_name`, `password_min_length`); before a weak
# word, these also say so (`max_token`, `public_key`).
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
# Kinds of key that are not secrets: these before `key` (`sort_key`, `cache_key`, `join_key`) say
# so, and after any credential word they qualify it like the others. `primary` is not one: an
# Azure `primaryKey` is an account key.
_KEY_QUALIFIERS = frozenset(
    (
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
    )
)
_KEY_WORD = re.compile(r"keys?\d*")
_NAME_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def _strong(parts: list[str], i: int) -> bool:
    """Whether part `i` holds a strong stem, alone or ending in it with the part before it
    (`api` `key`)."""
    if any(s in parts[i] for s in _NAME_STEMS):
        return True
    if not i:
        return False
    pair = parts[i - 1] + parts[i]
    return any(s in pair and s not in parts[i - 1] for s in _NAME_STEMS)


@lru_cache(maxsize=65_536)
def credential_name(name: str) -> bool:
    """Whether a field, variable or header called `name` holds a credential, whatever its
    value looks like. Case and separators do not matter: `AWS_SECRET_ACCESS_KEY`,
    `X-Goog-Api-Key`, `databasePassword`, `trustStorePassword` and `PGPASSWORD` all do;
    `input_tokens`, `public_key`, `token_type`, `session_id` and `keyboard` do not."""
    return _strength(name) > 0


def strong_credential_name(name: str) -> bool:
    """Whether `name` is a credential's by a strong stem (`password`, `secret`, `api_key`...),
    not only by a weak word (`key`, `token`, `auth`)."""
    return _strength(name) > 1


@lru_cache(maxsize=65_536)
def _strength(name: str) -> int:
    """2 for a credential's name by a strong stem, 1 by a weak word only, 0 for no credential."""
    if len(name) > 128:
        return 0
    if "<redacted:" in name:
        name = _PLACEHOLDER.sub(" ", name)  # a key already redacted names nothing
    parts = [p.lower() for p in _NAME_SPLIT.split(name) if p]
    qualifiers = _NAME_QUALIFIERS | _KEY_QUALIFIERS
    for i in range(len(parts) - 1, -1, -1):  # the last credential word decides
        part = parts[i]
        strong = _strong(parts, i)
        if not strong and part not in _NAME_WORDS and not _KEY_WORD.fullmatch(part):
            continue
        if any(p in qualifiers for p in parts[i + 1 :]):
            return 0
        if strong:
            return 2
        vetoes = qualifiers if _KEY_WORD.fullmatch(part) else _NAME_QUALIFIERS
        return 0 if any(p in vetoes for p in parts[:i]) else 1
    return 0
