"""The context policy: every threshold of summarization checkpoints, pruning and doom-loop
detection, in one frozen, validated object, and the bounds the policies themselves keep.

Defaults are the session semantics' numbers. This module decides nothing and touches no storage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from eventlog import InvalidArgumentError

TokenCounter = Callable[[Mapping[str, Any]], int]
ContextSummarizer = Callable[..., object]
"""``summarizer(messages, *, max_tokens, temperature)``: the messages to summarize as dicts; returns
the summary text, or a message dict with `content` (and optionally `model` and `usage`)."""

summary_chars_max: Final = 256 * 1024
"""A summary's text. Far above what `summary_tokens_max` allows a model to write; a longer answer
is a summarizer that ignored its budget, and keeping it would defeat the checkpoint."""

decide_attempts_max: Final = 3
"""How many times a summarization checkpoint is decided (the summarizer called) when the session
keeps changing while the model runs; after that the checkpoint waits for the next turn."""

error_chars_max: Final = 2_000
"""The error text kept in `context_compaction_failed`: enough for a message and a status line,
never a whole response body."""

pruned_results_per_event_max: Final = 2_000
"""Decisions in one `context_pruned` event (about 150 bytes each): keeps the event far below
`event_bytes_max`; any left over are decided at the next maintenance."""

window_tokens_max: Final = 100_000_000
"""A context window. Two orders of magnitude above the largest model windows; more is a typo."""

chars_max: Final = 1_000_000_000
"""Any character-count setting of the policy: above this no message could be stored anyway."""


@dataclass(frozen=True)
class ContextPolicy:
    """What `maintain_context` does to keep a session within `window_tokens`.

    Ratios are fractions of the window. Summarization triggers at `summarize_ratio` used or more
    (and at least `summarize_messages_min` messages in the view); soft trim and hard clear act on
    a context that *exceeds* their ratios. `reserved_tokens` is added to every total: what the
    system prompt and tool definitions take beside the messages.
    """

    window_tokens: int = 128_000
    reserved_tokens: int = 0
    summarize_ratio: float = 0.8
    summarize_messages_min: int = 6
    keep_turns: int = 4
    summary_tokens_max: int = 4_096
    summary_temperature: float = 0.3
    summarizer: ContextSummarizer | None = None
    soft_trim_ratio: float = 0.3
    hard_clear_ratio: float = 0.5
    prunable_chars_min: int = 50_000
    soft_trim_head_chars: int = 1_500
    soft_trim_tail_chars: int = 1_500
    keep_last_assistants: int = 3
    skill_tools: frozenset[str] = frozenset()
    aggressive_soft_trim_ratio: float = 0.15
    aggressive_hard_clear_ratio: float = 0.25
    aggressive_prunable_chars_min: int = 10_000
    doom_loop_repeats: int = 3
    token_counter: TokenCounter | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name.endswith("_ratio"):
                _check_ratio(item.name, value)
            elif item.type == "int":
                _check_int(item.name, value)
        if self.window_tokens < 1 or self.window_tokens > window_tokens_max:
            raise InvalidArgumentError(
                f"ContextPolicy: `window_tokens` must be from 1 to {window_tokens_max}, "
                f"got {self.window_tokens}"
            )
        if self.doom_loop_repeats < 2:
            raise InvalidArgumentError(
                f"ContextPolicy: `doom_loop_repeats` must be >= 2, got {self.doom_loop_repeats}"
            )
        temperature = self.summary_temperature
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise InvalidArgumentError(
                f"ContextPolicy: `summary_temperature` must be a number, got {temperature!r}"
            )
        if not isinstance(self.skill_tools, frozenset) or not all(
            isinstance(name, str) for name in self.skill_tools
        ):
            raise InvalidArgumentError(
                f"ContextPolicy: `skill_tools` must be a frozenset of tool names, "
                f"got {self.skill_tools!r:.80}"
            )
        for name in ("summarizer", "token_counter"):
            found = getattr(self, name)
            if found is not None and not callable(found):
                raise InvalidArgumentError(
                    f"ContextPolicy: `{name}` must be callable, got {type(found).__name__}"
                )

    def tokens_at(self, ratio: float) -> int:
        """The token count a ratio of the window stands for (rounded down)."""
        return math.floor(self.window_tokens * ratio + 1e-9)


def _check_ratio(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value <= 1
        or math.isnan(value)
    ):
        raise InvalidArgumentError(
            f"ContextPolicy: `{name}` must be a fraction of the window in (0, 1], got {value!r}"
        )


def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= chars_max:
        raise InvalidArgumentError(
            f"ContextPolicy: `{name}` must be an int from 0 to {chars_max}, got {value!r}"
        )
