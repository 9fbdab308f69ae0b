"""One prompt, start to end: the model, the tool calls it asks for (run in parallel, each a child
loop of the prompt's loop), their results back to the model, until a final answer or
`max_steps` model calls.

Every step is an event: `prompt_started`, then per model call that asks for tools
`step_completed` with `tool_call_started` for each call (one commit), `tool_call_finished` as each
ends, and finally `prompt_completed` (or `prompt_failed` / `prompt_cancelled`). Whatever ends a
prompt early answers the calls still open first, so the transcript never holds a call without its
result. After each round of tool results the context policy runs; a doom-loop warning it records
reaches the model in the next step (``steer``) or ends the loop (``stop``). A cancel ends the loop
at the next await or step boundary: no tool starts and no completion is recorded after it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from eventlog import InvalidArgumentError, LimitExceededError, check_encodable, limits
from eventlog import events as ev
from eventlog.errors import ConfigurationError
from eventlog.limits import check_at_most
from projections import _runtime as rt
from projections._loop_usage import LoopUsage, loop_usage
from sessions._group import outcome
from sessions._ids import uuid7
from sessions._messages import to_message
from sessions._store import SessionStore
from sessions.runtime import _filters, _jobs, _limits, _wire
from sessions.runtime._args import reply_of
from sessions.runtime._errors import PromptCancelledError, ProviderError
from sessions.runtime._http import (
    HttpProvider,
    ProviderConnectionError,
    ProviderHTTPError,
    ProviderTimeoutError,
)
from sessions.runtime._providers import ContextLengthError, Provider
from sessions.runtime._recorder import usage_dict
from sessions.runtime._replay import Replay

if TYPE_CHECKING:
    from sessions.runtime._runtime import Runtime

ToolCallHook = Callable[[dict[str, Any]], object]
TOOL_ERROR = "tool_error"
"""The metadata key of a tool result that is an error (its kind): the Anthropic API gets
``is_error``."""
DROPPED_CALLS = "dropped_tool_calls"
"""The metadata key of a reply that asked for tools when none were offered: its calls, kept out
of the transcript (no result answers them, and an API refuses a call without one)."""
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass
class Flight:
    """A prompt this process is running: what `cancel` and `close` reach for. `cancelled` is
    True once its `prompt_cancelled` is recorded."""

    request_id: str
    prompt: ev.Message | None = None
    """The user's message, which a retry of the request must repeat (`_replay.join`)."""
    task: asyncio.Future[Any] | None = None
    cancel_reason: str | None = None
    cancelled: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if self.task is not None:
            self.task.cancel()


def failure_kind(exc: Exception) -> str:
    """The `prompt_failed` kind of a provider's exception, by its type. ``context_length`` and
    ``transient`` (what the transport retries, still failing once its retries ran out: 429 and
    5xx answers, timeouts, dropped connections and streams) leave the session idle for the caller
    to try again; an answer past one of the runtime's bounds (`LimitExceededError`: a stream
    line past `sse_line_bytes_max`) is ``invalid_reply``, as a reply too large to record is;
    anything else (401/403, a bad request, an unreadable answer) is ``provider``. Both fail it."""
    if isinstance(exc, ContextLengthError):
        return rt.CONTEXT_LENGTH
    if isinstance(exc, LimitExceededError):
        return "invalid_reply"
    if isinstance(exc, (ProviderTimeoutError, ProviderConnectionError)):
        return rt.TRANSIENT
    if isinstance(exc, (TimeoutError, ConnectionError)):  # a provider of the caller's own
        return rt.TRANSIENT
    status = exc.status if isinstance(exc, ProviderHTTPError) else None
    if status is not None and (status == 429 or status >= 500):
        return rt.TRANSIENT
    return "provider"


def scrub_key(provider: Provider, text: str) -> str:
    """`text` with `provider`'s API key (an HTTP provider's) replaced."""
    if isinstance(provider, HttpProvider):
        return provider.scrub(text)
    return text


@dataclass(frozen=True)
class Tool:
    """A tool a prompt offers the model: its `name`, the JSON Schema of its arguments, and `fn`,
    called with the arguments as keywords (awaited when it returns an awaitable). A tool without
    `fn` is run by the caller: the prompt's `on_tool_call(call)` answers it."""

    name: str
    fn: Callable[..., object] | None = None
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    description: str = ""

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }


