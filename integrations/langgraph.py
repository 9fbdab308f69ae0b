"""A LangGraph checkpointer on sessionlog: `SessionlogSaver(store)`, sync and async.

`graph = builder.compile(checkpointer=SessionlogSaver("var/graphs"))`. Each thread is one sessionlog
session; every `put`, `put_writes`, deletion of runs and prune is one item appended to it, so a
thread's history is an append-only log and `copy_thread` is a fork: O(1), sharing every
checkpoint. A list channel whose new value extends the value at the parent checkpoint (a messages
channel) stores only the new suffix, so a checkpoint costs what changed, not the whole list.

Deleting runs and pruning hide checkpoints (the log keeps them, and a `DeltaChannel` replays
their writes); `delete_thread` deletes the session. Items are indexed in memory per thread as
they are read (`_langgraph_index`); values are stored and read back by `_langgraph_values`. An
append reads what other writers (other processes) added and decides its item inside the store's
write transaction, so it never fails because another writer was active, and a decision that
depends on the whole thread (which checkpoint `prune` keeps) sees everything written before it.
Needs ``pip install 'sessionlog-engine[langgraph]'``.
"""

from __future__ import annotations

import builtins
import os
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote

import projections as pj
from eventlog import limits
from integrations._common import async_store, require
from integrations._langgraph_index import (
    CyclicValueError,
    Doomed,
    Stored,
    Thread,
    Typed,
    all_but_newest,
    elements_of,
    newest,
    prefixed,
)
from sessions import LimitExceededError, SessionStore, UnknownSessionError
from sessions._collector import collector_paused
from sessions.aio import AsyncSessionStore

