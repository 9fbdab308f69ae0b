"""What counts as a secret in a bundle: credential-looking names, and secret-shaped text.

Two questions, both pure functions of a string: is this field or variable NAME a credential's
(`credential_name`, decided by a rule on the name's parts, not by a list of names), and where in
this TEXT are secrets (`scan`). Token shapes come from the `detect-secrets` library's detectors;
the rules here cover what it has no detector for: key=value assignments judged by the name rule
(found by `replay._secret_assignments`), private key blocks that span lines, `user:pass@host` with
or without a scheme, `Authorization` headers, this engine's own bearer tokens, modern provider keys,
and base64 or hex text that decodes to any of these.

Speed: a string reaches the detectors only if a cheap gate says it could hold a secret (a digit or
a sign like `:@=_+/-`, an upper-case run, or one long word); prose passes the gate in one pass of a
character-class search. Results are kept per distinct string, and per distinct long word.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from replay._secret_assignments import assignments
from replay._secret_detectors import detectors
from replay._secret_names import _PLACEHOLDER, credential_name

_CACHE_MAX = 200_000  # distinct strings remembered per process; cleared whole when full
_DECODE_DEPTH = 2  # base64 inside hex inside text, no deeper


@dataclass(frozen=True)
class Hit:
    """One secret in a text: `text[start:end]` is secret of the named kind."""

    start: int
    end: int
    kind: str


# Text rules of our own, each (kind, regex); the whole match is the secret.

_PEM = (
    r"-{4,5} ?BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)? ?-{4,5}[\s\S]*?"
    r"(?:-{4,5} ?END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)? ?-{4,5}|\Z)"
)


def _basic_credentials(match: re.Match[str]) -> bool:
    """`Basic X` is a credential when X is base64 of `user:password` (not `basic example`)."""
    try:
        decoded = base64.b64decode(match.group("cred"), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return False
    return ":" in decoded and decoded.isprintable()


def _token_like(match: re.Match[str]) -> bool:
    """`Bearer X` is a credential when X looks made, not written: a digit, a sign, or a capital
    after its first letter (`Bearer authentication` is prose)."""
    token = match.group("cred")
    return any(c.isdigit() or c in "._~+/=-" for c in token) or any(c.isupper() for c in token[1:])


def _always(match: re.Match[str]) -> bool:
    return True


# (kind, a lower-case word the text must hold, regex, check of a match); the whole match is the
# secret.
_TEXT_RULES: tuple[tuple[str, str, re.Pattern[str], Callable[[re.Match[str]], bool]], ...] = tuple(
    (kind, guard, re.compile(source), check)
    for kind, guard, source, check in (
        ("private_key_block", "private key", _PEM, _always),
        (
            "putty_private_key",
            "putty-user-key-file",
            r"PuTTY-User-Key-File-\d+:[\s\S]*?(?:Private-MAC: ?[0-9a-fA-F]+|\Z)",
            _always,
        ),
        (
            "authorization_header",
            "authori",
            r"(?i)\b(?:proxy-)?authori[sz]ation[\"']?\s*[:=]\s*[\"']?(?![\[<\"'])[^\r\n\"']{4,}",
            _always,
        ),
        (
            "basic_auth",
            "basic",
            r"\b[Bb]asic\s+(?![\[<])(?P<cred>[A-Za-z0-9+/]{4,}={0,2})",
            _basic_credentials,
        ),
        (
            "bearer_token",
            "bearer",
            r"\b[Bb]earer\s+(?![\[<])(?P<cred>[A-Za-z0-9._~+/=-]{12,})",
            _token_like,
        ),
        (
            "home_directory",
            "users",
            r"/Users/[A-Za-z0-9._-]+|\b[A-Za-z]:\\Users\\[^\\\s]+",
            _always,
        ),
        ("home_directory", "/home/", r"/home/[A-Za-z0-9._-]+", _always),
    )
)
# `user:password@host`, with or without a scheme: found from the `@`, read backwards.
_AT = re.compile(r"@")
_USERINFO_BEFORE = re.compile(r"([^\s:@/\"'<>\[\]]{1,256}):([A-Za-z0-9._%+-]{0,64})(?![\w.%+-])")
_HOST_AFTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]+")
_URL_SECRET_PARAMS = frozenset(
    ("sig", "signature", "x-amz-signature", "x-goog-signature", "code", "auth")
)
# Long words: where token-shaped secrets live.
_WORD = re.compile(r"[^\s\"'`<>()\[\]{},;|\\]{16,}")

# Token shapes detect-secrets has no detector for (checked on a long word, first match wins).
_OWN_TOKENS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(source))
    for kind, source in (
        ("anthropic_api_key", r"\bsk-ant-[A-Za-z0-9_-]{16,}"),
        ("openai_api_key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
        ("stripe_key", r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"),
        ("aws_access_key_id", r"\b(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[0-9A-Z]{16}\b"),
        ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"),
        ("slack_token", r"\bxox[abeoprs]-[A-Za-z0-9-]{10,}"),
        ("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}"),
        ("google_oauth_token", r"\bya29\.[0-9A-Za-z_-]{20,}"),
        ("npm_token", r"\bnpm_[A-Za-z0-9]{36}"),
        ("pypi_token", r"\bpypi-[A-Za-z0-9_-]{50,}"),
        ("azure_client_secret", r"[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}"),
        ("jwt", r"\beyJ[A-Za-z0-9_-]{6,}\.eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}"),
    )
)
# Every token shape above (ours and detect-secrets') holds one of these; a word holding none is
# not run through the detectors one by one.
_ANCHORS = (
    "AKIA",
    "ASIA",
    "ABIA",
    "ACCA",
    "A3T",
    "AKC",
    "AP",
    "AC",
    "SK",
    "AccountKey",
    "://",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "gldt-",
    "glft-",
    "glsoat-",
    "glrt-",
    "glcbt-",
    "glimt-",
    "glptt-",
    "glagent-",
    "gloas-",
    "GR1348941",
    "eyJ",
    "-us",
    "_authToken",
    "npm_",
    "T3BlbkFJ",
    "sk-",
    "sk_",
    "rk_",
    "pypi-",
    "SG.",
    "xox",
    "hooks.slack",
    "sq0",
    "AIza",
    "ya29.",
    "Q~",
)
_TELEGRAM_ANCHOR = re.compile(r"\d{8}:")


def _anchored(word: str) -> bool:
    """Whether `word` holds what one of the token shapes starts with or must contain."""
    if any(anchor in word for anchor in _ANCHORS):
        return True
    if ":" in word and _TELEGRAM_ANCHOR.search(word):
        return True
    return len(word) >= 50 and word.count(".") >= 2  # a Discord bot token


# Dates, times, numbers, versions and UUIDs: never a secret, and common in every event.
_PLAIN_WORD = re.compile(
    r"[\d\s:.,TZ+/_-]+|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
_B64 = re.compile(r"[A-Za-z0-9+/]+={0,2}|[A-Za-z0-9_-]+={0,2}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
_PRINTABLE_RUN = re.compile(rb"[\t\n\r\x20-\x7e]{6,}")  # text inside binary bytes
_OWN_BEARER = re.compile(r"[A-Za-z0-9_-]{43}")
_WORD_EDGE = "\"'`.,:;!?)]}>"

# The gate: deleting the letters and punctuation of prose from a text's UTF-8 leaves its capitals
# and everything else (digits, signs like `:@=_+/-`, other scripts). Text where that is only a few
# capitals cannot hold any of the shapes above; an all-capitals run is looked for only when enough
# capitals are left.
_PROSE_BYTES = bytes(range(ord("a"), ord("z") + 1)) + b" \t\r\n.,;!?'\"()"
_GATE_CAPS = re.compile(r"[A-Z]{4}[A-Z0-9]{12}")


# Scanning

_scanned: dict[str, tuple[Hit, ...]] = {}
_words: dict[str, str | None] = {}


def forget() -> None:
    """Drop what `scan` remembers: each walk over a bundle starts afresh, so nothing of one
    bundle stays in memory after it (and a measurement never runs on a warm cache)."""
    _scanned.clear()
    _words.clear()


def scan(text: str) -> tuple[Hit, ...]:
    """Every secret in `text`, as non-overlapping hits in order (empty for clean text).
    Placeholders left by an earlier redaction are never secrets, so scanning is idempotent."""
    if len(text) < 6:
        return ()
    found = _scanned.get(text)
    if found is None:
        found = _scan(text, 0)
        if len(_scanned) >= _CACHE_MAX:
            _scanned.clear()
        _scanned[text] = found
    return found


def _could_hold(text: str) -> bool:
    if len(text) < 6:
        return False
    left = text.encode("utf-8", "surrogatepass").translate(None, _PROSE_BYTES)
    if not left:
        return False
    if not left.isalpha():
        return True  # a digit, a sign, another script: look closer
    return (len(left) >= 16 and _GATE_CAPS.search(text) is not None) or (
        len(text) >= 16 and " " not in text
    )


def _scan(text: str, depth: int) -> tuple[Hit, ...]:
    if not _could_hold(text):
        return ()
    if len(text) <= 256 and " " not in text:  # one word: a time, an id, a hash, a token
        if _PLAIN_WORD.fullmatch(text):
            return ()
        if _HEX.fullmatch(text) and len(text) % 2 == 0:
            decoded = _decode(text) if depth < _DECODE_DEPTH else None
            inner = _scan(decoded, depth + 1) if decoded else ()
            return (Hit(0, len(text), f"encoded_{inner[0].kind}"),) if inner else ()
    if "redacted" in text or "[withheld]" in text:
        text = _PLACEHOLDER.sub(lambda m: " " * len(m.group(0)), text)
    low = text.lower()
    hits: list[Hit] = []
    for kind, guard, regex, check in _TEXT_RULES:
        if guard in low:
            hits.extend(Hit(m.start(), m.end(), kind) for m in regex.finditer(text) if check(m))
    hits.extend(Hit(start, end, "credential_assignment") for start, end in assignments(text, low))
    if "@" in text:
        hits.extend(_userinfo(text))
    if "://" in text:
        hits.extend(
            Hit(m.start(), m.end(), "url_with_credentials")
            for m in _URL.finditer(text)
            if _url_leaks(m.group(0))
        )
    for start, end in _long_words(text):
        found = _word_kind(text[start:end], depth)
        if found is not None:
            hits.append(Hit(start, end, found))
    return _merge(hits)


def _long_words(text: str) -> Iterator[tuple[int, int]]:
    """The spans of the words of 16 characters or more (quotes, brackets and trailing
    punctuation are not part of a word)."""
    cursor = 0
    for chunk in text.split():
        if len(chunk) < 16:
            continue
        at = text.find(chunk, cursor)
        cursor = at + len(chunk)
        for match in _WORD.finditer(chunk):
            start, end = match.span()
            while end > start and chunk[end - 1] in _WORD_EDGE:
                end -= 1
            if end - start >= 16:
                yield at + start, at + end


def _merge(hits: list[Hit]) -> tuple[Hit, ...]:
    """Overlapping hits become one, named by the one that starts first (the longer on a tie)."""
    hits.sort(key=lambda h: (h.start, -h.end))
    out: list[Hit] = []
    for hit in hits:
        if out and hit.start < out[-1].end:
            last = out[-1]
            out[-1] = Hit(last.start, max(last.end, hit.end), last.kind)
        else:
            out.append(hit)
    return tuple(out)


def _userinfo(text: str) -> Iterator[Hit]:
    backwards = text[::-1]
    size = len(text)
    for at_sign in _AT.finditer(text):
        at = at_sign.start()
        before = _USERINFO_BEFORE.match(backwards, size - at)
        host = _HOST_AFTER.match(text, at + 1)
        if before is None or host is None:
            continue
        password, user = before.group(1)[::-1], before.group(2)[::-1]
        if password.isdigit() and (not user or user.isdigit()):
            continue  # `12:30@home` is a time, not a password
        yield Hit(size - before.end(), host.end(), "user_password_at_host")


def _url_leaks(url: str) -> bool:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed URL cannot be checked, so it is treated as a leak
        return True
    if password or (parts.username and "@" in parts.netloc):
        return True
    return any(
        credential_name(key) or key.lower() in _URL_SECRET_PARAMS
        for key, _ in parse_qsl(parts.query)
    )


def _word_kind(word: str, depth: int) -> str | None:
    """The kind of secret a long word is, or None."""
    if depth == 0:
        cached = _words.get(word, "")
        if cached != "":
            return cached
    kind = _classify_word(word, depth)
    if depth == 0:
        if len(_words) >= _CACHE_MAX:
            _words.clear()
        _words[word] = kind
    return kind


def _classify_word(word: str, depth: int) -> str | None:
    if _PLAIN_WORD.fullmatch(word):
        return None
    if _HEX.fullmatch(word) is None and _anchored(word):
        for kind, regex in _OWN_TOKENS:
            if regex.search(word):
                return kind
        for kind, analyze in detectors():
            if next(analyze(word), None) is not None:
                return kind
    if word.islower() and not any(c.isdigit() for c in word):
        return None  # a lower-case path or identifier: neither a made token nor an encoding
    if _OWN_BEARER.fullmatch(word) and _random_looking(word):
        return "sessionlog_bearer_token"
    if depth < _DECODE_DEPTH:
        decoded = _decode(word)
        if decoded is not None:
            inner = _scan(decoded, depth + 1)
            if inner:
                return f"encoded_{inner[0].kind}"
    return None


def _random_looking(word: str) -> bool:
    """A generated token (`secrets.token_urlsafe(32)`): mixed case with digits or `-_`, and not
    a word-built identifier (those rarely have three upper-case letters in a row)."""
    from sessions._tokens import entropy_problem

    upper = sum(c.isupper() for c in word)
    lower = sum(c.islower() for c in word)
    others = len(word) - upper - lower
    if upper < 3 or lower < 3 or others < 1:
        return False
    return entropy_problem(word) is None


def _decode(word: str) -> str | None:
    """The text a base64 or hex word encodes, if it is mostly printable text."""
    raw: bytes | None = None
    if len(word) % 2 == 0 and _HEX.fullmatch(word):
        raw = bytes.fromhex(word)
    elif _B64.fullmatch(word):
        urlsafe = "-" in word or "_" in word
        if len(word) % 4 == 1 or (not urlsafe and len(word) % 4 and "=" not in word):
            return None  # no base64 has that length (unpadded is only url-safe base64 here)
        padded = word + "=" * (-len(word) % 4)
        try:
            decode = base64.urlsafe_b64decode if urlsafe else base64.standard_b64decode
            raw = decode(padded)
        except (binascii.Error, ValueError):
            return None
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # binary: a key can still sit in it (a framed request body)
        return binary_text(raw) or None
    printable = sum(c.isprintable() or c in "\r\n\t" for c in text)
    return text if text and printable >= 0.9 * len(text) else None


def binary_text(raw: bytes) -> str:
    """The runs of printable ASCII (six characters or more) in bytes that are not UTF-8, one a
    line: where a secret inside a binary frame shows."""
    return "\n".join(run.decode("ascii") for run in _PRINTABLE_RUN.findall(raw))


def scrub(text: str) -> tuple[str, list[str]]:
    """`text` with every secret replaced by a named placeholder, and the placeholders used
    (empty when there was nothing to replace)."""
    hits = scan(text)
    if not hits:
        return text, []
    parts: list[str] = []
    used: list[str] = []
    last = 0
    for hit in hits:
        placeholder = placeholder_for(hit.kind, text[hit.start : hit.end])
        parts.append(text[last : hit.start])
        parts.append(placeholder)
        used.append(placeholder)
        last = hit.end
    parts.append(text[last:])
    return "".join(parts), used


# Private key blocks cut across strings: a text that begins a block and does not end it, then
# texts of base64 lines and armour headers up to the one that ends it.
_BLOCK_OPEN = re.compile(
    r"-{4,5} ?BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)? ?-{4,5}|PuTTY-User-Key-File-\d+:"
)
_BLOCK_CLOSE = re.compile(
    r"-{4,5} ?END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)? ?-{4,5}|Private-MAC: ?[0-9a-fA-F]+"
)
_BLOCK_LINE = re.compile(r"[A-Za-z0-9+/=]+|[A-Za-z][\w-]*: [^\n]*")
BLOCK_KINDS = frozenset(("private_key_block", "putty_private_key"))


def opens_block(text: str) -> str | None:
    """The kind of private key block `text` begins without ending (the rest is in the strings
    that follow it), or None."""
    if "PRIVATE KEY" not in text and "PuTTY-User-Key-File" not in text:
        return None
    opened = list(_BLOCK_OPEN.finditer(text))
    last = opened[-1] if opened else None
    if last is None or _BLOCK_CLOSE.search(text, last.end()):
        return None
    return "putty_private_key" if last.group(0).startswith("PuTTY") else "private_key_block"


def continues_block(text: str) -> tuple[bool, bool]:
    """Whether `text` can be the next part of an open private key block (blank, armour headers
    like `Version: x`, base64 lines of which one at least is long, or the end line), and whether
    it ends the block."""
    close = _BLOCK_CLOSE.search(text)
    head = text if close is None else text[: close.start()]
    lines = [line.strip() for line in head.splitlines() if line.strip()]
    if not all(_BLOCK_LINE.fullmatch(line) for line in lines):
        return False, False
    body = [line for line in lines if ": " not in line]
    if close is None and body and not any(len(line) >= 16 for line in body):
        return False, False  # a short word (`ok`) is not a key's line
    return True, close is not None


def placeholder_for(kind: str, secret: str | bytes) -> str:
    """What stands in for `secret` of `kind`: its kind and length in UTF-8 bytes, nothing else."""
    size = len(secret) if isinstance(secret, bytes) else len(secret.encode())
    return f"<redacted:{kind}:{size}>"