@dataclass(frozen=True)
class LoopOptions:
    tools: dict[str, Tool]
    max_steps: int
    on_tool_call: ToolCallHook | None


def check_tools(
    tools: Iterable[Tool | Mapping[str, Any]] | None, on_tool_call: object, where: str
) -> dict[str, Tool]:
    """Tools by name, each checked: a name both APIs accept, an object schema, `fn` callable or
    `on_tool_call` given to answer it."""
    if tools is None:
        return {}
    if isinstance(tools, (str, bytes, Mapping)):
        raise InvalidArgumentError(f"{where}: `tools` must be a list of tools")
    found: dict[str, Tool] = {}
    for index, item in enumerate(tools):
        tool = _tool(item, f"{where}: tools[{index}]")
        if tool.name in found:
            raise InvalidArgumentError(f"{where}: two tools are named {tool.name!r}")
        if tool.fn is None and on_tool_call is None:
            raise ConfigurationError(
                f"{where}: tool {tool.name!r} has no `fn`, so `on_tool_call` must answer it"
            )
        found[tool.name] = tool
    check_at_most(len(found), _limits.tools_max, "tools_max", f"{where}: tools")
    if on_tool_call is not None and not callable(on_tool_call):
        raise ConfigurationError(f"{where}: `on_tool_call` must be callable")
    return found


def _tool(item: object, where: str) -> Tool:
    if isinstance(item, Mapping):
        unknown = set(item) - {"name", "fn", "parameters", "description"}
        if unknown:
            raise InvalidArgumentError(f"{where}: unknown tool fields {sorted(unknown)}")
        item = Tool(**item)
    if not isinstance(item, Tool):
        raise InvalidArgumentError(f"{where} must be a Tool or a dict, got {type(item).__name__}")
    if not isinstance(item.name, str) or not _NAME.match(item.name):
        raise InvalidArgumentError(f"{where}: a tool name is 1-64 of [A-Za-z0-9_-]: {item.name!r}")
    schema = item.parameters
    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        raise InvalidArgumentError(f"{where}: `parameters` must be a JSON Schema of an object")
    check_encodable(dict(schema), what=f"{where}.parameters")
    if item.fn is not None and not callable(item.fn):
        raise InvalidArgumentError(f"{where}: `fn` must be callable")
    if not isinstance(item.description, str):
        raise InvalidArgumentError(f"{where}: `description` must be a str")
    return item


