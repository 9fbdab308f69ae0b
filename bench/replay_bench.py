"""Benchmarks of `replay.seed_from_jsonl`, each beside a baseline measured in the same run.

The input is one generated `llm_transcript.jsonl` of about 50 MB (`--quick`: 5 MB) in the
message-events format, as an agent's sidecar writes it: a system prompt, then per turn a request
record, the user message, zero to three tool rounds (the provider response with its tool calls,
the assistant message carrying them, a `tool_results` record) and a final response with the
assistant's answer. Messages run from a few hundred bytes to a few KB. MB here is 10^6 bytes of
the file.

- ``seed_parse`` (information): `replay._transcript.read_transcript`, the reading and classifying
  pass alone, vs the baseline.
- ``seed``: `seed_from_jsonl` into an open, empty, durable store (a fresh one each round; opening
  it is not timed), target >= 40 MB/s. Baseline for both rows: reading the same file line by line
  and decoding every line with `msgspec.json.Decoder`, the floor for any reader of this format;
  the ratio is what our rules and the engine cost on top of it.
- ``bundle_export``: `export_bundle` in `sanitized` mode of one session seeded from that transcript
  (`--quick`: the 5 MB one), target >= 20 MB of transcript per second. Baseline: `export_bundle` of
  the same session in `local` mode (reading, shaping, copying; no redaction), so the ratio is what
  finding and replacing secrets costs. MB here is 10^6 bytes of the transcript file. Notes: the
  replay_only rate, and the manifest's entry count (the generated text holds no secret, so every
  entry would be a false positive: it must stay 0).
- ``log_export`` / ``log_import`` (information): `export_log` of a store of 100,000 injected
  messages (`--quick`: 10,000) to JSON lines, vs reading every event with `log.read`; and
  `import_log` of that file into an empty durable store, vs py-lmdb putting the same record bytes.

After the timed rounds, untimed runs measure (1) the phase split: the read pass, then
`open_session` + `inject_many` of its messages into a fresh store in one transaction; (2) peak
memory two ways: the `tracemalloc` peak of one seed (Python allocations only: not LMDB's map,
not the C buffers outside Python's allocator), and the growth of peak RSS (`ru_maxrss`) across
one seed in a fresh subprocess (`VmHWM` of Linux's /proc/self/status: everything the process
touched, LMDB's pages included);
(3) a cProfile of one seed, whose top functions the summary prints.
"""

from __future__ import annotations

import cProfile
import itertools
import pstats
import random
import shutil
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from bench import _scaffold, agentlog_bench
from bench._timing import Result, Sample, Stopwatch, Target, compare
from bench.log_bench import _text
from eventlog import limits
from replay import _limits as replay_limits
from replay import export_bundle, export_log, import_log, seed_from_jsonl
from replay._transcript import read_transcript
from sessions import SessionStore

MB = 1_000_000
TOOLS = ("open_file", "grep", "run_tests", "list_dir", "apply_patch")


@dataclass(frozen=True, kw_only=True)
class Sizes(_scaffold.Sizes):
    transcript_bytes: int  # the generated file is at least this big
    log_events: int  # events in the store of `log_io`


FULL = Sizes(rounds=5, transcript_bytes=50 * MB, log_events=100_000, budget_s=90.0)
QUICK = Sizes(rounds=3, transcript_bytes=5 * MB, log_events=10_000, budget_s=20.0)


Context = _scaffold.Context[Sizes]


# The transcript


