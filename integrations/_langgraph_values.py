"""How a LangGraph thread's channel values are stored and read back (see `integrations.langgraph`):
a list value as the suffix it adds to its parent's, one value read back (a list joined again from
its suffixes), a checkpoint's pending writes in the order LangGraph applies them, and the ancestor
walk `DeltaChannel` rebuilds its value from. Nothing here appends to the thread or changes what
was folded into its index (beyond the few list values it keeps at hand)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.base import DeltaChannelHistory, PendingWrite, writes_sort_key
from langgraph.checkpoint.serde.base import SerializerProtocol

from integrations._langgraph_index import CyclicValueError, Name, Thread, Typed


def read_value(
    serde: SerializerProtocol, thread: Thread, ns: str, channel: str, version: Any, at: str | None
) -> tuple[str, Any]:
    """The value checkpoint `at` sees for `channel` at `version`: ("list", its elements
    serialized), ("value", a fresh decoding), or ("missing", None). A list is a whole stored
    value or stored suffixes joined to the value each extends; lists are kept at hand (a few
    per thread, serialized, so no caller's change reaches them) for the next checkpoint's
    comparison and the next reads."""
    name = thread.source(ns, channel, version, at)
    chain: list[tuple[Name, tuple[Any, ...]]] = []
    seen: set[Name] = set()
    while True:
        if name is None:
            return ("missing", None)
        if name in seen:
            raise CyclicValueError(thread.key, ns, channel, version)
        seen.add(name)
        cached = thread.values.get(name)
        if cached is not None:
            elements = cached
            break
        blob = thread.blobs[name]
        if blob[0] == "e":
            return ("missing", None)
        if blob[0] == "v":
            value = serde.loads_typed((blob[1], blob[2]))
            if not isinstance(value, list):
                if chain:  # a suffix of what is not a list: not written by this saver
                    return ("missing", None)
                return ("value", value)
            elements = tuple(serde.dumps_typed(e) for e in value)
            thread.remember(name, elements)
            break
        chain.append((name, blob))
        name = thread.source(ns, channel, blob[1], thread.origin[name][1])
    for name, blob in reversed(chain):
        suffix = serde.loads_typed((blob[2], blob[3]))
        elements = (*elements, *(serde.dumps_typed(e) for e in suffix))
        thread.remember(name, elements)
    return ("list", elements)


def blob_of(
    serde: SerializerProtocol,
    thread: Thread,
    ns: str,
    parent_id: str | None,
    channel: str,
    version: Any,
    values: dict[str, Any],
    elements: dict[str, tuple[Typed, ...] | None],
    whole: dict[str, Typed],
) -> list[Any] | None:
    """How `put` stores a new channel value: empty, a suffix of the parent's list, whole, or
    (None) not at all, when the parent holds the same version with the same value. A value is
    never stored as a suffix of its own version: a reader would follow it forever. `elements`
    holds each list value's elements serialized; `whole` is filled with each value serialized
    whole, once, as it is needed."""
    if channel not in values:
        return ["e"]
    value = values[channel]

    def stored() -> list[Any]:  # serialized only when stored whole, and once
        if channel not in whole:
            whole[channel] = serde.dumps_typed(value)
        return ["v", *whole[channel]]

    listed = elements.get(channel)
    parent = thread.checkpoints.get(ns, {}).get(parent_id or "")
    if listed is None or parent is None:
        return stored()
    base_version = serde.loads_typed(parent.checkpoint)["channel_versions"].get(channel)
    if base_version is None:
        return stored()
    kind, base = read_value(serde, thread, ns, channel, base_version, parent_id)
    if kind != "list":
        return stored()
    if base_version == version:
        return None if listed == base else stored()
    if base and len(listed) > len(base) and listed[: len(base)] == base:
        return ["x", base_version, *serde.dumps_typed(value[len(base) :])]
    return stored()


def decoded(serde: SerializerProtocol, found: tuple[str, Any]) -> Any:
    """What `read_value` found, decoded for a caller (a fresh object each time)."""
    kind, value = found
    return [serde.loads_typed(e) for e in value] if kind == "list" else value


def ordered_writes(
    thread: Thread, ns: str, checkpoint_id: str
) -> list[tuple[str, str, Typed, str]]:
    """The writes stored against a checkpoint, each (task, channel, value, task path), in
    `writes_sort_key` order: the order a step applies its tasks' writes in."""
    writes = thread.writes.get((ns, checkpoint_id), {})
    return [w for _, w in sorted(writes.items(), key=lambda kv: writes_sort_key(kv[1][3], *kv[0]))]


def delta_history(
    serde: SerializerProtocol, thread: Thread, ns: str, target: str, channels: Sequence[str]
) -> dict[str, DeltaChannelHistory]:
    """`get_delta_channel_history` for checkpoint `target` (visible), read from the index: for
    each channel, the writes stored against the target's ancestors, oldest first, back to and
    including the nearest ancestor that stores a value of the channel (its `seed`).

    The same answer as the base class's walk of `get_tuple` and `parent_config`, with two
    differences. It decodes only the requested channels and writes, not every value of every
    ancestor. And it walks through hidden ancestors (pruned, or of a deleted run): the log keeps
    them, so a visible checkpoint reads back the state it was put with, however its ancestors
    were hidden since. A parent chain that loops (a checkpoint put again under its descendant)
    ends the walk instead of going round forever."""
    writes: dict[str, list[PendingWrite]] = {c: [] for c in channels}
    seeds: dict[str, Any] = {}
    remaining = set(channels)
    checkpoints = thread.checkpoints.get(ns, {})
    walked = {target}
    cursor = checkpoints[target].parent
    while cursor is not None and cursor not in walked and remaining:
        stored = checkpoints.get(cursor)
        if stored is None:
            break
        walked.add(cursor)
        for task, channel, value, _ in reversed(ordered_writes(thread, ns, cursor)):
            if channel in remaining:
                writes[channel].append((task, channel, serde.loads_typed(value)))
        versions = serde.loads_typed(stored.checkpoint)["channel_versions"]
        for channel in sorted(remaining):
            if channel not in versions:
                continue
            found = read_value(serde, thread, ns, channel, versions[channel], cursor)
            if found[0] != "missing":
                seeds[channel] = decoded(serde, found)
                remaining.discard(channel)
        cursor = stored.parent
    history: dict[str, DeltaChannelHistory] = {}
    for channel in channels:
        entry: DeltaChannelHistory = {"writes": writes[channel][::-1]}
        if channel in seeds:
            entry["seed"] = seeds[channel]
        history[channel] = entry
    return history
