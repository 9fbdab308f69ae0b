"""The loop recorder's read side (seed 003): a session's header and its loop records, and the
queries over its loop tree.

A `SessionRecord` is a snapshot read from the runtime projection in one read transaction; its
queries are pure functions of that snapshot. It never writes, and it holds no store handle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

import projections as pj
from eventlog import LogView, to_builtins
from eventlog import events as ev
from projections import _runtime as rt
from sessions._checks import iso
from sessions._keyed_refs import SPAWN_REF, open_ref
from sessions._keyring import is_keyed
from sessions._seal import Sealer
from sessions._sealed_fields import SHOWN

SHOWN_IDS = SHOWN[ev.PromptStarted]
"""A loop record's ids that an encrypted session keeps as keyed digests, each with its text
sealed beside it in `sealed_<name>` (as `prompt_started` holds them)."""


def shown_id(
    sealer: Sealer | None, state: pj.SessionState, stored: str | None, sealed: str | None, name: str
) -> str | None:
    """A caller's id (request or loop id, `name`) as the runtime's answers show it: its text. An
    encrypted session's events hold its keyed digest (`Keyring.keyed`) and `prompt_started` a
    sealed copy (`sealed`), opened here while the session's key lives; None once it cannot be
    (the session forgotten, or read without a sealer). An id stored as it is (by a plain session,
    or by an encrypted one before such ids were digested) is shown so."""
    if not is_keyed(stored):
        return stored
    if sealer is None or sealed is None or state.forgotten:
        return None
    return sealer.open_text(sealed, state.key_slot, name, "record")


def in_flight_request_id(
    view: LogView, sealer: Sealer | None, state: pj.SessionState, runtime: rt.RuntimeState
) -> str | None:
    """The caller's id of the request the session runs (`shown_id`); None when idle."""
    stored = runtime.request_id
    if not is_keyed(stored):
        return stored
    loop = rt.load_loop_at(view, state.session_id, runtime.loop_position)
    sealed = None if loop is None else loop.sealed_request_id
    return shown_id(sealer, state, stored, sealed, "request_id")


def last_loop_id(
    view: LogView, sealer: Sealer | None, state: pj.SessionState, runtime: rt.RuntimeState
) -> str | None:
    """The caller's id of the session's latest prompt loop (`shown_id`), which a new prompt
    continues: its text, so that sealing the new prompt keys it to the same digest again."""
    stored = runtime.last_loop_id
    if not is_keyed(stored):
        return stored
    loop = rt.load_loop(view, state.session_id, stored)
    return shown_id(sealer, state, stored, None if loop is None else loop.sealed_loop_id, "loop_id")


def shown_ref(
    sealer: Sealer | None, state: pj.SessionState, ref: dict[str, Any] | None
) -> dict[str, Any] | None:
    """A sub-agent's `parent_spawn_ref`, or a parent loop's reference to a child, read in the
    session of `state`, as the runtime's answers show it: the ids an encrypted child keeps as
    digests (`KEYED_REFS`) shown by their sealed copies, which open while the child's key
    lives (a parent's record shows them after the parent was forgotten: they are the child's);
    None once they cannot be, or without a sealer."""

    def open_text(sealed: str | None, label: str) -> str | None:
        if sealer is None or sealed is None:
            return None
        return sealer.open_text(sealed, state.key_slot, label, "record")

    shown: dict[str, Any] | None = to_builtins(open_ref(ref, SPAWN_REF, open_text))
    return shown


def loop_dict(
    loop: rt.LoopRecord,
    show: Callable[[str | None], str | None],
    child: Callable[[dict[str, Any]], dict[str, Any] | None],
) -> dict[str, Any]:
    """A loop record as plain data, naming its request and loops as `show` does (`shown_id`),
    and the sessions it spawned as `child` does (`shown_ref`)."""
    return {
        "loop_id": show(loop.loop_id),
        "session_id": loop.session_id,
        "request_id": show(loop.request_id),
        "parent_loop_id": show(loop.parent_loop_id),
        "parallel_group": show(loop.parallel_group),
        "provider": loop.provider,
        "config": to_builtins(loop.config),
        "warnings": to_builtins(loop.warnings),
        "status": loop.status,
        "started_at": iso(loop.started_at),
        "finished_at": iso(loop.finished_at),
        "stop_reason": loop.stop_reason,
        "error": loop.error,
        "error_kind": loop.error_kind,
        "usage": usage_dict(loop.usage),
        "child_loop_refs": [child(ref) for ref in to_builtins(loop.child_loop_refs)],
    }


