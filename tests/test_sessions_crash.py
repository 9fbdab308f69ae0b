"""Crash safety of the session engine, demonstrated by killing a real `SessionStore` writer.

Fault model: the writer process is killed with SIGKILL at any instruction: while importing or
opening the store, while choosing a verb, inside a verb (reading the projection, appending,
folding the events into the projection, LMDB's commit), inside a multi-verb
`with store.transaction():` block, or between a commit and the line that acknowledges it. The
kernel, the file system and the disk keep working, so everything the process handed to the kernel
survives it. Power loss and kernel crashes (lost or reordered page-cache writes) are out of scope:
they are LMDB's fsync discipline, which `sync=True` turns on and a test cannot reach.

The writer (`_sessions_crash_writer.py`) reports each verb call before making it and each unit
(one call, or one transaction block) after it returned, with every result. The test replays the
acknowledged units on its own model of every session (transcript, scratchpad and its version, live
clients and controller, parent and children, event count, open or closed) and checks each reported
result against it. What must hold after every kill, on the same store reopened round after round
so state accumulates:

- every acknowledged unit's effect is there: the reopened store equals the model, session by
  session, field by field;
- the one unit in flight at the kill is either wholly there or wholly absent, and nothing else
  differs: the store equals the model without it or the model with it (only possible if the
  writer got as far as the commit); a transaction block is never partly there, and a block that
  aborted on purpose never shows;
- the projection is exactly what a rebuild from the log makes (`projections.dump` of the live
  state equals the dump after `store.rebuild()`), and `store.log.verify()` passes;
- the store still takes writes (the killed writer held LMDB's write lock or a reader slot).
"""

from __future__ import annotations

import copy
import json
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import projections as pj
from sessions import SessionStore
from tests._killer import KillPlan, kill_at_random_moment, start_writer
from tests._sessions_crash_writer import run, summarize
from tests.conftest import PROFILE

WRITER = Path(__file__).resolve().parent / "_sessions_crash_writer.py"
KILLS = {"dev": 8, "ci": 60, "deep": 300}.get(PROFILE, 8)
SEED = 20_240_611
PROBE = "probe"  # written by the test itself after each kill; the writer never touches it


# The model: what the store must hold, from the acknowledged units alone.


@dataclass
class Session:
    transcript: list[dict[str, Any]] = field(default_factory=list)
    scratchpad: dict[str, Any] | None = None
    scratchpad_version: int = 0
    clients: dict[str, str] = field(default_factory=dict)  # client id -> mode, attach order
    controller: str | None = None
    parent_id: str | None = None
    children: list[str] = field(default_factory=list)
    active: bool = True


def ok(value: Any) -> dict[str, Any]:
    return {"ok": value}


def refused(error: str) -> dict[str, Any]:
    return {"refused": error}


def split_point(messages: list[dict[str, Any]], keep_last: int) -> int:
    """Compaction's boundary: never between a tool call and its result (`sessions._compact`)."""
    split = max(len(messages) - keep_last, 0)
    while 0 < split < len(messages) and (
        messages[split]["role"] == "tool" or "tool_call_id" in messages[split]
    ):
        split -= 1
    return split


