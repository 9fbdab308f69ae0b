"""Credentials assigned in text, found by their names: `NAME=value`, `name: value`,
`"name": "value"`, `name => value`, `--name value`, and `{"name": NAME, "value": value}` pairs (a
Kubernetes env list, a HAR header) in JSON or YAML. The name decides (`credential_name`); what is
returned is where the secret is. Pure functions of a string, linear in its length: every run of name
characters is read once, whatever number of credential hints it holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from replay._secret_names import credential_name, strong_credential_name

# `name = value`, `name: value`, `"name": "value"`, `name => value`, `--name value`: found from
# the places a credential word could be part of a name (every word and stem of the name rule
# holds one of these hints), the name read around it, and the name decides.
_HINTS = (
    "pass",
    "secret",
    "token",
    "key",
    "auth",
    "cred",
    "cookie",
    "pwd",
    "pw",
    "sess",
    "jwt",
    "otp",
    "mfa",
    "dsn",
    "bearer",
    "signing",
    "priv",
)
_IDENT = re.compile(r"[\w.-]*")
_SEPARATOR_AFTER = re.compile(r"(?:\\?[\"'])?[ \t]*(?:=>|:=|:(?![:/])|=(?!=))")
# A quoted value is only the text between its quotes, so that a JSON or YAML text stays one after
# its secrets are replaced (`"password": "<redacted:...>"`).
_QUOTED = (
    r"\\\"(?P<esc>[^\"\r\n]{1,512}?)\\\""
    r"|\"(?P<dq>(?:[^\"\\\r\n]|\\.){1,512})\""
    r"|'(?P<sq>[^'\r\n]{1,512})'"
)
_VALUE_AT = re.compile(rf"[ \t]*(?:{_QUOTED}|(?P<bare>(?![\[<])[^\s\"',;&]{{1,512}}))")
_FLAG_NAME = re.compile(r"(?:^|-)-[A-Za-z]")
_FLAG_VALUE_AT = re.compile(rf"[ \t]+(?:{_QUOTED}|(?P<bare>(?![\[<-])[^\s\"',;&]{{3,512}}))")
_SPACED_QUOTED_AT = re.compile(rf"[ \t]+(?:{_QUOTED})(?P<bare>(?!))?")
_BARE_MIN = 3  # an unquoted value after a weak name (`key`, `token`) shorter than this is a word
# An assignment that owns its line (`.env`, YAML, properties, `export X=`) or is one `k=v` of a
# connection string: after a strong name its unquoted value is the rest of the line, spaces and
# all, up to a `;` that starts the next pair.
_OWNS_LINE = re.compile(r"(?:[\r\n;]|\\n)[ \t]*(?:(?:export|set|-)[ \t]+)?\Z")
_LINE_VALUE_END = re.compile(r"[\r\n\"]|\\[nr\"]|;(?=[ \t]*[A-Za-z][\w .-]*=)")
# Unquoted values that are code, not a secret: `token = getpass()`, `key: str`,
# `self.token = token`, `api_key: Optional[str]`, `key = os.environ[...]`.
_CODE_VALUE = re.compile(
    r"(?:self|cls|this|os|env|config|settings|args|kwargs|options|opts|request|params|ctx)\."
    r"|[A-Za-z_][\w.]*[\[(]|[\w.]*\.[A-Z]\w*$"
)
_WORD_VALUES = frozenset(
    (
        "str",
        "int",
        "bytes",
        "bool",
        "float",
        "none",
        "null",
        "true",
        "false",
        "undefined",
        "any",
        "dict",
        "list",
        "string",
        "number",
        "object",
    )
)
# `{"name": "DB_PASSWORD", "value": "..."}` (JSON, escaped or not) and `- name: DB_PASSWORD` with
# `value: ...` on the next line (YAML): the value is secret when the name is a credential's.
_PAIR_JSON = re.compile(
    r"\b(?:[Nn]ame|[Kk]ey)\\?[\"']?[ \t]*:[ \t]*\\?[\"'](?P<name>[\w.-]{1,128})\\?[\"'][ \t]*,"
    rf"\s*\\?[\"']?[Vv]alue\\?[\"']?[ \t]*:[ \t]*(?:{_QUOTED})"
)
_PAIR_YAML = re.compile(
    r"\b(?:name|key)[ \t]*:[ \t]*[\"']?(?P<name>[\w.-]{1,128})[\"']?[ \t]*\r?\n"
    r"[ \t]*value[ \t]*:[ \t]*(?:" + _QUOTED + r"|(?P<bare>[^\s\"'][^\r\n]{0,511}))"
)


def assignments(text: str, low: str) -> Iterator[tuple[int, int]]:
    """The (start, end) of every credential assigned in `text` (`low` is it lower-cased)."""
    spots = _hint_spots(low)
    if spots:
        backwards = text[::-1]
        size = len(text)
        run_end = -1
        for at in spots:
            if at < run_end:
                continue  # `access_token_key`, `pw_pw_pw`: one name, several hints, read once
            start = size - _ident_end(backwards, size - at)
            run_end = _ident_end(text, at)
            found = _assignment(text, start, run_end)
            if found is not None:
                yield found
    if "value" in low and ("name" in low or "key" in low):
        yield from _pairs(text)


def _hint_spots(low: str) -> list[int]:
    """Where in the lower-cased text a credential word could start, in order."""
    spots: list[int] = []
    for hint in _HINTS:
        at = low.find(hint)
        while at != -1:
            spots.append(at)
            at = low.find(hint, at + 1)
    spots.sort()
    return spots


def _ident_end(text: str, at: int) -> int:
    """Where the run of name characters (letters, digits, `_.-`) starting at `at` ends."""
    match = _IDENT.match(text, at)
    return at if match is None else match.end()


def _assignment(text: str, start: int, end: int) -> tuple[int, int] | None:
    """The secret assigned to the name `text[start:end]`, if it is a credential's."""
    name = text[start:end]
    if not credential_name(name.strip(".-")):
        return None
    separator = _SEPARATOR_AFTER.match(text, end)
    if separator is not None:
        value = _VALUE_AT.match(text, separator.end())
    elif _FLAG_NAME.search(name):  # `--password value`
        value = _FLAG_VALUE_AT.match(text, end)
    elif strong_credential_name(name.strip(".-")):  # `storePassword "value"` (Gradle, Groovy)
        value = _SPACED_QUOTED_AT.match(text, end)
    else:
        return None
    if value is None:
        return None
    if value.group("bare") is None:  # quoted: the text between the quotes
        inner = next(g for g in ("esc", "dq", "sq") if value.group(g) is not None)
        if not _is_secret_value(value.group(inner), name, quoted=True):
            return None
        return value.start(inner), value.end(inner)
    bare = value.group("bare")
    strong = strong_credential_name(name.strip(".-"))
    if not _is_secret_value(bare, name) or (not strong and len(bare) < _BARE_MIN):
        return None
    stop = value.end()
    if strong and _OWNS_LINE.search(
        ("\n" if start <= 24 else "") + text[max(0, start - 24) : start]
    ):
        whole = _line_end(text, value.start("bare"))
        if _is_secret_value(text[value.start("bare") : whole], name):
            stop = max(stop, whole)
    return start, stop