def check_max_steps(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{where}: `max_steps` must be an int >= 1, got {value!r}")
    check_at_most(value, _limits.max_steps_max, "max_steps_max", f"{where}: max_steps")
    return value


def require_tools(provider: Provider, where: str) -> None:
    """`ConfigurationError` unless `provider` can be handed tools."""
    if not takes_tools(provider):
        raise ConfigurationError(
            f"{where}: provider `{provider.name}` takes no tools (its `complete` has no "
            "`tools` argument)"
        )


def user_message(text: str, files: object, where: str) -> ev.Message:
    """The user's message of a prompt: its text, with the checked `files` attached if any."""
    attached = check_files(files, where)
    if not attached:
        return ev.Message(role="user", content=text)
    return to_message({"role": "user", "content": text, "files": attached}, where=where)


def check_files(files: object, where: str) -> list[dict[str, Any]] | None:
    """Attached files as file references: each a path (str or Path) or ``{path, name?,
    mime_type?}`` naming an existing file; at most `files_per_message_max`."""
    if files is None:
        return None
    if isinstance(files, (str, bytes, Mapping)) or not isinstance(files, Iterable):
        raise InvalidArgumentError(f"{where}: `files` must be a list of paths or file references")
    refs: list[dict[str, Any]] = []
    for index, item in enumerate(files):
        ref = dict(item) if isinstance(item, Mapping) else {"path": item}
        raw = ref.get("path")
        if not isinstance(raw, (str, Path)) or not str(raw):
            raise InvalidArgumentError(f"{where}: files[{index}] needs a `path`, got {item!r:.80}")
        path = Path(raw)
        if not path.is_file():
            raise InvalidArgumentError(f"{where}: files[{index}]: no such file {str(path)!r}")
        ref["path"] = str(path)
        ref.setdefault("name", path.name)
        ref.setdefault("size_bytes", path.stat().st_size)
        refs.append(ref)
    check_at_most(
        len(refs), limits.files_per_message_max, "files_per_message_max", f"{where}: files"
    )
    return refs


def takes_tools(provider: Provider) -> bool:
    try:
        parameters = inspect.signature(provider.complete).parameters
    except (TypeError, ValueError):
        return False
    return "tools" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def result_text(value: object) -> str:
    """A tool's return value as the text of its result message."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[: _limits.tool_result_chars_max]


def _without_calls(reply: ev.Message) -> ev.Message:
    """`reply` without its tool calls, which move to its metadata: no tools were offered, so none
    runs, and a call left in the transcript without a result is refused by every API (a
    synthetic result would not do: Anthropic refuses `tool_use` blocks in a request that
    defines no tools)."""
    dropped = list(reply.tool_calls or ())
    return msgspec.structs.replace(
        reply, tool_calls=None, metadata={**reply.metadata, DROPPED_CALLS: dropped}
    )


def _check_recordable(reply: ev.Message, what: str) -> None:
    """`LimitExceededError` when `reply` is too large for the event that records it."""
    size = check_encodable(reply, what=what, plain=False)
    if size > _limits.reply_bytes_max:
        raise LimitExceededError(
            f"{what}, encoded", "reply_bytes_max", _limits.reply_bytes_max, size
        )


class _Stop(Exception):
    """The loop ends early with a final synthetic reply (max steps, doom loop)."""

    def __init__(self, stop_reason: str, text: str) -> None:
        super().__init__(text)
        self.stop_reason = stop_reason
        self.text = text


class PromptLoop:
    """Runs one prompt of a session for `Runtime.prompt`, from `prompt_started` on."""

    def __init__(
        self,
        runtime: Runtime,
        store: SessionStore,
        sid: str,
        flight: Flight,
        options: LoopOptions,
    ) -> None:
        self.runtime = runtime
        self.store = store
        self.sid = sid
        self.flight = flight
        self.rid = flight.request_id
        self.options = options
        self.total = LoopUsage()
        self.steps = 0
        self.children: dict[str, str] = {}

    async def run(
        self,
        prompt: ev.Message,
        params: dict[str, Any],
        loop: tuple[str, str | None, str | None],
        warnings: list[dict[str, Any]],
    ) -> dict[str, Any]:
        runtime, sid, rid = self.runtime, self.sid, self.rid
        start = partial(
            _jobs.start_prompt,
            self.store,
            sid,
            rid,
            prompt,
            partial(runtime._defaults, sid),
            params,
            loop,
            warnings,
        )
        started, interrupted = await outcome(runtime._group(self.store).submit(start))
        if isinstance(started, Replay):  # a retry: nothing was written, and no model is called
            if interrupted:
                raise asyncio.CancelledError
            return started.result()
        try:
            if interrupted or self.flight.cancel_reason is not None:
                raise asyncio.CancelledError
            if started.first:
                await runtime._call_before_task({"session_id": sid, "request_id": rid})
            provider = runtime.providers.get(started.provider, "prompt")
            reply, usage, stop_reason = await self._loop(provider, started)
        except asyncio.CancelledError:
            return await self._cancelled()
        except _Stop as stop:
            reply = ev.Message(role="assistant", content=stop.text, synthetic=True)
            usage, stop_reason = ev.Usage(), stop.stop_reason
        except Exception as exc:  # a failure not recorded yet must not leave the session busy
            await runtime._fail(self.store, sid, rid, f"{type(exc).__name__}: {exc}", "runtime")
            raise
        await self._complete(reply, usage, stop_reason)
        await runtime._maintain(self.store, sid)
        return {
            "session_id": sid,
            "text": _wire.text_of(reply.content),
            "stop_reason": stop_reason,
            "request_id": rid,
            "loop_id": started.loop_id,
            "tool_calls": list(reply.tool_calls or []),
            "usage": usage_dict(self.total),
            "steps": self.steps,
        }

    async def _complete(self, reply: ev.Message, usage: ev.Usage, stop_reason: str) -> None:
        """Record `prompt_completed`. A completion the log refuses (a reply too large for one
        event) is recorded as the failure it is, so the session never stays busy."""
        sid, rid = self.sid, self.rid
        done = ev.PromptCompleted(request_id=rid, reply=reply, stop_reason=stop_reason, usage=usage)
        try:
            written = await self.runtime._finish(self.store, sid, rid, done)
        except Exception as exc:  # recorded as a failure, then raised
            unrecordable = isinstance(exc, InvalidArgumentError)
            why = f"{type(exc).__name__}: {exc}"
            await self.runtime._fail(
                self.store, sid, rid, why, "invalid_reply" if unrecordable else "runtime"
            )
            if unrecordable:
                raise ProviderError(
                    f"prompt: the reply to request `{rid}` of `{sid}` cannot be recorded: "
                    + self.runtime._scrub(why)
                ) from exc
            raise
        if not written:
            raise PromptCancelledError(
                f"prompt: session `{sid}` was closed while request `{rid}` ran"
            )

    async def _cancelled(self) -> dict[str, Any]:
        reason = self.flight.cancel_reason or "the caller was cancelled"
        cancelled = ev.PromptCancelled(request_id=self.rid, reason=reason)
        self.flight.cancelled = await self.runtime._finish(
            self.store, self.sid, self.rid, cancelled
        )
        caller = asyncio.current_task()
        if caller is not None and caller.cancelling():
            raise asyncio.CancelledError
        raise PromptCancelledError(
            f"prompt: request `{self.rid}` of `{self.sid}` was cancelled ({reason})"
        ) from None

    async def _guard(self, awaitable: Awaitable[Any]) -> Any:
        """Await through a task `cancel` and `close` can reach; cancelling it cancels the work.
        A cancel that landed before (between two guarded awaits) stops the work from starting."""
        if self.flight.cancel_reason is not None:
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            elif isinstance(awaitable, asyncio.Future):
                awaitable.cancel()
            raise asyncio.CancelledError
        task = self.flight.task = asyncio.ensure_future(awaitable)
        try:
            return await task
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self.flight.task = None

    def _check_cancel(self) -> None:
        """End the loop if a cancel landed outside `_guard` (during a write, a hook, the context
        policy): no tool runs and no completion is recorded after it."""
        if self.flight.cancel_reason is not None:
            raise asyncio.CancelledError

    async def _loop(
        self, provider: Provider, started: _jobs.Started
    ) -> tuple[ev.Message, ev.Usage, str]:
        tools = self.options.tools
        specs = [tool.spec() for tool in tools.values()]
        messages = started.messages
        while True:
            self.steps += 1
            info = {"session_id": self.sid, "request_id": self.rid, "step": self.steps}
            await self.runtime._call_step_hook("before_step", dict(info))
            reply, usage, stop_reason = await self._model(provider, messages, started.params, specs)
            self.total = self.total + loop_usage(usage)
            self._check_cancel()
            if not tools and reply.tool_calls:
                reply = _without_calls(reply)
            calls = await self._calls(reply)
            info.update(stop_reason=stop_reason, tool_calls=[name for _, name, _ in calls])
            if not calls:
                await self.runtime._call_step_hook("after_step", {**info, "results": []})
                self._check_cancel()
                return reply, usage, stop_reason
            await self._step(reply, usage, stop_reason, calls)
            self._check_cancel()
            if self.steps >= self.options.max_steps:
                await self._skip(calls, "max_steps", "the loop reached max_steps")
                raise _Stop("max_steps", f"Stopped after {self.steps} steps (max_steps).")
            results = await self._guard(asyncio.gather(*(self._tool(call) for call in calls)))
            self._check_cancel()
            await self.runtime._call_step_hook("after_step", {**info, "results": results})
            report = await self.runtime._maintain(self.store, self.sid)
            self._check_cancel()
            if report and report.get("doom_loop") and self.runtime.doom_loop == "stop":
                raise _Stop("doom_loop", "Stopped: the same tool call kept repeating.")
            messages = await asyncio.to_thread(self.store.context, self.sid)

    async def _model(
        self,
        provider: Provider,
        messages: list[dict[str, Any]],
        params: dict[str, Any],
        specs: list[dict[str, Any]],
    ) -> tuple[ev.Message, ev.Usage, str]:
        where = f"prompt: provider `{provider.name}`"
        call = (
            provider.complete(messages, params, tools=specs)  # type: ignore[call-arg]
            if specs
            else provider.complete(messages, params)
        )
        try:
            completion = await self._guard(call)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any provider failure is recorded, then raised as ProviderError
            kind = failure_kind(exc)
            why = self.runtime._scrub(f"{type(exc).__name__}: {exc}")
            await self.runtime._fail(self.store, self.sid, self.rid, why, kind)
            if kind == rt.CONTEXT_LENGTH:
                await self.runtime._maintain(self.store, self.sid, context_error=True)
            raise ProviderError(
                f"prompt: provider `{provider.name}` failed on request `{self.rid}` of "
                f"`{self.sid}` ({kind}): {why}"
            ) from exc
        try:
            reply, usage, stop_reason = reply_of(completion, where)
            _check_recordable(reply, f"{where}: the reply to request `{self.rid}`")
        except InvalidArgumentError as exc:
            why = self.runtime._scrub(str(exc))
            await self.runtime._fail(self.store, self.sid, self.rid, why, "invalid_reply")
            raise ProviderError(why) from exc
        return reply, usage, stop_reason

    async def _calls(self, reply: ev.Message) -> list[tuple[str, str, dict[str, Any]]]:
        parsed = []
        for call in reply.tool_calls or ():
            try:
                parsed.append(_wire.call_parts(call, f"prompt: `{self.sid}`"))
            except ProviderHTTPError as exc:
                await self.runtime._fail(self.store, self.sid, self.rid, str(exc), "invalid_reply")
                raise ProviderError(str(exc)) from None
        return parsed

    async def _step(
        self,
        reply: ev.Message,
        usage: ev.Usage,
        stop_reason: str,
        calls: list[tuple[str, str, dict[str, Any]]],
    ) -> None:
        group = uuid7() if len(calls) > 1 else None
        self.children = {call_id: uuid7() for call_id, _, _ in calls}
        events: list[ev.Event] = [
            ev.StepCompleted(
                request_id=self.rid,
                step=self.steps,
                reply=reply,
                stop_reason=stop_reason,
                usage=usage,
            )
        ]
        events += [
            ev.ToolCallStarted(
                request_id=self.rid,
                call_id=call_id,
                name=name,
                arguments=arguments,
                loop_id=self.children[call_id],
                parallel_group=group,
            )
            for call_id, name, arguments in calls
        ]
        await self._record(events)

    async def _record(self, events: list[ev.Event]) -> None:
        job = partial(_jobs.record_step, self.store, self.sid, self.rid, events)
        if not await self.runtime._write(self.store, job):
            raise PromptCancelledError(
                f"prompt: session `{self.sid}` was closed while request `{self.rid}` ran"
            )

    async def _skip(
        self, calls: list[tuple[str, str, dict[str, Any]]], kind: str, why: str
    ) -> None:
        await self._record(
            [
                self._finished(call_id, name, f"error: not run ({why})", why, kind)
                for call_id, name, _ in calls
            ]
        )

    def _finished(
        self, call_id: str, name: str, text: str, error: str | None, kind: str | None
    ) -> ev.ToolCallFinished:
        result = ev.Message(
            role="tool",
            tool_call_id=call_id,
            name=name,
            content=text,
            metadata={} if error is None else {TOOL_ERROR: kind or "tool_error"},
        )
        return ev.ToolCallFinished(
            request_id=self.rid,
            call_id=call_id,
            loop_id=self.children.get(call_id),
            result=result,
            error=error,
            kind=kind,
        )

    async def _tool(self, call: tuple[str, str, dict[str, Any]]) -> str:
        call_id, name, arguments = call
        error: str | None = None
        kind: str | None = None
        tool = self.options.tools.get(name)
        try:
            if tool is None:
                raise LookupError(f"no tool named {name!r}")
            if tool.fn is not None:
                value = tool.fn(**arguments)
            else:
                assert self.options.on_tool_call is not None, "check_tools requires it"
                request = {"id": call_id, "name": name, "arguments": arguments}
                value = self.options.on_tool_call(request)
            if inspect.isawaitable(value):
                value = await value
            text = result_text(value)
        except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's to see
            error = f"{type(exc).__name__}: {exc}"[:500]
            kind = "unknown_tool" if tool is None else "tool_error"
            text = f"error: {error}"
        text, kind, error = self._screen(text, kind, error)
        await self._record([self._finished(call_id, name, text, error, kind)])
        return text

    def _screen(
        self, text: str, kind: str | None, error: str | None
    ) -> tuple[str, str | None, str | None]:
        """Input filters see each tool result before the model does; a rejected one is withheld."""
        _, rejection = _filters.screen(self.runtime._filters, text)
        if rejection is None:
            return text, kind, error
        name, reason = rejection
        return f"[result withheld by input filter {name}: {reason}]", "rejected", reason
