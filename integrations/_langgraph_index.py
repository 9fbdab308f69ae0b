"""The in-memory index of one LangGraph thread (see `integrations.langgraph`): its checkpoints,
stored channel values and pending writes, folded from the thread's items in log order.

A stored channel value is named (ns, channel, version). The first item that stores a name owns it,
and no later item replaces it: a later checkpoint storing other bytes under a name already taken
(a branch resumed from an older checkpoint reusing a version, as LangGraph's integer versions did,
or versions a caller chose) keeps its value under its own checkpoint id, and the name is marked
shadowed. A checkpoint finds the value of a shadowed name by walking up its parents to the nearest
one that stored it. Stored bytes so never change once folded, which is what lets the saver keep
decoded values by name, and a thread written before this rule reads back as it was written: its
log still holds every branch's values, and the index is rebuilt from the log."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import projections as pj
from sessions import IntegrityError

if TYPE_CHECKING:  # (imported by `integrations.langgraph` once it found langgraph installed)
    from langgraph.checkpoint.serde.base import SerializerProtocol

Typed = tuple[str, bytes]
Doomed = Callable[[str, str, "Stored"], bool]
"""Which checkpoints (namespace, id, stored) a hiding picks."""
Name = tuple[Any, ...]
"""(ns, channel, version) as the owner stored it, or (ns, channel, version, checkpoint id)."""

VALUES_KEPT = 16


class CyclicValueError(IntegrityError):
    """A stored list value is a suffix of a value that, followed back, is a suffix of itself (an
    item written by an older saver, or parents that form a loop): it has no first element to
    start from. Raised instead of following the loop forever."""

    def __init__(self, thread_key: str, ns: str, channel: str, version: Any) -> None:
        super().__init__(
            f"langgraph thread `{thread_key}`: the stored value of channel {channel!r} "
            f"(namespace {ns!r}) at version {version!r} extends itself through a cycle"
        )


@dataclass(slots=True)
class Stored:
    """One checkpoint as stored: serialized checkpoint (without values) and metadata."""

    checkpoint: Typed
    metadata: Typed
    parent: str | None
    hidden: bool = False
    decoded_metadata: Any = None  # for `list`'s filter only; callers get a fresh decoding


@dataclass
class Thread:
    """What one thread's items say, folded in order; `length` items of incarnation `created` of
    the session `key`."""

    key: str = ""
    created: str | None = None
    length: int = 0
    checkpoints: dict[str, dict[str, Stored]] = field(default_factory=dict)
    # name -> ("v", typed) | ("e",) | ("x", base_version, typed suffix)
    blobs: dict[Name, tuple[Any, ...]] = field(default_factory=dict)
    # name -> (the checkpoint that stored it, that checkpoint's parent)
    origin: dict[Name, tuple[str, str | None]] = field(default_factory=dict)
    shadowed: set[Name] = field(default_factory=set)
    writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, Typed, str]]] = field(
        default_factory=dict
    )
    # name -> a list value, each element serialized: what no caller can reach or change
    values: OrderedDict[Name, tuple[Typed, ...]] = field(default_factory=OrderedDict)

    def remember(self, name: Name, elements: tuple[Typed, ...]) -> None:
        self.values[name] = elements
        self.values.move_to_end(name)
        while len(self.values) > VALUES_KEPT:
            self.values.popitem(last=False)

    def source(self, ns: str, channel: str, version: Any, at: str | None) -> Name | None:
        """The name of the value checkpoint `at` sees for `channel` at `version` (None: none is
        stored): the owner's, unless a checkpoint on the way up from `at` stored its own."""
        name: Name = (ns, channel, version)
        if name not in self.shadowed:
            return name if name in self.blobs else None
        owner = self.origin[name][0]
        seen: set[str] = set()
        while at is not None and at not in seen:
            seen.add(at)
            own = (*name, at)
            if own in self.blobs:
                return own
            if at == owner:
                return name
            stored = self.checkpoints.get(ns, {}).get(at)
            at = stored.parent if stored is not None else None
        return name

    def fold(self, entry: dict[str, Any]) -> None:
        kind = entry.get("k")
        if kind == "cp":
            self._fold_checkpoint(entry)
        elif kind == "w":
            stored = self.writes.setdefault((entry["ns"], entry["cp"]), {})
            for idx, channel, type_, data in entry["w"]:
                key = (entry["task"], idx)
                if idx >= 0 and key in stored:
                    continue
                stored[key] = (entry["task"], channel, (type_, data), entry["path"])
        elif kind == "hide":
            # A hidden checkpoint's writes stay in the index, out of every reader's sight but
            # the delta history of a visible descendant, which replays them.
            for ns, checkpoint_id in entry["ids"]:
                found = self.checkpoints.get(ns, {}).get(checkpoint_id)
                if found is not None:
                    found.hidden = True

    def _fold_checkpoint(self, entry: dict[str, Any]) -> None:
        ns, checkpoint_id, parent = entry["ns"], entry["id"], entry.get("parent")
        checkpoints = self.checkpoints.setdefault(ns, {})
        if checkpoint_id in checkpoints:  # put again: which values its children see may change
            self.values.clear()
            if checkpoints[checkpoint_id].hidden:  # a new checkpoint: the hidden one's writes go
                self.writes.pop((ns, checkpoint_id), None)
        checkpoints[checkpoint_id] = Stored(typed(entry["cp"]), typed(entry["md"]), parent)
        for blob in entry["blobs"]:
            name: Name = (ns, blob[0], blob[1])
            parts = tuple(blob[2:])
            held = self.blobs.get(name)
            if held is None:
                self.blobs[name], self.origin[name] = parts, (checkpoint_id, parent)
                continue
            # The same bytes mean the same value, unless they are a suffix of a value that
            # another parent may see otherwise.
            if held == parts and (parts[0] != "x" or self.origin[name][1] == parent):
                continue
            own = (*name, checkpoint_id)
            self.blobs[own], self.origin[own] = parts, (checkpoint_id, parent)
            self.shadowed.add(name)
            self.values.clear()  # (rare) a name now means different values on different paths


def newest(checkpoints: dict[str, Stored]) -> str | None:
    """The newest visible checkpoint's id (ids sort by time), None when none is visible. The
    newest is visible unless pruned or deleted, so the sort is the rare path."""
    if not checkpoints:
        return None
    last = max(checkpoints)
    if not checkpoints[last].hidden:
        return last
    return max((c for c, s in checkpoints.items() if not s.hidden), default=None)


def typed(value: Sequence[Any]) -> Typed:
    return (str(value[0]), bytes(value[1]))


def elements_of(serde: SerializerProtocol, value: list[Any]) -> tuple[Typed, ...] | None:
    """Each element of a list serialized on its own (None: one cannot be, so the list is
    stored whole, or refused whole)."""
    try:
        return tuple(serde.dumps_typed(element) for element in value)
    except Exception:  # noqa: BLE001 - storing the list whole raises the real error
        return None


def all_but_newest(thread: Thread) -> Doomed:
    """Picks every checkpoint but the newest visible one of its namespace."""
    kept = {ns: newest(cps) for ns, cps in thread.checkpoints.items()}
    return lambda ns, cid, stored: cid != kept.get(ns)


def prefixed(view: Any, prefix: str) -> Iterator[pj.SessionState]:
    """The sessions whose id starts with `prefix`, the one that is just `prefix` (the thread
    "") first: `iter_states` starts after the id it is given."""
    exact = pj.load_state(view, prefix)
    if exact is not None:
        yield exact
    for state in pj.iter_states(view, after=prefix):
        if not state.session_id.startswith(prefix):
            return
        yield state
