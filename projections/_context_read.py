"""Reading what a context view is built from: a transcript's messages from its latest checkpoint
on, each with its reference (the log position of the event carrying it, and its index there).

A checkpoint is a user message flagged `summary` followed by an assistant message flagged `summary`
(what `context_compacted`, and `compact` with a summarizer, insert). Finding it reads the
transcript backwards in growing pages, so a session with a recent checkpoint reads only its tail.
Read-only; never writes.
"""

from __future__ import annotations

from eventlog import LogView
from eventlog import events as ev
from projections._queries import read_refs
from projections._refs import Opener, messages_at, slice_ranges
from projections._state import Transcript

Ref = tuple[int, int]

TAIL_PAGE_MESSAGES_FIRST = 64
"""Messages read by the first backward page; later pages double, so finding a checkpoint `n`
messages back reads at most about `2n` messages and `log2(n)` pages."""


def is_checkpoint(messages: list[ev.Message], index: int) -> bool:
    """Whether a checkpoint pair starts at `messages[index]`."""
    if index + 1 >= len(messages):
        return False
    first, second = messages[index], messages[index + 1]
    return first.summary and first.role == "user" and second.summary and second.role == "assistant"


def read_span(
    view: LogView, transcript: Transcript, start: int, stop: int, opener: Opener | None = None
) -> tuple[list[ev.Message], list[Ref]]:
    """Messages ``[start, stop)`` of a transcript with their references, hash-checked."""
    refs: list[Ref] = []
    for segment, lo, hi in slice_ranges(transcript.ranges, start, stop):
        refs.extend(read_refs(view, segment, lo, hi, transcript))
    return messages_at(view, refs, opener), refs


def read_tail(
    view: LogView, transcript: Transcript, opener: Opener | None = None
) -> tuple[int, list[ev.Message], list[Ref]]:
    """``(start, messages, refs)``: the transcript from its latest checkpoint on (from its first
    message when it has none)."""
    messages: list[ev.Message] = []
    refs: list[Ref] = []
    low, page = transcript.length, TAIL_PAGE_MESSAGES_FIRST
    while low > 0:
        first = max(low - page, 0)
        more, more_refs = read_span(view, transcript, first, low, opener)
        messages, refs = more + messages, more_refs + refs
        for index in range(len(more) - 1, -1, -1):
            if is_checkpoint(messages, index):
                return first + index, messages[index:], refs[index:]
        low, page = first, page * 2
    return 0, messages, refs
