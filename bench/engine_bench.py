"""Benchmarks of the session engine (`sessions.SessionStore`), each beside a baseline in the same run.

- ``fork``: `fork` and `fork_at(keep_first=half)` of sessions holding 10, 1,000 and 100,000
  messages (`--quick`: 10, 1,000, 10,000), one durable commit per fork, shown as time per fork. The
  baseline, for information, is reading the messages a copying fork would have to copy (all of
  them, or the first half). Two more figures per size (see `fork_bytes`): the growth of `data.mdb`
  over all the forks of that row, and the bytes one fork writes (its event record, its
  stream-index entry and every projection key it adds or changes). A check then compares the time
  at the largest size with the time at the smallest: a fork must not scale with the transcript.
- ``inject_durable``: `inject`, one durable commit per command, vs raw py-lmdb doing one `put` per
  durable write transaction with values of the sizes of our stored records.
- ``inject_batched``: 1,000 messages per durable transaction, vs raw py-lmdb putting the same number
  of values of the same sizes in one durable transaction; two rows: ``inject_batched`` is the batched
  verb, `store.inject_many(sid, messages)` of 1,000 messages, and ``inject_batched_calls`` (for
  information) is 1,000 separate `inject` calls inside one `store.transaction()`.
- ``inject_threads``: 16 threads, each injecting into its own session with one durable `inject`
  per call, vs one thread doing the same on the same store (target 5x): concurrent writers share
  group commits (`sessions/_group.py`), so one fsync acknowledges many commands.
- ``snapshot``: `snapshot()` of a 1,000-message transcript (interleaved with three other sessions in
  the log, as concurrent sessions are), in messages/s: cold (a store with `hot_sessions=0`, so every
  message is read and hash-checked from the log; the OS page cache is warm) vs point reads of the
  same records with raw py-lmdb + msgspec decode + `to_builtins`; and warm (the engine's hot cache)
  vs `msgspec.to_builtins` of the cached messages, the floor for handing out fresh dicts; and
  ``snapshot_after_inject`` (information): each snapshot right after an inject into the session
  (not timed), so the cached copy is one message behind, against the same floor.
- ``open_snapshot``: `SessionStore.open(path)` + `snapshot()` of a 100-message session, on a store
  of 1,000,000 events against the same on a store of 10,000 events (`--quick`: 100,000 vs 1,000),
  shown as time per open; the ratio says how flat it is. ``open_snapshot_cold`` repeats it after
  evicting `data.mdb` from the OS page cache (`posix_fadvise(DONTNEED)`; Linux; not in `--quick`).
- ``tree``: what `sessionlog tree` does for a family of 1,000 sessions (a root of 2,000 messages and
  999 forks, ten per session, four levels deep), loading every node and drawing the text tree, shown
  as time per tree; each node is one projection read (`SessionStore.summary`). The baseline, for
  information, is the way it used to load them: a full `snapshot` (every message) per node. The
  target: a tree of 1,000 sessions in under 0.5 s.
- ``rebuild``: `store.rebuild()` over a store of about 200,000 events of a realistic mix (opens,
  injects, forks, fork_at, trims, closes) vs `log.iter_all()` over the same log (reading and
  hash-checking alone).
- ``verify_projections``: `store.verify(projections=True)` on the 1,000,000-event store of
  ``open_snapshot`` (`--quick`: 100,000) vs `store.verify()` on the same store: what checking every
  projection against the log adds to checking the log. Both walk in a child process, whose CPU
  time is the CPU column; the notes give the children's peak resident memory (which counts the
  mapped pages of `data.mdb`).

Stores built from many engine commands are cached under ``var/bench-cache/``, in a directory named
after `FIXTURE_VERSION` and the log's on-disk format marker, one sub-directory per fixture and size
holding the LMDB files and a ``fixture.json`` written last (a build that was killed leaves no
``fixture.json`` and is built again). Later runs reuse them: the 1,000,000-event store takes a
minute or so to build with batched transactions. A fixture whose projection was computed by other
`projections/` sources (a fingerprint in ``fixture.json``) is brought up to date with `rebuild()`
rather than rebuilt from scratch, since the events stay valid. ``--rebuild-cache`` deletes and
rebuilds the fixtures a run uses; deleting ``var/bench-cache/`` is always safe. Benchmarks that
write (fork, rebuild) work on a copy of the cached store under ``var/bench-tmp``.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import msgspec

import projections as pj
from bench import _scaffold
from bench._timing import Result, Sample, Stopwatch, Target, compare, run_threads
from bench.log_bench import (
    _fit,
    _position_key,
    _raw_env,
    _stored_values,
    _text,
    durable_puts,
    record_bytes,
    write_amplification,
)
from eventlog import Envelope
from eventlog._lmdb import FORMAT
from eventlog.events import Message
from sessions import SessionStore

FIXTURE_VERSION = 1
"""Bump when the fixture builders change what they write: cached stores of another version are
ignored (and can be deleted)."""

ROOT = Path(__file__).resolve().parent.parent
BUILD_BATCH = 1_000  # engine commands per transaction when building fixtures


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    round_s: float  # wall time one round aims at where the work per round is calibrated
    fork_messages: tuple[int, ...]  # transcript sizes forked
    forks_per_round: int
    fork_copy_messages: int  # baseline: copies per round read about this many messages (>= 1 copy)
    durable_injects: tuple[int, int]  # (fewest, most) durable injects per round
    batch_injects: int  # injects per transaction in `inject_batched`
    batches: tuple[int, int]  # (fewest, most) transactions per round
    snapshot_messages: int
    snapshots: tuple[int, int]  # (fewest, most) snapshots per round
    open_events: tuple[int, int]  # (big, small) store sizes for `open_snapshot`
    open_session_messages: int
    opens_per_round: int
    open_cold: bool  # also measure with data.mdb evicted from the page cache
    rebuild_events: int
    rebuild_rounds: int


FULL = Sizes(
    rounds=9,
    round_s=0.3,
    fork_messages=(10, 1_000, 100_000),
    forks_per_round=20,  # 1 warm-up + 9 rounds: 200 forks per row
    fork_copy_messages=20_000,
    durable_injects=(100, 3_000),
    batch_injects=1_000,
    batches=(2, 40),
    snapshot_messages=1_000,
    snapshots=(5, 500),
    open_events=(1_000_000, 10_000),
    open_session_messages=100,
    opens_per_round=5,
    open_cold=True,
    rebuild_events=200_000,
    rebuild_rounds=7,
    budget_s=35.0,
)
QUICK = Sizes(
    rounds=3,
    round_s=0.03,
    fork_messages=(10, 1_000, 10_000),
    forks_per_round=5,
    fork_copy_messages=2_000,
    durable_injects=(20, 200),
    batch_injects=1_000,
    batches=(1, 2),
    snapshot_messages=1_000,
    snapshots=(2, 50),
    open_events=(100_000, 1_000),
    open_session_messages=100,
    opens_per_round=2,
    open_cold=False,
    rebuild_events=10_000,
    rebuild_rounds=3,
    budget_s=10.0,
)


@dataclass(kw_only=True)
class Context(_scaffold.Context[Sizes]):
    cache_dir: Path  # var/bench-cache
    rebuild_cache: bool = False
    quick: bool = False
    rebuilt: set[str] = field(default_factory=set)  # fixtures already rebuilt by this run


# Payloads


def make_messages(count: int, seed: int) -> list[dict[str, Any]]:
    """Alternating user and assistant messages of realistic, varied lengths (80 to 900 chars)."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for index in range(count):
        if index % 2 == 0:
            out.append({"role": "user", "content": _text(rng, rng.randint(80, 300))})
        else:
            out.append({"role": "assistant", "content": _text(rng, rng.randint(200, 900))})
    return out


