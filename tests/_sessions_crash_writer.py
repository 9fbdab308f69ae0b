"""The writer process that `test_sessions_crash.py` kills with SIGKILL at random moments.

Usage: `python tests/_sessions_crash_writer.py STORE_PATH ROUND SEED`. It opens
`SessionStore.open(STORE_PATH)` and runs a mixed workload of session verbs forever, in units: a
unit is one verb call, or one `with store.transaction():` block of several verbs (some blocks abort
on purpose by raising, some hold an inner block that raises and is undone alone). It reports on
stdout, one flushed JSON line each:

- `ready {"head": N}` once the store is open;
- `cmd {...}` before each verb call, naming the unit, its index in the unit, the verb and every
  argument (session ids, message, client, keep counts, ...), so the test can replay it on a model;
- `undo {"unit": U, "from": I, "to": J}` after an inner block (a savepoint inside a block) that
  raised on purpose: its calls `I..J-1` ran, then were undone, and the outer block goes on;
- `commit {"unit": U, "n": N}` once the unit's calls are all issued and nothing but the commit is
  left (for a single call: right before it, for a block: as the last statement inside the block).
  A unit without this line never committed; an aborting block never prints it;
- `ack {"unit": U, "results": [...]}` after the unit returned (for a block: after it committed),
  one result per call: `{"ok": value}` (the verb's return value, reduced to plain data) or
  `{"refused": "ErrorClass"}` for a verb the store refused; or `ack {"unit": U, "aborted": true}`
  after a block that raised and was rolled back.

The workload reads the store to choose mostly-valid verbs; correctness never depends on those
choices, because the test checks every reported outcome against its own model. It never exits on
its own.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sessions import (
    ControllerConflictError,
    InvalidArgumentError,
    SessionExistsError,
    SessionStore,
    UnknownSessionError,
)

POOL = [f"s{k}" for k in range(10)]
"""The session ids the workload uses; a small pool, so closed ids get reopened and forked onto."""
CLIENTS = ["alice", "bob", "carol"]
REFUSALS = (UnknownSessionError, SessionExistsError, ControllerConflictError, InvalidArgumentError)


def summarize(messages: list[dict[str, Any]]) -> str:
    """The store's deterministic `llm` summarizer: the test computes the same summary."""
    blob = json.dumps(messages, sort_keys=True).encode()
    return f"summary of {len(messages)}: {hashlib.sha256(blob).hexdigest()[:16]}"


class Aborted(Exception):
    """Raised inside a block to roll it back on purpose."""


def emit(word: str, body: dict[str, Any]) -> None:
    print(f"{word} {json.dumps(body, separators=(',', ':'))}", flush=True)


def content(rng: random.Random, label: str) -> str:
    roll = rng.random()
    size = rng.randint(0, 120) if roll < 0.9 else rng.randint(2_000, 40_000)  # some overflow pages
    return f"{label} {rng.randbytes(size // 2).hex()}"


def message(rng: random.Random, label: str) -> dict[str, Any]:
    roll = rng.random()
    if roll < 0.45:
        return {"role": "user", "content": content(rng, label)}
    if roll < 0.8:
        return {"role": "assistant", "content": content(rng, label)}
    return {"role": "tool", "content": content(rng, label), "tool_call_id": f"call-{label}"}


def choose(store: SessionStore, rng: random.Random, label: str) -> dict[str, Any]:
    """One verb call, chosen from what the store holds now (inside a block: the block's view)."""
    sid = rng.choice(POOL)
    if not store.exists(sid):
        roll = rng.random()
        live = [other for other in POOL if store.exists(other)]
        if roll < 0.75 or not live:
            return {"verb": "open_session", "sid": sid}
        if roll < 0.92:
            return {"verb": "fork", "sid": rng.choice(live), "dest": sid}
        return {
            "verb": rng.choice(["inject", "trim", "reset"]),
            "sid": sid,
            "keep": 1,
            "message": message(rng, label),
        }  # refused: the session is not open
    length = store.length(sid)
    clients = {c["client_id"]: c["mode"] for c in store.live_clients(sid)}
    controller = next((c for c, mode in clients.items() if mode == "controller"), None)
    verb = rng.choices(
        [
            "inject",
            "fork",
            "fork_at",
            "trim",
            "reset",
            "compact",
            "set_scratchpad",
            "clear_scratchpad",
            "attach",
            "takeover",
            "detach",
            "client_inject_prompt",
            "close_session",
            "open_session",
        ],
        weights=[30, 5, 5, 4, 2, 6, 6, 1, 6, 3, 3, 8, 8, 1],
    )[0]
    if verb == "client_inject_prompt" and controller is None and rng.random() < 0.6:
        verb = "takeover"  # mostly prompt as the controller; a prompt without one is refused
    cmd: dict[str, Any] = {"verb": verb, "sid": sid}
    if verb == "inject":
        cmd["message"] = message(rng, label)
    elif verb in ("fork", "fork_at"):
        free = [other for other in POOL if not store.exists(other)]
        # Mostly onto a free id; sometimes onto an open one (refused), rarely onto itself.
        cmd["dest"] = rng.choice(free) if free and rng.random() < 0.85 else rng.choice(POOL)
        if verb == "fork_at":
            cmd["keep"] = rng.randint(0, length + 2)
    elif verb == "trim":
        cmd["keep"] = rng.randint(0, length + 1)
    elif verb == "compact":
        cmd["strategy"] = rng.choice(["truncate", "llm"])
        cmd["keep"] = rng.randint(0, 8)
    elif verb == "set_scratchpad":
        cmd["pad"] = {
            "label": label,
            "n": rng.randint(0, 10**6),
            "notes": [label] * rng.randint(0, 3),
        }
    elif verb == "attach":
        cmd["client"] = rng.choice(CLIENTS)
        cmd["mode"] = rng.choice(["observer", "controller"])
        cmd["takeover"] = rng.random() < 0.5
    elif verb == "takeover":
        cmd["client"] = rng.choice(CLIENTS)
    elif verb == "detach":
        attached = list(clients)
        cmd["client"] = (
            rng.choice(attached) if attached and rng.random() < 0.85 else rng.choice(CLIENTS)
        )
    elif verb == "client_inject_prompt":
        right = controller is not None and rng.random() < 0.85
        cmd["client"] = controller if right else rng.choice(CLIENTS)
        cmd["content"] = content(rng, label)
    elif verb == "close_session":
        cmd["reason"] = rng.choice([None, "done", "crash-test"])
    return cmd


def run(store: SessionStore, cmd: dict[str, Any]) -> Any:
    """Call the verb `cmd` names; returns its result reduced to plain data."""
    verb, sid = cmd["verb"], cmd["sid"]
    if verb == "open_session":
        return store.open_session(sid)
    if verb == "inject":
        return store.inject(sid, cmd["message"])
    if verb == "fork":
        return store.fork(sid, cmd["dest"])
    if verb == "fork_at":
        return store.fork_at(sid, cmd["keep"], cmd["dest"])
    if verb == "trim":
        return store.trim(sid, cmd["keep"])
    if verb == "reset":
        return store.reset(sid)
    if verb == "compact":
        return store.compact(sid, compact_strategy=cmd["strategy"], keep_last=cmd["keep"])
    if verb == "set_scratchpad":
        return store.set_scratchpad(sid, cmd["pad"], {"source": "crash-writer"})["version"]
    if verb == "clear_scratchpad":
        return store.clear_scratchpad(sid)["version"]
    if verb == "attach":
        opts = {"mode": cmd["mode"], "takeover": cmd["takeover"]}
        return store.attach(sid, cmd["client"], opts)["mode"]
    if verb == "takeover":
        return store.takeover(sid, cmd["client"])["mode"]
    if verb == "detach":
        return store.detach(sid, cmd["client"])["released_control"]
    if verb == "client_inject_prompt":
        return store.client_inject_prompt(sid, cmd["client"], cmd["content"])
    if verb == "close_session":
        return store.close_session(sid, cmd["reason"])
    raise AssertionError(f"unknown verb {verb}")


def call(
    store: SessionStore, unit: str, index: int, cmd: dict[str, Any], *, single: bool = False
) -> dict[str, Any]:
    emit("cmd", {"unit": unit, "i": index, **cmd})
    if single:
        emit("commit", {"unit": unit, "n": 1})  # nothing is left but the call and its commit
    try:
        return {"ok": run(store, cmd)}
    except REFUSALS as exc:
        return {"refused": type(exc).__name__}


def block(store: SessionStore, rng: random.Random, unit: str) -> None:
    """One `with store.transaction():` block of several calls. Some blocks hold an inner block
    (a savepoint) that raises after its calls, which undoes just those; some abort as a whole."""
    size = rng.randint(2, 6)
    inner_at = rng.randrange(size) if rng.random() < 0.4 else None
    abort = rng.random() < 0.2
    results: list[dict[str, Any]] = []
    try:
        with store.transaction():
            for step in range(size):
                if step == inner_at:
                    start = len(results)
                    try:
                        with store.transaction():
                            for _ in range(rng.randint(1, 3)):
                                index = len(results)
                                cmd = choose(store, rng, f"{unit}#{index}")
                                results.append(call(store, unit, index, cmd))
                            raise Aborted(unit)
                    except Aborted:
                        emit("undo", {"unit": unit, "from": start, "to": len(results)})
                index = len(results)
                results.append(call(store, unit, index, choose(store, rng, f"{unit}#{index}")))
            if abort:
                raise Aborted(unit)
            emit("commit", {"unit": unit, "n": len(results)})
    except Aborted:
        emit("ack", {"unit": unit, "aborted": True})
        return
    emit("ack", {"unit": unit, "results": results})


def main() -> None:
    path, round_no, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    with SessionStore.open(path, summarizer=summarize) as store:
        emit("ready", {"head": store.log.head})
        counter = 0
        while True:
            counter += 1
            unit = f"{round_no}.{counter}"
            if rng.random() < 0.8:
                result = call(store, unit, 0, choose(store, rng, f"{unit}#0"), single=True)
                emit("ack", {"unit": unit, "results": [result]})
                continue
            block(store, rng, unit)


if __name__ == "__main__":
    main()
