"""A LangGraph checkpointer on sessionlog: `SessionlogSaver(store)`, sync and async.

`graph = builder.compile(checkpointer=SessionlogSaver("var/graphs"))`. Each thread is one sessionlog
session; every `put`, `put_writes`, deletion of runs and prune is one item appended to it, so a
thread's history is an append-only log and `copy_thread` is a fork: O(1), sharing every
checkpoint. A list channel whose new value extends the value at the parent checkpoint (a messages
channel) stores only the new suffix, so a checkpoint costs what changed, not the whole list.

Deleting runs and pruning hide checkpoints (the log keeps them); `delete_thread` deletes the
session. Items are indexed in memory per thread as they are read, and an append names the length
it expects, so a second writer (another process) is noticed and read before writing again.
Needs ``pip install 'sessionlog-engine[langgraph]'``.
"""

from __future__ import annotations

import builtins
import os
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import projections as pj
from integrations._common import async_store, require
from sessions import LengthConflictError, SessionStore, UnknownSessionError
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
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol  # noqa: E402

THREAD_PREFIX = "lg:"
_RETRIES = 5
_VALUES_KEPT = 16
Typed = tuple[str, bytes]


def thread_key(thread_id: str) -> str:
    """The sessionlog id of a LangGraph thread."""
    return THREAD_PREFIX + quote(str(thread_id), safe="")


@dataclass
class _Stored:
    """One checkpoint as stored: serialized checkpoint (without values) and metadata."""

    checkpoint: Typed
    metadata: Typed
    parent: str | None
    hidden: bool = False
    decoded_metadata: Any = None


@dataclass
class _Thread:
    """What one thread's items say, folded in order; `length` items of incarnation `created`."""

    created: str | None = None
    length: int = 0
    checkpoints: dict[str, dict[str, _Stored]] = field(default_factory=dict)
    # (ns, channel, version) -> ("v", typed) | ("e",) | ("x", base_version, typed suffix)
    blobs: dict[tuple[str, str, Any], tuple[Any, ...]] = field(default_factory=dict)
    writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, Typed, str]]] = field(
        default_factory=dict
    )
    values: OrderedDict[tuple[str, str, Any], list[Any]] = field(default_factory=OrderedDict)

    def remember(self, key: tuple[str, str, Any], value: list[Any]) -> None:
        self.values[key] = value
        self.values.move_to_end(key)
        while len(self.values) > _VALUES_KEPT:
            self.values.popitem(last=False)

    def fold(self, entry: dict[str, Any]) -> None:
        kind = entry.get("k")
        if kind == "cp":
            ns = entry["ns"]
            self.checkpoints.setdefault(ns, {})[entry["id"]] = _Stored(
                _typed(entry["cp"]), _typed(entry["md"]), entry.get("parent")
            )
            for blob in entry["blobs"]:
                self.blobs[(ns, blob[0], blob[1])] = tuple(blob[2:])
        elif kind == "w":
            stored = self.writes.setdefault((entry["ns"], entry["cp"]), {})
            for idx, channel, type_, data in entry["w"]:
                key = (entry["task"], idx)
                if idx >= 0 and key in stored:
                    continue
                stored[key] = (entry["task"], channel, (type_, data), entry["path"])
        elif kind == "hide":
            for ns, checkpoint_id in entry["ids"]:
                found = self.checkpoints.get(ns, {}).get(checkpoint_id)
                if found is not None:
                    found.hidden = True
                self.writes.pop((ns, checkpoint_id), None)


def _typed(value: Sequence[Any]) -> Typed:
    return (str(value[0]), bytes(value[1]))