def _data_file(path: Path) -> Path:
    return path / "data.mdb"


def _evict(path: Path) -> None:
    """Drop `path`'s clean pages from the OS page cache, so the next open reads from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# Fixture stores: built through the engine in batched transactions, cached across runs.


def _projection_fingerprint() -> str:
    """A hash of the projection sources: a cached projection computed by other code is stale."""
    digest = hashlib.sha256()
    for source in sorted((ROOT / "projections").glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def _cache_root(ctx: Context) -> Path:
    fmt = FORMAT.decode().replace("/", "-")
    return ctx.cache_dir / f"engine-v{FIXTURE_VERSION}-{fmt}"


Builder = Callable[[SessionStore], dict[str, Any]]


def cached_store(ctx: Context, name: str, builder: Builder) -> tuple[Path, dict[str, Any]]:
    """The directory of the cached fixture `name` (built by `builder` when missing) and its
    metadata. Callers that write must work on a copy (`copy_store`)."""
    root = _cache_root(ctx)
    path = root / name
    meta_file = path / "fixture.json"
    if ctx.rebuild_cache and name not in ctx.rebuilt:
        shutil.rmtree(path, ignore_errors=True)
        ctx.rebuilt.add(name)
    meta = _load_meta(meta_file)
    if meta is not None:
        fingerprint = _projection_fingerprint()
        if meta.get("projection_fingerprint") != fingerprint:
            ctx.note(f"  cached {name}: projection sources changed, rebuilding its projection ...")
            started = time.perf_counter()
            try:
                with SessionStore.open(path, sync=False) as store:
                    store.rebuild()
            except Exception as exc:
                ctx.note(f"  cached {name} cannot be reused ({exc}); building it again")
                meta = None
            else:
                meta["projection_fingerprint"] = fingerprint
                meta["projection_rebuilt_s"] = round(time.perf_counter() - started, 1)
                meta_file.write_text(json.dumps(meta, indent=2) + "\n")
        if meta is not None:
            ctx.note(f"  using cached {name} ({meta['events']:,} events) from {path}")
            return path, meta
    ctx.note(f"  building {name} (cached under {root} for later runs) ...")
    shutil.rmtree(path, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    building = root / f".building-{name}-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    started = time.perf_counter()
    try:
        with SessionStore.open(building, sync=False) as store:
            meta = builder(store)
            meta["events"] = store.log.head
        meta.update(
            fixture=name,
            fixture_version=FIXTURE_VERSION,
            log_format=FORMAT.decode(),
            projection_fingerprint=_projection_fingerprint(),
            build_s=round(time.perf_counter() - started, 1),
            built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            data_bytes=_data_file(building).stat().st_size,
        )
        (building / "fixture.json").write_text(json.dumps(meta, indent=2) + "\n")
        os.rename(building, path)  # atomic: a concurrent or killed build never looks complete
    finally:
        shutil.rmtree(building, ignore_errors=True)
    ctx.note(f"  built {name}: {meta['events']:,} events in {meta['build_s']:.1f}s")
    return path, meta


def _load_meta(meta_file: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("fixture_version") != FIXTURE_VERSION:
        return None
    if not _data_file(meta_file.parent).exists():
        return None
    return meta


def copy_store(source: Path, destination: Path) -> Path:
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_data_file(source), _data_file(destination))
    return destination


class _Batches:
    """Runs engine commands in transactions of about `BUILD_BATCH` commands."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.pending = 0
        self._tx: Any = None

    def __enter__(self) -> _Batches:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close(exc[0] is None)

    def tick(self) -> None:
        if self._tx is None:
            self._tx = self.store.transaction()
            self._tx.__enter__()
        self.pending += 1
        if self.pending >= BUILD_BATCH:
            self._close(True)

    def _close(self, ok: bool) -> None:
        if self._tx is not None:
            tx, self._tx, self.pending = self._tx, None, 0
            if ok:
                tx.__exit__(None, None, None)
            else:
                tx.__exit__(RuntimeError, RuntimeError("fixture build failed"), None)


