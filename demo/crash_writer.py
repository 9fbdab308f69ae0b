"""The demo's doomed writer: appends messages to one session, one durable commit each, until killed.

Prints `ready` once the store is open, then the number of each message after its commit returned:
a printed number is an acknowledged append, which must survive the SIGKILL that ends this process.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sessions import SessionStore


def main(store_path: str, session_id: str) -> None:
    with SessionStore.open(store_path) as store:
        print("ready", flush=True)
        number = 0
        while True:
            number += 1
            store.inject(session_id, {"role": "user", "content": f"crash-test message {number}"})
            print(number, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
