"""Rules of the `sessions.testing` state machine for a session's transcript (inject, trim, reset,
compact, mask) and its scratchpad, mixed into `SessionMachine`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from sessions._model import visible_text
from sessions._rules_base import PICK, RulesBase, has_open
from sessions._strategies import (
    compact_options,
    custom_compact,
    mask_as_message,
    mask_as_text,
    messages,
    scratchpads,
    short_text,
    summarize,
    tool_exchanges,
)

_CALLABLES = {"summarizer": summarize, "custom_compactor": custom_compact}


class TranscriptRules(RulesBase):
    """The transcript and scratchpad rules; `SessionMachine` supplies the store and the model."""

    # Transcript

    @precondition(has_open)
    @rule(pick=PICK, message=messages())
    def inject(self, pick: int, message: dict[str, Any]) -> None:
        sid = self.pick_open(pick)
        self.store.inject(sid, message)
        self.model.inject(sid, message)

    @precondition(has_open)
    @rule(pick=PICK, exchange=tool_exchanges(), batched=st.booleans())
    def inject_tool_exchange(
        self, pick: int, exchange: list[dict[str, Any]], batched: bool
    ) -> None:
        sid = self.pick_open(pick)
        if batched:
            assert self.store.inject_many(sid, exchange) == len(exchange)
        else:
            for message in exchange:
                self.store.inject(sid, message)
        for message in exchange:
            self.model.inject(sid, message)

    @precondition(has_open)
    @rule(pick=PICK, keep_last=st.integers(0, 15))
    def trim(self, pick: int, keep_last: int) -> None:
        sid = self.pick_open(pick)
        kept, expected = self.store.trim(sid, keep_last), self.model.trim(sid, keep_last)
        self.expect_equal(f"trim({sid!r}, {keep_last})", kept, expected)

    @precondition(has_open)
    @rule(pick=PICK)
    def reset(self, pick: int) -> None:
        sid = self.pick_open(pick)
        self.store.reset(sid)
        self.model.reset(sid)

    @precondition(has_open)
    @rule(pick=PICK, options=compact_options())
    def compact(self, pick: int, options: dict[str, Any]) -> None:
        sid = self.pick_open(pick)
        kept, expected = self.store.compact(sid, **options), self.model.compact(sid, options)
        self.expect_equal(f"compact({sid!r}, {options})", kept, expected)

    @precondition(has_open)
    @rule(
        pick=PICK,
        exchange=tool_exchanges(),
        newer=st.integers(0, 2),
        into=st.integers(1, 3),
        strategy=st.sampled_from(("truncate", "observation_mask", "llm")),
    )
    def compact_at_a_tool_boundary(
        self, pick: int, exchange: list[dict[str, Any]], newer: int, into: int, strategy: str
    ) -> None:
        """A tool exchange, `newer` messages after it, and a `keep_last` that ends inside the
        exchange's results: the kept part must start at the call."""
        sid = self.pick_open(pick)
        for message in [*exchange, *({"role": "user", "content": "ok"} for _ in range(newer))]:
            self.store.inject(sid, message)
            self.model.inject(sid, message)
        keep_last = newer + min(into, len(exchange) - 1)
        self.compact(pick, {"compact_strategy": strategy, "keep_last": keep_last} | _CALLABLES)

    @precondition(has_open)
    @rule(
        pick=PICK,
        exchange=tool_exchanges(),
        delta=st.sampled_from((-1, 0, 1)),
        mask=st.sampled_from((None, mask_as_text, mask_as_message)),
    )
    def mask_at_the_length_limit(
        self, pick: int, exchange: list[dict[str, Any]], delta: int, mask: Any
    ) -> None:
        """Observation masking with `tool_output_max_chars` one below, at, or one above the
        length of a tool output in the older part."""
        sid = self.pick_open(pick)
        for message in [*exchange, {"role": "user", "content": "next"}]:
            self.store.inject(sid, message)
            self.model.inject(sid, message)
        limit = max(len(visible_text(exchange[1].get("content"))) + delta, 0)
        options = {"compact_strategy": "observation_mask", "keep_last": 1}
        options |= {"tool_output_max_chars": limit}
        if mask is not None:
            options["mask_callback"] = mask
        self.compact(pick, options)

    # Scratchpad

    @precondition(has_open)
    @rule(
        pick=PICK,
        scratchpad=scratchpads(),
        opts=st.none()
        | st.fixed_dictionaries({"source": st.just("planner"), "reason": short_text()}),
    )
    def set_scratchpad(
        self, pick: int, scratchpad: dict[str, Any], opts: dict[str, Any] | None
    ) -> None:
        sid = self.pick_open(pick)
        got = self.store.set_scratchpad(sid, scratchpad, opts)
        version = self.model.set_scratchpad(sid, scratchpad)
        expected = {"ok": True, "version": version, "scratchpad": scratchpad}
        self.expect_equal("set_scratchpad", got, expected)

    @precondition(has_open)
    @rule(pick=PICK)
    def clear_scratchpad(self, pick: int) -> None:
        sid = self.pick_open(pick)
        got = self.store.clear_scratchpad(sid, {"reason": "done"})
        expected = {"ok": True, "version": self.model.clear_scratchpad(sid), "scratchpad": None}
        self.expect_equal("clear_scratchpad", got, expected)
