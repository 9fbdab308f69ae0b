"""Token counts of a runtime loop, and of loops summed: what the runtime projection
(`_runtime.py`) records of each model call's usage. Pure values: nothing here reads storage.
"""

from __future__ import annotations

import msgspec

from eventlog import events as ev


class LoopUsage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """Token counts of one loop, or summed over loops."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: LoopUsage) -> LoopUsage:
        return LoopUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


def loop_usage(usage: ev.Usage) -> LoopUsage:
    """A provider's usage as a loop records it. The total is the provider's own `total_tokens`
    when it reports one (in `extra`), else input plus output."""
    reported = usage.extra.get("total_tokens")
    total = reported if isinstance(reported, int) and not isinstance(reported, bool) else None
    return LoopUsage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        total_tokens=usage.input_tokens + usage.output_tokens if total is None else total,
    )