def usage_dict(usage: pj.LoopUsage) -> dict[str, int]:
    """Every count of `usage` by name, zeros included."""
    return msgspec.structs.asdict(usage)


@dataclass(frozen=True)
class SessionRecord:
    """One session as the recorder sees it: header fields and every loop, oldest first."""

    session_id: str
    agent_id: str | None
    status: str
    open: bool
    formation: dict[str, Any]
    scope: str
    created_at: str | None
    last_active_at: str | None
    """When the last loop started (seed 003), or the creation time before any loop."""
    parent_spawn_ref: dict[str, Any] | None
    provider: str
    rejected_inputs: int
    loops: list[dict[str, Any]] = field(default_factory=list)

    def get_loop(self, loop_id: str) -> dict[str, Any] | None:
        return next((loop for loop in self.loops if loop["loop_id"] == loop_id), None)

    def total_usage(self) -> dict[str, int]:
        """Every usage field summed over all loops."""
        total = dict.fromkeys(usage_dict(pj.LoopUsage()), 0)
        for loop in self.loops:
            for name, count in loop["usage"].items():
                total[name] += count
        return total

    def root_loops(self) -> list[dict[str, Any]]:
        """Loops without a parent in this session (none at all, or one in another session)."""
        ours = {loop["loop_id"] for loop in self.loops}
        return [loop for loop in self.loops if loop["parent_loop_id"] not in ours]

    def children_of(self, loop_id: str) -> list[dict[str, Any]]:
        return [loop for loop in self.loops if loop["parent_loop_id"] == loop_id]

    def parallel_siblings(self, loop_id: str) -> list[dict[str, Any]]:
        """Every loop of `loop_id`'s parallel group (itself included); [] when it has none."""
        found = self.get_loop(loop_id)
        if found is None or found["parallel_group"] is None:
            return []
        group, parent = found["parallel_group"], found["parent_loop_id"]
        return [
            loop
            for loop in self.loops
            if loop["parallel_group"] == group and loop["parent_loop_id"] == parent
        ]

    def loop_chain_to(self, loop_id: str) -> list[str]:
        """Loop ids from the root to `loop_id` along parent links, root first; [] if unknown.
        Only the selected path is kept: siblings and other branches are not on it."""
        by_id = {loop["loop_id"]: loop for loop in self.loops}
        chain: list[str] = []
        current = by_id.get(loop_id)
        while current is not None and current["loop_id"] not in chain:
            chain.append(current["loop_id"])
            current = by_id.get(current["parent_loop_id"])
        chain.reverse()
        return chain


def read_record(
    view: LogView, session_id: str, sealer: Sealer | None = None
) -> SessionRecord | None:
    """The record of `session_id`'s current incarnation, open or closed; None if the runtime never
    knew it. An encrypted session's request and loop ids are shown with the store's `sealer`
    (else None); a tool call's loop names its prompt's request and loop, whose record holds the
    sealed copies."""
    runtime = rt.load_runtime(view, session_id)
    state = pj.load_state(view, session_id)
    if runtime is None or state is None:
        return None
    found = rt.load_loops(view, session_id)
    texts: dict[str, str | None] = {}  # digest: text, from the prompts' sealed copies
    for loop in found:
        for name in SHOWN_IDS:
            stored, sealed = getattr(loop, name), getattr(loop, f"sealed_{name}")
            if sealed is not None and texts.get(stored) is None:
                texts[stored] = shown_id(sealer, state, stored, sealed, name)

    def show(stored: str | None) -> str | None:
        if not is_keyed(stored):
            return stored
        return texts.get(stored)

    loops = [loop_dict(loop, show, lambda ref: shown_ref(sealer, state, ref)) for loop in found]
    return SessionRecord(
        session_id=session_id,
        agent_id=state.agent_id,
        status=runtime.status if runtime.open else "closed",
        open=runtime.open,
        formation=to_builtins(state.formation),
        scope=state.scope,
        created_at=iso(state.created_at),
        last_active_at=iso(runtime.last_loop_started_at or state.created_at),
        parent_spawn_ref=shown_ref(sealer, state, state.parent_spawn_ref),
        provider=runtime.provider,
        rejected_inputs=runtime.rejected,
        loops=loops,
    )