@dataclass
class Model:
    sessions: dict[str, Session] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)  # events per stream, every incarnation

    def live(self, sid: str) -> Session | None:
        found = self.sessions.get(sid)
        return found if found is not None and found.active else None

    def _event(self, sid: str) -> None:
        self.events[sid] = self.events.get(sid, 0) + 1

    def apply(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Apply one verb call; returns the result the store must have reported for it."""
        verb, sid = cmd["verb"], cmd["sid"]
        session = self.live(sid)
        if verb == "open_session":
            if session is None:
                self.sessions[sid] = Session()
                self._event(sid)
            return ok(sid)
        if session is None:
            return refused("UnknownSessionError")
        if verb in ("fork", "fork_at"):
            return self._fork(session, sid, cmd)
        if verb == "compact":
            return self._compact(session, sid, cmd)
        if verb in ("attach", "takeover", "detach", "client_inject_prompt"):
            return self._live_verb(session, sid, cmd)
        result: Any = None
        if verb == "inject":
            session.transcript.append(cmd["message"])
        elif verb == "trim":
            result = min(cmd["keep"], len(session.transcript))
            session.transcript = session.transcript[len(session.transcript) - result :]
        elif verb == "reset":
            session.transcript = []
        elif verb == "set_scratchpad":
            session.scratchpad = cmd["pad"]
            session.scratchpad_version = result = session.scratchpad_version + 1
        elif verb == "clear_scratchpad":
            session.scratchpad = None
            session.scratchpad_version = result = session.scratchpad_version + 1
        elif verb == "close_session":
            session.active = False
        else:
            raise AssertionError(f"the model does not know {verb}")
        self._event(sid)
        return ok(result)

    def _fork(self, source: Session, sid: str, cmd: dict[str, Any]) -> dict[str, Any]:
        dest = cmd["dest"]
        if self.live(dest) is not None:
            return refused("SessionExistsError")
        kept = source.transcript if cmd["verb"] == "fork" else source.transcript[: cmd["keep"]]
        self.sessions[dest] = Session(
            transcript=list(kept),
            scratchpad=copy.deepcopy(source.scratchpad),
            scratchpad_version=source.scratchpad_version,
            parent_id=sid,
        )
        source.children.append(dest)
        self._event(dest)
        return ok(dest)

    def _compact(self, session: Session, sid: str, cmd: dict[str, Any]) -> dict[str, Any]:
        messages = session.transcript
        split = split_point(messages, cmd["keep"])
        if split == 0:
            return ok(len(messages))  # nothing to compact: no event
        older, newer = messages[:split], messages[split:]
        if cmd["strategy"] == "truncate":
            session.transcript = newer
        else:
            boundary = {
                "role": "user",
                "content": f"[summary of the {len(older)} earlier messages]",
                "synthetic": True,
                "summary": True,
            }
            reply = {
                "role": "assistant",
                "content": summarize(older),
                "synthetic": True,
                "summary": True,
            }
            session.transcript = [boundary, reply, *newer]
        self._event(sid)
        return ok(len(session.transcript))

    def _live_verb(self, session: Session, sid: str, cmd: dict[str, Any]) -> dict[str, Any]:
        verb, client = cmd["verb"], cmd["client"]
        current = session.controller
        result: Any
        if verb == "detach":
            if client not in session.clients:
                return refused("InvalidArgumentError")
            result = current == client
            del session.clients[client]
            if result:
                session.controller = None
        elif verb == "client_inject_prompt":
            if current != client:
                return refused("ControllerConflictError")
            session.transcript.append(
                {
                    "role": "user",
                    "content": cmd["content"],
                    "metadata": {"live_session": {"client_id": client}},
                }
            )
            result = None
        elif verb == "takeover" or cmd["mode"] == "controller":
            if verb == "attach" and current not in (None, client) and not cmd["takeover"]:
                return refused("ControllerConflictError")
            if current is not None and current != client:
                session.clients[current] = "observer"
            session.controller = client
            session.clients[client] = result = "controller"
        else:
            if current == client:
                session.controller = None
            session.clients[client] = result = "observer"
        self._event(sid)
        return ok(result)

    def child_ids(self, sid: str) -> list[str]:
        """The ids forked from this incarnation, oldest first, each once, leaving out an id whose
        current incarnation is no longer that fork (reopened, or forked from elsewhere)."""
        listed: list[str] = []
        for child in self.sessions[sid].children:
            if child not in listed and self.sessions[child].parent_id == sid:
                listed.append(child)
        return listed

    def view(self) -> dict[str, Any]:
        """What the store must show: every open session, and which ones are closed."""
        active = {
            sid: {
                "transcript": s.transcript,
                "length": len(s.transcript),
                "version": self.events[sid],
                "scratchpad": s.scratchpad,
                "scratchpad_version": s.scratchpad_version,
                "clients": [[client, mode] for client, mode in s.clients.items()],
                "controller": s.controller,
                "parent_id": s.parent_id,
                "child_ids": self.child_ids(sid),
            }
            for sid, s in sorted(self.sessions.items())
            if s.active
        }
        closed = sorted(sid for sid, s in self.sessions.items() if not s.active)
        return {"active": active, "closed": closed}


def observe(store: SessionStore) -> dict[str, Any]:
    """The same view, read from the store through its public queries."""

    def ids(status: str) -> list[str]:
        found: list[str] = []
        cursor = None
        while True:
            page = store.list_sessions(cursor=cursor, limit=50, status=status)
            found += [entry["session_id"] for entry in page["sessions"]]
            cursor = page["next_cursor"]
            if cursor is None:
                return found

    active: dict[str, Any] = {}
    for sid in ids("active"):
        snap = store.snapshot(sid)
        assert snap is not None, f"`{sid}` is listed as active but has no snapshot"
        active[sid] = {
            "transcript": snap["transcript"],
            "length": snap["length"],
            "version": snap["version"],
            "scratchpad": snap["scratchpad"],
            "scratchpad_version": snap["scratchpad_version"],
            "clients": [[c["client_id"], c["mode"]] for c in snap["live_clients"]],
            "controller": snap["live_controller_id"],
            "parent_id": snap["parent_id"],
            "child_ids": snap["child_ids"],
        }
    return {"active": active, "closed": ids("closed")}


def difference(want: dict[str, Any], got: dict[str, Any]) -> str:
    """The first few differences between two views, for a readable failure."""
    lines: list[str] = []
    if want["closed"] != got["closed"]:
        lines.append(f"closed: want {want['closed']}, got {got['closed']}")
    for sid in sorted(set(want["active"]) | set(got["active"])):
        a, b = want["active"].get(sid), got["active"].get(sid)
        if a is None or b is None:
            lines.append(f"{sid}: want {'absent' if a is None else 'open'}, got the other")
            continue
        for key in a:
            if a[key] != b[key]:
                lines.append(f"{sid}.{key}: want {str(a[key])[:300]}, got {str(b[key])[:300]}")
    return "\n".join(lines[:12]) or "(no difference)"


# The writer process and what it reported.


@dataclass
class Unit:
    """One unit of work the writer reported: its calls, whether it reached its commit, its ack."""

    name: str
    cmds: list[dict[str, Any]] = field(default_factory=list)
    undone: list[tuple[int, int]] = field(default_factory=list)  # inner blocks rolled back
    committed: bool = False
    ack: dict[str, Any] | None = None


PLAN = KillPlan(
    weights=(1, 3, 6), startup_max_s=0.25, anytime_max_s=0.2, steps=(20, 250), in_step_max_s=0.003
)


def parse(lines: list[str]) -> list[Unit]:
    units: dict[str, Unit] = {}
    for line in lines:
        word, _, rest = line.rstrip("\n").partition(" ")
        body = json.loads(rest)
        if word == "ready":
            continue
        name = body.pop("unit")
        unit = units.setdefault(name, Unit(name))
        assert unit.ack is None, f"unit {name} reported after its ack: {line[:200]}"
        if word == "cmd":
            assert body.pop("i") == len(unit.cmds), f"unit {name}: calls out of order"
            unit.cmds.append(body)
        elif word == "undo":
            assert body["to"] == len(unit.cmds) and 0 <= body["from"] < body["to"], line
            unit.undone.append((body["from"], body["to"]))
        elif word == "commit":
            assert body["n"] == len(unit.cmds), f"unit {name}: commit after {len(unit.cmds)} calls"
            unit.committed = True
        elif word == "ack":
            unit.ack = body
        else:
            raise AssertionError(f"unknown line {line[:200]}")
    found = list(units.values())
    unacked = [unit.name for unit in found[:-1] if unit.ack is None]
    assert not unacked, f"units {unacked} were never acknowledged, yet later ones ran"
    return found


@dataclass
class Tally:
    units: int = 0
    blocks: int = 0
    aborted: int = 0
    undone: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)  # "verb:ok" / "verb:refused"
    rolled_back: int = 0
    committed_unacked: int = 0
    in_flight_blocks: int = 0
    modes: dict[str, int] = field(default_factory=dict)


def apply_unit(model: Model, unit: Unit) -> list[dict[str, Any]]:
    """Apply a unit's calls to `model`, undoing its rolled-back inner blocks; returns the results
    every call must have had (an undone call ran, so it had one)."""
    results: list[dict[str, Any]] = []
    undone = dict(unit.undone)
    index = 0
    while index < len(unit.cmds):
        end = undone.get(index)
        if end is None:
            results.append(model.apply(unit.cmds[index]))
            index += 1
            continue
        saved = copy.deepcopy(model)
        results += [model.apply(cmd) for cmd in unit.cmds[index:end]]
        model.sessions, model.events = saved.sessions, saved.events
        index = end
    return results


def replay_acknowledged(model: Model, units: list[Unit], tally: Tally) -> Unit | None:
    """Apply every acknowledged unit to `model`, checking its results; returns the one in flight."""
    for unit in units:
        if unit.ack is None:
            return unit
        tally.units += 1
        tally.blocks += "aborted" in unit.ack or len(unit.cmds) > 1
        if unit.ack.get("aborted"):
            assert not unit.committed, f"unit {unit.name} reached its commit, then aborted"
            tally.aborted += 1
            continue
        assert unit.committed, f"unit {unit.name} acknowledged without reaching its commit"
        got = unit.ack["results"]
        assert len(got) == len(unit.cmds), f"unit {unit.name}: {len(got)} results"
        tally.undone += len(unit.undone)
        for cmd, result, want in zip(unit.cmds, got, apply_unit(model, unit), strict=True):
            assert result == want, f"unit {unit.name}: {cmd['verb']} gave {result}, want {want}"
            key = f"{cmd['verb']}:{'ok' if 'ok' in want else 'refused'}"
            tally.outcomes[key] = tally.outcomes.get(key, 0) + 1
    return None


def calls(unit: Unit | None) -> str:
    return "none" if unit is None else ", ".join(f"{c['verb']}({c['sid']})" for c in unit.cmds)


def check_projection(store: SessionStore, round_no: int) -> None:
    report = store.log.verify()
    assert report.ok, f"round {round_no}: verify failed: {report}"
    assert report.events_checked == store.log.head
    with store.log.view() as view:
        live = pj.dump(view)
        assert pj.projected_position(view) == view.head, f"round {round_no}: projection behind"
    assert store.rebuild() == store.log.head
    with store.log.view() as view:
        rebuilt = pj.dump(view)
    if live != rebuilt:
        a, b = dict(live), dict(rebuilt)
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise AssertionError(
            f"round {round_no}: the live projection differs from a rebuild at {len(keys)} keys: "
            + ", ".join(f"{k!r}: {a.get(k)!r} != {b.get(k)!r}" for k in keys[:6])
        )


def probe(store: SessionStore, model: Model, round_no: int) -> None:
    """Write through the store the killed writer left behind; the model takes the same calls."""
    for cmd in (
        {"verb": "open_session", "sid": PROBE},
        {"verb": "inject", "sid": PROBE, "message": {"role": "user", "content": f"p{round_no}"}},
    ):
        want = model.apply(cmd)
        assert {"ok": run(store, cmd)} == want


@pytest.mark.slow
def test_sigkilled_session_writer_keeps_every_acknowledged_command(tmp_path: Path) -> None:
    path = tmp_path / "store"
    rng = random.Random(SEED)
    model = Model()
    tally = Tally()
    started = time.monotonic()
    with SessionStore.open(path, summarizer=summarize) as store:
        probe(store, model, 0)
    for round_no in range(1, KILLS + 1):
        err = tmp_path / f"w{round_no}.err"
        writer = start_writer(
            WRITER, "cmd", [str(path), str(round_no), str(rng.randrange(2**32))], err
        )
        mode = kill_at_random_moment(writer, rng, PLAN)
        tally.modes[mode] = tally.modes.get(mode, 0) + 1
        assert writer.proc.returncode == -signal.SIGKILL, (
            f"round {round_no}: the writer died by itself:\n{err.read_text()}"
        )

        in_flight = replay_acknowledged(model, parse(writer.lines), tally)
        candidates = [model]  # the acknowledged state; then, maybe, that plus the unit in flight
        if in_flight is not None and in_flight.committed:
            # It reached its commit: it may have committed before the kill, all of it or none.
            with_it = copy.deepcopy(model)
            apply_unit(with_it, in_flight)
            candidates.append(with_it)
        views = [candidate.view() for candidate in candidates]
        with SessionStore.open(path, summarizer=summarize) as store:
            got = observe(store)
            matched = [index for index, view in enumerate(views) if view == got]
            assert matched, (
                f"round {round_no}: the store is neither the acknowledged state nor that plus "
                f"the unit in flight ({calls(in_flight)}, reached its commit: "
                f"{bool(in_flight and in_flight.committed)}):\n"
                + "\nor, with the unit in flight:\n".join(difference(v, got) for v in views)
            )
            model = candidates[matched[-1]]
            if len(views) == 2 and views[0] != views[1]:
                tally.committed_unacked += matched == [1]
                tally.rolled_back += matched == [0]
            tally.in_flight_blocks += in_flight is not None and len(in_flight.cmds) > 1
            check_projection(store, round_no)
            assert observe(store) == model.view(), f"round {round_no}: changed by the rebuild"
            probe(store, model, round_no)
    elapsed = time.monotonic() - started
    summary = (
        f"{KILLS} kills {tally.modes}, {tally.units} units acknowledged ({tally.blocks} blocks, "
        f"{tally.aborted} aborted, {tally.undone} inner blocks undone), in flight: rolled back "
        f"{tally.rolled_back}, committed but unacknowledged {tally.committed_unacked}, blocks "
        f"{tally.in_flight_blocks}; "
        f"{elapsed:.1f}s\n{dict(sorted(tally.outcomes.items()))}"
    )
    print(summary)
    assert sum(tally.modes.values()) == KILLS >= 5
    assert tally.units > 10 * KILLS, f"the writer hardly wrote anything:\n{summary}"
    assert tally.blocks - tally.aborted > 0 and tally.aborted > 0 and tally.undone > 0, summary
    assert tally.rolled_back + tally.committed_unacked > 0, f"no kill hit a commit:\n{summary}"
    verbs = {
        "open_session", "inject", "fork", "fork_at", "trim", "reset", "compact", "set_scratchpad",
        "attach", "takeover", "detach", "client_inject_prompt", "close_session",
    }  # fmt: skip
    missed = sorted(verb for verb in verbs if not tally.outcomes.get(f"{verb}:ok"))
    assert not missed, f"verbs never acknowledged: {missed}\n{summary}"