def _turn(rng: random.Random, index: int, provider: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of one turn: request, user message, tool rounds, final answer."""
    stamp = f"{1746123456 + index * 7}.{rng.randint(0, 999):03d}"
    records: list[dict[str, Any]] = [
        {"type": "provider_call_request", **provider, "message_count": index, "timestamp": stamp},
        {
            "type": "message",
            "message": {"role": "user", "content": _text(rng, rng.randint(100, 2_000))},
        },
    ]
    for round_ in range(rng.choice((0, 1, 1, 2, 3))):
        calls = [
            {
                "id": f"call_{index}_{round_}_{n}",
                "name": rng.choice(TOOLS),
                "arguments": {
                    "path": f"src/module_{rng.randint(1, 400)}.py",
                    "query": _text(rng, 40),
                },
            }
            for n in range(rng.randint(1, 3))
        ]
        thought = _text(rng, rng.randint(20, 300))
        usage = {"input_tokens": rng.randint(1_000, 90_000), "output_tokens": rng.randint(20, 900)}
        records.append(
            {
                "type": "provider_call_response",
                **provider,
                "text": thought,
                "tool_calls": calls,
                **usage,
            }
        )
        assistant = {"role": "assistant", "content": thought, "tool_calls": calls}
        records.append({"type": "message", "message": assistant})
        results = [
            {
                "tool_name": c["name"],
                "tool_call_id": c["id"],
                "observation": _text(rng, rng.randint(200, 4_000)),
            }
            for c in calls
        ]
        records.append({"type": "tool_results", "results": results})
    answer = _text(rng, rng.randint(200, 3_000))
    records.append(
        {
            "type": "provider_call_response",
            **provider,
            "text": answer,
            "tool_calls": [],
            "stop_reason": "end_turn",
        }
    )
    records.append({"type": "message", "message": {"role": "assistant", "content": answer}})
    if rng.random() < 0.2:
        records.append({"type": "routing_decision", "route": "default", "reason": _text(rng, 60)})
    return records


def make_transcript(path: Path, size_bytes: int, seed: int = 11) -> dict[str, int]:
    """Write a transcript of at least `size_bytes`; returns its size, lines and messages."""
    rng = random.Random(seed)
    provider = {"provider": "anthropic", "model": "claude-sonnet", "tool_format": "native"}
    encode = msgspec.json.Encoder().encode
    written = lines = messages = 0
    with path.open("wb") as out:
        header = {"type": "system_prompt", "content": _text(rng, 2_000)}
        for index in itertools.count():
            for record in [header] if index == 0 else _turn(rng, index, provider):
                line = encode(record) + b"\n"
                out.write(line)
                written += len(line)
                lines += 1
                kind = record["type"]
                messages += len(record["results"]) if kind == "tool_results" else kind == "message"
            if written >= size_bytes:
                break
    return {"bytes": written, "lines": lines, "messages": messages}


def _transcript(ctx: Context) -> tuple[Path, dict[str, int]]:
    if "transcript" not in ctx.cache:
        path = ctx.tmp / "llm_transcript.jsonl"
        started = time.perf_counter()
        facts = make_transcript(path, ctx.sizes.transcript_bytes)
        ctx.note(
            f"  generated {facts['bytes'] / MB:.1f} MB, {facts['lines']:,} lines, "
            f"{facts['messages']:,} messages in {time.perf_counter() - started:.1f}s"
        )
        ctx.cache["transcript"] = (path, facts)
    return ctx.cache["transcript"]  # type: ignore[no-any-return]


# Rounds


def _decode_round(path: Path, megabytes: float) -> Callable[[], Sample]:
    def run() -> Sample:
        decode = msgspec.json.Decoder().decode
        with Stopwatch() as watch, path.open("rb", buffering=1 << 20) as file:
            for line in file:
                if line.strip():
                    decode(line)
        return watch.sample(megabytes)

    return run


def _parse_round(path: Path, megabytes: float) -> Callable[[], Sample]:
    def run() -> Sample:
        with Stopwatch() as watch:
            transcript = read_transcript(path)
        assert transcript.messages
        return watch.sample(megabytes)

    return run


def _seed_round(ctx: Context, path: Path, megabytes: float) -> Callable[[], Sample]:
    counter = itertools.count()

    def run() -> Sample:
        target = ctx.tmp / f"seed-store-{next(counter)}"
        try:
            with SessionStore.open(target) as store:
                with Stopwatch() as watch:
                    result = seed_from_jsonl(store, path)
                if not result.ok:
                    raise RuntimeError(f"seeding failed: {result.error}")
        finally:
            shutil.rmtree(target, ignore_errors=True)
        return watch.sample(megabytes)

    return run


def seed(ctx: Context) -> list[Result]:
    path, facts = _transcript(ctx)
    megabytes = facts["bytes"] / MB
    sizes = ctx.sizes
    baseline = "read line by line + msgspec.json.Decoder().decode of every line"
    parse = compare(
        name="seed_parse",
        description="read_transcript: the reading and classifying pass alone",
        unit="MB/s",
        baseline=_decode_round(path, megabytes),
        subject=_parse_round(path, megabytes),
        baseline_description=baseline,
        rounds=sizes.rounds,
        target=None,
        budget_s=sizes.budget_s,
        progress=ctx.progress,
    )
    full = compare(
        name="seed",
        description="seed_from_jsonl into an open durable store, one commit",
        unit="MB/s",
        baseline=_decode_round(path, megabytes),
        subject=_seed_round(ctx, path, megabytes),
        baseline_description=baseline,
        rounds=sizes.rounds,
        target=Target("absolute", 40.0),
        budget_s=sizes.budget_s,
        progress=ctx.progress,
    )
    full.notes.update({"transcript": facts, **_phases(ctx, path), **_memory(ctx, path, facts)})
    full.notes["profile_top"] = _profile(ctx, path)
    parse.notes["transcript"] = facts
    return [parse, full]


# Untimed runs: phases, memory, profile


def _phases(ctx: Context, path: Path) -> dict[str, Any]:
    target = ctx.tmp / "phase-store"
    try:
        with SessionStore.open(target) as store:
            started = time.perf_counter()
            transcript = read_transcript(path)
            read_s = time.perf_counter() - started
            started = time.perf_counter()
            with store.transaction():
                sid = store.open_session(metadata={"bench": True})
                # As the seed writes them: a batch at a time, decoded from the kept buffer.
                for batch in transcript.messages.batches(
                    limits.messages_per_event_max, replay_limits.seed_batch_bytes
                ):
                    store.inject_many(sid, batch)
            engine_s = time.perf_counter() - started
    finally:
        shutil.rmtree(target, ignore_errors=True)
    count = len(transcript.messages)
    ctx.note(f"  phases: read {read_s:.2f}s, engine {engine_s:.2f}s for {count:,} messages")
    return {
        "phase_read_s": read_s,
        "phase_engine_s": engine_s,
        "engine_share": engine_s / (read_s + engine_s),
        "engine_us_per_message": engine_s / count * 1e6,
        "read_us_per_message": read_s / count * 1e6,
    }


_RSS_SCRIPT = """
import sys
from replay import export_bundle, export_log, import_log, seed_from_jsonl
from sessions import SessionStore

def high_water():
    # VmHWM belongs to this process's own address space; ru_maxrss would start from the
    # parent's peak, which the child inherits across fork on Linux.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no VmHWM in /proc/self/status")

with SessionStore.open(sys.argv[2]) as store:
    before = high_water()
    result = seed_from_jsonl(store, sys.argv[1])
    after = high_water()
assert result.ok, result.error
print(before, after)
"""


def _memory(ctx: Context, path: Path, facts: dict[str, int]) -> dict[str, Any]:
    target = ctx.tmp / "memory-store"
    try:
        with SessionStore.open(target) as store:
            tracemalloc.start()
            try:
                result = seed_from_jsonl(store, path)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert result.ok, result.error
    finally:
        shutil.rmtree(target, ignore_errors=True)
    try:
        out = subprocess.run(
            [sys.executable, "-c", _RSS_SCRIPT, str(path), str(target)],
            check=True,
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        ).stdout.split()
    finally:
        shutil.rmtree(target, ignore_errors=True)
    rss_growth = int(out[1]) - int(out[0])
    ctx.note(
        f"  memory: tracemalloc peak {peak / MB:.0f} MB, peak RSS growth {rss_growth / MB:.0f} MB "
        f"for a {facts['bytes'] / MB:.0f} MB file"
    )
    return {
        "tracemalloc_peak_bytes": peak,
        "rss_peak_growth_bytes": rss_growth,
        "tracemalloc_peak_per_file_byte": peak / facts["bytes"],
        "rss_peak_growth_per_file_byte": rss_growth / facts["bytes"],
    }


def _profile(ctx: Context, path: Path, top: int = 12) -> list[str]:
    target = ctx.tmp / "profile-store"
    profiler = cProfile.Profile()
    try:
        with SessionStore.open(target) as store:
            profiler.enable()
            result = seed_from_jsonl(store, path)
            profiler.disable()
            assert result.ok, result.error
    finally:
        shutil.rmtree(target, ignore_errors=True)
    text = StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    body = text.getvalue().splitlines()
    start = next(i for i, line in enumerate(body) if line.lstrip().startswith("ncalls"))
    return [line.rstrip() for line in body[start : start + top + 1] if line.strip()]


# Whole-log export and import


def _log_store(ctx: Context) -> tuple[Path, int]:
    """A store of sessions with messages of realistic sizes, built once per run."""
    if "log_store" not in ctx.cache:
        path = ctx.tmp / "log-source"
        rng = random.Random(5)
        with SessionStore.open(path) as store:
            sessions = [store.open_session() for _ in range(20)]
            for start in range(0, ctx.sizes.log_events, 1_000):
                batch = [
                    {"role": "user" if i % 2 else "assistant", "content": _text(rng, 200 + i % 600)}
                    for i in range(1_000)
                ]
                store.inject_many(sessions[(start // 1_000) % len(sessions)], batch)
            events = store.log.head
        ctx.cache["log_store"] = (path, events)
    return ctx.cache["log_store"]  # type: ignore[no-any-return]


def log_io(ctx: Context) -> list[Result]:
    source, events = _log_store(ctx)
    export = ctx.tmp / "log-export.jsonl"
    counter = itertools.count()

    def exported() -> Sample:
        with SessionStore.open(source) as store, Stopwatch() as watch:
            export_log(store, export)
        return watch.sample(events)

    def read_all() -> Sample:
        with SessionStore.open(source) as store, Stopwatch() as watch:
            after = 0
            while page := store.log.read(after=after, limit=1_000):
                after = page[-1].position
        return watch.sample(events)

    def imported() -> Sample:
        target = ctx.tmp / f"log-import-{next(counter)}"
        try:
            with SessionStore.open(target) as store, Stopwatch() as watch:
                import_log(store, export)
            return watch.sample(events)
        finally:
            shutil.rmtree(target, ignore_errors=True)

    def raw_puts() -> Sample:
        target = ctx.tmp / f"log-raw-{next(counter)}"
        with SessionStore.open(source) as store:
            records: list[bytes] = []
            while page := store.log.read_records(after=len(records), limit=10_000):
                records.extend(raw for _, raw in page)
        env = lmdb.open(str(target), map_size=1 << 34, sync=True, metasync=True)
        try:
            with Stopwatch() as watch:
                for first in range(0, len(records), 20_000):
                    with env.begin(write=True) as txn:
                        for offset, record in enumerate(records[first : first + 20_000]):
                            key = (first + offset + 1).to_bytes(8, "big")
                            txn.put(key, record, append=True)
            return watch.sample(events)
        finally:
            env.close()
            shutil.rmtree(target, ignore_errors=True)

    exported()  # the file the import rounds read
    common = {
        "unit": "events/s",
        "rounds": ctx.sizes.rounds,
        "target": None,
        "budget_s": ctx.sizes.budget_s,
        "progress": ctx.progress,
    }
    out = compare(
        name="log_export",
        description=f"export_log of a {events:,}-event store to JSON lines",
        baseline=read_all,
        subject=exported,
        baseline_description="log.read of every event, page by page (reading and hash checks)",
        **common,  # type: ignore[arg-type]
    )
    back = compare(
        name="log_import",
        description="import_log of that export into an empty durable store",
        baseline=raw_puts,
        subject=imported,
        baseline_description="py-lmdb: put the same record bytes, 20,000 per durable transaction",
        **common,  # type: ignore[arg-type]
    )
    out.notes = back.notes = {"events": events, "export_bytes": export.stat().st_size}
    return [out, back]


# Bundle export


def _seeded(ctx: Context) -> tuple[Path, str, dict[str, int]]:
    """A store holding one session seeded from the generated transcript, built once per run."""
    if "seeded" not in ctx.cache:
        path, facts = _transcript(ctx)
        target = ctx.tmp / "bundle-source"
        with SessionStore.open(target) as store:
            result = seed_from_jsonl(store, path)
            if not result.ok or result.session_id is None:
                raise RuntimeError(f"seeding failed: {result.error}")
        ctx.cache["seeded"] = (target, result.session_id, facts)
    return ctx.cache["seeded"]  # type: ignore[no-any-return]


def _export_round(source: Path, sid: str, mode: str, megabytes: float) -> Callable[[], Sample]:
    def run() -> Sample:
        with SessionStore.open(source) as store:
            store.snapshot(sid)  # the transcript decoded once: both sides start from the cache
            with Stopwatch() as watch:
                bundle = export_bundle(store, sid, mode)
        assert bundle["redaction"]["mode"] == mode
        return watch.sample(megabytes)

    return run


def bundle_export(ctx: Context) -> list[Result]:
    source, sid, facts = _seeded(ctx)
    megabytes = facts["bytes"] / MB
    result = compare(
        name="bundle_export",
        description="export_bundle, sanitized, of one session seeded from the transcript",
        unit="MB/s",
        baseline=_export_round(source, sid, "local", megabytes),
        subject=_export_round(source, sid, "sanitized", megabytes),
        baseline_description="export_bundle of the same session in local mode (no redaction)",
        rounds=ctx.sizes.rounds,
        target=Target("absolute", 20.0),
        budget_s=ctx.sizes.budget_s,
        progress=ctx.progress,
    )
    replay_only = _export_round(source, sid, "replay_only", megabytes)()
    with SessionStore.open(source) as store:
        entries = len(export_bundle(store, sid, "sanitized")["redaction"]["entries"])
        messages = store.snapshot(sid)["length"]  # type: ignore[index]
    result.notes.update(
        {
            "transcript": facts,
            "messages": messages,
            "replay_only_mb_per_s": replay_only.rate,
            "sanitized_entries": entries,
        }
    )
    ctx.note(
        f"  {messages:,} messages; replay_only {replay_only.rate:.1f} MB/s (one round); "
        f"sanitized manifest entries on clean text: {entries}"
    )
    return [result]


def agent_logs(ctx: Context) -> list[Result]:
    """`import_agent_log` per format: see `bench.agentlog_bench`."""
    sizes = ctx.sizes
    return agentlog_bench.rows(
        ctx.tmp, sizes.transcript_bytes, sizes.rounds, sizes.budget_s, ctx.progress, ctx.note
    )


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "seed": seed,
    "bundle_export": bundle_export,
    "log_io": log_io,
    "agent_logs": agent_logs,
}


def run(ctx: Context, names: Sequence[str]) -> list[Result]:
    return _scaffold.run(BENCHMARKS, ctx, names)


def summary(results: Sequence[Result]) -> str:
    """Phase split, memory and the profile of the `seed` row."""
    row = next((r for r in results if r.name == "seed"), None)
    if row is None:
        return ""
    n = row.notes
    size = n["transcript"]["bytes"]
    lines = [
        f"seed of {size / MB:.1f} MB ({n['transcript']['messages']:,} messages): "
        f"read pass {n['phase_read_s']:.2f}s ({n['read_us_per_message']:.1f} µs/message), "
        f"engine open_session + inject_many {n['phase_engine_s']:.2f}s "
        f"({n['engine_us_per_message']:.1f} µs/message, {n['engine_share']:.0%} of the two)",
        f"peak memory: tracemalloc {n['tracemalloc_peak_bytes'] / MB:.0f} MB "
        f"({n['tracemalloc_peak_per_file_byte']:.2f} x the file; Python allocations only), "
        f"peak RSS (VmHWM) growth {n['rss_peak_growth_bytes'] / MB:.0f} MB "
        f"({n['rss_peak_growth_per_file_byte']:.2f} x the file; fresh subprocess, whole process)",
        "cProfile of one seed, top functions by own time:",
        *(f"  {line}" for line in n["profile_top"]),
    ]
    return "\n".join(lines)
