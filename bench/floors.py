"""`python -m bench.floors [--rounds N]`: what the work every write and read must do costs on its
own, against the same raw py-lmdb baselines the engine suite measures against.

Three rows, each a ratio in one run, as in the other suites:

- ``append_floor``: 1,000 messages per durable transaction, each written as the log must write
  a one-message record: the message checked (`plain_message`), the event and its envelope built,
  encoded, hashed into the chain, packed when long enough (`eventlog/_packing.py`), put, and its
  position added to its stream's index chunk. One tight loop, with no command, no transaction
  bookkeeping and no projection. The baseline is the engine suite's `inject_batched`: py-lmdb
  putting values of the same sizes, encoded beforehand. No `inject` called once per message can
  reach a better ratio than this row's; ``append_floor_unpacked`` is the same loop without zstd.
- ``read_floor``: a cold read of one session's messages (one in four of the store's records, as
  in the engine suite's `snapshot_cold`), each as a read must check it: the record got and
  unpacked, the hash of the record before it read, the chain hash computed and compared, the
  envelope decoded. The baseline gets the same records with py-lmdb and nothing else. No cold
  `snapshot` can read more messages a second than this row.
- ``thread_handoff``: one thread waking another parked on a lock, in handoffs a second, against
  py-lmdb's durable one-put commits a second. A group commit of 16 writer threads wakes each of
  them once per shared commit (`sessions/_group.py`), so the ratio says how many handoffs cost
  one durable commit's time on this machine.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import blake3
import lmdb

from bench._timing import Result, Sample, Stopwatch, information, table
from bench.engine_bench import make_messages
from bench.log_bench import _position_key, _raw_env, durable_puts
from eventlog._codec import BODY_START, HASH_START, Envelope, _encode_into, envelope_decoder
from eventlog._lmdb_tree import POSITION_BYTES, chunk_key, event_key, slot
from eventlog._packing import PACK_MIN_BYTES, pack, unpacker
from eventlog._storage import stream_key
from eventlog.events import Message, MessageInjected
from sessions import SessionStore
from sessions._messages import plain_message

ROOT = Path(__file__).resolve().parent.parent
BATCH = 1_000
"""Messages per durable transaction in the append rows, as in the engine suite."""
SESSIONS = 8
READ_MESSAGES = 4_000
HANDOFFS = 2_000


def _append_rows(tmp: Path, rounds: int) -> list[Result]:
    messages = make_messages(BATCH * 4, seed=32)
    events = [MessageInjected(message=_plain(m)) for m in messages[:BATCH]]
    at = datetime.now(UTC)
    values = [bytes(_record(bytes(32), 1, "s", 1, event, at)[0]) for event in events]
    raw_env = _raw_env(tmp / "raw", sync=True)
    floor_env = _raw_env(tmp / "floor", sync=True)
    raw_next = floor_next = 1
    prev = bytes(32)
    versions: dict[str, int] = {}

    def raw() -> Sample:
        nonlocal raw_next
        position = raw_next
        raw_next += len(values)
        with Stopwatch() as watch, raw_env.begin(write=True) as txn:
            for value in values:
                txn.put(_position_key(position), value, append=True)
                position += 1
        return watch.sample(len(values))

    def floor(packed: bool) -> Sample:
        nonlocal floor_next, prev
        position = floor_next
        floor_next += BATCH
        at = datetime.now(UTC)
        with Stopwatch() as watch, floor_env.begin(write=True) as txn:
            put, get = txn.put, txn.get
            dirty: dict[bytes, bytes] = {}  # the index chunks this transaction rewrites
            for index, message in enumerate(messages[:BATCH]):
                stream = f"s{index % SESSIONS}"
                version = versions[stream] = versions.get(stream, 0) + 1
                event = MessageInjected(message=_plain(message))
                record, prev = _record(prev, position, stream, version, event, at)
                stored = pack(record) if packed and len(record) >= PACK_MIN_BYTES else record
                put(event_key(position), stored, True, False, True)
                key = chunk_key(stream_key(stream), version)
                held = dirty.get(key)
                if held is None:  # a chunk begun by an earlier transaction is read, as the log does
                    held = bytes(get(key) or b"") if slot(version) else b""
                dirty[key] = held + position.to_bytes(POSITION_BYTES, "big")
                position += 1
            for key, chunk in dirty.items():
                put(key, chunk)
        return watch.sample(BATCH)

    try:
        rows = []
        for name, packed in (("append_floor", True), ("append_floor_unpacked", False)):
            rows.append(
                information(
                    name,
                    f"{BATCH:,} one-message records per durable transaction, each checked, "
                    "encoded, chained, "
                    + ("packed, " if packed else "not packed, ")
                    + "put and indexed in one loop: no command, no projection",
                    "messages/s",
                    (
                        raw,
                        f"py-lmdb: {BATCH:,} puts of values of our record sizes in one durable "
                        "transaction (the engine suite's inject_batched baseline)",
                    ),
                    functools.partial(floor, packed),
                    rounds,
                )
            )
        return rows
    finally:
        raw_env.close()
        floor_env.close()


_HASHER = blake3.blake3()


def _plain(message: dict[str, Any]) -> Message:
    """`message` checked as `inject` checks a plain text message."""
    parsed = plain_message(message)
    if parsed is None:
        raise AssertionError(f"not a plain message: {message!r}")
    return parsed


def _record(
    prev: bytes, position: int, stream: str, version: int, event: MessageInjected, at: datetime
) -> tuple[bytearray, bytes]:
    """The record of `event` at `position`, chained to `prev`, as `_codec.encode_records`
    builds it (one hasher, reset per record); and its hash."""
    envelope = Envelope(prev, position, stream, version, at, {}, event)
    buf = bytearray()
    _encode_into(envelope, buf)
    _HASHER.reset()
    _HASHER.update(buf[HASH_START:])
    digest = _HASHER.digest()
    buf[HASH_START:BODY_START] = digest
    return buf, digest


def _read_row(tmp: Path, rounds: int) -> Result:
    pool = make_messages(READ_MESSAGES, seed=41)
    with SessionStore.open(tmp / "store", sync=False) as store:
        sessions = [store.open_session() for _ in range(4)]
        with store.transaction():
            for index, message in enumerate(pool):
                store.inject(sessions[index % 4], message)
        positions = [e.position for e in store.log.read_stream(sessions[1], limit=READ_MESSAGES)][
            1:
        ]  # its messages, after the event that opened it
    env = lmdb.open(str(tmp / "store"), readonly=True, lock=False, max_dbs=8)
    keys = [(event_key(p - 1), event_key(p)) for p in positions]
    unpack_one, decode = unpacker(), envelope_decoder.decode
    hasher = blake3.blake3()
    reset, update, digest_of = hasher.reset, hasher.update, hasher.digest

    def raw() -> Sample:
        with Stopwatch() as watch, env.begin(buffers=True) as txn:
            get = txn.get
            for _, key in keys:
                get(key)
        return watch.sample(len(keys))

    def floor() -> Sample:
        with Stopwatch() as watch, env.begin(buffers=True) as txn:
            get = txn.get
            for before_key, key in keys:
                before, stored = get(before_key), get(key)
                if before is None or stored is None:
                    raise AssertionError("a record of the floor's store is missing")
                link = bytes(before[HASH_START:BODY_START])
                record = unpack_one(stored)
                envelope = decode(record)
                reset()
                update(link)
                update(record[BODY_START:])
                if digest_of() != envelope.hash:
                    raise AssertionError("a record of the floor's store does not verify")
        return watch.sample(len(keys))

    try:
        return information(
            "read_floor",
            f"{len(keys):,} messages of one session among four, each got, unpacked, its chain "
            "link read, hashed, compared and decoded: a cold snapshot's reads alone",
            "messages/s",
            (raw, "py-lmdb: get of the same records, nothing else"),
            floor,
            rounds,
        )
    finally:
        env.close()


def _handoff_row(tmp: Path, rounds: int) -> Result:
    env = _raw_env(tmp / "commits", sync=True)
    durable = durable_puts(env, [b"x" * 300] * 200)

    def handoffs() -> Sample:
        ping, pong = threading.Lock(), threading.Lock()
        ping.acquire()
        pong.acquire()

        def other() -> None:
            for _ in range(HANDOFFS):
                ping.acquire()
                pong.release()

        thread = threading.Thread(target=other)
        thread.start()
        with Stopwatch() as watch:
            for _ in range(HANDOFFS):
                ping.release()
                pong.acquire()
        thread.join()
        return watch.sample(HANDOFFS * 2)  # each round trip wakes each thread once

    try:
        return information(
            "thread_handoff",
            "one thread wakes another parked on a lock, which runs (two a round trip)",
            "handoffs/s",
            (durable, "py-lmdb: one put per durable write transaction"),
            handoffs,
            rounds,
        )
    finally:
        env.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floors", description=__doc__)
    parser.add_argument("--rounds", type=int, default=9, help="rounds per side (default 9)")
    args = parser.parse_args(argv)
    scratch = ROOT / "var" / "bench-tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="floors-", dir=scratch))
    try:
        results = measure(tmp, args.rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(results))
    return 0


def measure(tmp: Path, rounds: int) -> list[Result]:
    """Every row, with scratch stores under `tmp`."""
    results = _append_rows(tmp / "append", rounds)
    results.append(_read_row(tmp / "read", rounds))
    results.append(_handoff_row(tmp / "handoff", rounds))
    return results


if __name__ == "__main__":
    raise SystemExit(main())
