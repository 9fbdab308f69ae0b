"""Context policies over the engine, mixed into `SessionStore`: `context` (what the next model
call sees) and `maintain_context` (doom-loop warning, summarization checkpoint, pruning).

Every decision is an event holding its outcome, so the view is rebuilt from the log alone and
replay never calls a summarizer. `context` only reads; `snapshot` keeps showing every message.
A failing summarizer is recorded as `context_compaction_failed` and never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import msgspec

import projections as pj
from eventlog import LogView
from eventlog import events as ev
from projections import Ref, is_checkpoint, read_span, read_tail
from sessions import _context_plan as plan
from sessions._context_policy import (
    ContextPolicy,
    TokenCounter,
    decide_attempts_max,
    error_chars_max,
    pruned_results_per_event_max,
)
from sessions._host import Command, SessionHost
from sessions._hot import Kept
from sessions._messages import to_dicts

logger = logging.getLogger("sessionlog.sessions")


@dataclass
class ContextView:
    """A session's context view at one transcript version: the recorded messages from the
    latest checkpoint on (`start` is where that is in the transcript), their references, and
    how each is shown under the recorded prune decisions."""

    generation: int
    version: int
    ranges: tuple[tuple[int, int, int], ...]
    prune_version: int
    start: int
    messages: list[ev.Message]
    refs: list[Ref]
    shown: list[ev.Message]
    prunes: dict[Ref, ev.PrunedResult]
    counter: TokenCounter | None = None
    tokens: list[int] = field(default_factory=list)

    def token_counts(self, counter: TokenCounter) -> list[int]:
        """Tokens of each shown message, counted once per message and counter."""
        if self.counter is not counter:
            self.counter, self.tokens = counter, []
        if len(self.tokens) < len(self.shown):
            count = plan.message_tokens(counter)
            self.tokens = self.tokens + [count(m) for m in self.shown[len(self.tokens) :]]
        return self.tokens


def _extend(
    hit: ContextView, transcript: pj.Transcript, view: LogView, opener: pj.Opener | None
) -> ContextView | None:
    """`hit` with the messages appended since, or None if more than appends happened."""
    added = pj.ranges_added(hit.ranges, transcript.ranges)
    if added is None:
        return None
    new: list[ev.Message] = []
    new_refs: list[Ref] = []
    if added:
        flat = msgspec.structs.replace(  # the chunk the session holds comes with it
            transcript, ranges=added, length=sum(hi - lo for _, lo, hi in added)
        )
        new, new_refs = read_span(view, flat, 0, flat.length, opener)
    messages, refs, shown = hit.messages + new, hit.refs + new_refs, hit.shown + new
    start = hit.start
    for index in range(len(messages) - 2, max(len(hit.messages) - 2, -1), -1):
        if is_checkpoint(messages, index):  # a checkpoint pair came in as plain messages
            start += index
            messages, refs, shown = messages[index:], refs[index:], shown[index:]
            break
    return replace(
        hit,
        version=transcript.version,
        ranges=transcript.ranges,
        start=start,
        messages=messages,
        refs=refs,
        shown=shown,
        tokens=list(hit.tokens) if start == hit.start else [],
    )


class ContextVerbs(SessionHost):
    """`context` and `maintain_context`."""

    token_counter: TokenCounter
    context_policy: ContextPolicy
    _context_views: Kept[ContextView]
    """Session id -> its latest context view."""

    def context(self, session_id: str) -> list[dict[str, Any]]:
        """The messages the next model call should see, as fresh dicts: the transcript from its
        latest checkpoint pair on, with recorded prune decisions applied. Raises
        `UnknownSessionError` for an unknown id."""
        with self.log.view() as view:
            state = self._state(view, session_id, "context")
            return to_dicts(self._context_view(view, state).shown)

    def _context_view(self, view: LogView, state: pj.SessionState) -> ContextView:
        sid = state.session_id
        transcript = pj.load_transcript(view, sid) or pj.Transcript()
        pruned_at = pj.prune_version(view, sid)
        opener = self._opener(view, state, "context")
        hit = self._context_views.get(sid)
        found = None
        if hit is not None and not self._cache_usable(view, state):
            hit = None
        if hit is not None and hit.generation == state.generation:
            if hit.version == transcript.version and hit.ranges == transcript.ranges:
                found = hit
            elif hit.prune_version == pruned_at:
                found = _extend(hit, transcript, view, opener)
        if found is None:
            start, messages, refs = read_tail(view, transcript, opener)
            oldest = min((position for position, _ in refs), default=0)
            prunes = pj.load_prunes(view, sid, state.generation, from_position=oldest)
            found = ContextView(
                generation=state.generation,
                version=transcript.version,
                ranges=transcript.ranges,
                prune_version=pruned_at,
                start=start,
                messages=messages,
                refs=refs,
                shown=[plan.shown(m, prunes.get(r)) for m, r in zip(messages, refs, strict=True)],
                prunes=prunes,
            )
        # Reading a cached view is safe anywhere; keeping one only outside a transaction, whose
        # writes could still be rolled back.
        if found is not hit and self._keeps_reads():
            self._context_views.put(sid, found)
        return found

    def _decide(
        self,
        session_id: str,
        verb: str,
        decide: Callable[[ContextView], list[ev.Event]],
        *,
        calls_model: bool = False,
    ) -> list[ev.Event]:
        """Decide on a (cached) view read outside the write, then write; if the session changed
        in between, decide again on the view inside the write transaction. A decision that
        `calls_model` is never made inside it: it is made again outside, and given up for this
        turn (nothing written) after `decide_attempts_max` changes in a row."""
        for _attempt in range(decide_attempts_max if calls_model else 1):
            with self.log.view() as view:
                state = self._state(view, session_id, verb)
                seen = self._context_view(view, state)
                inherited = self._cache_usable(view, state)  # no ancestor read was forgotten
            events = decide(seen)
            if not events:
                return []
            recheck = partial(self._recheck, seen, inherited, events, decide, calls_model)
            written = self._command(verb, session_id, recheck)
            if written is not None:
                return written  # None: it changed while the model ran; decide again outside
        logger.warning("%s: `%s` kept changing while the model ran; skipped", verb, session_id)
        return []

    def _recheck(
        self,
        seen: ContextView,
        inherited: bool,
        events: list[ev.Event],
        decide: Callable[[ContextView], list[ev.Event]],
        calls_model: bool,
        cmd: Command,
    ) -> list[ev.Event] | None:
        """Inside the write: append `events`, decided on `seen`, if the session is still as seen
        (and, when `inherited`, no ancestor whose messages it shows was forgotten since: what
        was decided on them must not outlive the forget); else decide again on the view inside
        the write (None, writing nothing, when the decision `calls_model`: it is never made
        inside the write)."""
        state, transcript = cmd.state, cmd.transcript
        if (state.generation, transcript.version) != (seen.generation, seen.version) or (
            inherited and not self._cache_usable(cmd.tx, state)
        ):
            if calls_model:
                return None
            events = decide(self._context_view(cmd.tx, state))
        if events:
            cmd.emit(events)
        return events

    def maintain_context(
        self,
        session_id: str,
        *,
        policy: ContextPolicy | None = None,
        context_error: bool = False,
    ) -> dict[str, Any]:
        """After a turn: warn of a doom loop, summarize into a checkpoint when the context is
        over the policy's threshold, then prune large tool results; `context_error=True` (the
        model refused the context as too long) prunes with the aggressive thresholds.

        Returns what it did: ``{doom_loop, checkpoint, summary_failed, pruned, tokens,
        window_tokens}``, where `tokens` is the context's total afterwards.
        """
        self._writable("maintain_context")
        rules = self.context_policy if policy is None else policy
        if not isinstance(rules, ContextPolicy):
            raise TypeError(f"maintain_context: `policy` must be a ContextPolicy, got {rules!r}")
        counter = rules.token_counter or self.token_counter
        report: dict[str, Any] = {"window_tokens": rules.window_tokens}
        verb = "maintain_context"
        warned = self._decide(session_id, verb, lambda view: _doom_events(view, rules))
        report["doom_loop"] = bool(warned)
        outcome: list[ev.Event] = []
        if rules.summarizer is not None:
            outcome = self._decide(
                session_id,
                verb,
                lambda view: _checkpoint_events(view, rules, counter),
                calls_model=True,
            )
        report["checkpoint"] = any(isinstance(e, ev.ContextCompacted) for e in outcome)
        failed = [e for e in outcome if isinstance(e, ev.ContextCompactionFailed)]
        report["summary_failed"] = failed[0].error if failed else None
        pruned = self._decide(
            session_id, verb, lambda view: _prune_events(view, rules, counter, context_error)
        )
        report["pruned"] = sum(len(e.results) for e in pruned if isinstance(e, ev.ContextPruned))
        with self.log.view() as view:
            state = self._state(view, session_id, "maintain_context")
            final = self._context_view(view, state)
            report["tokens"] = sum(final.token_counts(counter)) + rules.reserved_tokens
        return report


def _doom_events(view: ContextView, rules: ContextPolicy) -> list[ev.Event]:
    found = plan.doom_loop(view.messages, rules.doom_loop_repeats)
    if found is None:
        return []
    tool, run = found
    return [ev.DoomLoopDetected(message=plan.warning_message(tool, run), tool=tool, repeats=run)]


def _checkpoint_events(
    view: ContextView, rules: ContextPolicy, counter: TokenCounter
) -> list[ev.Event]:
    tokens = view.token_counts(counter)
    total = sum(tokens) + rules.reserved_tokens
    if total < rules.tokens_at(rules.summarize_ratio):
        return []
    if len(view.shown) < rules.summarize_messages_min:
        return []
    split = plan.checkpoint_split(view.messages, rules.keep_turns)
    if split is None:
        return []
    older = to_dicts(view.shown[:split])
    assert rules.summarizer is not None, "maintain_context checks for a summarizer"
    try:
        answer = rules.summarizer(
            older, max_tokens=rules.summary_tokens_max, temperature=rules.summary_temperature
        )
        summary = plan.summary_message(answer, "summarizer")
    except Exception as exc:  # a failing summarizer is recorded, never fatal (seed 004)
        logger.warning("context summarizer failed; recorded, not raised", exc_info=True)
        kind = "invalid_summary" if isinstance(exc, ValueError) else "summarizer"
        error = f"{type(exc).__name__}: {exc}"[:error_chars_max]
        return [
            ev.ContextCompactionFailed(
                error=error, kind=kind, tokens_before=total, message_count=split
            )
        ]
    boundary = plan.boundary_message(split)
    count = plan.message_tokens(counter)
    after = total - sum(tokens[:split]) + count(boundary) + count(summary)
    return [
        ev.ContextCompacted(
            insert_at=view.start + split,
            boundary=boundary,
            summary=summary,
            summarized_start=view.start,
            summarized_count=split,
            tokens_before=total,
            tokens_after=after,
        )
    ]


def _prune_events(
    view: ContextView, rules: ContextPolicy, counter: TokenCounter, aggressive: bool
) -> list[ev.Event]:
    results, before, after = plan.plan_prunes(
        view.messages,
        view.refs,
        view.prunes,
        view.token_counts(counter),
        rules,
        plan.message_tokens(counter),
        aggressive=aggressive,
    )
    if not results:
        return []
    return [
        ev.ContextPruned(
            results=results[:pruned_results_per_event_max],
            aggressive=aggressive,
            tokens_before=before,
            tokens_after=after,
        )
    ]
