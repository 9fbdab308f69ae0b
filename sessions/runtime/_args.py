"""Argument checks of the runtime's verbs, and the provider's answer as the events record it.

Every check raises `InvalidArgumentError` (or `ConfigurationError`) naming the verb, the argument,
what was expected and what came. Nothing here touches storage or awaits.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import projections as pj
from eventlog import InvalidArgumentError, LogView, to_builtins
from eventlog import events as ev
from eventlog.errors import ConfigurationError
from eventlog.limits import check_at_most
from sessions._checks import check_dict
from sessions._ids import uuid7
from sessions._messages import to_message
from sessions._retention import RetentionPolicy
from sessions.runtime import _limits
from sessions.runtime._params import check_params, merge_params, wire_params
from sessions.runtime._providers import ECHOED, Completion, ProviderRegistry

Hook = Callable[..., object]
logger = logging.getLogger("sessionlog.runtime")


def check_id(value: object, name: str, where: str) -> str:
    if value is None:
        return uuid7()
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidArgumentError(f"{where}: `{name}` must be a non-empty str, got {value!r}")
    check_at_most(
        len(value), _limits.request_id_chars_max, "request_id_chars_max", f"{where}: `{name}`"
    )
    return value


def check_loop(
    loop_id: object, parent_loop_id: object, parallel_group: object, where: str
) -> tuple[str, str | None, str | None]:
    """A prompt's loop ids: its own (fresh when not given), its parent's and its group's."""
    return (
        check_id(loop_id, "loop_id", where),
        None if parent_loop_id is None else check_id(parent_loop_id, "parent_loop_id", where),
        None if parallel_group is None else check_id(parallel_group, "parallel_group", where),
    )


def check_prompt(prompt: object, where: str) -> str:
    if not isinstance(prompt, str) or not prompt:
        raise InvalidArgumentError(f"{where}: `prompt` must be a non-empty str, got {prompt!r:.80}")
    check_at_most(len(prompt), _limits.prompt_chars_max, "prompt_chars_max", f"{where}: prompt")
    return prompt


def check_seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgumentError(f"Runtime: `{name}` must be a number of seconds > 0: {value!r}")
    return float(value)


def check_hook(hook: object, name: str) -> Hook | None:
    if hook is not None and not callable(hook):
        raise ConfigurationError(f"Runtime: `{name}` must be callable, got {type(hook).__name__}")
    return hook


def check_retention(policy: object) -> RetentionPolicy | None:
    """The runtime's retention policy (what its reaper sweeps by), or None."""
    if policy is not None and not isinstance(policy, RetentionPolicy):
        raise ConfigurationError(f"Runtime: `retention` must be a RetentionPolicy: {policy!r}")
    return policy


def check_now(now: object, where: str) -> datetime:
    if now is None:
        return datetime.now(UTC)
    if not isinstance(now, datetime) or now.tzinfo is None:
        raise InvalidArgumentError(f"{where}: `now` must be a timezone-aware datetime, got {now!r}")
    return now


def check_spawn_ref(ref: object) -> dict[str, Any] | None:
    if ref is None:
        return None
    data = check_dict(ref, "parent_spawn_ref", "create", optional=False)
    if not isinstance(data.get("session_id"), str):
        raise InvalidArgumentError(
            f"create: `parent_spawn_ref` needs the parent's `session_id` (a str), got {ref!r:.120}"
        )
    for name in ("loop_id", "tool_call_id"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise InvalidArgumentError(f"create: `parent_spawn_ref.{name}` must be a str or None")
    return data


def reply_of(completion: object, where: str) -> tuple[ev.Message, ev.Usage, str]:
    """The provider's answer as the assistant message to record, its usage and stop reason."""
    if not isinstance(completion, Completion):
        raise InvalidArgumentError(
            f"{where}: the provider returned {type(completion).__name__}, not a Completion"
        )
    if not isinstance(completion.text, str) or not isinstance(completion.stop_reason, str):
        raise InvalidArgumentError(f"{where}: a Completion needs str `text` and `stop_reason`")
    usage = {k: v for k, v in dict(completion.usage).items() if v is not None}
    for name, count in usage.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgumentError(f"{where}: usage `{name}` must be an int >= 0: {count!r}")
    fields: dict[str, Any] = {"role": "assistant", "content": completion.text, "usage": usage}
    if completion.tool_calls:
        fields["tool_calls"] = [dict(call) for call in completion.tool_calls]
    if completion.model is not None:
        fields["model"] = completion.model
    if completion.echoed:
        fields["metadata"] = {ECHOED: [dict(block) for block in completion.echoed]}
    message = to_message(fields, where=where)
    return message, message.usage or ev.Usage(), completion.stop_reason


def binding(
    providers: ProviderRegistry,
    default_provider: str,
    provider: str | None,
    runtime_params: Mapping[str, Any] | None,
    metadata: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """The provider a new session is bound to and its layer of parameters, from `create`'s
    keyword arguments and seed 002's ``metadata.provider`` / ``metadata.runtimeParams``
    (removed from `metadata`; the keyword arguments win field by field)."""
    named = metadata.pop("provider", None)
    if named is not None and not isinstance(named, str):
        raise InvalidArgumentError(f"create: `metadata.provider` must be a str, got {named!r}")
    if provider is not None and named is not None and provider != named:
        raise ConfigurationError(
            f"create: `provider` {provider!r} and `metadata.provider` {named!r} disagree"
        )
    name = provider or named or default_provider
    if not isinstance(name, str):
        raise InvalidArgumentError(f"create: `provider` must be a str, got {name!r}")
    providers.get(name, "create")
    layer = wire_params(metadata.pop("runtimeParams", None), "create: metadata.runtimeParams")
    stored = wire_params(metadata.pop("runtime_params", None), "create: metadata.runtime_params")
    params = merge_params(stored, layer, check_params(runtime_params, "create"))
    return name, params


def session_metadata(view: LogView, session_id: str) -> dict[str, Any]:
    state = pj.load_state(view, session_id)
    return {} if state is None else dict(to_builtins(state.metadata))


async def call_hook(hook: Hook | None, name: str, *args: object) -> None:
    """Run a user hook; like the engine's subscribers, its failure is logged and never changes
    the outcome of the verb that fired it."""
    if hook is None:
        return
    try:
        result = hook(*args)
        if inspect.isawaitable(result):
            await result
    except Exception:  # a hook's bug must not undo a committed verb
        logger.exception("runtime hook %s failed", name)
