"""The delegation runtime: asyncio verbs to create, prompt, cancel, close and expire sessions.

Every state change is an event appended through the store's group commit (`sessions/_group.py`);
status, loops and usage are the runtime projection (`projections/_runtime.py`). Reads run in
worker threads. Nothing here runs store work on the event loop, and a call returns only after the
events it wrote are durable. Ephemeral sessions live in an in-memory store beside the durable one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from eventlog import CapacityError, InvalidArgumentError, UnknownSessionError, check_encodable
from eventlog import events as ev
from eventlog.errors import ConfigurationError, LeaseLostError
from projections import _runtime as rt
from sessions._checks import check_dict, iso
from sessions._group import GroupCommit, outcome
from sessions._ids import check_session_id
from sessions._retention import RetentionPolicy
from sessions._store import SessionStore
from sessions.runtime import _filters, _jobs, _limits, _replay
from sessions.runtime._args import (
    Hook,
    binding,
    call_hook,
    check_hook,
    check_id,
    check_loop,
    check_now,
    check_prompt,
    check_retention,
    check_seconds,
    check_spawn_ref,
    session_metadata,
)
from sessions.runtime._errors import InputRejectedError
from sessions.runtime._lease import RuntimeLease
from sessions.runtime._params import check_params
from sessions.runtime._prompting import (
    Flight,
    LoopOptions,
    PromptLoop,
    Tool,
    ToolCallHook,
    check_max_steps,
    check_tools,
    require_tools,
    scrub_key,
    user_message,
)
from sessions.runtime._providers import (
    MockProvider,
    Provider,
    ProviderRegistry,
)
from sessions.runtime._recorder import SessionRecord, read_record, usage_dict

T = TypeVar("T")
logger = logging.getLogger("sessionlog.runtime")


class Runtime:
    """Drives sessions of a `SessionStore` through providers, from one asyncio event loop.

    Use it as ``async with Runtime(store) as runtime:``; inside, a reaper closes expired and idle
    sessions every `reap_interval_s` (None: only when `reap` is called), then sweeps by `retention`
    (`SessionStore.sweep`). One per store: a second is refused with `LeaseHeldError`; starting
    fails the prompts a stopped one left in flight (``interrupted``); one that lost its lease
    cancels its prompts and refuses writes with `LeaseLostError` (`sessions/runtime/_lease.py`)."""

    def __init__(
        self,
        store: SessionStore,
        *,
        providers: ProviderRegistry | Iterable[Provider] | None = None,
        default_provider: str = "mock",
        ttl_s: float = _limits.ttl_s_default,
        idle_s: float = _limits.idle_s_default,
        max_sessions: int | None = None,
        on_session_close: Hook | None = None,
        input_filters: Iterable[_filters.InputFilter] = (),
        before_task: Hook | None = None,
        after_task: Hook | None = None,
        ephemeral_store: SessionStore | None = None,
        maintain_context: bool = True,
        before_step: Hook | None = None,
        after_step: Hook | None = None,
        doom_loop: str = "steer",
        reap_interval_s: float | None = _limits.reap_interval_s_default,
        retention: RetentionPolicy | None = None,
    ) -> None:
        if not isinstance(store, SessionStore):
            raise InvalidArgumentError(f"Runtime: store must be a SessionStore, got {store!r:.80}")
        if providers is None:
            providers = ProviderRegistry([MockProvider()])
        elif not isinstance(providers, ProviderRegistry):
            providers = ProviderRegistry(providers)
        self.providers = providers
        self.default_provider = default_provider
        providers.get(default_provider, "Runtime: default_provider")
        self.ttl_s = check_seconds(ttl_s, "ttl_s")
        self.idle_s = check_seconds(idle_s, "idle_s")
        if max_sessions is not None and (
            isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1
        ):
            raise InvalidArgumentError(
                f"Runtime: max_sessions must be an int >= 1: {max_sessions!r}"
            )
        self.max_sessions = max_sessions
        self._on_close = check_hook(on_session_close, "on_session_close")
        self._before_task = check_hook(before_task, "before_task")
        self._after_task = check_hook(after_task, "after_task")
        # Around each model call of a prompt (tool loop or not): `before_step({session_id,
        # request_id, step})`, then `after_step({..., stop_reason, tool_calls, results})`.
        self._before_step = check_hook(before_step, "before_step")
        self._after_step = check_hook(after_step, "after_step")
        self._filters = _filters.check_filters(input_filters)
        self.store = store
        self._own_ephemeral = ephemeral_store is None
        self.ephemeral_store = ephemeral_store or SessionStore.memory()
        self._ephemeral_ids: set[str] = set()
        self._flights: dict[str, Flight] = {}
        self._prompting: set[asyncio.Event] = set()  # `prompt` calls running, for `stop`
        self._stopping = False
        self._create_lock: asyncio.Lock | None = None
        self.recovered: list[str] = []
        self._lease = RuntimeLease()
        # After each turn the context policy runs (`SessionStore.maintain_context`): doom loops,
        # checkpoints, pruning; aggressive after a provider's `ContextLengthError`.
        self.maintain_context = bool(maintain_context)
        if doom_loop not in ("steer", "stop"):
            raise ConfigurationError(f"Runtime: `doom_loop` must be steer or stop: {doom_loop!r}")
        self.doom_loop = doom_loop
        """A doom-loop warning's effect on a tool loop: ``steer`` (it joins the transcript and the
        model goes on) or ``stop`` (the loop ends, stop reason ``doom_loop``)."""
        self.reap_interval_s = (
            None if reap_interval_s is None else check_seconds(reap_interval_s, "reap_interval_s")
        )
        self._reaper: asyncio.Task[None] | None = None
        self.retention = check_retention(retention)

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Take the `runtime` lease, start the writers, fail the prompts left in flight."""
        if self._lease.held:  # started: a runtime holds its leases exactly while it runs
            return
        await asyncio.to_thread(self._lease.hold, self.store, self.ephemeral_store)
        self._create_lock = asyncio.Lock()
        self._stopping = False
        self._lease.watch(self._flights)
        try:
            for store in (self.store, self.ephemeral_store):
                self.recovered.extend(await self._write(store, partial(_jobs.recover, store)))
        except BaseException:  # not started after all: keep no lease, and no watcher, from it
            self._lease.release()
            raise
        if self.recovered:
            logger.warning("marked %d interrupted prompts failed", len(self.recovered))
        if self.reap_interval_s is not None:
            self._reaper = asyncio.create_task(self._reap_forever(self.reap_interval_s))

    async def _reap_forever(self, interval_s: float) -> None:
        """Every `interval_s`, close the sessions past their TTL (``expired``) or idle limit
        (``idle``) and sweep by `retention`; a failed round is logged, a lost lease ends it."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self._lease.lost()  # the sweep writes too: nothing more once the lease is lost
                closed = await self.reap()
                if self.retention is not None:  # the durable store's closed sessions
                    await asyncio.to_thread(self.store.sweep, self.retention)
            except LeaseLostError:
                return
            except Exception:  # a store error must not end the reaper for good
                logger.exception("the periodic reaper failed; trying again in %.1fs", interval_s)
                continue
            if closed:
                logger.info("the reaper closed %d sessions", len(closed))

    async def stop(self) -> None:
        """Stop the reaper, cancel the prompts still running (each waits for its last writes),
        refuse writes from then on, and release the lease. From its first step on, `prompt`
        starts nothing: a retry answers the outcome its request recorded (one waiting for a
        prompt this cancels gets that cancellation), a request with none recorded gets
        `RuntimeStoppedError`; `stop` returns once every `prompt` call has."""
        self._stopping = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for flight in list(self._flights.values()):
            flight.cancel("shutdown")
        for flight in list(self._flights.values()):
            await flight.done.wait()
        while self._prompting:  # the retries that waited for them, reading what they recorded
            await next(iter(self._prompting)).wait()
        for provider in self.providers.all():
            closer = getattr(provider, "aclose", None)
            if closer is not None:
                await call_hook(closer, f"`{provider.name}`.aclose")
        self._lease.release()  # writes are refused from here on
        if self._own_ephemeral:
            self.ephemeral_store.close()

    def _group(self, store: SessionStore) -> GroupCommit:
        """The group commit of `store`, which every write of the runtime goes through."""
        if not self._lease.held:
            raise InvalidArgumentError("the runtime is not started: use `async with Runtime(...)`")
        self._lease.lost()  # another runtime may hold the store now: write nothing more
        return store._group

    def _store_of(self, session_id: str) -> SessionStore:
        return self.ephemeral_store if session_id in self._ephemeral_ids else self.store

    async def _write(self, store: SessionStore, fn: Callable[[], T]) -> T:
        value, interrupted = await outcome(self._group(store).submit(fn))
        if interrupted:
            raise asyncio.CancelledError
        return value

    async def _read(self, store: SessionStore, fn: Callable[[Any], T]) -> T:
        def run() -> T:
            with store.log.view() as view:
                return fn(view)

        return await asyncio.to_thread(run)

    # Sessions

    async def create(
        self,
        agent_id: str,
        *,
        provider: str | None = None,
        runtime_params: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        scope: str = "persistent",
        parent_spawn_ref: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        formation: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Open a session bound to `provider` (the default when None); returns its status record.

        `runtime_params` are the session's layer, between the provider's defaults and each
        prompt's. Seed 002's form works too: ``metadata={"provider": ..., "runtimeParams":
        {...}}`` (camelCase); an unregistered provider is refused with `ConfigurationError`.
        `scope="ephemeral"` keeps the session in memory only: a restart forgets it.
        `parent_spawn_ref` (``{session_id, loop_id, tool_call_id}``) marks a sub-agent session;
        the parent's loop then lists it among its children.
        """
        if not isinstance(agent_id, str) or not agent_id:
            raise InvalidArgumentError(f"create: `agent_id` must be a non-empty str: {agent_id!r}")
        extra = check_dict(metadata, "metadata", "create")
        name, params = binding(
            self.providers, self.default_provider, provider, runtime_params, extra
        )
        if scope not in ("persistent", "ephemeral"):
            raise InvalidArgumentError(
                f"create: `scope` must be persistent or ephemeral: {scope!r}"
            )
        sid = None if session_id is None else check_session_id(session_id, where="create")
        made = check_dict(formation, "formation", "create") or {"kind": "explicit"}
        made.setdefault("timestamp", iso(datetime.now(UTC)))
        options: dict[str, Any] = {"scope": scope, "formation": made}
        spawn = check_spawn_ref(parent_spawn_ref)
        if spawn is not None:
            options["parent_spawn_ref"] = spawn
        check_encodable(extra, what="create: `metadata`")
        store = self.ephemeral_store if scope == "ephemeral" else self.store
        self._group(store)  # refuses before any work when the runtime is not started
        assert self._create_lock is not None, "start() made the lock"
        async with self._create_lock:  # capacity spans both stores: creates take turns
            if self.max_sessions is not None:
                count = await self.open_sessions()
                if count >= self.max_sessions:
                    raise CapacityError(
                        f"create: the runtime holds max_sessions = {self.max_sessions} open "
                        "sessions; close or reap some first"
                    )
            job = partial(_jobs.open_session, store, sid, agent_id, name, params, extra, options)
            created = await self._write(store, job)
            if scope == "ephemeral":
                self._ephemeral_ids.add(created["session_id"])
        return created

    async def adopt(
        self,
        session_id: str,
        *,
        provider: str | None = None,
        agent_id: str | None = None,
        runtime_params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Drive a session the runtime did not create (seeded from a transcript, imported from a
        bundle, opened with `store.open_session`): from here on `prompt` sends its transcript
        to `provider` (the default when None). Recorded as `runtime_adopted`; adopting a session
        already driven with the same provider changes nothing. Returns its status record."""
        sid = check_session_id(session_id, where="adopt")
        name = self.default_provider if provider is None else provider
        if not isinstance(name, str):
            raise InvalidArgumentError(f"adopt: `provider` must be a str, got {name!r}")
        self.providers.get(name, "adopt")
        if agent_id is not None and (not isinstance(agent_id, str) or not agent_id):
            raise InvalidArgumentError(f"adopt: `agent_id` must be a non-empty str: {agent_id!r}")
        params = check_params(runtime_params, "adopt")
        store = self._store_of(sid)
        job = partial(_jobs.adopt_session, store, sid, name, agent_id, params)
        return await self._write(store, job)

    async def status(self, session_id: str) -> dict[str, Any]:
        """``{session_id, agent_id, status, created_at, last_activity_at, ...}`` of an open
        session; `UnknownSessionError` for a closed or unknown one."""
        sid = check_session_id(session_id, where="status")
        store = self._store_of(sid)
        job = partial(_jobs.info, session_id=sid, verb="status", sealer=store._sealer)
        return await self._read(store, job)

    async def open_sessions(self) -> int:
        """How many runtime sessions are open, in both stores."""
        count = 0
        for each in (self.store, self.ephemeral_store):
            count += await self._read(each, rt.open_runtime_count)
        return count

    async def record(self, session_id: str) -> SessionRecord:
        """The loop recorder's view of a session, open or closed (seed 003)."""
        sid = check_session_id(session_id, where="record")
        stores = [self._store_of(sid)]
        if stores[0] is self.store:  # not found there, it may be in the ephemeral store
            stores.append(self.ephemeral_store)
        for store in stores:
            job = partial(read_record, session_id=sid, sealer=store._sealer)
            if (found := await self._read(store, job)) is not None:
                return found
        raise UnknownSessionError(sid, "record")

    async def total_usage(self) -> dict[str, int]:
        """Usage summed over every loop of both stores (the ephemeral one since this start)."""
        total = await self._read(self.store, rt.total_usage)
        total = total + await self._read(self.ephemeral_store, rt.total_usage)
        return usage_dict(total)

    async def close(self, session_id: str, *, reason: str = "closed") -> dict[str, Any]:
        """Close a session, cancelling its prompt if one is running; afterwards the session is not
        found, except by a retry of a request it ran, which answers what that run recorded. Calls
        `after_task(record)` and `on_session_close(session_id, reason)`."""
        sid = check_session_id(session_id, where="close")
        flight = self._flights.get(sid)
        if flight is not None:
            flight.cancel(reason)
            await flight.done.wait()
        store = self._store_of(sid)
        last = await self._write(store, partial(_jobs.close_session, store, sid, reason, "close"))
        self._ephemeral_ids.discard(sid)
        if self._after_task is not None:
            await call_hook(self._after_task, "after_task", await self.record(sid))
        await call_hook(self._on_close, "on_session_close", sid, reason)
        return {"closed": True, "session_id": sid, "reason": reason, "status": last["status"]}

    async def reap(self, now: datetime | None = None) -> list[dict[str, str]]:
        """Close every session past its TTL (reason ``expired``, cancelling a running prompt) or
        idle past `idle_s` (reason ``idle``), as of `now`; returns what it closed."""
        at = check_now(now, "reap")
        closed: list[dict[str, str]] = []
        for store in (self.store, self.ephemeral_store):
            due = await self._read(
                store, partial(_jobs.expired, now=at, ttl_s=self.ttl_s, idle_s=self.idle_s)
            )
            for sid, reason, _ in due:
                try:
                    await self.close(sid, reason=reason)
                except UnknownSessionError:
                    continue  # closed by someone else meanwhile
                closed.append({"session_id": sid, "reason": reason})
        return closed

    async def rotate_if_inactive(
        self, session_id: str, threshold_s: float, now: datetime | None = None
    ) -> str:
        """If the session has been idle for `threshold_s` or more, close it (reason ``rotated``)
        and return a new session of the same agent, provider and parameters, formed by
        ``inactivity_timeout`` and pointing back to it; else return `session_id`."""
        threshold = check_seconds(threshold_s, "threshold_s")
        at = check_now(now, "rotate_if_inactive")
        current = await self.status(session_id)
        last = datetime.fromisoformat(current["last_activity_at"])
        if (at - last).total_seconds() < threshold or current["status"] == rt.BUSY:
            return str(current["session_id"])
        store = self._store_of(current["session_id"])
        record = await self.record(current["session_id"])
        metadata = await self._read(store, partial(session_metadata, session_id=record.session_id))
        params = metadata.pop("runtime_params", None)
        metadata.pop("provider", None)
        fresh = await self.create(
            record.agent_id or "agent",
            provider=record.provider,
            runtime_params=params if isinstance(params, dict) else None,
            metadata=metadata,
            scope=record.scope,
            formation={
                "kind": "inactivity_timeout",
                "threshold_secs": threshold,
                "previous_session_id": record.session_id,
                "timestamp": iso(at),
            },
        )
        await self.close(record.session_id, reason="rotated")
        return str(fresh["session_id"])

    # Prompts

    async def prompt(
        self,
        session_id: str,
        prompt: str,
        runtime_params: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
        loop_id: str | None = None,
        parent_loop_id: str | None = None,
        parallel_group: str | None = None,
        tools: Iterable[Tool | Mapping[str, Any]] | None = None,
        max_steps: int = _limits.max_steps_default,
        on_tool_call: ToolCallHook | None = None,
        files: Iterable[Any] | None = None,
    ) -> dict[str, Any]:
        """Send `prompt` to the session's provider and wait for the answer:
        ``{text, stop_reason, request_id, loop_id, tool_calls, usage, steps}``.

        With `tools`, the runtime runs the loop: the model's tool calls run (in parallel when it
        asks for several), their results go back to it, until it answers without calling a tool
        or `max_steps` model calls were made (stop reason ``max_steps``). A `Tool` without `fn`
        is answered by `on_tool_call({id, name, arguments})`. `files` (paths, or ``{path, name,
        mime_type}``; at most 10) are attached to the prompt and sent in each provider's form.

        Refused with `SessionBusyError` while another prompt runs (never queued). A provider
        failure is recorded as `prompt_failed` (`ProviderError`; after a transient one the
        session is idle again), a cancellation as `prompt_cancelled` (`PromptCancelledError`, or
        `CancelledError` when the caller itself was cancelled). A loop continues the session's
        previous loop unless `parent_loop_id` says otherwise.

        A `request_id` is idempotent per session: a retry with one the session already ran calls
        no model and answers that run's recorded outcome (its result, or the error it raised),
        after waiting for it if it is still running, and also after the session was closed; the
        same id with another prompt (text or files) is refused with `RequestConflictError`, and
        nothing is written. Once `stop` has begun, nothing starts: a retry (one already waiting
        included) answers the outcome its request recorded, and a prompt whose request has none
        raises `RuntimeStoppedError`.
        """
        sid = check_session_id(session_id, where="prompt")
        text = check_prompt(prompt, "prompt")
        params = check_params(runtime_params, "prompt")
        rid = check_id(request_id, "request_id", "prompt")
        loop = check_loop(loop_id, parent_loop_id, parallel_group, "prompt")
        options = LoopOptions(
            tools=check_tools(tools, on_tool_call, "prompt"),
            max_steps=check_max_steps(max_steps, "prompt"),
            on_tool_call=on_tool_call,
        )
        message = user_message(text, files, "prompt")
        _replay.check_request(sid, rid)
        with _replay.underway(self._prompting):  # `stop` waits for it
            store = self._store_of(sid)
            if options.tools and not self._stopping:
                await self._check_tools_supported(store, sid)
            reader = partial(self._read, store)
            replay = await _replay.join(
                self._flights, store, sid, rid, message, reader, lambda: self._stopping
            )
            if replay is not None:  # else nothing suspends from here until the flight is ours
                return replay.result()
            warnings = await self._screen(store, sid, rid, text)
            flight = self._flights[sid] = Flight(request_id=rid, prompt=message)
            try:
                return await PromptLoop(self, store, sid, flight, options).run(
                    message, params, loop, warnings
                )
            finally:
                if self._flights.get(sid) is flight:
                    del self._flights[sid]
                flight.done.set()

    async def _screen(self, store: SessionStore, sid: str, rid: str, text: str) -> list[Any]:
        """The input filters' warnings about `text`; a rejection is recorded, then raised (with
        no rejection, nothing here suspends)."""
        warnings, rejection = _filters.screen(self._filters, text)
        if rejection is not None:
            await self._write(store, partial(_jobs.reject_input, store, sid, rid, *rejection))
            raise InputRejectedError(sid, *rejection)
        return warnings

    async def _check_tools_supported(self, store: SessionStore, sid: str) -> None:
        found = await self._read(store, partial(rt.load_runtime, session_id=sid))
        if found is None:
            raise UnknownSessionError(sid, "prompt")
        provider = self.providers.get(found.provider, "prompt")
        require_tools(provider, "prompt")

    async def _call_before_task(self, info: dict[str, Any]) -> None:
        await call_hook(self._before_task, "before_task", info)

    async def _call_step_hook(self, name: str, info: dict[str, Any]) -> None:
        hook = self._before_step if name == "before_step" else self._after_step
        await call_hook(hook, name, info)

    async def _maintain(
        self, store: SessionStore, sid: str, *, context_error: bool = False
    ) -> dict[str, Any] | None:
        """Run the context policy after a turn (or a round of tool results) in a worker thread:
        a summarizer model holds up neither the loop nor the writer. None when it is off."""
        if not self.maintain_context:
            return None
        self._lease.lost()  # it writes (checkpoints, prunes): nothing once the lease is lost
        return await asyncio.to_thread(store.maintain_context, sid, context_error=context_error)

    def _defaults(self, session_id: str, provider: str) -> Mapping[str, Any]:
        return self.providers.get(provider, f"prompt to `{session_id}`").defaults

    async def _finish(self, store: SessionStore, sid: str, rid: str, event: ev.Event) -> bool:
        written, _ = await outcome(
            self._group(store).submit(partial(_jobs.finish_prompt, store, sid, rid, event))
        )
        return written

    async def _fail(self, store: SessionStore, sid: str, rid: str, error: str, kind: str) -> None:
        text = self._scrub(error)[: _limits.prompt_chars_max]
        await self._finish(store, sid, rid, ev.PromptFailed(request_id=rid, error=text, kind=kind))

    def _scrub(self, text: str) -> str:
        """`text` without the API key of any provider: the runtime's own backstop, so a failure
        is never recorded (nor raised) with a key an error body or a stream echoed. Like the
        transport's error text, it is cut to `ERROR_TEXT_MAX` characters then."""
        for provider in self.providers.all():
            text = scrub_key(provider, text)
        return text

    async def cancel(self, session_id: str, request_id: str) -> bool:
        """Cancel the prompt `request_id` if it is running; True once `prompt_cancelled` is
        recorded, False if that request is not running (finished, or never started)."""
        sid = check_session_id(session_id, where="cancel")
        flight = self._flights.get(sid)
        if flight is None or flight.request_id != request_id:
            await self.status(sid)  # an unknown session is an error, a finished request is not
            return False
        flight.cancel("cancelled")
        await flight.done.wait()
        return flight.cancelled  # the prompt may have ended otherwise before the cancel landed

    async def delegate(
        self,
        agent_id: str,
        prompt: str,
        *,
        provider: str | None = None,
        runtime_params: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        scope: str = "persistent",
    ) -> dict[str, Any]:
        """Create a session (formation ``first_loop``), prompt it once, close it (reason
        ``delegated``, or ``failed`` when the prompt raised); returns the prompt's result with
        ``session_id``."""
        created = await self.create(
            agent_id,
            provider=provider,
            metadata=metadata,
            scope=scope,
            formation={"kind": "first_loop"},
        )
        sid = created["session_id"]
        try:
            result = await self.prompt(sid, prompt, runtime_params)
        except BaseException:
            await asyncio.shield(self._close_quietly(sid, "failed"))
            raise
        await self.close(sid, reason="delegated")
        return result

    async def _close_quietly(self, sid: str, reason: str) -> None:
        try:
            await self.close(sid, reason=reason)
        except UnknownSessionError:
            return  # already closed: what was wanted
