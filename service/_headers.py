"""The request headers the service refuses rather than reads leniently, checked before the
credential and before any route runs (so before anything is written).

A body in a content coding (the service never decodes one), a charset other than UTF-8 (bodies
are read as UTF-8), a second copy of a header that holds one value (which copy a proxy, a client
library or this server reads is a guess), and an `If-Match` (the service keeps no entity tags, so
none can match; a conditional inject says `expected_length` in its body). Never echoes a
credential.
"""

from __future__ import annotations

from collections.abc import Iterable

from service._problems import HTTPProblem

SINGLE = ("content-type", "content-encoding", "idempotency-key", "harn-agents-protocol-version")
"""Headers that hold one value: a request carrying one of them twice is refused."""

_CHARSETS = ("utf-8", "utf8", "us-ascii", "ascii")
"""Charsets whose bytes the service's UTF-8 reading gets right (ASCII is UTF-8's first half;
`utf8` is a spelling some clients send)."""

_SHOWN_CHARS_MAX = 80
"""Characters of a refused header's value repeated in the problem's detail."""


def refusal(headers: Iterable[tuple[bytes, bytes]]) -> HTTPProblem | None:
    """The problem answering a request with these (raw ASGI) headers, or None when it may go on."""
    seen: dict[str, list[str]] = {}
    for raw_name, raw_value in headers:
        seen.setdefault(raw_name.decode("latin-1").lower(), []).append(raw_value.decode("latin-1"))
    for name in SINGLE:
        values = seen.get(name, [])
        if len(values) > 1:
            shown = ", ".join(repr(v[:_SHOWN_CHARS_MAX]) for v in values)
            return HTTPProblem(
                400,
                "malformed-request",
                f"the request carries {len(values)} `{name}` headers ({shown}); it must carry "
                "one: which copy a proxy or a server reads differs, so none is guessed",
            )
    for check in (_coding, _charset, _if_match):
        problem = check(seen)
        if problem is not None:
            return problem
    return None


def _coding(seen: dict[str, list[str]]) -> HTTPProblem | None:
    value = seen.get("content-encoding", [""])[0]
    codings = [c.strip().lower() for c in value.split(",") if c.strip()]
    if all(coding == "identity" for coding in codings):
        return None
    return HTTPProblem(
        415,
        "unsupported-media-type",
        f"Content-Encoding {value[:_SHOWN_CHARS_MAX]!r}: the service reads a body as it is sent "
        "and decodes no content coding; send it uncompressed (identity)",
        headers={"accept-encoding": "identity"},
    )


def _charset(seen: dict[str, list[str]]) -> HTTPProblem | None:
    value = seen.get("content-type", [""])[0]
    for parameter in value.split(";")[1:]:
        name, _, given = parameter.partition("=")
        if name.strip().lower() != "charset":
            continue
        charset = given.strip().strip('"').strip()
        if charset.lower() not in _CHARSETS:
            return HTTPProblem(
                415,
                "unsupported-media-type",
                f"Content-Type charset {charset[:_SHOWN_CHARS_MAX]!r}: the service reads bodies "
                "as UTF-8 only; send the body in UTF-8 (charset=utf-8, or no charset)",
            )
    return None


def _if_match(seen: dict[str, list[str]]) -> HTTPProblem | None:
    tags = [tag.strip() for value in seen.get("if-match", []) for tag in value.split(",")]
    if not tags or tags == ["*"]:
        return None
    return HTTPProblem(
        412,
        "precondition-failed",
        f"If-Match {', '.join(tags)[:_SHOWN_CHARS_MAX]}: the service keeps no entity tags, so "
        "none can match and nothing was done; to write only if the transcript is unchanged, "
        "send `expected_length` (its length as last read) in the inject's body",
    )
