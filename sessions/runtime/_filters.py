"""Input filters: checks on a prompt's text that run before any provider call.

A filter is a callable `(prompt) -> Verdict` with a `name` (or a `__name__`). `pass` lets the prompt
through, `warn` lets it through and records the warning with the loop, `reject` stops it: the
runtime records `input_rejected` and calls no provider. A filter that raises rejects (it fails
closed). Nothing here touches storage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from eventlog.errors import ConfigurationError
from eventlog.limits import check_at_most
from sessions.runtime import _limits

PASS = "pass"
WARN = "warn"
REJECT = "reject"


@dataclass(frozen=True)
class Verdict:
    action: str = PASS
    reason: str = ""

    def __post_init__(self) -> None:
        if self.action not in (PASS, WARN, REJECT):
            raise ConfigurationError(
                f"Verdict: action must be pass, warn or reject, got {self.action!r}"
            )


def passed() -> Verdict:
    return Verdict(PASS)


def warn(reason: str) -> Verdict:
    return Verdict(WARN, reason)


def reject(reason: str) -> Verdict:
    return Verdict(REJECT, reason)


InputFilter = Callable[[str], Verdict]


def filter_name(check: InputFilter) -> str:
    name = getattr(check, "name", None) or getattr(check, "__name__", None)
    return name if isinstance(name, str) else type(check).__name__


def check_filters(filters: Iterable[InputFilter]) -> tuple[InputFilter, ...]:
    found = tuple(filters)
    check_at_most(
        len(found), _limits.input_filters_max, "input_filters_max", "Runtime: input_filters"
    )
    for check in found:
        if not callable(check):
            raise ConfigurationError(
                f"Runtime: an input filter must be callable, got {type(check).__name__}"
            )
    return found


def screen(
    filters: tuple[InputFilter, ...], prompt: str
) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
    """Run every filter in order: the warnings, and the first rejection as (filter, reason)."""
    warnings: list[dict[str, Any]] = []
    for check in filters:
        name = filter_name(check)
        try:
            verdict: object = check(prompt)
        except Exception as exc:  # noqa: BLE001 - a broken filter rejects: passing is unsafe
            return warnings, (name, f"the filter failed: {type(exc).__name__}: {exc}")
        if not isinstance(verdict, Verdict):
            return warnings, (name, f"the filter returned {type(verdict).__name__}, not a Verdict")
        if verdict.action == REJECT:
            return warnings, (name, verdict.reason or "rejected")
        if verdict.action == WARN:
            warnings.append({"filter": name, "reason": verdict.reason})
    return warnings, None
