"""The writer process that `test_log_crash.py` kills with SIGKILL at random moments.

Usage: `python tests/_crash_writer.py LOG_PATH ROUND SEED`. It appends forever (single appends,
multi-event appends, multi-stream transactions) and reports on stdout, one flushed line each:
`ready HEAD` once the log is open, `begin TX N` before a call that writes N events, and
`ack {json}` after that call returned. It never exits on its own.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec

from eventlog import ANY, NO_STREAM, Envelope, EventLog
from eventlog.events import Message, MessageInjected

STREAMS = [f"crash-{k}" for k in range(6)]


def digest(event: object) -> str:
    """What the test compares a decoded event against: a hash of its JSON form."""
    return hashlib.sha256(msgspec.json.encode(event)).hexdigest()


def event_size(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.80:
        return rng.randint(10, 300)
    if roll < 0.98:
        return rng.randint(1_000, 8_000)
    return rng.randint(20_000, 100_000)  # overflow pages: one event spans many LMDB pages


def make_event(rng: random.Random, tx: str, index: int) -> MessageInjected:
    padding = rng.randbytes(event_size(rng) // 2).hex()
    return MessageInjected(message=Message(role="user", content=f"{tx}#{index} {padding}"))


def plan(rng: random.Random, round_no: int, counter: int) -> list[tuple[str, int]]:
    """(stream, event count) per append of one call; more than one entry means a transaction."""
    kind = rng.random()
    if kind < 0.35:
        return [(rng.choice(STREAMS), 1)]
    if kind < 0.65:
        return [(rng.choice(STREAMS), rng.randint(2, 40))]
    streams = rng.sample(STREAMS, rng.randint(2, 4))
    if rng.random() < 0.3:
        streams.append(f"crash-r{round_no}-new{counter}")  # created inside the transaction
    return [(stream, rng.randint(1, 20)) for stream in streams]


def main() -> None:
    path, round_no, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    with EventLog.open(path) as log:
        committed: list[Envelope] = []
        log.subscribe(committed.append)
        versions = {stream: log.stream_version(stream) for stream in STREAMS}
        print(f"ready {log.head}", flush=True)
        counter = 0
        while True:
            counter += 1
            tx = f"{round_no}.{counter}"
            steps = plan(rng, round_no, counter)
            total = sum(count for _, count in steps)
            written: list[MessageInjected] = []
            batches = []
            for stream, count in steps:
                batch = [make_event(rng, tx, len(written) + k) for k in range(count)]
                written.extend(batch)
                expected = versions.get(stream, NO_STREAM)
                if stream in versions and rng.random() < 0.2:
                    expected = ANY
                batches.append((stream, batch, expected))
            print(f"begin {tx} {total}", flush=True)
            positions: list[int] = []
            start = len(committed)
            if len(batches) == 1:
                stream, batch, expected = batches[0]
                meta = {"tx": tx, "n": total, "first": 0}
                positions += log.append(stream, batch, expected_version=expected, meta=meta)
            else:
                with log.transaction() as txn:
                    first = 0
                    for stream, batch, expected in batches:
                        meta = {"tx": tx, "n": total, "first": first}
                        positions += txn.append(stream, batch, expected_version=expected, meta=meta)
                        first += len(batch)
            envelopes = committed[start:]
            # Our own checks: the call returned what the subscription saw committed.
            assert [e.position for e in envelopes] == positions, (positions, envelopes)
            assert [e.data for e in envelopes] == written
            for envelope in envelopes:
                if envelope.stream in STREAMS:
                    versions[envelope.stream] = envelope.version
            rows = [
                [e.position, e.stream, e.version, e.hash.hex(), digest(w)]
                for e, w in zip(envelopes, written, strict=True)
            ]
            print("ack " + json.dumps({"tx": tx, "events": rows}), flush=True)


if __name__ == "__main__":
    main()