def _line_end(text: str, at: int) -> int:
    """Where an unquoted value that runs to the end of its line ends (trailing blanks out)."""
    limit = min(len(text), at + 512)
    match = _LINE_VALUE_END.search(text, at, limit)
    end = limit if match is None else match.start()
    while end > at and text[end - 1] in " \t":
        end -= 1
    return end


def _is_secret_value(raw: str, name: str, *, quoted: bool = False) -> bool:
    """Whether what follows `name =` is a value to hide: not empty, not a placeholder, and, when
    unquoted, not code (a call, a type, an attribute, the name itself)."""
    value = raw.strip("\\\"'").strip()
    if not value or value.startswith(("[", "<")):
        return False
    if quoted or raw[:1] in "\"'\\":
        return True
    last = name.rsplit(".", 1)[-1].lstrip("-")
    if value == last or value.endswith("." + last) or value.lower() in _WORD_VALUES:
        return False
    return _CODE_VALUE.match(value) is None


def _pairs(text: str) -> Iterator[tuple[int, int]]:
    """The values of `{name: NAME, value: ...}` pairs whose NAME is a credential's."""
    for regex in (_PAIR_JSON, _PAIR_YAML):
        for match in regex.finditer(text):
            if not credential_name(match.group("name")):
                continue
            group = next(
                g for g in ("esc", "dq", "sq", "bare") if match.groupdict().get(g) is not None
            )
            value = match.group(group).rstrip()
            if value.strip("\\\"' ") and not value.startswith(("[", "<")):
                yield match.start(group), match.start(group) + len(value)
