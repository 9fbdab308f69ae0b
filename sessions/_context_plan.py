"""Context decisions as pure functions of a context view and a policy: where a checkpoint splits
the view, which tool results to prune and how, whether the last tool calls are a doom loop, and
how a recorded prune decision shows a message.

Nothing here reads storage, writes events or calls a summarizer; `sessions/_context.py` does.
A decision never separates a tool result from the call it answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from eventlog import events as ev
from sessions._context_policy import ContextPolicy, summary_chars_max
from sessions._messages import (
    answers_call,
    is_tool_result,
    text_of,
    to_dict,
    tool_result_ids,
    tool_use_ids,
)

SOFT_TRIM = "soft_trim"
HARD_CLEAR = "hard_clear"
DOOM_LOOP_KEY = "doom_loop"
"""The metadata key of a doom-loop warning message (its reason, tool and repeats)."""

Ref = tuple[int, int]


# Checkpoints


def checkpoint_split(messages: list[ev.Message], keep_turns: int) -> int | None:
    """Index of the first message to keep when the older ones are summarized: the start of the
    last `keep_turns` turns (a turn starts at a user message that is not synthetic and holds no
    `tool_result` block), moved back so no tool result is kept without its call. None when
    nothing older is left to summarize (the view's own checkpoint pair alone is not worth
    summarizing again)."""
    starts = [
        index
        for index, message in enumerate(messages)
        if message.role == "user"
        and not message.synthetic
        and not message.summary
        and not answers_call(message)
    ]
    if keep_turns == 0:
        split = len(messages)
    elif len(starts) <= keep_turns:
        return None
    else:
        split = starts[-keep_turns]
    split = _keep_calls_with_results(messages, split)
    older = messages[:split]
    if not any(not message.summary for message in older):
        return None
    return split


def _keep_calls_with_results(messages: list[ev.Message], split: int) -> int:
    while split > 0:
        anonymous = split < len(messages) and messages[split].role == "tool"
        if anonymous and messages[split].tool_call_id is None:
            split -= 1  # a result without an id belongs to the message before it
            continue
        wanted = set().union(*(tool_result_ids(m) for m in messages[split:]))
        earlier = next(
            (index for index in range(split) if tool_use_ids(messages[index]) & wanted), None
        )
        if earlier is None:
            return split
        split = earlier
    return split


def boundary_message(count: int) -> ev.Message:
    return ev.Message(
        role="user",
        content=f"[context checkpoint: the {count} earlier messages are summarized next]",
        synthetic=True,
        summary=True,
        metadata={"context_checkpoint": {"summarized": count}},
    )


def summary_message(answer: object, where: str) -> ev.Message:
    """The assistant summary from what a summarizer returned; `ValueError` saying what came when
    it is not a summary (recorded as a failure, never raised to the caller)."""
    model = None
    usage: ev.Usage | None = None
    if isinstance(answer, Mapping):
        content = answer.get("content")
        found_model = answer.get("model")
        model = found_model if isinstance(found_model, str) else None
        raw_usage = answer.get("usage")
        if isinstance(raw_usage, Mapping):
            counts: dict[str, int] = {
                str(k): v for k, v in raw_usage.items() if type(v) is int and k in _USAGE_KEYS
            }
            usage = ev.Usage(
                input_tokens=counts.get("input_tokens", 0),
                output_tokens=counts.get("output_tokens", 0),
                reasoning_tokens=counts.get("reasoning_tokens", 0),
                cache_read_tokens=counts.get("cache_read_tokens", 0),
                cache_write_tokens=counts.get("cache_write_tokens", 0),
            )
    else:
        content = answer
    if not isinstance(content, str) or not content.strip():
        raise ValueError(f"{where}: expected a non-empty str summary, got {type(content).__name__}")
    if len(content) > summary_chars_max:
        raise ValueError(
            f"{where}: the summary has {len(content)} characters, "
            f"more than summary_chars_max = {summary_chars_max}"
        )
    return ev.Message(
        role="assistant", content=content, synthetic=True, summary=True, model=model, usage=usage
    )


_USAGE_KEYS = frozenset(
    ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_tokens", "cache_write_tokens")
)


# Pruning


def shown(message: ev.Message, result: ev.PrunedResult | None) -> ev.Message:
    """How a message appears in the context view under a recorded prune decision."""
    if result is None:
        return message
    if result.action == HARD_CLEAR:
        content = result.notice
    else:
        text = text_of(message.content)
        tail = text[len(text) - result.tail_chars :] if result.tail_chars else ""
        content = text[: result.head_chars] + result.notice + tail
    return msgspec.structs.replace(message, content=content)


def _tool_names(messages: list[ev.Message]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        for call in message.tool_calls or ():
            if isinstance(call, Mapping) and isinstance(call.get("id"), str):
                name = _call_name(call)
                if name is not None:
                    names[call["id"]] = name
    return names


def _is_skill(message: ev.Message, names: dict[str, str], policy: ContextPolicy) -> bool:
    if message.metadata.get("skill") is True:
        return True
    name = message.name
    if name is None and message.tool_call_id is not None:
        name = names.get(message.tool_call_id)
    return name is not None and name in policy.skill_tools


def protected_from(messages: list[ev.Message], keep_last_assistants: int) -> int:
    """Index from which nothing is pruned: the `keep_last_assistants`-th last assistant message
    (0 when there are fewer, so nothing is; the end when the setting is 0)."""
    if keep_last_assistants == 0:
        return len(messages)
    seen = 0
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "assistant":
            seen += 1
            if seen == keep_last_assistants:
                return index
    return 0


def plan_prunes(
    messages: list[ev.Message],
    refs: list[Ref],
    existing: Mapping[Ref, ev.PrunedResult],
    tokens: list[int],
    policy: ContextPolicy,
    count: Callable[[ev.Message], int],
    *,
    aggressive: bool,
) -> tuple[list[ev.PrunedResult], int, int]:
    """New prune decisions for the view, with the token totals before and after them.

    `tokens` are the counts of the view as it is shown now. Over the soft ratio every eligible
    result not yet pruned is soft-trimmed; if still over the hard ratio, eligible results are
    cleared, oldest first, until the total is at or under it.
    """
    soft_ratio = policy.aggressive_soft_trim_ratio if aggressive else policy.soft_trim_ratio
    hard_ratio = policy.aggressive_hard_clear_ratio if aggressive else policy.hard_clear_ratio
    chars_min = policy.aggressive_prunable_chars_min if aggressive else policy.prunable_chars_min
    before = sum(tokens) + policy.reserved_tokens
    total = before
    if total <= policy.tokens_at(soft_ratio):
        return [], before, before
    names = _tool_names(messages)
    eligible: list[int] = []
    for index in range(protected_from(messages, policy.keep_last_assistants)):
        message = messages[index]
        if not is_tool_result(message) or _is_skill(message, names, policy):
            continue
        found = existing.get(refs[index])
        if found is not None and found.action == HARD_CLEAR:
            continue
        if len(text_of(message.content)) >= chars_min:
            eligible.append(index)
    decided: dict[int, ev.PrunedResult] = {}
    current: dict[int, int] = {}  # tokens of the results soft-trimmed by this plan
    head, tail = policy.soft_trim_head_chars, policy.soft_trim_tail_chars
    for index in eligible:
        chars = len(text_of(messages[index].content))
        if refs[index] in existing or chars <= head + tail:
            continue
        notice = f"\n\n[... {chars - head - tail} characters of this tool result trimmed ...]\n\n"
        result = ev.PrunedResult(
            position=refs[index][0],
            index=refs[index][1],
            action=SOFT_TRIM,
            chars=chars,
            head_chars=head,
            tail_chars=tail,
            notice=notice,
        )
        decided[index] = result
        current[index] = count(shown(messages[index], result))
        total += current[index] - tokens[index]
    for index in eligible:
        if total <= policy.tokens_at(hard_ratio):
            break
        chars = len(text_of(messages[index].content))
        result = ev.PrunedResult(
            position=refs[index][0],
            index=refs[index][1],
            action=HARD_CLEAR,
            chars=chars,
            notice=f"[tool result cleared from the context: {chars} characters]",
        )
        total += count(shown(messages[index], result)) - current.get(index, tokens[index])
        decided[index] = result
    return [decided[index] for index in sorted(decided)], before, total


# Doom loops


def _call_name(call: Mapping[str, Any]) -> str | None:
    function = call.get("function")
    name = call.get("name")
    if name is None and isinstance(function, Mapping):
        name = function.get("name")
    return name if isinstance(name, str) else None


def _call_key(call: object) -> tuple[str, str] | None:
    """(tool, canonical arguments) of a tool call, ignoring its id; None if it names no tool."""
    if not isinstance(call, Mapping):
        return None
    name = _call_name(call)
    if name is None:
        return None
    function = call.get("function")
    arguments: object = None
    for key in ("arguments", "input", "args", "parameters"):
        if key in call:
            arguments = call[key]
            break
    else:
        if isinstance(function, Mapping):
            arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # arguments that are not JSON compare as the text they are
    return name, json.dumps(arguments, sort_keys=True, default=repr)


def _calls(message: ev.Message) -> list[tuple[str, str] | None]:
    calls: list[object] = list(message.tool_calls or ())
    if isinstance(message.content, list):
        calls.extend(
            {"name": block.get("name"), "input": block.get("input")}
            for block in message.content
            if isinstance(block, Mapping) and block.get("type") == "tool_use"
        )
    return [_call_key(call) for call in calls]


def doom_loop(messages: list[ev.Message], repeats: int) -> tuple[str, int] | None:
    """``(tool, run)`` when the last `run` >= `repeats` tool calls are identical (same tool, same
    arguments) and consecutive, and no warning was given for this run yet; else None. A user
    message or an assistant message without calls ends a run; tool results do not."""
    run, key, first = 0, None, len(messages)
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "assistant":
            calls = _calls(message)
            if not calls:
                break
            stop = False
            for call in reversed(calls):
                if call is None or (key is not None and call != key):
                    stop = True
                    break
                key, run, first = call, run + 1, index
            if stop:
                break
        elif message.role == "user" and not message.synthetic:
            break
    if key is None or run < repeats:
        return None
    if any(DOOM_LOOP_KEY in message.metadata for message in messages[first:]):
        return None
    return key[0], run


def warning_message(tool: str, run: int) -> ev.Message:
    reason = f"the tool `{tool}` was called {run} times in a row with the same arguments"
    return ev.Message(
        role="user",
        content=(
            f"Warning: {reason}, and the result will not change. Stop repeating it: try a "
            "different tool or different arguments, or explain what is blocking you."
        ),
        synthetic=True,
        metadata={DOOM_LOOP_KEY: {"tool": tool, "repeats": run, "reason": reason}},
    )


def message_tokens(counter: Callable[[Mapping[str, Any]], int]) -> Callable[[ev.Message], int]:
    """The store's token counter applied to a `Message`."""

    def count(message: ev.Message) -> int:
        return int(counter(to_dict(message)))

    return count