class SessionlogSaver(BaseCheckpointSaver[int]):
    """`BaseCheckpointSaver` on a sessionlog store (a `SessionStore`, its asyncio face, or a
    path): `put`, `put_writes`, `get_tuple`, `list`, `delete_thread`, `delete_for_runs`,
    `copy_thread` (a fork) and `prune`, each with its async twin. Blocking work runs on the
    store's worker thread, never on the event loop."""

    def __init__(
        self,
        store: SessionStore | AsyncSessionStore | str | os.PathLike[str],
        *,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.face = async_store(store)
        self._threads: dict[str, _Thread] = {}
        self._lock = threading.RLock()

    @property
    def store(self) -> SessionStore:
        return self.face.store

    # Reading a thread

    def _thread(self, thread_id: str) -> _Thread:
        """The thread's index, brought up to date with the store."""
        key = thread_key(thread_id)
        summary = self.store.summary(key)
        cached = self._threads.get(key)
        if summary is None or summary["status"] != pj.ACTIVE:
            self._threads.pop(key, None)
            return _Thread()
        if (
            cached is None
            or cached.created != summary["created_at"]
            or (cached.length > summary["length"])
        ):
            cached = self._threads[key] = _Thread(created=summary["created_at"])
        if cached.length < summary["length"]:
            entries = self.store.messages(key, after=cached.length)
            for entry in entries:  # (another writer may have added more since the summary)
                cached.fold(entry["item"])
            cached.length += len(entries)
        return cached

    def _append(self, thread_id: str, make: Any) -> None:
        """Append the item `make(thread)` returns (None: nothing to write) at the length the
        index has read; another writer in between makes it read and decide again."""
        key = thread_key(thread_id)
        for _ in range(_RETRIES):
            thread = self._thread(thread_id)
            entry = make(thread)
            if entry is None:
                return
            if thread.created is None:
                self.store.open_session(key)
                thread = self._thread(thread_id)
            try:
                self.store.inject(key, {"item": entry}, expected_length=thread.length)
            except LengthConflictError:
                continue
            thread.fold(entry)
            thread.length += 1
            return
        raise LengthConflictError(key, thread.length, self.store.length(key), "langgraph put")

    def _value(self, thread: _Thread, ns: str, channel: str, version: Any) -> Any:
        """The value of `channel` at `version`: a whole stored value, or the stored suffixes
        joined to the value they extend. List values are kept at hand (a few per thread) for
        the next checkpoint's comparison; callers get their own copy."""
        key = (ns, channel, version)
        suffixes: builtins.list[tuple[Any, ...]] = []
        while key not in thread.values:
            blob = thread.blobs.get(key)
            if blob is None or blob[0] == "e":
                return _MISSING
            if blob[0] == "v":
                value = self.serde.loads_typed((blob[1], blob[2]))
                break
            suffixes.append(blob)
            key = (ns, channel, blob[1])
        else:
            value = thread.values[key]
        for blob in reversed(suffixes):
            value = [*value, *self.serde.loads_typed((blob[2], blob[3]))]
        if isinstance(value, list):
            thread.remember((ns, channel, version), value)
            return list(value)
        return value

    def _tuple(
        self, thread_id: str, thread: _Thread, ns: str, checkpoint_id: str, stored: _Stored
    ) -> CheckpointTuple:
        checkpoint: Checkpoint = self.serde.loads_typed(stored.checkpoint)
        values = {}
        for channel, version in checkpoint["channel_versions"].items():
            value = self._value(thread, ns, channel, version)
            if value is not _MISSING:
                values[channel] = value
        writes = thread.writes.get((ns, checkpoint_id), {})
        ordered = sorted(writes.items(), key=lambda kv: writes_sort_key(kv[1][3], *kv[0]))
        return CheckpointTuple(
            config=_config(thread_id, ns, checkpoint_id),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self._metadata(stored),
            parent_config=_config(thread_id, ns, stored.parent) if stored.parent else None,
            pending_writes=[
                (task, channel, self.serde.loads_typed(value))
                for task, channel, value, _ in (w for _, w in ordered)
            ],
        )

    def _metadata(self, stored: _Stored) -> Any:
        if stored.decoded_metadata is None:
            stored.decoded_metadata = self.serde.loads_typed(stored.metadata)
        return stored.decoded_metadata

    # The sync API, each call run on the store's worker thread

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.face.call(self._get_tuple, config)

    def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        with self._lock:
            thread_id = str(config["configurable"]["thread_id"])
            ns = config["configurable"].get("checkpoint_ns", "")
            thread = self._thread(thread_id)
            visible = {cid: s for cid, s in thread.checkpoints.get(ns, {}).items() if not s.hidden}
            checkpoint_id = get_checkpoint_id(config) or max(visible, default=None)
            if checkpoint_id is None or checkpoint_id not in visible:
                return None
            return self._tuple(thread_id, thread, ns, checkpoint_id, visible[checkpoint_id])

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
                for state in _prefixed(view, THREAD_PREFIX)
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

        def entry(thread: _Thread) -> dict[str, Any]:
            blobs = [
                [channel, version, *self._blob(thread, ns, parent_id, channel, values)]
                for channel, version in new_versions.items()
            ]
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
                    if isinstance(values.get(channel), list):
                        thread.remember((ns, channel, version), list(values[channel]))
        return _config(thread_id, ns, checkpoint["id"])

    def _blob(
        self,
        thread: _Thread,
        ns: str,
        parent_id: str | None,
        channel: str,
        values: dict[str, Any],
    ) -> builtins.list[Any]:
        """How a new channel value is stored: empty, a suffix of the parent's list, or whole."""
        if channel not in values:
            return ["e"]
        value = values[channel]
        parent = thread.checkpoints.get(ns, {}).get(parent_id or "")
        if isinstance(value, list) and value and parent is not None:
            versions = self.serde.loads_typed(parent.checkpoint)["channel_versions"]
            base_version = versions.get(channel)
            if base_version is not None:
                base = self._value(thread, ns, channel, base_version)
                if (
                    isinstance(base, list)
                    and base
                    and len(value) >= len(base)
                    and _same_prefix(value, base)
                ):
                    return ["x", base_version, *self.serde.dumps_typed(value[len(base) :])]
        return ["v", *self.serde.dumps_typed(value)]

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

        def entry(thread: _Thread) -> dict[str, Any] | None:
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
            try:
                self.store.delete(thread_key(thread_id))
            except UnknownSessionError:
                return

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Hide every checkpoint (and its writes) whose metadata names one of `run_ids`."""
        self.face.call(self._delete_for_runs, run_ids)

    def _delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = {str(r) for r in run_ids}
        if not runs:
            return
        with self._lock:
            for thread_id in self._all():
                self._hide(thread_id, lambda ns, cid, s: self._metadata(s).get("run_id") in runs)

    def _hide(self, thread_id: str, doomed: Any) -> None:
        def entry(thread: _Thread) -> dict[str, Any] | None:
            ids = [
                [ns, cid]
                for ns, checkpoints in thread.checkpoints.items()
                for cid, stored in checkpoints.items()
                if not stored.hidden and doomed(ns, cid, stored)
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
        delete the threads."""
        self.face.call(self._prune, thread_ids, strategy)

    def _prune(self, thread_ids: Sequence[str], strategy: str) -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune: strategy must be keep_latest or delete, got {strategy!r}")
        with self._lock:
            for thread_id in thread_ids:
                if strategy == "delete":
                    self._delete_thread(str(thread_id))
                    continue
                thread = self._thread(str(thread_id))
                newest = {
                    ns: max((c for c, s in cps.items() if not s.hidden), default=None)
                    for ns, cps in thread.checkpoints.items()
                }
                self._hide(str(thread_id), lambda ns, cid, s, keep=newest: cid != keep.get(ns))

    # The async API: the same work on the worker thread, awaited

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self.face.run(self._get_tuple, config)

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
        return await self.face.run(self._put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self.face.run(self._put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self.face.run(self._delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.face.run(self._delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.face.run(self._copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.face.run(self._prune, thread_ids, strategy)


_MISSING = object()


def _same_prefix(value: list[Any], base: list[Any]) -> bool:
    try:
        return bool(value[: len(base)] == base)
    except Exception:  # noqa: BLE001 - elements that cannot be compared: store it whole
        return False


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _prefixed(view: Any, prefix: str) -> Iterator[pj.SessionState]:
    for state in pj.iter_states(view, after=prefix):
        if not state.session_id.startswith(prefix):
            return
        yield state
