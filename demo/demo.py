"""The main job (`make demo`): a session's whole life on the embedded LMDB store under var/demo.

Seeds a session from the shipped sample transcript, continues it, forks it two ways, attaches live
clients with a takeover, compacts a fork, kills a writer process with SIGKILL mid-flight and checks
that every acknowledged append survived, verifies the hash chain, exports a sanitized bundle, and
prints the ancestry tree and the store's figures with the command line's own renderers.

Every run starts from an empty var/demo: what it prints (counts, the crash check) is about one run,
and a clean start makes a second run print the same story. The store is kept until the next run,
and the demo ends with the commands to explore it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import replay  # noqa: E402
from sessionlog import _render  # noqa: E402
from sessionlog._commands import load_tree, stats_rows, store_figures  # noqa: E402
from sessions import SessionStore  # noqa: E402
from sessions.runtime import MockProvider, Runtime  # noqa: E402

VAR = ROOT / "var" / "demo"
STORE = VAR / "sessions"
SAMPLE = ROOT / "demo" / "sample_transcript.jsonl"
WRITER = ROOT / "demo" / "crash_writer.py"
SESSION = "release-1"
CRASH_SESSION = "crash-test"
# The writer is killed once it has acknowledged this many appends (or after the time limit):
# enough that the kill lands in the middle of a stream of commits.
CRASH_ACKS = 40
CRASH_TIME_S = 10.0


def say(step: str, text: str) -> None:
    print(f"  {step:<9} {text}")


def continue_session(store: SessionStore, session_id: str, question: str) -> str:
    """Continue the seeded conversation through the delegation runtime: the runtime adopts the
    session (it did not create it), then the mock provider answers a prompt."""

    async def prompt() -> str:
        async with Runtime(store, providers=[MockProvider()]) as runtime:
            await runtime.adopt(session_id, agent_id="demo")
            answer = await runtime.prompt(session_id, question)
        return str(answer["text"])

    text = asyncio.run(prompt())
    return f"runtime + mock provider: {_render.cut(text, 40)!r}"


def crash_and_recover() -> tuple[int, int]:
    """Run the writer, SIGKILL it mid-flight, reopen: (acknowledged appends, appends found)."""
    with subprocess.Popen(
        [sys.executable, str(WRITER), str(STORE), CRASH_SESSION],
        stdout=subprocess.PIPE,
        text=True,
    ) as writer:
        assert writer.stdout is not None
        acknowledged = 0
        deadline = time.monotonic() + CRASH_TIME_S
        for line in writer.stdout:
            if line.strip().isdigit():
                acknowledged = int(line)
            if acknowledged >= CRASH_ACKS or time.monotonic() > deadline:
                break
        writer.send_signal(signal.SIGKILL)  # mid-flight: it is still appending
        writer.wait()
        for line in writer.stdout:  # acknowledged before the kill, read after it
            if line.endswith("\n") and line.strip().isdigit():
                acknowledged = int(line)
    with SessionStore.open(STORE) as store:
        found = store.messages(CRASH_SESSION)
    numbers = [int(m["content"].rsplit(" ", 1)[1]) for m in found]
    if numbers != list(range(1, len(numbers) + 1)):
        raise SystemExit(f"demo: the crash-test session holds {numbers}, expected 1..n in order")
    return acknowledged, len(numbers)


def main() -> int:
    started = time.monotonic()
    shutil.rmtree(VAR, ignore_errors=True)
    print(f"sessionlog demo: embedded LMDB store at {STORE.relative_to(ROOT)}")
    with SessionStore.open(STORE) as store:
        seeded = replay.seed_from_jsonl(store, SAMPLE, rename_session=SESSION)
        if not seeded.ok:
            raise SystemExit(f"demo: seeding failed: {seeded.error}")
        store.rename(SESSION, "Release 1.4 changelog")
        say("seed", f"{SESSION}: {seeded.messages_loaded} messages from {SAMPLE.name}")
        say("continue", continue_session(store, SESSION, "Good. Add them to the changelog."))

        whole = store.fork(SESSION, "release-1-retry")
        early = store.fork_at(SESSION, 4, "release-1-at-4")
        say("fork", f"{whole}: all {store.length(whole)} messages, the prefix shared, not copied")
        say("fork_at", f"{early}: the first {store.length(early)} messages")

        store.attach(SESSION, "ui-1", {"mode": "observer"})
        store.attach(SESSION, "agent-a", {"mode": "controller"})
        store.takeover(SESSION, "agent-b", {"reason": "agent-a stalled"})
        clients = store.snapshot(SESSION)["live_clients"]  # type: ignore[index]
        say("live", f"{len(clients)} clients; observer ui-1, agent-a taken over by agent-b")

        before = store.length(whole)
        kept = store.compact(whole, keep_last=4, compact_strategy="truncate")
        say("compact", f"{whole}: {before} -> {kept} messages; {SESSION} still has "
            f"{store.length(SESSION)}")  # fmt: skip
        store.open_session(CRASH_SESSION, title="crash test")

    acknowledged, found = crash_and_recover()
    lost = max(acknowledged - found, 0)
    say("crash", f"writer SIGKILLed after {acknowledged} acknowledged appends; reopened: "
        f"{found} present, {lost} lost")  # fmt: skip

    with SessionStore.open(STORE) as store:
        report = store.log.verify()
        say("verify", f"{'ok' if report.ok else 'FAILED'}: {report.events_checked} events, "
            f"{report.streams_checked} streams, head {report.head_hash.hex()[:16]}")  # fmt: skip
        bundle = replay.export_bundle(store, SESSION, mode="sanitized")
        out = VAR / f"{SESSION}.bundle.json"
        out.write_text(json.dumps(bundle, indent=2, ensure_ascii=False) + "\n")
        entries = len(bundle["redaction"]["entries"])
        say("export", f"sanitized bundle -> {out.relative_to(ROOT)} ({entries} redactions)")
        tree, _ = load_tree(store, SESSION)
        figures = store_figures(store)
        figures["sessions_active"] = len(store.list_sessions()["sessions"])
    print("\nancestry:")
    print("  " + _render.plain(_render.text_tree(tree, mark=SESSION)).replace("\n", "\n  "))
    print("\nstore:")
    print("  " + _render.plain(_render.pairs(stats_rows(figures))).replace("\n", "\n  "))
    ok = report.ok and lost == 0 and acknowledged > 0
    print(f"\n{'done' if ok else 'FAILED'} in {time.monotonic() - started:.1f} s")
    explore()
    return 0 if ok else 1


def explore() -> None:
    """The commands to look at what the demo built: its store stays until the next run."""
    script = Path(sys.executable).with_name("sessionlog")
    shown = os.path.relpath(script) if script.is_relative_to(Path.cwd()) else str(script)
    store = os.path.relpath(STORE) if STORE.is_relative_to(Path.cwd()) else str(STORE)
    command = f"{shlex.quote(shown)} --store {shlex.quote(store)}"
    print("\nexplore it (the store stays until the next `make demo`):")
    for words in ("ls", f"tree {SESSION}", f"show {SESSION} --limit 5", "tail --follow"):
        print(f"  {command} {words}")
    # The HTTP service over the same store (the `service` extra); the key is the caller's own.
    print(f'  SESSIONLOG_API_KEYS="admin=$(openssl rand -hex 32)" {command} serve --port 8700')


if __name__ == "__main__":
    raise SystemExit(main())
