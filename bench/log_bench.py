"""Benchmarks of the event log, each against raw py-lmdb / msgspec / blake3 doing the same job.

- ``durable_append``: one event per `append` (one durable commit each) vs one `put` per durable
  py-lmdb write transaction, with values the size of our stored records.
- ``batched_append``: 1,000 events per `append` (one durable commit) vs msgspec-encoding the same
  payload structs and putting them in one durable py-lmdb transaction.
- ``read_all``: decoding the whole log with `iter_all()` vs a raw py-lmdb cursor over the same
  stored values plus msgspec decoding of each into `Envelope`.
- ``verify``: `verify()` over that log in MB/s vs a raw cursor over the same values hashing them
  into a blake3 chain (no decoding, no index checks).

Only this package measures performance; the tests never do. Stores live under `var/bench-tmp` (on
the repository's filesystem, never tmpfs: the fsync cost depends on the filesystem).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import lmdb
import msgspec

from bench import _scaffold
from bench._timing import Result, Sample, Stopwatch, Target, compare, write_bytes_per
from eventlog import ANY, GENESIS_HASH, Envelope, EventLog
from eventlog.events import Message, MessageInjected

RAW_MAP_SIZE = 4 * 1024**3  # sparse: reserves address space only
_ENCODER = msgspec.msgpack.Encoder(order="deterministic")  # how the log encodes a record
_VOCABULARY = (
    "the session agent tool call result user model reply token context window file path read "
    "write patch test build error retry plan step summary cache prompt stream event log commit "
    "index value hash chain verify page cursor map size grow reader writer lock sync durable"
)
_WORDS = _VOCABULARY.split()


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    round_s: float  # wall time one round of an append benchmark aims at (sizes are calibrated)
    durable_appends: tuple[int, int]  # (fewest, most) single-event appends per round
    batch_events: int  # events per append call in `batched_append`
    batches: tuple[int, int]  # (fewest, most) append calls per round in `batched_append`
    read_events: int  # events in the log that `read_all` and `verify` walk
    read_rounds: int


FULL = Sizes(
    rounds=9,
    round_s=0.5,
    durable_appends=(100, 3_000),
    batch_events=1_000,
    batches=(2, 40),
    read_events=200_000,
    read_rounds=7,
    budget_s=35.0,
)
QUICK = Sizes(
    rounds=3,
    round_s=0.05,
    durable_appends=(20, 200),
    batch_events=1_000,
    batches=(1, 3),
    read_events=20_000,
    read_rounds=3,
    budget_s=10.0,
)


def _fit(rate: float, seconds: float, bounds: tuple[int, int], per: int = 1) -> int:
    """How many units of `per` events fill `seconds` at `rate` events/s, within `bounds`."""
    low, high = bounds
    return max(low, min(high, round(rate * seconds / per)))


Context = _scaffold.Context[Sizes]


# Payloads


def _text(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    length = 0
    while length < chars:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    text = " ".join(words)[: chars - 1]
    return text[0].upper() + text[1:] + "."


def make_events(count: int, seed: int = 7) -> list[MessageInjected]:
    """Realistic user messages of about 200 characters, all different."""
    rng = random.Random(seed)
    return [
        MessageInjected(message=Message(role="user", content=_text(rng, rng.randint(180, 220))))
        for _ in range(count)
    ]


def make_streams(count: int, seed: int = 11) -> list[str]:
    """Session-like stream names (36 characters, the length of a UUID)."""
    rng = random.Random(seed)
    return [
        "-".join(
            "".join(rng.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12)
        )
        for _ in range(count)
    ]


def record_bytes(envelope: Envelope) -> bytes:
    """The bytes the log stores for `envelope` (the log's own encoding; checked in `read_all`)."""
    return _ENCODER.encode(envelope)


def _position_key(position: int) -> bytes:
    return position.to_bytes(8, "big")


def durable_puts(env: lmdb.Environment, values: Sequence[bytes]) -> Callable[[], Sample]:
    """The baseline of every durable-commit benchmark: a round puts each of `values` in a write
    transaction of its own, at the next free keys of `env`."""
    next_key = 1

    def raw() -> Sample:
        nonlocal next_key
        keys = [_position_key(next_key + i) for i in range(len(values))]
        next_key += len(values)
        with Stopwatch() as watch:
            for key, value in zip(keys, values, strict=True):
                with env.begin(write=True) as txn:
                    txn.put(key, value, append=True)
        return watch.sample(len(values))

    return raw


def _raw_env(path: Path, *, sync: bool) -> lmdb.Environment:
    path.mkdir(parents=True, exist_ok=True)
    return lmdb.open(
        str(path), map_size=RAW_MAP_SIZE, sync=sync, metasync=sync, writemap=False, max_dbs=2
    )


def _stored_values(log_dir: Path) -> list[bytes]:
    """Every record of a closed log, byte for byte as the log reads it back: unpacked where
    format 3 stores it packed (the bytes the chain hashes, not the bytes on disk)."""
    values: list[bytes] = []
    with EventLog.open(log_dir, readonly=True) as log:
        while page := log.read_records(after=len(values), limit=10_000):
            values += [raw for _, raw in page]
    return values


def write_amplification(
    ours: Callable[[], object], raw: Callable[[], object], count: int
) -> dict[str, Any]:
    """`write()` bytes per durable commit of one untimed round of each side, and their ratio (the
    pages a commit copies: the event's, the index's, the tree above them, the free list, the
    meta page)."""
    ours_bytes = write_bytes_per(ours, count)
    raw_bytes = write_bytes_per(raw, count)
    if ours_bytes is None or raw_bytes is None:
        return {}
    return {
        "write_bytes_per_commit": round(ours_bytes),
        "raw_write_bytes_per_commit": round(raw_bytes),
        "write_bytes_ratio": round(ours_bytes / raw_bytes, 2),
    }


def disk_bytes(root: Path, ours_events: int, raw_env: lmdb.Environment) -> dict[str, Any]:
    """Bytes of `data.mdb` per event stored, ours (`root/ours`) and raw (`root/raw`, the store of
    `raw_env`), the file holding everything each side needs to find an event again."""
    raw_events = int(raw_env.stat()["entries"])
    ours = (root / "ours" / "data.mdb").stat().st_size / max(ours_events, 1)
    raw = (root / "raw" / "data.mdb").stat().st_size / max(raw_events, 1)
    return {"disk_bytes_per_event": round(ours, 1), "raw_disk_bytes_per_event": round(raw, 1)}


# 1. Durable single-event appends


def durable_append(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    events = make_events(sizes.durable_appends[1], seed=1)
    streams = make_streams(8)
    log = EventLog.open(ctx.tmp / "durable" / "ours")  # the default: durable commits
    env = _raw_env(ctx.tmp / "durable" / "raw", sync=True)
    try:

        def append_ours(count: int) -> Sample:
            with Stopwatch() as watch:
                for index, event in enumerate(events[:count]):
                    log.append(streams[index % 8], [event], expected_version=ANY)
            return watch.sample(count)

        probe = append_ours(sizes.durable_appends[0])
        count = _fit(probe.rate, sizes.round_s, sizes.durable_appends)
        append_ours(count)  # also gives us the records whose sizes the baseline writes
        values = [record_bytes(e) for e in log.read(after=0, limit=count)]
        mean_size = sum(map(len, values)) / len(values)
        raw = durable_puts(env, values)

        result = compare(
            name="durable_append",
            description="log.append(stream, [event], expected_version=ANY), durable commit each",
            unit="events/s",
            baseline=raw,
            subject=lambda: append_ours(count),
            baseline_description=(
                "py-lmdb: one put per write transaction, sync=True metasync=True writemap=False, "
                "values of our record sizes"
            ),
            rounds=sizes.rounds,
            target=Target("ratio", 0.7),
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )
        result.notes = {
            "events_per_round": count,
            "record_bytes_mean": round(mean_size, 1),
            **write_amplification(lambda: append_ours(count), raw, count),
            **disk_bytes(ctx.tmp / "durable", log.head, env),
        }
        return [result]
    finally:
        log.close()
        env.close()


# 2. Batched appends


def batched_append(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    batch = sizes.batch_events
    batches = [make_events(batch, seed=100 + i) for i in range(sizes.batches[1])]
    streams = make_streams(sizes.batches[1], seed=12)
    log = EventLog.open(ctx.tmp / "batched" / "ours")
    env = _raw_env(ctx.tmp / "batched" / "raw", sync=True)
    encoder = msgspec.msgpack.Encoder()
    try:

        def append_ours(calls: int) -> Sample:
            with Stopwatch() as watch:
                for stream, events in zip(streams[:calls], batches[:calls], strict=True):
                    log.append(stream, events, expected_version=ANY)
            return watch.sample(calls * batch)

        probe = append_ours(sizes.batches[0])
        calls = _fit(probe.rate, sizes.round_s, sizes.batches, per=batch)
        raw_next = 1

        def raw() -> Sample:
            nonlocal raw_next
            position = raw_next
            raw_next += calls * batch
            with Stopwatch() as watch:
                for events in batches[:calls]:
                    with env.begin(write=True) as txn:
                        for event in events:
                            txn.put(_position_key(position), encoder.encode(event), append=True)
                            position += 1
            return watch.sample(calls * batch)

        result = compare(
            name="batched_append",
            description=f"log.append(stream, <{batch} events>, ...): one durable commit per call",
            unit="events/s",
            baseline=raw,
            subject=lambda: append_ours(calls),
            baseline_description=(
                f"msgspec encode of the same payload structs + py-lmdb put, {batch} per durable "
                "transaction"
            ),
            rounds=sizes.rounds,
            target=Target("ratio", 0.35),
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )
        result.notes = {"events_per_round": calls * batch, "events_per_append": batch}
        return [result]
    finally:
        log.close()
        env.close()


# 3 and 4. Reading and verifying the whole log


@dataclass
class ReadFixture:
    log: EventLog
    env: lmdb.Environment
    events: int
    record_bytes: int
    """The records' bytes as the chain hashes them (unpacked; `bench.store_bytes` measures the
    disk)."""
    reencode_matches: bool

    def close(self) -> None:
        self.log.close()
        self.env.close()


def read_fixture(ctx: Context) -> ReadFixture:
    """A log of `read_events` realistic events, and a plain LMDB copy of its stored values."""
    cached = ctx.cache.get("read_fixture")
    if isinstance(cached, ReadFixture):
        return cached
    count = ctx.sizes.read_events
    log_dir = ctx.tmp / "read" / "ours"
    ctx.note(f"  building a log of {count:,} events for read_all/verify ...")
    events = make_events(min(count, 10_000), seed=3)
    streams = make_streams(50, seed=13)
    per_append = 1_000
    with EventLog.open(log_dir, sync=False) as log:  # the same bytes, written faster
        written = 0
        while written < count:
            n = min(per_append, count - written)
            start = written % len(events)
            chunk = (events[start:] + events[:start])[:n]
            log.append(streams[(written // per_append) % len(streams)], chunk, expected_version=ANY)
            written += n
        sample = log.read(after=0, limit=100)
    values = _stored_values(log_dir)
    if len(values) != count:
        raise AssertionError(f"expected {count} stored records, found {len(values)}")
    matches = all(record_bytes(e) == v for e, v in zip(sample, values, strict=False))
    if not matches:
        print("  warning: re-encoded envelopes differ from the stored bytes", flush=True)
    env = _raw_env(ctx.tmp / "read" / "raw", sync=False)
    with env.begin(write=True) as txn:
        txn.cursor().putmulti([(_position_key(i), v) for i, v in enumerate(values, 1)], append=True)
    env.sync(True)
    fixture = ReadFixture(
        log=EventLog.open(log_dir),
        env=env,
        events=count,
        record_bytes=sum(map(len, values)),
        reencode_matches=matches,
    )
    del values
    ctx.cache["read_fixture"] = fixture
    return fixture


def read_all(ctx: Context) -> list[Result]:
    fx = read_fixture(ctx)
    decoder = msgspec.msgpack.Decoder(Envelope)

    def ours() -> Sample:
        n = 0
        with Stopwatch() as watch:
            for _ in fx.log.iter_all():
                n += 1
        if n != fx.events:
            raise AssertionError(f"iter_all gave {n} events, expected {fx.events}")
        return watch.sample(n)

    def raw() -> Sample:
        n = 0
        with Stopwatch() as watch, fx.env.begin(buffers=True) as txn:
            for _, value in txn.cursor():
                decoder.decode(value)
                n += 1
        return watch.sample(n)

    result = compare(
        name="read_all",
        description=f"decode the whole log ({fx.events:,} events) with log.iter_all()",
        unit="events/s",
        baseline=raw,
        subject=ours,
        baseline_description="py-lmdb cursor over the same values + msgspec decode into Envelope",
        rounds=ctx.sizes.read_rounds,
        target=Target("absolute", 500_000),
        budget_s=ctx.sizes.budget_s,
        progress=ctx.progress,
    )
    result.notes = {
        "events": fx.events,
        "record_bytes": fx.record_bytes,
        "record_bytes_mean": round(fx.record_bytes / fx.events, 1),
        "reencoded_record_bytes_match_stored": fx.reencode_matches,
    }
    return [result]


def verify(ctx: Context) -> list[Result]:
    fx = read_fixture(ctx)
    megabytes = fx.record_bytes / 1e6

    def ours() -> Sample:
        with Stopwatch() as watch:
            report = fx.log.verify()
        if not report.ok or report.events_checked != fx.events:
            raise AssertionError(f"verify failed on the benchmark log: {report}")
        return watch.sample(megabytes)

    def raw() -> Sample:
        with Stopwatch() as watch, fx.env.begin(buffers=True) as txn:
            prev = GENESIS_HASH
            for _, value in txn.cursor():
                hasher = blake3.blake3(prev)
                hasher.update(value)
                prev = hasher.digest()
        return watch.sample(megabytes)

    result = compare(
        name="verify",
        description=f"log.verify() over the whole log ({megabytes:.1f} MB of records)",
        unit="MB/s",
        baseline=raw,
        subject=ours,
        baseline_description="py-lmdb cursor over the same values, chained blake3(prev || value)",
        rounds=ctx.sizes.read_rounds,
        target=None,
        budget_s=ctx.sizes.budget_s,
        progress=ctx.progress,
    )
    result.notes = {"events": fx.events, "record_bytes": fx.record_bytes}
    return [result]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "durable_append": durable_append,
    "batched_append": batched_append,
    "read_all": read_all,
    "verify": verify,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    try:
        return _scaffold.run(BENCHMARKS, ctx, names)
    finally:
        fixture = ctx.cache.pop("read_fixture", None)
        if isinstance(fixture, ReadFixture):
            fixture.close()