def build_population(
    store: SessionStore,
    *,
    events: int,
    seed: int,
    mix: bool,
    target_messages: int | None = None,
) -> dict[str, Any]:
    """About `events` events from many concurrent sessions, through the engine.

    Sessions of 20 to 180 messages (100 on average) run concurrently, so each transcript is spread
    over the log. With `target_messages`, one session opened half way holds exactly that many
    messages (the one `open_snapshot` reads). With `mix`, sessions are also forked (half of them
    with `fork_at`), trimmed and closed at their end, as a store that has served agents for a while.
    """
    rng = random.Random(seed)
    pool = make_messages(4_096, seed)
    concurrent = max(4, min(64, events // 1_000))
    active: list[list[Any]] = []  # [session id, messages still to write]
    lengths: dict[str, int] = {}
    counts: Counter[str] = Counter()
    target: str | None = None
    written = 0
    next_message = 0

    def open_one(remaining: int) -> str:
        sid = store.open_session()
        active.append([sid, remaining])
        lengths[sid] = 0
        counts["open"] += 1
        return sid

    with _Batches(store) as batches:
        while written < events or (target is not None and lengths[target] < (target_messages or 0)):
            batches.tick()
            written += 1
            if len(active) < concurrent:
                if target_messages is not None and target is None and written >= events // 2:
                    target = open_one(target_messages)
                else:
                    open_one(rng.randint(20, 180))
                continue
            slot = rng.randrange(len(active))
            sid, remaining = active[slot]
            roll = rng.random() if mix and sid != target else 1.0
            if roll < 0.01 and lengths[sid] > 0:
                if roll < 0.005:
                    child = store.fork(sid)
                    lengths[child] = lengths[sid]
                    counts["fork"] += 1
                else:
                    keep = rng.randint(0, lengths[sid])
                    child = store.fork_at(sid, keep)
                    lengths[child] = keep
                    counts["fork_at"] += 1
                active.append([child, rng.randint(5, 60)])
                continue
            if roll < 0.02 and lengths[sid] > 10:
                lengths[sid] = store.trim(sid, rng.randint(5, lengths[sid] - 1))
                counts["trim"] += 1
                continue
            store.inject(sid, pool[next_message % len(pool)])
            next_message += 1
            lengths[sid] += 1
            counts["inject"] += 1
            if remaining > 1:
                active[slot][1] = remaining - 1
                continue
            active.pop(slot)
            if mix:
                store.close_session(sid)
                counts["close"] += 1
    meta: dict[str, Any] = {"commands": dict(counts), "sessions": counts["open"]}
    if target is not None:
        meta["target_session"] = target
        meta["target_messages"] = lengths[target]
    return meta


def build_fork_sources(store: SessionStore, sizes: Sequence[int]) -> dict[str, Any]:
    """One session per size, their messages interleaved while several are still growing."""
    pool = make_messages(4_096, seed=21)
    sessions = {size: store.open_session() for size in sizes}
    left = {size: size for size in sizes}
    written = 0
    with _Batches(store) as batches:
        while any(left.values()):
            for size, sid in sessions.items():
                if left[size]:
                    batches.tick()
                    store.inject(sid, pool[written % len(pool)])
                    written += 1
                    left[size] -= 1
    return {"sessions": {str(size): sid for size, sid in sessions.items()}}


# 1. fork and fork_at


def fork(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    label = "-".join(str(n) for n in sizes.fork_messages)
    cached, meta = cached_store(
        ctx, f"fork-sources-{label}", lambda s: build_fork_sources(s, sizes.fork_messages)
    )
    path = copy_store(cached, ctx.tmp / "fork")
    results: list[Result] = []
    # hot_sessions=0: the baseline's reads are real reads; a fork never uses that cache anyway.
    with SessionStore.open(path, hot_sessions=0) as store:  # durable: one fsync per fork
        for verb in ("fork", "fork_at"):
            for size in sizes.fork_messages:
                source = meta["sessions"][str(size)]
                results.append(_fork_row(ctx, store, path, verb, size, source))
    return results


def _fork_row(
    ctx: Context, store: SessionStore, path: Path, verb: str, size: int, source: str
) -> Result:
    sizes = ctx.sizes
    keep = size // 2
    per_round = sizes.forks_per_round

    def one_fork() -> str:
        return store.fork(source) if verb == "fork" else store.fork_at(source, keep)

    singles: list[float] = []
    forks_done = 0

    def subject() -> Sample:
        nonlocal forks_done
        with Stopwatch() as watch:
            for _ in range(per_round):
                started = time.perf_counter()
                one_fork()
                singles.append(time.perf_counter() - started)
        forks_done += per_round
        return watch.sample(per_round)

    copies = max(1, min(per_round, sizes.fork_copy_messages // max(size, 1)))
    kept = size if verb == "fork" else keep

    def baseline() -> Sample:
        with Stopwatch() as watch:
            for _ in range(copies):
                messages = _read_first(store, source, kept)
        if len(messages) != kept:
            raise AssertionError(f"read {len(messages)} messages, expected {kept}")
        return watch.sample(copies)

    file_before = _data_file(path).stat().st_size
    result = compare(
        name=f"{verb}/{size}",
        description=(
            f"store.{verb}(<session of {size:,} messages>"
            + ("" if verb == "fork" else f", keep_first={keep:,}")
            + "), one durable commit per fork"
        ),
        unit="forks/s",
        baseline=baseline,
        subject=subject,
        baseline_description=(
            f"reading the {kept:,} messages a copying fork would copy "
            "(projection refs + hash-checked event reads, hot cache off)"
        ),
        rounds=sizes.rounds,
        target=Target("absolute", 1_000),  # under 1 ms per fork
        budget_s=sizes.budget_s,
        progress=ctx.progress,
    )
    file_after = _data_file(path).stat().st_size
    result.per = "fork"
    singles.sort()
    result.notes = {
        "messages": size,
        "keep_first": None if verb == "fork" else keep,
        "forks_measured": forks_done,
        "fork_ms_p50": round(1e3 * statistics.median(singles), 4),
        "fork_ms_p90": round(1e3 * singles[int(0.9 * (len(singles) - 1))], 4),
        "fork_ms_max": round(1e3 * singles[-1], 4),
        "copy_ms_median": round(1e3 / result.baseline, 4),
        "data_mdb_growth_bytes_per_fork": round((file_after - file_before) / forks_done, 1),
        **fork_bytes(store, one_fork),
    }
    return result


def _read_first(store: SessionStore, session_id: str, count: int) -> list[Message]:
    """The first `count` messages of a session, read as `snapshot` reads them (what a fork that
    copied the transcript would have to read at least)."""
    with store.log.view() as view:
        transcript = pj.load_transcript(view, session_id) or pj.Transcript()
        ranges = pj.slice_ranges(transcript.ranges, 0, count)
        return pj.read_messages(view, transcript, ranges=ranges)


def fork_bytes(store: SessionStore, one_fork: Callable[[], str]) -> dict[str, Any]:
    """What one more fork writes: its event record, its stream-index entry, and every projection
    key it adds or changes (key + value bytes), from the projection before and after it."""
    with store.log.view() as view:
        before = dict(pj.dump(view))
    child = one_fork()
    with store.log.view() as view:
        after = dict(pj.dump(view))
        envelope = view.read(after=view.head - 1, limit=1)[0]
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    if envelope.stream != child:
        raise AssertionError("the last event is not the fork's")
    record = len(record_bytes(envelope))
    # A new stream's first chunk of the index: region byte, name, NUL, chunk number; a position.
    index_entry = 1 + len(child.encode()) + 1 + 4 + 6
    projection = sum(len(k) + len(v) for k, v in changed.items())
    return {
        "event_record_bytes": record,
        "stream_index_bytes": index_entry,
        "projection_bytes_written": projection,
        "projection_keys_written": sorted(_key_kind(k) for k in changed),
        "logical_bytes_per_fork": record + index_entry + projection,
    }


def _key_kind(key: bytes) -> str:
    """A projection key with the session id or numbers left out, e.g. ``h/<sid>``."""
    for prefix, kind in ((b"h/", "h/<sid>"), (b"t/", "t/<sid>"), (b"c/", "c/<parent>\\0<pos>")):
        if key.startswith(prefix):
            return kind
    if key.startswith(b"g/"):
        return key[:2].decode() + "<segment>"
    return key.decode(errors="replace")


# 2. inject, durable and batched


@dataclass
class _InjectStore:
    store: SessionStore
    sessions: list[str]
    messages: list[dict[str, Any]]
    next: int = 0

    def inject(self, count: int) -> None:
        sessions, messages, store = self.sessions, self.messages, self.store
        for index in range(self.next, self.next + count):
            store.inject(sessions[index % len(sessions)], messages[index % len(messages)])
        self.next += count

    def records(self, count: int) -> list[bytes]:
        """The stored bytes of the last `count` events (the sizes the raw baseline writes)."""
        head = self.store.log.head
        return [record_bytes(e) for e in self.store.log.read(after=head - count, limit=count)]


def _inject_store(path: Path, count: int, seed: int) -> _InjectStore:
    store = SessionStore.open(path)  # durable commits
    sessions = [store.open_session() for _ in range(8)]
    return _InjectStore(store, sessions, make_messages(count, seed))


def inject_durable(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    fx = _inject_store(ctx.tmp / "inject-durable" / "ours", sizes.durable_injects[1], seed=31)
    env = _raw_env(ctx.tmp / "inject-durable" / "raw", sync=True)
    try:

        def ours(count: int) -> Sample:
            with Stopwatch() as watch:
                fx.inject(count)
            return watch.sample(count)

        probe = ours(sizes.durable_injects[0])
        count = _fit(probe.rate, sizes.round_s, sizes.durable_injects)
        ours(count)
        values = fx.records(count)
        raw = durable_puts(env, values)

        result = compare(
            name="inject_durable",
            description="store.inject(sid, message), one durable commit per command, 8 sessions",
            unit="injects/s",
            baseline=raw,
            subject=lambda: ours(count),
            baseline_description=(
                "py-lmdb: one put per durable write transaction (sync=True metasync=True), "
                "values of our stored record sizes"
            ),
            rounds=sizes.rounds,
            target=Target("ratio", 0.6),
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )
        result.notes = {
            "injects_per_round": count,
            "record_bytes_mean": round(sum(map(len, values)) / len(values), 1),
            **write_amplification(lambda: ours(count), raw, count),
        }
        return [result]
    finally:
        fx.store.close()
        env.close()


WRITER_THREADS = 16


def inject_threads(ctx: Context) -> list[Result]:
    """16 threads, one durable `inject` per call each, against one thread doing the same."""
    sizes = ctx.sizes
    fx = _inject_store(ctx.tmp / "inject-threads" / "ours", sizes.durable_injects[1], seed=33)
    store, messages = fx.store, fx.messages
    sessions = [store.open_session() for _ in range(WRITER_THREADS)]
    try:

        def threaded(count: int) -> Sample:
            share = max(count // WRITER_THREADS, 1)

            def write(sid: str) -> None:
                for index in range(share):
                    store.inject(sid, messages[index % len(messages)])

            with Stopwatch() as watch:
                run_threads(write, sessions)
            return watch.sample(share * WRITER_THREADS)

        def single(count: int) -> Sample:
            with Stopwatch() as watch:
                fx.inject(count)
            return watch.sample(count)

        probe = single(sizes.durable_injects[0])
        count = _fit(probe.rate, sizes.round_s, sizes.durable_injects)
        commits, shared = store._group.commits, store._group.shared
        result = compare(
            name="inject_threads",
            description=(
                f"{WRITER_THREADS} threads, store.inject(sid, message) per call, each thread its "
                "own session, durable: the threads share group commits"
            ),
            unit="injects/s",
            baseline=lambda: single(count),
            subject=lambda: threaded(count * 4),
            baseline_description="one thread doing the same durable injects, same store",
            rounds=sizes.rounds,
            target=Target("ratio", 5.0),
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )
        batches = store._group.commits - commits
        result.notes = {
            "injects_per_round_single": count,
            "injects_per_round_threads": max(count * 4 // WRITER_THREADS, 1) * WRITER_THREADS,
            "shared_commits": batches,
            "commands_per_shared_commit": round(
                (store._group.shared - shared) / max(batches, 1), 1
            ),
        }
        return [result]
    finally:
        store.close()


def inject_batched(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    batch = sizes.batch_injects
    fx = _inject_store(ctx.tmp / "inject-batched" / "ours", batch * 4, seed=32)
    env = _raw_env(ctx.tmp / "inject-batched" / "raw", sync=True)
    try:

        def many(calls: int) -> Sample:
            store, sessions, messages = fx.store, fx.sessions, fx.messages
            chunks = [messages[i : i + batch] for i in range(0, len(messages), batch)]
            with Stopwatch() as watch:
                for call in range(calls):
                    store.inject_many(sessions[call % len(sessions)], chunks[call % len(chunks)])
            return watch.sample(calls * batch)

        def loop(calls: int) -> Sample:
            store = fx.store
            with Stopwatch() as watch:
                for _ in range(calls):
                    with store.transaction():
                        fx.inject(batch)
            return watch.sample(calls * batch)

        # The baseline puts one value per message, of the size a one-message event is stored at.
        fx.inject(batch)
        values = fx.records(batch)
        results = []
        for name, subject, description, target in (
            (
                "inject_batched",
                many,
                f"store.inject_many(sid, {batch:,} messages): one command, one durable commit, "
                "one messages_injected event",
                Target("ratio", 0.25),
            ),
            (
                "inject_batched_calls",
                loop,
                f"{batch:,} store.inject calls inside one store.transaction(), 8 sessions",
                None,
            ),
        ):
            result = _batched_row(ctx, values, env, name, subject, description, target)
            results.append(result)
        return results
    finally:
        fx.store.close()
        env.close()


def _batched_row(
    ctx: Context,
    values: list[bytes],
    env: lmdb.Environment,
    name: str,
    subject: Callable[[int], Sample],
    description: str,
    target: Target | None,
) -> Result:
    sizes = ctx.sizes
    batch = sizes.batch_injects
    probe = subject(sizes.batches[0])
    calls = _fit(probe.rate, sizes.round_s, sizes.batches, per=batch)
    with env.begin() as txn:  # the rows share the raw store: carry on after its last key
        cursor = txn.cursor()
        raw_next = int.from_bytes(cursor.key(), "big") + 1 if cursor.last() else 1

    def raw() -> Sample:
        nonlocal raw_next
        position = raw_next
        raw_next += calls * batch
        with Stopwatch() as watch:
            for _ in range(calls):
                with env.begin(write=True) as txn:
                    for value in values:
                        txn.put(_position_key(position), value, append=True)
                        position += 1
        return watch.sample(calls * batch)

    result = compare(
        name=name,
        description=description,
        unit="injects/s",
        baseline=raw,
        subject=lambda: subject(calls),
        baseline_description=(
            f"py-lmdb: {batch:,} puts of values of our record sizes in one durable transaction"
        ),
        rounds=sizes.rounds,
        target=target,
        budget_s=sizes.budget_s,
        progress=ctx.progress,
    )
    result.notes = {
        "injects_per_round": calls * batch,
        "injects_per_transaction": batch,
        "record_bytes_mean": round(sum(map(len, values)) / len(values), 1),
    }
    return result


# 3. snapshot, cold and warm


SNAPSHOT_TARGET = Target("absolute", 300_000)


def snapshot(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    n = sizes.snapshot_messages
    base = ctx.tmp / "snapshot"
    built = base / "built"
    pool = make_messages(n * 4, seed=41)
    with SessionStore.open(built, sync=False) as store:
        sessions = [store.open_session() for _ in range(4)]
        with store.transaction():
            for index in range(n * 4):  # four concurrent sessions: transcripts interleave
                store.inject(sessions[index % 4], pool[index])
        sid = sessions[1]
        positions = [
            e.position
            for e in store.log.read_stream(sid, limit=n + 1)
            if e.type != "session_opened"
        ]
    values = _stored_values(built)
    env = _raw_env(base / "raw", sync=False)
    with env.begin(write=True) as txn:
        txn.cursor().putmulti([(_position_key(i), v) for i, v in enumerate(values, 1)], append=True)
    del values
    cold = SessionStore.open(copy_store(built, base / "cold"), hot_sessions=0)
    warm = SessionStore.open(copy_store(built, base / "warm"))
    growing = SessionStore.open(copy_store(built, base / "growing"), sync=False)
    decoder = msgspec.msgpack.Decoder(Envelope)
    keys = [_position_key(p) for p in positions]
    try:
        first = warm.snapshot(sid)  # fills the hot cache
        if first is None or first["length"] != n or cold.snapshot(sid) != first:
            raise AssertionError("the cold and warm stores disagree about the transcript")
        with warm.log.view() as view:
            transcript = pj.load_transcript(view, sid) or pj.Transcript()
            cached = pj.read_messages(view, transcript)

        def snapshots(store: SessionStore, count: int) -> Sample:
            with Stopwatch() as watch:
                for _ in range(count):
                    store.snapshot(sid)
            return watch.sample(count * n)

        def after_injects(count: int) -> Sample:
            # Only the snapshot is timed; the inject before it makes the cached copy stale.
            elapsed = cpu = 0.0
            for index in range(count):
                growing.inject(sid, pool[index % len(pool)])
                with Stopwatch() as watch:
                    growing.snapshot(sid)
                elapsed += watch.wall_s
                cpu += watch.cpu_s
            return Sample(count * n, elapsed, cpu)

        def raw_reads(count: int) -> Sample:
            to_builtins, decode, message_of = msgspec.to_builtins, decoder.decode, pj.message_of
            with Stopwatch() as watch:
                for _ in range(count):
                    with env.begin(buffers=True) as txn:
                        get = txn.get
                        out = [
                            to_builtins(message_of(decode(get(key, b"")).data, 0)) for key in keys
                        ]
            if len(out) != n:
                raise AssertionError("the raw reads missed messages")
            return watch.sample(count * n)

        def dict_copies(count: int) -> Sample:
            with Stopwatch() as watch:
                for _ in range(count):
                    msgspec.to_builtins(cached)
            return watch.sample(count * n)

        def row(
            name: str,
            store: SessionStore,
            how: str,
            floor: Callable[[int], Sample],
            floor_text: str,
            subject: Callable[[int], Sample] | None = None,
            target: Target | None = SNAPSHOT_TARGET,
        ) -> Result:
            def ours(count: int) -> Sample:
                return snapshots(store, count) if subject is None else subject(count)

            probe = ours(sizes.snapshots[0])
            count = _fit(probe.rate, sizes.round_s, sizes.snapshots, per=n)
            result = compare(
                name=name,
                description=f"store.snapshot(<{n:,}-message session>), {how}",
                unit="messages/s",
                baseline=lambda: floor(count),
                subject=lambda: ours(count),
                baseline_description=floor_text,
                rounds=sizes.rounds,
                target=target,
                budget_s=sizes.budget_s,
                progress=ctx.progress,
            )
            result.notes = {"messages": n, "snapshots_per_round": count}
            return result

        return [
            row(
                "snapshot_cold",
                cold,
                "hot_sessions=0: every message read and hash-checked from the log",
                raw_reads,
                "py-lmdb point reads of the same records + msgspec decode + to_builtins",
            ),
            row(
                "snapshot_warm",
                warm,
                "from the hot cache (hot_sessions=128), already filled",
                dict_copies,
                "msgspec.to_builtins of the cached Message list (fresh dicts)",
            ),
            row(
                "snapshot_after_inject",
                growing,
                "each right after an inject into it (the cached copy is one message behind)",
                dict_copies,
                "msgspec.to_builtins of the cached Message list (fresh dicts)",
                subject=after_injects,
                target=None,
            ),
        ]
    finally:
        cold.close()
        warm.close()
        growing.close()
        env.close()


# 4. open + snapshot on a big store and a small one


def _open_fixture(ctx: Context, events: int) -> tuple[Path, dict[str, Any]]:
    messages = ctx.sizes.open_session_messages
    return cached_store(
        ctx,
        f"population-{events}",
        lambda store: build_population(
            store, events=events, seed=51, mix=False, target_messages=messages
        ),
    )


def open_snapshot(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    big_events, small_events = sizes.open_events
    if ctx.quick:
        ctx.note(
            f"  --quick: stores of {big_events:,} vs {small_events:,} events "
            "(the full run uses 1,000,000 vs 10,000)"
        )
    big_path, big = _open_fixture(ctx, big_events)
    small_path, small = _open_fixture(ctx, small_events)
    for meta in (big, small):
        if meta.get("target_messages") != sizes.open_session_messages:
            raise AssertionError(f"fixture {meta['fixture']} has no session of the right size")

    def opens(path: Path, sid: str, cold_disk: bool) -> Sample:
        wall = cpu = 0.0
        for _ in range(sizes.opens_per_round):
            if cold_disk:
                _evict(_data_file(path))
            with Stopwatch() as watch:
                store = SessionStore.open(path)
                snap = store.snapshot(sid)
            store.close()
            if snap is None or snap["length"] != sizes.open_session_messages:
                raise AssertionError("the 100-message session is not there")
            wall += watch.wall_s
            cpu += watch.cpu_s
        return Sample(sizes.opens_per_round, wall, cpu)

    def row(cold_disk: bool) -> Result:
        return compare(
            name="open_snapshot_cold" if cold_disk else "open_snapshot",
            description=(
                f"SessionStore.open + snapshot(<{sizes.open_session_messages}-message session>) "
                f"on a store of {big['events']:,} events"
                + (", data.mdb evicted from the page cache first" if cold_disk else "")
            ),
            unit="opens/s",
            baseline=lambda: opens(small_path, small["target_session"], cold_disk),
            subject=lambda: opens(big_path, big["target_session"], cold_disk),
            baseline_description=f"the same on a store of {small['events']:,} events",
            rounds=sizes.rounds,
            # Under 50 ms, and flat: at most 25% slower than on the small store.
            target=None if cold_disk else Target("absolute", 20, ratio_minimum=0.8),
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )

    variants = [False, True] if sizes.open_cold and hasattr(os, "posix_fadvise") else [False]
    results: list[Result] = []
    for cold_disk in variants:
        result = row(cold_disk)
        result.per = "open"
        result.notes = {
            "big_store": {k: big[k] for k in ("events", "sessions", "data_bytes")},
            "small_store": {k: small[k] for k in ("events", "sessions", "data_bytes")},
            "session_messages": sizes.open_session_messages,
            "quick_sizes": ctx.quick,
        }
        results.append(result)
    return results


# 5. rebuild


def rebuild(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    cached, meta = cached_store(
        ctx,
        f"mix-{sizes.rebuild_events}",
        lambda store: build_population(store, events=sizes.rebuild_events, seed=61, mix=True),
    )
    path = copy_store(cached, ctx.tmp / "rebuild")
    with SessionStore.open(path) as store:
        events = store.log.head
        with store.log.view() as view:
            expected = pj.dump(view)

        def ours() -> Sample:
            with Stopwatch() as watch:
                position = store.rebuild()
            if position != events:
                raise AssertionError(f"rebuild reflects {position}, expected {events}")
            return watch.sample(events)

        def read_only() -> Sample:
            count = 0
            with Stopwatch() as watch:
                for _ in store.log.iter_all(page_events=10_000):
                    count += 1
            return watch.sample(count)

        result = compare(
            name="rebuild",
            description=f"store.rebuild() over {events:,} events of a realistic mix",
            unit="events/s",
            baseline=read_only,
            subject=ours,
            baseline_description="log.iter_all() over the same log: reading and hash-checking alone",
            rounds=sizes.rebuild_rounds,
            target=Target("absolute", 150_000),
            budget_s=sizes.budget_s,
            progress=ctx.progress,
        )
        with store.log.view() as view:
            if pj.dump(view) != expected:
                raise AssertionError("rebuild changed the projection of the cached store")
    result.notes = {
        "events": events,
        "commands": meta.get("commands"),
        "sessions": meta.get("sessions"),
        "projection_keys": len(expected),
        "data_bytes": meta.get("data_bytes"),
    }
    return [result]


TREE_SESSIONS = 1_000
TREE_ROOT_MESSAGES = 2_000
TREE_TIME_MAX_S = 0.5


def tree(ctx: Context) -> list[Result]:
    from sessionlog import _render
    from sessionlog._commands import load_tree

    path = ctx.tmp / "tree"
    with SessionStore.open(path, sync=False) as store, store.transaction():
        store.open_session("root", title="a family of forks")
        store.inject_many("root", make_messages(TREE_ROOT_MESSAGES, seed=71))
        parents = ["root"]
        for i in range(TREE_SESSIONS - 1):  # ten forks per session: four levels deep
            parent = parents[i // 10]
            keep = None if i % 3 else (i % TREE_ROOT_MESSAGES)
            child = f"fork-{i:04d}"
            if keep is None:
                store.fork(parent, child)
            else:
                store.fork_at(parent, keep, child)
            parents.append(child)

    with SessionStore.open(path) as store:

        def ours() -> Sample:
            with Stopwatch() as watch:
                root, left_out = load_tree(store, "root")
                drawn = _render.plain(_render.text_tree(root, mark="root"))
            if left_out or drawn.count("\n") != TREE_SESSIONS - 1:
                raise AssertionError(f"tree drew {drawn.count(chr(10)) + 1} sessions")
            return watch.sample(1)

        def snapshots() -> Sample:
            with Stopwatch() as watch:
                queue, seen = ["root"], 0
                while queue:
                    snapshot = store.snapshot(queue.pop())
                    assert snapshot is not None
                    queue.extend(snapshot["child_ids"])
                    seen += 1
            if seen != TREE_SESSIONS:
                raise AssertionError(f"read {seen} snapshots")
            return watch.sample(1)

        result = compare(
            name="tree",
            description=f"sessionlog tree of {TREE_SESSIONS:,} sessions (load + draw)",
            unit="trees/s",
            baseline=snapshots,
            subject=ours,
            baseline_description="a full snapshot per node, as tree read them before",
            rounds=ctx.sizes.rounds,
            target=Target("absolute", 1 / TREE_TIME_MAX_S),
            budget_s=ctx.sizes.budget_s,
            progress=ctx.progress,
        )
    result.per = "tree"
    result.notes = {"sessions": TREE_SESSIONS, "root_messages": TREE_ROOT_MESSAGES}
    return [result]


# 7. verify with the projection check


def verify_projections(ctx: Context) -> list[Result]:
    """`store.verify(projections=True)` (the log's walk, then every projection rebuilt into
    scratch space and compared key by key) against `store.verify()` (the log's walk alone), on
    the store `open_snapshot` uses: 1,000,000 events (`--quick`: 100,000)."""
    big_events = ctx.sizes.open_events[0]
    path, meta = _open_fixture(ctx, big_events)
    with SessionStore.open(path) as store:
        events = store.log.head
        with store.log.view() as view:
            keys = len(pj.dump(view))

        def checked(projections: bool) -> Sample:
            # The walk runs in a child process: its CPU time is the children's, not ours.
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            with Stopwatch() as watch:
                report = store.verify(projections=projections)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            watch.cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            if not report.ok:
                raise AssertionError(f"the fixture does not verify: {report.problem}")
            if projections and report.projection_keys_checked != keys:
                raise AssertionError(f"{report.projection_keys_checked} keys checked of {keys}")
            return watch.sample(events)

        result = compare(
            name="verify_projections",
            description=(
                f"store.verify(projections=True) over {events:,} events: the log's walk, then "
                "every projection rebuilt into scratch space and compared"
            ),
            unit="events/s",
            baseline=lambda: checked(False),
            subject=lambda: checked(True),
            baseline_description="store.verify(): the log's walk alone (both in a child process)",
            rounds=3,
            warmup=0,
            target=None,
            budget_s=ctx.sizes.budget_s,
            progress=ctx.progress,
        )
    result.notes = {
        "events": events,
        "projection_keys": keys,
        "data_bytes": meta.get("data_bytes"),
        # Includes the pages of data.mdb the walk mapped (the whole file, for a whole walk).
        "child_peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "quick_sizes": ctx.quick,
    }
    return [result]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "fork": fork,
    "inject_durable": inject_durable,
    "inject_batched": inject_batched,
    "inject_threads": inject_threads,
    "snapshot": snapshot,
    "open_snapshot": open_snapshot,
    "rebuild": rebuild,
    "tree": tree,
    "verify_projections": verify_projections,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    return _scaffold.run(BENCHMARKS, ctx, names, around=_quiet_gc)


@contextmanager
def _quiet_gc() -> Iterator[None]:
    """Collect between benchmarks, so one benchmark's garbage is not the next one's cost."""
    gc.collect()
    try:
        yield
    finally:
        gc.collect()


# What the table cannot say: fork costs side by side, and whether they are flat.


@dataclass
class Check:
    name: str
    text: str
    value: float
    limit: float
    passed: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


FORK_FLAT_MAX = 1.25
"""A fork of the largest transcript may take at most this many times a fork of the smallest."""


def checks(results: Sequence[Result]) -> list[Check]:
    out: list[Check] = []
    for verb in ("fork", "fork_at"):
        rows = [r for r in results if r.name.startswith(f"{verb}/")]
        if len(rows) < 2:
            continue
        smallest = min(rows, key=lambda r: r.notes["messages"])
        largest = max(rows, key=lambda r: r.notes["messages"])
        spread = smallest.ours / largest.ours  # time at the largest / time at the smallest
        out.append(
            Check(
                name=f"{verb}_flat",
                text=(
                    f"{verb}: time per fork at {largest.notes['messages']:,} messages / at "
                    f"{smallest.notes['messages']:,} = {spread:.2f} (must be <= {FORK_FLAT_MAX})"
                ),
                value=spread,
                limit=FORK_FLAT_MAX,
                passed=spread <= FORK_FLAT_MAX,
            )
        )
    return out


def summary(results: Sequence[Result]) -> str:
    """The fork rows side by side (time, copy time, bytes), and the checks."""
    rows = [r for r in results if r.name.split("/")[0] in ("fork", "fork_at")]
    lines: list[str] = []
    if rows:
        header = (
            "fork",
            "ms/fork",
            "p90 ms",
            "copy ms",
            "data.mdb +B/fork",
            "event+index B",
            "projection B",
        )
        table = [header]
        for r in rows:
            n = r.notes
            table.append(
                (
                    r.name,
                    f"{1e3 / r.ours:.3f}",
                    f"{n['fork_ms_p90']:.3f}",
                    f"{n['copy_ms_median']:.3f}",
                    f"{n['data_mdb_growth_bytes_per_fork']:,.0f}",
                    f"{n['event_record_bytes'] + n['stream_index_bytes']:,}",
                    f"{n['projection_bytes_written']:,} ({len(n['projection_keys_written'])} keys)",
                )
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for number, row in enumerate(table):
            cells = [
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells))
            if number == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append(
            "  data.mdb +B/fork: growth of the data file over all the row's forks / forks (LMDB\n"
            "  reuses the pages copy-on-write frees, so this is what the store keeps per fork);\n"
            "  event+index B, projection B: the bytes of the keys and values one fork adds or\n"
            "  changes (its event record, its stream-index entry, the projection keys it writes)"
        )
    for check in checks(results):
        lines.append(f"{'pass' if check.passed else 'MISS'}: {check.text}")
    return "\n".join(lines)
