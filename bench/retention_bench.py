"""Retention benchmarks (`python -m bench --suite retention`): sweeping closed sessions, dropping the
log's old prefix, and compacting the files, each against the bare work it cannot avoid, in the
same run. Every round works on a fresh copy of one store of `sessions` closed sessions (each
opened, one message, closed: three events) and one open session opened after them.

- ``sweep``: `store.sweep(policy)` with action "archive" (a plain store: nothing to shred), a
  commit per `batch` sessions, every session due, in sessions/s, vs the archive alone: the same
  sessions' events read by id and written to the same kind of sink, one file per batch, with no
  state scan, no readable line and no commit.
- ``truncate_log``: `store.truncate_log(before)` dropping every event before the open session
  (archived to a sink first, then checked against the chain and deleted in one commit), in
  events/s, vs the archive alone (the same events read and written to the sink).
- ``compact_store``: `EventLog.compact_files` of the truncated store, in MB/s of the file
  before, vs copying that file byte for byte and syncing the copy.

The summary prints the data file's size before, after `truncate_log` (LMDB keeps the freed pages
for reuse, so it does not shrink) and after `compact_store`, as ratios to the size before.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench import _scaffold
from bench._timing import Result, Sample, Stopwatch, information
from eventlog import EventLog
from sessions import DirectorySink, RetentionPolicy, SessionStore
from sessions._retention import archive_lines, log_records, stream_records

LATER = timedelta(days=30)
"""How far ahead of the store's events the sweep runs: every closed session is due."""


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    sessions: int  # closed sessions in the store
    batch: int  # sessions per sweep commit (and per archive file)
    message_bytes: int  # the one message of each session


FULL = Sizes(rounds=3, sessions=100_000, batch=1_000, message_bytes=300, budget_s=600)
QUICK = Sizes(rounds=3, sessions=5_000, batch=1_000, message_bytes=300, budget_s=60)

Context = _scaffold.Context[Sizes]


def _template(ctx: Context) -> Path:
    """The store every round copies, built once per run (not timed)."""
    path: Path | None = ctx.cache.get("template")
    if path is not None:
        return path
    path = ctx.tmp / "template"
    sizes = ctx.sizes
    text = "m" * sizes.message_bytes
    ctx.note(f"  building {sizes.sessions:,} closed sessions ...")
    with SessionStore.open(path, sync=False) as store:
        for start in range(0, sizes.sessions, 1_000):
            with store.transaction():
                for index in range(start, min(start + 1_000, sizes.sessions)):
                    sid = store.open_session(f"closed-{index:07d}")
                    store.inject(sid, {"role": "user", "content": f"{index} {text}"})
                    store.close_session(sid)
        live = store.open_session("live")
        store.inject(live, {"role": "user", "content": "still open"})
    ctx.cache["template"] = path
    return path


def _copy(ctx: Context, name: str) -> Path:
    target = ctx.tmp / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(_template(ctx), target)
    return target


def _archive_only(ctx: Context, groups: list[list[str]], sink: DirectorySink) -> Sample:
    """The floor of archiving: each group's events read by stream and put in the sink as one
    file."""
    path = ctx.tmp / "baseline"
    units = sum(map(len, groups))
    with SessionStore.open(path) as store, Stopwatch() as watch:
        for number, group in enumerate(groups):
            lines = (line for sid in group for line in archive_lines(stream_records(store, sid)))
            sink.put(f"baseline-{number}", lines)
    return watch.sample(units)


def sweep(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    _copy(ctx, "baseline")
    ids = [f"closed-{index:07d}" for index in range(sizes.sessions)]
    groups = [ids[start : start + sizes.batch] for start in range(0, len(ids), sizes.batch)]

    def sweeping() -> Sample:
        path = _copy(ctx, "subject")
        sink = DirectorySink(ctx.tmp / "sweep-sink")
        policy = RetentionPolicy(
            max_age=timedelta(days=1), action="archive", sink=sink, batch_sessions=sizes.batch
        )
        with SessionStore.open(path) as store, Stopwatch() as watch:
            report = store.sweep(policy, now=datetime.now(UTC) + LATER)
        assert len(report.archived) == sizes.sessions, len(report.archived)
        shutil.rmtree(ctx.tmp / "sweep-sink")
        return watch.sample(sizes.sessions)

    def archiving() -> Sample:
        sample = _archive_only(ctx, groups, DirectorySink(ctx.tmp / "baseline-sink"))
        shutil.rmtree(ctx.tmp / "baseline-sink")
        return sample

    result = _compare(
        ctx,
        "sweep",
        f"sweep of {sizes.sessions:,} closed sessions, archive, {sizes.batch} a commit",
        "sessions/s",
        (archiving, "their events read by id and written to the sink, no commit"),
        sweeping,
    )
    result.notes = {"sessions": sizes.sessions, "batch": sizes.batch}
    return [result]


def _compare(
    ctx: Context,
    name: str,
    description: str,
    unit: str,
    baseline: tuple[Callable[[], Sample], str],
    subject: Callable[[], Sample],
) -> Result:
    """A row as every row here runs: no target (the figures are information), no warm-up round
    (each round builds its own store copy, untimed)."""
    sizes = ctx.sizes
    return information(
        name,
        description,
        unit,
        baseline,
        subject,
        sizes.rounds,
        warmup=0,
        budget_s=sizes.budget_s,
        progress=ctx.progress,
    )


def _cut(path: Path) -> int:
    with SessionStore.open(path) as store:
        return store.log.read_stream("live", after=0, limit=1)[0].position


def truncate_log(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    cut = _cut(_template(ctx))
    events = cut - 1
    measured: dict[str, int] = {}

    def truncating() -> Sample:
        path = _copy(ctx, "subject")
        measured["bytes_before"] = (path / "data.mdb").stat().st_size
        with SessionStore.open(path) as store, Stopwatch() as watch:
            anchor, _ = store.truncate_log(cut, sink=DirectorySink(ctx.tmp / "truncate-sink"))
        assert anchor == events
        measured["bytes_after_truncate"] = (path / "data.mdb").stat().st_size
        shutil.rmtree(ctx.tmp / "truncate-sink")
        return watch.sample(events)

    def archiving() -> Sample:
        path = _template(ctx)
        sink = DirectorySink(ctx.tmp / "baseline-sink")
        with SessionStore.open(path) as store, Stopwatch() as watch:
            sink.put("baseline", archive_lines(log_records(store, 0, events)))
        shutil.rmtree(ctx.tmp / "baseline-sink")
        return watch.sample(events)

    result = _compare(
        ctx,
        "truncate_log",
        f"truncate_log of {events:,} events ({sizes.sessions:,} closed sessions)",
        "events/s",
        (archiving, "the same events read and written to the sink"),
        truncating,
    )
    result.notes = dict(measured, events=events)
    ctx.cache["sizes"] = measured
    return [result]


def compact_store(ctx: Context) -> list[Result]:
    sizes = ctx.sizes
    cut = _cut(_template(ctx))
    truncated = ctx.tmp / "truncated"
    shutil.rmtree(truncated, ignore_errors=True)
    shutil.copytree(_template(ctx), truncated)
    with SessionStore.open(truncated) as store:
        store.truncate_log(cut, sink=DirectorySink(ctx.tmp / "compact-sink"))
    size = (truncated / "data.mdb").stat().st_size
    measured: dict[str, int] = {"bytes_before_compact": size}

    def compacting() -> Sample:
        path = ctx.tmp / "subject"
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(truncated, path)
        with Stopwatch() as watch:
            before, after = EventLog.compact_files(path)
        measured["bytes_after_compact"] = after
        return watch.sample(before / 1e6)

    def copying() -> Sample:
        target = ctx.tmp / "copy.mdb"
        with Stopwatch() as watch:
            shutil.copyfile(truncated / "data.mdb", target)
            descriptor = os.open(target, os.O_RDONLY)
            os.fsync(descriptor)
            os.close(descriptor)
        target.unlink()
        return watch.sample(size / 1e6)

    result = _compare(
        ctx,
        "compact_store",
        f"compact_files of the truncated store ({sizes.sessions:,} sessions dropped)",
        "MB/s",
        (copying, "a byte-for-byte copy of the file, synced"),
        compacting,
    )
    result.notes = measured
    ctx.cache.setdefault("sizes", {}).update(measured)
    return [result]


def summary(results: list[Result]) -> str:
    """The data file's size before, after truncate_log and after compact-store, as ratios."""
    notes: dict[str, int] = {}
    for result in results:
        notes.update({k: v for k, v in result.notes.items() if k.startswith("bytes_")})
    before = notes.get("bytes_before")
    if not before:
        return ""
    lines = [f"store size: {before:,} bytes before truncate_log"]
    for key, what in (
        ("bytes_after_truncate", "after truncate_log"),
        ("bytes_after_compact", "after truncate_log + compact-store"),
    ):
        if key in notes:
            lines.append(f"  {what}: {notes[key]:,} bytes = {notes[key] / before:.3f}x")
    return "\n".join(lines)


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "sweep": sweep,
    "truncate_log": truncate_log,
    "compact_store": compact_store,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    return _scaffold.run(BENCHMARKS, ctx, names)
