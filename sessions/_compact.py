"""Compaction: decide what a transcript becomes, before anything is written.

`plan` runs the chosen strategy (and the caller's callables: summarizer, compactor, masks) and
returns the outcome as one replacement of a contiguous run of messages, which is what the
`session_compacted` event records. Replay applies that outcome and never calls anything again.

Semantics:
- `keep_last` (default 12) newest messages are never touched; the boundary moves back so a tool
  result is never separated from the call before it.
- `token_threshold`: compact only when the transcript's tokens exceed it (and the hard limit,
  if any, is not exceeded either way).
- `truncate` drops the older part; `observation_mask` keeps it, but replaces tool outputs longer
  than `tool_output_max_chars` (default 200) with a placeholder (`mask_callback(message)` may
  supply it) and then passes the older part through `compress_callback(messages)` when given; `llm`
  replaces the older part with a summary pair (a synthetic user boundary and the assistant
  summary, both flagged `summary`) from `summarizer(messages)`; `custom` hands the whole
  transcript to `custom_compactor(messages)` and keeps what it returns.
- `hard_limit_tokens`: if still above it, `hard_limit_strategy` (default `truncate`) runs on the
  result, and then the oldest messages go, each with the tool results that follow it, until the
  limit holds (the newest message, with the call it answers, always stays).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from eventlog import InvalidArgumentError
from eventlog import events as ev
from sessions._messages import answers_call, is_tool_result, text_of, to_dict, to_message

STRATEGIES = ("llm", "truncate", "observation_mask", "custom")
OPTIONS = frozenset(
    (
        "keep_last",
        "token_threshold",
        "tool_output_max_chars",
        "compact_strategy",
        "hard_limit_tokens",
        "hard_limit_strategy",
        "custom_compactor",
        "mask_callback",
        "compress_callback",
        "summarizer",
    )
)
KEEP_LAST_DEFAULT = 12
TOOL_OUTPUT_MAX_CHARS_DEFAULT = 200

TokenCounter = Callable[[Mapping[str, Any]], int]
Summarizer = Callable[[list[dict[str, Any]]], str]


@dataclass(frozen=True)
class Plan:
    strategy: str
    replace_start: int
    replace_end: int
    replacement: list[ev.Message]
    tokens_before: int
    tokens_after: int
    kept: int


@dataclass(frozen=True)
class _Options:
    keep_last: int
    token_threshold: int | None
    tool_output_max_chars: int
    strategy: str
    hard_limit_tokens: int | None
    hard_limit_strategy: str
    custom_compactor: Callable[..., Any] | None
    mask_callback: Callable[..., Any] | None
    compress_callback: Callable[..., Any] | None
    summarizer: Callable[..., Any] | None


def _int_option(options: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = options.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"compact: `{key}` must be an int, got {type(value).__name__}")
    if value < 0:
        raise InvalidArgumentError(f"compact: `{key}` must be >= 0, got {value}")
    return value


def _strategy_option(options: Mapping[str, Any], key: str, default: str) -> str:
    value = options.get(key, default)
    if value not in STRATEGIES:
        raise InvalidArgumentError(
            f"compact: `{key}` must be one of {', '.join(STRATEGIES)}, got {value!r}"
        )
    return str(value)


def _callable_option(options: Mapping[str, Any], key: str) -> Callable[..., Any] | None:
    value = options.get(key)
    if value is not None and not callable(value):
        raise InvalidArgumentError(f"compact: `{key}` must be callable, got {type(value).__name__}")
    return value


def parse_options(options: Mapping[str, Any], summarizer: Summarizer | None) -> _Options:
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise InvalidArgumentError(
            f"compact: unknown option {', '.join(map(repr, unknown))} "
            f"(expected one of: {', '.join(sorted(OPTIONS))})"
        )
    parsed = _Options(
        keep_last=_int_option(options, "keep_last", KEEP_LAST_DEFAULT) or 0,
        token_threshold=_int_option(options, "token_threshold", None),
        tool_output_max_chars=_int_option(
            options, "tool_output_max_chars", TOOL_OUTPUT_MAX_CHARS_DEFAULT
        )
        or 0,
        strategy=_strategy_option(options, "compact_strategy", "truncate"),
        hard_limit_tokens=_int_option(options, "hard_limit_tokens", None),
        hard_limit_strategy=_strategy_option(options, "hard_limit_strategy", "truncate"),
        custom_compactor=_callable_option(options, "custom_compactor"),
        mask_callback=_callable_option(options, "mask_callback"),
        compress_callback=_callable_option(options, "compress_callback"),
        summarizer=_callable_option(options, "summarizer") or summarizer,
    )
    for strategy in {parsed.strategy, parsed.hard_limit_strategy}:
        if strategy == "custom" and parsed.custom_compactor is None:
            raise InvalidArgumentError("compact: strategy `custom` needs `custom_compactor`")
        if strategy == "llm" and parsed.summarizer is None:
            raise InvalidArgumentError(
                "compact: strategy `llm` needs a `summarizer` (an option, or the store's)"
            )
    return parsed


def split_point(messages: list[ev.Message], keep_last: int) -> int:
    """Index of the first message to keep, never between a tool call and its result."""
    split = max(len(messages) - keep_last, 0)
    while 0 < split < len(messages) and answers_call(messages[split]):
        split -= 1
    return split


def _convert_all(values: object, where: str) -> list[ev.Message]:
    if not isinstance(values, list):
        raise InvalidArgumentError(f"compact: {where} must return a list of messages")
    return [to_message(value, where=f"compact: {where}[{i}]") for i, value in enumerate(values)]


def _mask(message: ev.Message, opts: _Options) -> ev.Message:
    if not is_tool_result(message):
        return message
    text = text_of(message.content)
    if len(text) <= opts.tool_output_max_chars:
        return message
    if opts.mask_callback is not None:
        placeholder = opts.mask_callback(to_dict(message))
        if isinstance(placeholder, Mapping):
            return to_message(placeholder, where="compact: mask_callback")
        if not isinstance(placeholder, str):
            raise InvalidArgumentError("compact: mask_callback must return a str or a message")
    else:
        placeholder = f"[tool output masked: {len(text)} characters]"
    return msgspec.structs.replace(message, content=placeholder)


def _run(strategy: str, messages: list[ev.Message], opts: _Options) -> list[ev.Message]:
    if strategy == "custom":
        assert opts.custom_compactor is not None
        return _convert_all(
            opts.custom_compactor([to_dict(m) for m in messages]), "custom_compactor"
        )
    split = split_point(messages, opts.keep_last)
    if split == 0:
        return messages
    older, newer = messages[:split], messages[split:]
    if strategy == "truncate":
        return newer
    if strategy == "observation_mask":
        masked = [_mask(message, opts) for message in older]
        if opts.compress_callback is not None:
            masked = _convert_all(
                opts.compress_callback([to_dict(m) for m in masked]), "compress_callback"
            )
        return masked + newer
    assert opts.summarizer is not None
    summary = opts.summarizer([to_dict(m) for m in older])
    if not isinstance(summary, str) or not summary.strip():
        # An empty assistant message is refused by the provider APIs on every later call.
        raise InvalidArgumentError(
            f"compact: the summarizer must return a non-empty str, got {summary!r:.80}"
        )
    boundary = ev.Message(
        role="user",
        content=f"[summary of the {len(older)} earlier messages]",
        synthetic=True,
        summary=True,
    )
    reply = ev.Message(role="assistant", content=summary, synthetic=True, summary=True)
    return [boundary, reply, *newer]


def plan(
    messages: list[ev.Message],
    options: Mapping[str, Any],
    *,
    token_counter: TokenCounter,
    summarizer: Summarizer | None,
) -> tuple[Plan | None, int]:
    """The compaction outcome (None when nothing changes) and the resulting message count."""
    opts = parse_options(options, summarizer)

    def tokens(items: list[ev.Message]) -> int:
        return sum(token_counter(to_dict(m)) for m in items)

    before = tokens(messages)
    over_hard = opts.hard_limit_tokens is not None and before > opts.hard_limit_tokens
    if opts.token_threshold is not None and before <= opts.token_threshold and not over_hard:
        return None, len(messages)
    result = _run(opts.strategy, messages, opts)
    after = tokens(result)
    if opts.hard_limit_tokens is not None and after > opts.hard_limit_tokens:
        result = _run(opts.hard_limit_strategy, result, opts)
        while len(result) > 1 and tokens(result) > opts.hard_limit_tokens:
            # Drop the oldest message together with the tool results that answer it.
            cut = 1
            while cut < len(result) and answers_call(result[cut]):
                cut += 1
            if cut == len(result):
                break  # only the newest call and its results are left: they stay together
            result = result[cut:]
        after = tokens(result)
    prefix = 0
    while prefix < min(len(messages), len(result)) and messages[prefix] == result[prefix]:
        prefix += 1
    suffix = 0
    limit = min(len(messages), len(result)) - prefix
    while suffix < limit and messages[-1 - suffix] == result[-1 - suffix]:
        suffix += 1
    if prefix == len(messages) == len(result):
        return None, len(messages)
    return (
        Plan(
            strategy=opts.strategy,
            replace_start=prefix,
            replace_end=len(messages) - suffix,
            replacement=result[prefix : len(result) - suffix],
            tokens_before=before,
            tokens_after=after,
            kept=len(result),
        ),
        len(result),
    )