require("langgraph.checkpoint.base", "langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.checkpoint.base import (  # noqa: E402
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol  # noqa: E402

from integrations._langgraph_values import (  # noqa: E402
    blob_of,
    decoded,
    delta_history,
    ordered_writes,
    read_value,
)

__all__ = ["CyclicValueError", "SessionlogSaver", "THREAD_PREFIX", "thread_key"]

THREAD_PREFIX = "lg:"


def thread_key(thread_id: str) -> str:
    """The sessionlog id of a LangGraph thread."""
    return THREAD_PREFIX + quote(str(thread_id), safe="")


class SessionlogSaver(BaseCheckpointSaver[Any]):
    """`BaseCheckpointSaver` on a sessionlog store (a `SessionStore`, its asyncio face, or a
    path): `put`, `put_writes`, `get_tuple`, `list`, `delete_thread`, `delete_for_runs`,
    `copy_thread` (a fork), `prune` and `get_delta_channel_history` (what `DeltaChannel`
    replays), each with its async twin. Blocking work runs on the store's worker thread, never
    on the event loop.

    Limits, both the store's: one `put` (its new channel values, checkpoint and metadata) or one
    `put_writes` is one event of at most `eventlog.limits.event_bytes_max` (4 MiB) encoded, and a
    thread id must fit a session id of `session_id_bytes_max` (128) bytes once percent-encoded
    after the `lg:` prefix: about 125 bytes of letters and digits, a third of that in other
    characters. Either refusal is a `LimitExceededError` naming the limit, and writes nothing
    (not even the thread's session)."""

    def __init__(
        self,
        store: SessionStore | AsyncSessionStore | str | os.PathLike[str],
        *,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.face = async_store(store)
        self._threads: dict[str, Thread] = {}
        self._lock = threading.RLock()

    @property
    def store(self) -> SessionStore:
        return self.face.store

    def get_next_version(self, current: Any, channel: None) -> Any:
        """The next version: its count and a random part, as LangGraph's own savers make them,
        so a branch resumed from an older checkpoint never reuses a version the abandoned
        branch stored. A thread begun with integer versions (this saver's before) goes on with
        integers, since LangGraph compares versions of different channels with each other; the
        index keeps the values of branches reusing one integer version apart."""
        if isinstance(current, int):
            return current + 1
        count = 0 if current is None else int(str(current).split(".")[0])
        return f"{count + 1:032}.{random.random():016}"

    # Reading a thread

    def _thread(self, thread_id: str) -> Thread:
        """The thread's index, brought up to date with the store (inside a transaction: with
        what it holds, which no other writer can change until it ends)."""
        key = thread_key(thread_id)
        if len(key.encode()) > limits.session_id_bytes_max:
            return Thread()  # an id no session can have: nothing was ever stored under it
        summary = self.store.summary(key)
        cached = self._threads.get(key)
        if summary is None or summary["status"] != pj.ACTIVE:
            self._threads.pop(key, None)
            return Thread()
        if (
            cached is None
            or cached.created != summary["created_at"]
            or (cached.length > summary["length"])
        ):
            cached = self._threads[key] = Thread(key, created=summary["created_at"])
        if cached.length < summary["length"]:
            entries = self.store.messages(key, after=cached.length)
            for entry in entries:  # (another writer may have added more since the summary)
                cached.fold(entry["item"])
            cached.length += len(entries)
        return cached

    def _append(self, thread_id: str, make: Callable[[Thread], dict[str, Any] | None]) -> None:
        """Append the item `make(thread)` returns (None: nothing to write). It is made first on
        what this index has read, outside the store's write lock; inside the write transaction
        the index reads what other writers added meanwhile and, if there was any, the item is
        made again on that. Opening the thread's session and the append are one commit, so a
        refused item leaves nothing behind."""
        key = thread_key(thread_id)
        size = len(key.encode())
        if size > limits.session_id_bytes_max:
            raise LimitExceededError(
                f"SessionlogSaver: thread id {thread_id[:40]!r}, percent-encoded after `lg:`",
                "session_id_bytes_max",
                limits.session_id_bytes_max,
                size,
            )
        thread = self._thread(thread_id)
        seen = (thread.created, thread.length)
        entry = make(thread)
        if entry is None:
            return
        kind = _KINDS.get(entry["k"], "item")
        try:
            with self.store.transaction():
                thread = self._thread(thread_id)
                if (thread.created, thread.length) != seen:
                    entry = make(thread)
                    if entry is None:
                        return
                if thread.created is None:
                    self.store.open_session(key)
                self.store.inject(key, {"item": entry}, expected_length=thread.length)
        except LimitExceededError as exc:
            if exc.limit_name != "event_bytes_max":
                raise
            raise LimitExceededError(
                f"SessionlogSaver: one {kind} for thread {thread_id!r}, encoded",
                exc.limit_name,
                exc.limit,
                exc.actual,
            ) from exc
        if thread.created is None or self._threads.get(key) is not thread:
            self._thread(thread_id)  # a new session: read it (one item) to learn its incarnation
            return
        thread.fold(entry)
        thread.length += 1

    def _tuple(
        self, thread_id: str, thread: Thread, ns: str, checkpoint_id: str, stored: Stored
    ) -> CheckpointTuple:
        checkpoint: Checkpoint = self.serde.loads_typed(stored.checkpoint)
        values = {}
        for channel, version in checkpoint["channel_versions"].items():
            found = read_value(self.serde, thread, ns, channel, version, checkpoint_id)
            if found[0] != "missing":
                values[channel] = decoded(self.serde, found)
        return CheckpointTuple(
            config=_config(thread_id, ns, checkpoint_id),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self.serde.loads_typed(stored.metadata),  # the caller's own copy
            parent_config=_config(thread_id, ns, stored.parent) if stored.parent else None,
            pending_writes=[
                (task, channel, self.serde.loads_typed(value))
                for task, channel, value, _ in ordered_writes(thread, ns, checkpoint_id)
            ],
        )

    def _metadata(self, stored: Stored) -> Any:
        """The decoded metadata, for filtering only: never handed to a caller."""
        if stored.decoded_metadata is None:
            stored.decoded_metadata = self.serde.loads_typed(stored.metadata)
        return stored.decoded_metadata

    # The sync API, each call run on the store's worker thread

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.face.call(self._get_tuple, config)

    @collector_paused()  # a checkpoint's thousands of decoded messages hold no cycle
    def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        with self._lock:
            found = self._checkpoint(config)
            return None if found is None else self._tuple(*found)

    def _checkpoint(self, config: RunnableConfig) -> tuple[str, Thread, str, str, Stored] | None:
        """The visible checkpoint `config` names (the thread's newest without an id): its thread
        id, thread, namespace, id and what is stored of it; None when there is none. Called with
        the lock held."""
        thread_id = str(config["configurable"]["thread_id"])
        ns = config["configurable"].get("checkpoint_ns", "")
        checkpoints = (thread := self._thread(thread_id)).checkpoints.get(ns, {})
        checkpoint_id = get_checkpoint_id(config) or newest(checkpoints) or ""
        stored = checkpoints.get(checkpoint_id)
        if stored is None or stored.hidden:
            return None
        return thread_id, thread, ns, checkpoint_id, stored

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """For each of `channels`, the writes stored against the ancestors of the checkpoint
        `config` names (the thread's newest without an id) and the nearest stored value, as
        `DeltaChannel` replays them: the base class's answer, read from the thread's index
        instead of a `get_tuple` per ancestor, and walking through hidden ancestors (see
        `prune` and `delete_for_runs`)."""
        return self.face.call(self._delta_history, config, channels)

    @collector_paused()  # as in `_get_tuple`: the decoded writes hold no cycle
    def _delta_history(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> dict[str, DeltaChannelHistory]:
        if not channels:
            return {}
        with self._lock:
            found = self._checkpoint(config)
            if found is None:
                return {channel: {"writes": []} for channel in channels}
            _, thread, ns, checkpoint_id, _ = found
            return delta_history(self.serde, thread, ns, checkpoint_id, channels)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (per thread and namespace), matching `filter` (metadata
        keys and values), older than `before`, at most `limit`."""
        yield from self.face.call(self._list, config, filter, before, limit)

    def _list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> builtins.list[CheckpointTuple]:
        found: builtins.list[CheckpointTuple] = []
        wanted_ns = config["configurable"].get("checkpoint_ns") if config else None
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        with self._lock:
            thread_ids = [str(config["configurable"]["thread_id"])] if config else self._all()
            for thread_id in thread_ids:
                thread = self._thread(thread_id)
                for ns, checkpoints in thread.checkpoints.items():
                    if wanted_ns is not None and ns != wanted_ns:
                        continue
                    for checkpoint_id in sorted(checkpoints, reverse=True):
                        stored = checkpoints[checkpoint_id]
                        if stored.hidden or (wanted_id and checkpoint_id != wanted_id):
                            continue
                        if before_id and checkpoint_id >= before_id:
                            continue
                        metadata = self._metadata(stored)
                        if filter and not all(metadata.get(k) == v for k, v in filter.items()):
                            continue
                        if limit is not None and len(found) >= limit:
                            return found
                        found.append(self._tuple(thread_id, thread, ns, checkpoint_id, stored))
        return found

    def _all(self) -> builtins.list[str]:
        with self.store.log.view() as view:
            return [
                unquote(state.session_id[len(THREAD_PREFIX) :])
                for state in prefixed(view, THREAD_PREFIX)
                if state.status == pj.ACTIVE
            ]

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.face.call(self._put, config, checkpoint, metadata, new_versions)

    def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id = str(config["configurable"]["thread_id"])
        ns = config["configurable"].get("checkpoint_ns", "")
        parent_id = config["configurable"].get("checkpoint_id")
        values = checkpoint["channel_values"]
        rest = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        full_metadata = get_checkpoint_metadata(config, metadata)

        # Serialized once, before the item is made (perhaps twice): each list element on its
        # own, to find the prefix the parent's list shares by what is stored, not by `==` (under
        # which 1, 1.0 and True, or one instant in two time zones, are all alike).
        elements = {
            channel: elements_of(self.serde, values[channel])
            for channel in new_versions
            if isinstance(values.get(channel), list)
        }
        whole: dict[str, Typed] = {}

        def entry(thread: Thread) -> dict[str, Any]:
            blobs = []
            for channel, version in new_versions.items():
                blob = blob_of(
                    self.serde, thread, ns, parent_id, channel, version, values, elements, whole
                )
                if blob is not None:
                    blobs.append([channel, version, *blob])
            return {
                "k": "cp",
                "ns": ns,
                "id": checkpoint["id"],
                "parent": parent_id,
                "cp": list(self.serde.dumps_typed(rest)),
                "md": list(self.serde.dumps_typed(full_metadata)),
                "blobs": blobs,
            }

        with self._lock:
            self._append(thread_id, entry)
            thread = self._threads.get(thread_key(thread_id))
            if thread is not None:  # keep the new list values at hand for the next step's diff
                for channel, version in new_versions.items():
                    listed = elements.get(channel)
                    name = thread.source(ns, channel, version, checkpoint["id"])
                    if listed is not None and name is not None:
                        thread.remember(name, listed)
        return _config(thread_id, ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self.face.call(self._put_writes, config, writes, task_id, task_path)

    def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        thread_id = str(config["configurable"]["thread_id"])
        ns = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = config["configurable"]["checkpoint_id"]

        def entry(thread: Thread) -> dict[str, Any] | None:
            stored = thread.writes.get((ns, checkpoint_id), {})
            new: builtins.list[builtins.list[Any]] = []
            for idx, (channel, value) in enumerate(writes):
                slot = WRITES_IDX_MAP.get(channel, idx)
                if slot < 0 or (task_id, slot) not in stored:
                    new.append([slot, channel, *self.serde.dumps_typed(value)])
            if not new:
                return None  # a retried write: nothing new to store
            return {
                "k": "w",
                "ns": ns,
                "cp": checkpoint_id,
                "task": task_id,
                "path": task_path,
                "w": new,
            }

        with self._lock:
            self._append(thread_id, entry)

    def delete_thread(self, thread_id: str) -> None:
        self.face.call(self._delete_thread, thread_id)

    def _delete_thread(self, thread_id: str) -> None:
        with self._lock:
            self._threads.pop(thread_key(thread_id), None)
            if len(thread_key(thread_id).encode()) > limits.session_id_bytes_max:
                return  # no session can have that id
            try:
                self.store.delete(thread_key(thread_id))
            except UnknownSessionError:
                return

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Hide every checkpoint (and its writes) whose metadata names one of `run_ids`: no
        `get_tuple`, `list` or pending write shows them again. A checkpoint of another run still
        reads back the state it was put with, even when a hidden one is its ancestor: its
        `DeltaChannel` history walks through the hidden checkpoints, which the log keeps (where
        the base class warns that deleting them breaks those channels)."""
        self.face.call(self._delete_for_runs, run_ids)

    def _delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = {str(r) for r in run_ids}
        if not runs:
            return
        with self._lock:
            for thread_id in self._all():
                self._hide(
                    thread_id,
                    lambda _: lambda ns, cid, s: self._metadata(s).get("run_id") in runs,
                )

    def _hide(self, thread_id: str, doomed: Callable[[Thread], Doomed]) -> None:
        """Hide the visible checkpoints `doomed(thread)` picks, decided on the thread as the
        append finds it (so inside its transaction when another writer added to it)."""

        def entry(thread: Thread) -> dict[str, Any] | None:
            picks = doomed(thread)
            ids = [
                [ns, cid]
                for ns, checkpoints in thread.checkpoints.items()
                for cid, stored in checkpoints.items()
                if not stored.hidden and picks(ns, cid, stored)
            ]
            return {"k": "hide", "ids": ids} if ids else None

        self._append(thread_id, entry)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Make `target_thread_id` a fork of the source: every checkpoint and write shared, in
        O(1) (a thread already there under the target id is replaced)."""
        self.face.call(self._copy_thread, source_thread_id, target_thread_id)

    def _copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source, target = thread_key(source_thread_id), thread_key(target_thread_id)
        with self._lock:
            if not self.store.exists(source) or source == target:
                return
            self._threads.pop(target, None)
            with self.store.transaction():
                if self.store.exists(target):
                    self.store.delete(target)
                self.store.fork(source, target)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`keep_latest`: hide all but the newest checkpoint of each namespace; `delete`:
        delete the threads.

        Of the ways the base class names to keep a `DeltaChannel` whole, `keep_latest` takes
        the first, keeping the ancestors and their writes: hidden, they are kept for the delta
        history of the checkpoint kept, so its channels replay from their last snapshot as
        before. Forcing a snapshot into the kept checkpoint is the other way, and not one a
        saver can take: folding the ancestors' writes into a value needs the channel's reducer,
        which only the graph has. The log drops nothing when it hides, so every ancestor stays
        (not only those back to a snapshot), and no channel needs telling apart."""
        self.face.call(self._prune, thread_ids, strategy)

    def _prune(self, thread_ids: Sequence[str], strategy: str) -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune: strategy must be keep_latest or delete, got {strategy!r}")
        with self._lock:
            for thread_id in thread_ids:
                if strategy == "delete":
                    self._delete_thread(str(thread_id))
                    continue
                self._hide(str(thread_id), all_but_newest)

    # The async API: the same work on the worker thread, awaited (writes settled: `run_write`)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self.face.run(self._get_tuple, config)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await self.face.run(self._delta_history, config, channels)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for found in await self.face.run(self._list, config, filter, before, limit):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self.face.run_write(self._put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self.face.run_write(self._put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self.face.run_write(self._delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.face.run_write(self._delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.face.run_write(self._copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.face.run_write(self._prune, thread_ids, strategy)


_KINDS = {"cp": "put", "w": "put_writes", "hide": "hiding of checkpoints"}


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }
