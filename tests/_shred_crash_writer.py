"""The writer process that `test_shred_crash.py` kills with SIGKILL, mostly inside `forget` and
`rotate_keys`.

Usage: `python tests/_shred_crash_writer.py STORE_PATH SEED KEY_HEX_A KEY_HEX_B`. It opens the
store with whichever of the two keys opens it (a rotation alternates them), then, forever: opens
a session holding one planted message, then forgets a live session or rotates to the other key.
One flushed line each: `ready {"key": "a"|"b"}` once open; `made {"sid"}` after a session is
committed; `op {"op": "forget"|"rotate", "sid"?, "to"?}` before a forget or rotation starts;
`done {...}` after it returned.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import projections as pj
from sessions import LocalKeyProvider, SessionStore, WrongKeyError


def say(word: str, data: dict[str, object]) -> None:
    sys.stdout.write(f"{word} {json.dumps(data)}\n")
    sys.stdout.flush()


def open_with_either(path: str, keys: dict[str, LocalKeyProvider]) -> tuple[SessionStore, str]:
    for name, key in keys.items():
        store = SessionStore.open(path, keys=key)
        try:
            store._keyring.provider_checked("open")  # the key that opens the keyring
        except WrongKeyError:
            store.close()
            continue
        return store, name
    raise SystemExit("neither key opens the store")


def main() -> None:
    path, seed, hex_a, hex_b = sys.argv[1:5]
    rng = random.Random(int(seed))
    keys = {
        "a": LocalKeyProvider.from_text(hex_a, "a"),
        "b": LocalKeyProvider.from_text(hex_b, "b"),
    }
    store, current = open_with_either(path, keys)
    say("ready", {"key": current})
    with store.log.view() as view:
        live = [state.session_id for state in pj.iter_states(view) if not state.forgotten]
    count = rng.randrange(10**9)
    while True:
        count += 1
        sid = f"s{count}"
        store.open_session(sid, title=f"title-{sid}")
        store.inject(sid, {"role": "user", "content": f"secret-{sid}"})
        say("made", {"sid": sid})
        live.append(sid)
        if rng.random() < 0.5 and live:
            victim = live.pop(rng.randrange(len(live)))
            say("op", {"op": "forget", "sid": victim})
            store.forget(victim, "crash test")
            say("done", {"op": "forget", "sid": victim})
        else:
            target = "b" if current == "a" else "a"
            say("op", {"op": "rotate", "to": target})
            store.rotate_keys(keys[target])
            current = target
            say("done", {"op": "rotate", "to": target})


if __name__ == "__main__":
    main()
