"""A `Session` for the OpenAI Agents SDK on sessionlog: `SessionlogSession(session_id, store=...)`.

Pass it where the SDK takes a session (`Runner.run(agent, input, session=...)`). Each item the SDK
adds is stored verbatim as one transcript item, so `get_items` gives back exactly what was added.
`add_items` is one atomic commit, so a batch is stored whole or not at all (on a new session id,
opening the session is part of that commit). Where a commit can end
with its outcome unknown (PostgreSQL, when the connection drops during COMMIT) it carries an
idempotency key and is retried under it, so a batch is never stored twice; an LMDB commit has
either happened or written nothing, so it needs no key (and stores none).
`fork(at_item=...)` returns a new session sharing the history's prefix without copying it.
With `compaction=ContextPolicy(summarizer=...)`, the SDK's compaction hook (`run_compaction`, called
after a turn) writes a summarization checkpoint when the history passes the policy's threshold, and
`get_items` gives the model the history from the latest checkpoint on (its summary, then the newer
items); the store keeps every item. `run_compaction({"force": True})` summarizes below the
threshold too. The summarizer (a plain function, or an `async def`) is never run on the store's
worker thread, so the other sessions' reads go on while it calls its model.

Wrapped in the SDK's `OpenAIResponsesCompactionSession`, the history is replaced by the output of
`responses.compact` in one atomic commit, through the two hooks that wrapper looks for
(`_atomic_replace_items`; `_get_compaction_snapshot`, whose suffix replacement refuses a suffix
changed meanwhile), and never as its fallback, `clear_session` then `add_items`: two commits, and
a process killed between them would leave the history empty. The log keeps the replaced items.
That wrapper calls the session it wraps without the run's context, so a routed session's hooks
act where its other calls from the wrapper do: on ``route(None, session_id)``.

Every method accepts the SDK's optional `wrapper` (the run's context); give `route` to pick the
stored session from it, e.g. one per tenant: ``route=lambda w, sid: f"{w.context.tenant}/{sid}"``.
Needs ``pip install 'sessionlog-engine[openai-agents]'``; the SDK is imported only when a session
is made.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

import projections as pj
from eventlog import OutcomeUnknownError
from integrations._common import async_store, require
from sessions import ContextPolicy, InvalidArgumentError, SessionStore, UnknownSessionError
from sessions._messages import item_copier
from sessions.aio import AsyncSessionStore

if TYPE_CHECKING:
    from agents import RunContextWrapper, TResponseInputItem
    from agents.memory import SessionSettings
    from agents.memory.session import _CompactionSnapshot

Route = Callable[["RunContextWrapper[Any] | None", str], str]

_ATTEMPTS = 3

_ITEM_VERBS = ("get_items", "add_items", "pop_item", "clear_session")
"""The methods through which items are stored and read; see `_stores_as_is`."""


class SessionlogSession:
    """The SDK's `Session` protocol (`get_items`, `add_items`, `pop_item`, `clear_session`,
    `session_settings`) on a sessionlog store."""

    def __init__(
        self,
        session_id: str,
        *,
        store: SessionStore | AsyncSessionStore | str | os.PathLike[str],
        session_settings: SessionSettings | dict[str, Any] | None = None,
        route: Route | None = None,
        compaction: ContextPolicy | None = None,
    ) -> None:
        require("agents", "openai-agents")
        from agents.memory import SessionSettings
        from agents.memory.session_settings import coerce_session_settings

        if not isinstance(session_id, str) or not session_id:
            raise InvalidArgumentError(
                f"SessionlogSession: `session_id` must be a non-empty str, got {session_id!r}"
            )
        self.session_id = session_id
        self.session_settings: SessionSettings | None = (
            SessionSettings()
            if session_settings is None
            else coerce_session_settings(session_settings)
        )
        self.store = async_store(store)
        self.route = route
        self.compaction = None if compaction is None else _for_items(compaction)
        self._opened: set[str] = set()

    def _sid(self, wrapper: RunContextWrapper[Any] | None) -> str:
        return self.session_id if self.route is None else self.route(wrapper, self.session_id)

    async def _ensure(self, sid: str) -> None:
        if sid not in self._opened:
            await self.store.open_session(sid)
            self._opened.add(sid)

    async def get_items(
        self, limit: int | None = None, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> list[TResponseInputItem]:
        """The history, oldest first; with `limit` (or the settings' limit) its last `limit`
        items, read without the ones before."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is not None and limit < 0:  # as SQLiteSession (SQLite's LIMIT -1): no limit
            limit = None
        sid = self._sid(wrapper)
        try:
            if self.compaction is None:
                return await self.store.run(_items, self.store.store, sid, limit)
            # the context view: from the latest summarization checkpoint on
            entries = await self.store.run(self.store.store.context, sid)
        except UnknownSessionError:
            return []
        if limit is not None:
            entries = entries[max(len(entries) - limit, 0) :] if limit > 0 else []
        return [_item_of(entry) for entry in entries]

    async def add_items(
        self,
        items: list[TResponseInputItem],
        *,
        wrapper: RunContextWrapper[Any] | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        """Append `items` in one atomic commit. On a backend where a commit's outcome can be
        unknown (the process cannot tell whether it happened), the commit carries an
        idempotency key and is retried under it, so it is applied once. Give `idempotency_key`
        to make your own retries safe as well."""
        if not items:
            return
        for index, item in enumerate(items):
            _check_item(index, item)
        sid = self._sid(wrapper)
        key = idempotency_key
        if key is None and self.store.store.log.outcome_may_be_unknown:
            key = uuid.uuid4().hex
        entries = [{"role": _role(item), "item": item} for item in items]
        for attempt in range(_ATTEMPTS):
            try:
                if sid in self._opened:
                    await self.store.inject_many(sid, entries, idempotency_key=key)
                else:  # open it in the same commit: a refused batch leaves no session behind
                    await self.store._write(_open_and_add, self.store.store, sid, entries, key)
                    self._opened.add(sid)
                return
            except UnknownSessionError:  # deleted meanwhile: open it again and retry
                self._opened.discard(sid)
                if attempt == _ATTEMPTS - 1:
                    raise
            except OutcomeUnknownError:
                if key is None or attempt == _ATTEMPTS - 1:
                    raise

    async def pop_item(
        self, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> TResponseInputItem | None:
        """Take the newest item off the history and return it (None when it is empty). The
        store's log keeps it: `store.as_of(position)` still shows it."""
        try:
            entry = await self.store.pop(self._sid(wrapper))
        except UnknownSessionError:
            return None
        return None if entry is None else _item_of(entry)

    async def clear_session(self, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Empty the history (the session id stays; the log keeps what was there)."""
        try:
            await self.store.reset(self._sid(wrapper))
        except UnknownSessionError:
            return

    async def run_compaction(
        self,
        args: Mapping[str, Any] | None = None,
        *,
        wrapper: RunContextWrapper[Any] | None = None,
    ) -> None:
        """The SDK's compaction hook: with a `compaction` policy, summarize the older turns into
        a checkpoint when the history is over the policy's threshold, or whenever `args` has
        ``force`` (`store.maintain_context`); without one, nothing. The summarizer is given SDK
        items and returns the summary text.

        `maintain_context` runs on a thread of its own, not the store's worker, so the other
        sessions' reads go on while the summarizer calls its model (an async summarizer runs in
        this loop); it commits the checkpoint only if the session is as summarized, and asks
        again if not."""
        if self.compaction is None:
            return
        rules = self.compaction
        if args is not None and args.get("force"):
            rules = _forced(rules)
        rules = dataclasses.replace(rules, summarizer=_on_items(rules.summarizer))
        try:
            await asyncio.to_thread(
                self.store.store.maintain_context, self._sid(wrapper), policy=rules
            )
        except UnknownSessionError:
            return

    async def _get_compaction_snapshot(
        self,
        limit: int,
        *,
        prune_prefix: Callable[[TResponseInputItem], bool] | None = None,
    ) -> _CompactionSnapshot | None:
        """The read the SDK's `OpenAIResponsesCompactionSession` compacts automatically from: the
        last `limit` items, whether they are the whole history, and `replace_suffix(start,
        output)`. That puts `output` in place of the items read from `start` on, in one commit,
        or returns False and writes nothing when those are no longer the session's last items
        (one was added, popped or replaced meanwhile). With `prune_prefix` (`EncryptedSession`
        passes its expiry test) the same commit also drops the leading items before them that
        it holds for, up to the first it does not.

        None, so the SDK reads the whole history and replaces it whole, for a session with a
        `compaction` policy (the model was given its context view, not the stored items) and
        for a subclass that changes how items are stored or read (`_stores_as_is`)."""
        from agents.memory.session import _CompactionSnapshot

        if self.compaction is not None or not self._stores_as_is() or limit < 1:
            return None
        sid = self._sid(None)
        read = await self.store.run(_tail, self.store.store, sid, limit)
        if read is None:
            return None
        items, seen = read

        async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
            if not 0 <= start < len(items):
                return False  # nothing read from there on: nothing the SDK may replace
            at = seen.length - len(items) + start
            suffix = pj.ranges_window(seen.ranges, at, None)
            try:
                return await self._commit(
                    _replace_suffix, sid, output, suffix, seen.length - at, prune_prefix, limit
                )
            except UnknownSessionError:  # closed or deleted meanwhile
                self._opened.discard(sid)
                return False

        return _CompactionSnapshot(items, seen.length <= limit, replace_suffix)

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The SDK compaction wrapper's whole-history replacement (a manual `run_compaction`,
        or an automatic one without a snapshot): the history becomes `items` in one commit,
        which opens the session when it is new. As the SDK's own stores, it does not ask
        whether the history is still the one compacted: the wrapper holds its lock from the
        read to here. False, writing nothing, for a subclass that changes how items are stored
        or read: the SDK then clears and adds through that subclass's own methods."""
        if not self._stores_as_is():
            return False
        return await self._commit(_replace_all, self._sid(None), items)

    def _stores_as_is(self) -> bool:
        """Whether items are stored and read by this class's own methods. A subclass that
        changes one (to encrypt, or filter) must see a replacement go through it, so the
        compaction hooks step aside for it, as the SDK's own stores' hooks do."""
        cls = type(self)
        return all(getattr(cls, name) is getattr(SessionlogSession, name) for name in _ITEM_VERBS)

    async def _commit(
        self, replace: Callable[..., bool], sid: str, output: list[Any], *args: Any
    ) -> bool:
        """`replace(store, sid, entries, key, *args)`, one transaction, in the store's group
        commit. Where a commit's outcome can be unknown, `output` is written under a key of its
        own, and a commit asked again finds it (`_applied`) rather than replacing twice."""
        for index, item in enumerate(output):
            _check_item(index, item, "compaction replacement")
        entries = [{"role": _role(item), "item": item} for item in output]
        key = None
        if entries and self.store.store.log.outcome_may_be_unknown:
            key = uuid.uuid4().hex
        attempt = 1
        while True:
            try:
                done = await self.store._write(replace, self.store.store, sid, entries, key, *args)
            except OutcomeUnknownError:
                if key is None or attempt == _ATTEMPTS:
                    raise
                attempt += 1
                continue
            if done and entries:
                self._opened.add(sid)
            return done

    async def fork(
        self,
        *,
        at_item: int | None = None,
        session_id: str | None = None,
        wrapper: RunContextWrapper[Any] | None = None,
    ) -> SessionlogSession:
        """A new session whose history is this one's (its first `at_item` items), shared, not
        copied: O(1) in the history's length. Later changes to either never reach the other."""
        source = self._sid(wrapper)
        await self._ensure(source)
        if at_item is None:
            child = await self.store.fork(source, session_id)
        else:
            child = await self.store.fork_at(source, at_item, session_id)
        forked = SessionlogSession(child, store=self.store, session_settings=self.session_settings)
        forked.compaction = self.compaction
        forked._opened.add(child)
        return forked


def _check_item(index: int, item: object, where: str = "add_items") -> None:
    """Refuse what is not an input item (a mapping, or a model of one) before anything is
    written: stored, it would come back as some other item."""
    if not isinstance(item, Mapping) and not hasattr(item, "model_dump"):
        raise InvalidArgumentError(
            f"SessionlogSession.{where}: items[{index}] must be a mapping (an input item), "
            f"got {type(item).__name__}",
            index=index,
            where=where,
        )


def _open_and_add(
    store: SessionStore, sid: str, entries: list[dict[str, Any]], key: str | None
) -> int:
    """Open the session and append `entries`: one command, so one commit."""
    store.open_session(sid)
    return store.inject_many(sid, entries, idempotency_key=key)


def _replace_all(
    store: SessionStore, sid: str, entries: list[dict[str, Any]], key: str | None
) -> bool:
    """Make `entries` the whole transcript, in one transaction: opened if new, reset if it held
    anything (the log keeps what it held), then appended. A new session and no entries: no
    write."""
    with store.transaction():
        if entries:
            store.open_session(sid)
            if _applied(store, sid, key):
                return True
        elif not store.exists(sid):
            return True
        if store.length(sid):
            store.reset(sid)
        if entries:
            store.inject_many(sid, entries, idempotency_key=key)
    return True


def _replace_suffix(
    store: SessionStore,
    sid: str,
    entries: list[dict[str, Any]],
    key: str | None,
    suffix: tuple[tuple[int, int, int], ...],
    count: int,
    prune: Callable[[Any], bool] | None,
    page: int,
) -> bool:
    """In one transaction: if the transcript's last `count` entries are still the ones the
    snapshot read (`suffix`, their ranges: a slot once filled never changes, so equal ranges
    are the same entries), rewind them away (the log keeps them), drop the leading entries
    `prune` holds for (`trim`), and append `entries`; else False, writing nothing."""
    with store.transaction():
        if _applied(store, sid, key):
            return True
        now = _transcript(store, sid)
        at = now.length - count
        if at < 0 or pj.ranges_window(now.ranges, at, None) != suffix:
            return False
        expired = 0 if prune is None else _expired(store, sid, at, prune, page)
        store.rewind(sid, at)
        if expired:
            store.trim(sid, at - expired)
        if entries:
            store.inject_many(sid, entries, idempotency_key=key)
    return True


def _expired(
    store: SessionStore, sid: str, before: int, prune: Callable[[Any], bool], page: int
) -> int:
    """How many of the first `before` entries `prune` holds for, counted from the first up to
    the first it does not hold for, read `page` at a time."""
    count = 0
    while count < before:
        found, fresh = store.message_structs(sid, after=count, limit=min(page, before - count))
        for item in _as_items(found, fresh):
            if not prune(item):
                return count
            count += 1
    return count


def _applied(store: SessionStore, sid: str, key: str | None) -> bool:
    """Whether a replacement under `key` committed already (its first try's outcome unknown)."""
    return key is not None and store.injected_with(sid, key) is not None


def _tail(store: SessionStore, sid: str, last: int) -> tuple[list[Any], pj.Transcript] | None:
    """The session's last `last` items and the transcript they were read from (none of a
    session not open). The two are two reads: they are read again when the transcript changed
    between them, and None comes back when it changed every time."""
    for _ in range(_ATTEMPTS):
        before = _transcript(store, sid)
        try:
            found, fresh = store.message_structs(sid, last=last)
        except UnknownSessionError:
            return [], pj.Transcript()
        if _transcript(store, sid) == before:
            return _as_items(found, fresh), before
    return None


def _transcript(store: SessionStore, sid: str) -> pj.Transcript:
    """The session's transcript projection (an empty one for an id never opened); inside a
    transaction, as the transaction sees it."""
    with store.log.view() as view:
        return pj.load_transcript(view, sid) or pj.Transcript()


def _on_items(summarize: Any) -> Callable[..., Any]:
    """The policy's summarizer given SDK items, called on `maintain_context`'s thread; an async
    one (or an awaitable it returns) is awaited in the calling loop, the thread waiting for it."""
    loop = asyncio.get_running_loop()

    def on_items(messages: list[dict[str, Any]], **options: Any) -> Any:
        answer = summarize([_item_of(m) for m in messages], **options)
        if inspect.isawaitable(answer):
            return asyncio.run_coroutine_threadsafe(_awaited(answer), loop).result()
        return answer

    return on_items


async def _awaited(answer: Any) -> Any:
    return await answer


def _items(store: SessionStore, sid: str, last: int | None) -> list[Any]:
    """The SDK items of the session's last `last` entries (all without it)."""
    found, fresh = store.message_structs(sid, last=last)
    return _as_items(found, fresh)


def _as_items(found: list[Any], fresh: bool) -> list[Any]:
    """The SDK items of stored messages (`message_structs`), copied unless `fresh`: taken as
    `_item_of` takes them from message dicts, without building those dicts."""
    copy = item_copier(fresh)
    return [
        copy(m.item) if m.item is not None else {"role": m.role, "content": copy(m.content or "")}
        for m in found
    ]


def _item_of(entry: dict[str, Any]) -> Any:
    """The SDK item an entry holds; a chat message (a checkpoint's summary, or one written by
    other code) is given as a role and content input item."""
    if "item" in entry:
        return entry["item"]
    return {"role": entry["role"], "content": entry.get("content") or ""}


def _role(item: object) -> str:
    """An item's role when it has one (turns start at user items), else ``item``."""
    role = item.get("role") if isinstance(item, Mapping) else None
    return role if isinstance(role, str) and role.strip() else "item"


def _item_tokens(entry: Mapping[str, Any]) -> int:
    """About four characters per token of the item's JSON (or the message's text)."""
    if "item" in entry:
        return (len(msgspec.json.encode(entry["item"])) + 3) // 4
    return (len(str(entry.get("content") or "")) + 3) // 4


def _for_items(policy: ContextPolicy) -> ContextPolicy:
    """`policy` with its tokens counted on items (its summarizer is given items by
    `_on_items`)."""
    if policy.summarizer is None:
        raise InvalidArgumentError("SessionlogSession: `compaction` needs a summarizer")
    counter = policy.token_counter or _item_tokens
    return dataclasses.replace(policy, token_counter=counter)


def _forced(policy: ContextPolicy) -> ContextPolicy:
    """`policy` summarizing at any size: a threshold of no tokens (the smallest ratio the policy
    takes that rounds down to none) and no least number of messages."""
    ratio = 0.5 / policy.window_tokens
    return dataclasses.replace(policy, summarize_ratio=ratio, summarize_messages_min=0)
