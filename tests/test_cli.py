"""The `sessionlog` console script, end to end: each command run as a real subprocess.

Every run is checked for what a user relies on: the exit code of its kind, the output (JSON parsed
back where `--json` is given), one line on stderr when it fails, and never a traceback.
"""

from __future__ import annotations

import json
import os
import pty
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventlog._codec import BODY_START
from replay._validate import bundle_id
from sessions import SessionStore
from tests._pg import fresh_schema_url
from tests._raw_lmdb import raw_log, tree_store_marked

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).with_name("sessionlog")
SAMPLE = ROOT / "demo" / "sample_transcript.jsonl"
SAMPLE_MESSAGES = 8
COMMANDS = (
    *("ls", "show", "tree", "as-of", "stats", "tail", "verify", "rebuild", "compact-store"),
    *("sweep", "truncate-log"),
    *("export-log", "import-log", "seed", "export", "import"),
)


def run(
    *args: str | Path, store: Path | str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [str(SCRIPT), *(["--store", str(store)] if store else []), *map(str, args)]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode != 0:
        assert done.stderr.startswith("sessionlog"), done.stderr
        assert done.stderr.count("\n") == 1, f"expected one line, got {done.stderr!r}"
    return done


def seed(store: Path, session_id: str) -> None:
    done = run("seed", SAMPLE, "--id", session_id, store=store)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding `release-1` (seeded by the CLI) and three forks of it."""
    store = tmp_path_factory.mktemp("cli") / "store"
    seed(store, "release-1")
    with SessionStore.open(store) as sessions:
        sessions.fork("release-1", "copy")
        sessions.fork_at("release-1", 3, "at-3")
        sessions.fork_at("at-3", 1, "at-3-1")
        sessions.rename("release-1", "Release 1.4 changelog")
    return store


@pytest.fixture
def scratch(family: Path, tmp_path: Path) -> Path:
    """A private copy of `family`, free to change or damage."""
    copy = tmp_path / "store"
    shutil.copytree(family, copy)
    return copy


def head_of(store: Path) -> tuple[int, str]:
    with SessionStore.open(store) as sessions:
        return sessions.log.head, sessions.log.head_hash.hex()


# Help and usage


def test_help_has_usage_commands_options_examples() -> None:
    done = run("--help")
    assert done.returncode == 0
    for section in ("Usage:", "Commands:", "Options:", "Examples:"):
        assert f"\n{section}" in "\n" + done.stdout, section
    for command in COMMANDS:
        assert f"\n  {command} " in done.stdout, command
    sub = run("seed", "--help")
    assert sub.returncode == 0
    assert sub.stdout.startswith("Usage: sessionlog seed")
    for section in ("Arguments:", "Options:", "Examples:", "--truncate-to-last"):
        assert section in sub.stdout


@pytest.mark.parametrize(
    "args",
    [(), ("frobnicate",), ("show",), ("as-of", "x", "id"), ("ls", "--limit", "-1"), ("tail", "-z")],
)
def test_usage_errors_exit_2_in_one_line(family: Path, args: tuple[str, ...]) -> None:
    done = run(*args, store=family)
    assert done.returncode == 2
    assert "--help" in done.stderr


def test_a_missing_store_is_not_created_by_reading_commands(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    for args in (("ls",), ("show", "x"), ("stats",), ("verify",), ("tail",)):
        done = run(*args, store=missing)
        assert done.returncode == 3, args
        assert "no store at" in done.stderr
    assert not missing.exists()


def test_the_store_comes_from_the_environment(family: Path, tmp_path: Path) -> None:
    done = run("ls", "--json", env={"SESSIONLOG_STORE": str(family)})
    assert done.returncode == 0
    assert "release-1" in [s["session_id"] for s in json.loads(done.stdout)["sessions"]]
    # --store wins over the environment.
    other = run("ls", store=tmp_path / "absent", env={"SESSIONLOG_STORE": str(family)})
    assert other.returncode == 3


# Reading sessions


def test_ls_prints_a_table_and_pages(family: Path) -> None:
    done = run("ls", store=family)
    assert done.returncode == 0
    header, rule, *rows = done.stdout.splitlines()
    assert header.split() == ["ID", "TITLE", "STATUS", "MESSAGES", "LAST", "ACTIVITY"]
    assert set(rule) <= {"-", " "}
    row = next(r for r in rows if r.startswith("release-1 "))
    assert "Release 1.4 changelog" in row and "active" in row and " 8 " in row
    page = run("ls", "--limit", "2", store=family)
    assert len(page.stdout.splitlines()) == 2 + 2 + 1
    assert "--cursor" in page.stdout.splitlines()[-1]
    pages = run("ls", "--limit", "1", "--all", "--json", store=family)
    everything = json.loads(pages.stdout)
    ids = [s["session_id"] for s in everything["sessions"]]
    assert ids == ["at-3", "at-3-1", "copy", "release-1"]  # id order
    assert everything["next_cursor"] is None


def test_show_prints_the_transcript_and_json(family: Path) -> None:
    done = run("show", "release-1", store=family)
    assert done.returncode == 0
    assert "[1] user\n    Is the changelog ready for the 1.4 release?" in done.stdout
    assert '-> read_file({"path": "CHANGELOG.md"})' in done.stdout
    assert f"[{SAMPLE_MESSAGES}] assistant" in done.stdout
    snapshot = json.loads(run("show", "release-1", "--json", store=family).stdout)
    with SessionStore.open(family) as sessions:
        assert snapshot == json.loads(json.dumps(sessions.snapshot("release-1")))
    assert snapshot["length"] == SAMPLE_MESSAGES
    assert sorted(snapshot["child_ids"]) == ["at-3", "copy"]


def test_show_of_an_unknown_session_exits_3(family: Path) -> None:
    done = run("show", "nope", store=family)
    assert done.returncode == 3
    assert "no session `nope`" in done.stderr


def test_tree_in_three_formats(family: Path) -> None:
    text = run("tree", "at-3-1", store=family)
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert lines[0].startswith('release-1  "Release 1.4 changelog"  8 messages')
    assert any(line.startswith(("├── at-3", "└── at-3")) for line in lines)
    assert any("at-3-1" in line and "forked at message 1" in line for line in lines)
    assert [line for line in lines if line.endswith("<-")] == [
        next(line for line in lines if "at-3-1" in line)
    ]
    dot = run("tree", "release-1", "--format", "dot", store=family).stdout
    assert dot.startswith("digraph sessions {") and dot.rstrip().endswith("}")
    assert '"release-1" -> "at-3" [label="at 3"];' in dot
    assert '"at-3" -> "at-3-1" [label="at 1"];' in dot
    mermaid = run("tree", "copy", "--format", "mermaid", store=family).stdout
    assert mermaid.startswith("graph TD")
    assert mermaid.count("-->") == 3
    assert run("tree", "nope", store=family).returncode == 3
    assert run("tree", "copy", "--format", "png", store=family).returncode == 2


def test_as_of_shows_the_past(family: Path) -> None:
    # Position 1 opened release-1; position 2 injected all its seeded messages at once.
    before = json.loads(run("as-of", "1", "release-1", "--json", store=family).stdout)
    assert before["length"] == 0
    past = json.loads(run("as-of", "2", "release-1", "--json", store=family).stdout)
    assert past["length"] == SAMPLE_MESSAGES
    assert past["transcript"][0]["content"] == "Is the changelog ready for the 1.4 release?"
    text = run("as-of", "2", "release-1", store=family)
    assert text.stdout.startswith("as of position 2\n")
    assert run("as-of", "2", "copy", store=family).returncode == 3  # not forked yet
    late = run("as-of", "100000", "release-1", store=family)
    assert late.returncode == 2
    assert "as-of: POSITION must be from 0 to" in late.stderr


def test_stats_counts_the_store(family: Path) -> None:
    figures = json.loads(run("stats", "--json", store=family).stdout)
    head, head_hash = head_of(family)
    assert figures["events"] == head
    assert figures["head_hash"] == head_hash
    assert figures["sessions_active"] == 4
    assert figures["messages"] == 8 + 8 + 3 + 1
    assert figures["bytes_on_disk"] > 0
    text = run("stats", store=family).stdout
    assert f"head hash                 {head_hash}" in text
    assert "bytes on disk" in text


# The log


def test_tail_lists_events_from_any_position(family: Path) -> None:
    head, _ = head_of(family)
    lines = run("tail", store=family).stdout.splitlines()
    assert len(lines) == head
    assert lines[0].split()[0] == "1" and "session_opened" in lines[0]
    events = [json.loads(line) for line in run("tail", "--json", store=family).stdout.splitlines()]
    assert [e["position"] for e in events] == list(range(1, head + 1))
    only = run("tail", "--session", "at-3", "--json", store=family).stdout.splitlines()
    assert {json.loads(line)["stream"] for line in only} == {"at-3"}
    after = run("tail", "--after", str(head - 2), "--json", store=family).stdout.splitlines()
    assert [json.loads(line)["position"] for line in after] == [head - 1, head]


def test_tail_follow_sees_another_process_commit(scratch: Path) -> None:
    head, _ = head_of(scratch)
    argv = [str(SCRIPT), "--store", str(scratch), "tail", "--follow", "--json"]
    argv += ["--after", str(head)]
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as follower:
        try:
            time.sleep(0.3)  # let it reach the live part: what follows is committed after it
            seed(scratch, "late")  # another process writes
            assert follower.stdout is not None
            # The seed is two events: the session opened, and its messages in one batch.
            seen = [json.loads(follower.stdout.readline()) for _ in range(2)]
            assert [e["position"] for e in seen] == [head + 1, head + 2]
            assert {e["stream"] for e in seen} == {"late"}
            assert [e["type"] for e in seen] == ["session_opened", "messages_injected"]
            follower.send_signal(signal.SIGTERM)
            _, errors = follower.communicate(timeout=10)
            assert follower.returncode == 0, errors  # a follow ends cleanly when told to stop
            assert errors == ""
        finally:
            if follower.poll() is None:
                follower.kill()


def test_verify_a_sound_store(family: Path) -> None:
    done = run("verify", store=family)
    head, head_hash = head_of(family)
    assert done.returncode == 0
    assert done.stdout.strip() == f"ok: {head} events in 4 streams, head hash {head_hash}"
    report = json.loads(run("verify", "--json", store=family).stdout)
    assert report["ok"] is True and report["events_checked"] == head


def test_verify_names_the_first_bad_position(scratch: Path) -> None:
    with raw_log(scratch) as raw:
        record = bytearray(raw.record(5) or b"")
        record[BODY_START + 3] ^= 0x40
        assert raw.put_record(5, bytes(record))
    done = run("verify", store=scratch)
    assert done.returncode == 4
    assert "damaged at position 5" in done.stderr
    report = run("verify", "--json", store=scratch)
    assert report.returncode == 4
    found = json.loads(report.stdout)
    assert found["ok"] is False and found["first_bad_position"] == 5
    assert found["events_checked"] == 4


def test_a_store_that_is_not_one_is_an_integrity_failure(tmp_path: Path) -> None:
    store = tmp_path / "junk"
    store.mkdir()
    (store / "data.mdb").write_bytes(b"not a database" * 1000)
    for args in (("verify",), ("ls",)):
        done = run(*args, store=store)
        assert done.returncode == 4, (args, done.stderr)
    assert (store / "data.mdb").read_bytes() == b"not a database" * 1000


def test_a_store_of_a_newer_format_is_a_plain_error_not_an_integrity_failure(
    tmp_path: Path,
) -> None:
    store = tmp_path / "newer"
    before = tree_store_marked(store, b"sessionlog-log/12")
    for args in (("verify",), ("ls",)):
        done = run(*args, store=store)
        assert done.returncode == 1, (args, done.stderr)
        assert "sessionlog-log/12" in done.stderr and "newer version" in done.stderr
    assert (store / "data.mdb").read_bytes() == before


def test_rebuild_reports_the_position(scratch: Path) -> None:
    before = run("show", "at-3", "--json", store=scratch).stdout
    done = run("rebuild", store=scratch)
    head, _ = head_of(scratch)
    assert done.returncode == 0
    assert done.stdout.strip().endswith(f"through position {head}")
    assert run("show", "at-3", "--json", store=scratch).stdout == before


def test_export_log_and_import_log_round_trip(family: Path, tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    done = run("export-log", "--output", out, store=family)
    head, head_hash = head_of(family)
    assert done.returncode == 0 and head_hash in done.stdout
    piped = run("export-log", store=family).stdout.splitlines()
    assert json.loads(piped[0])["events"] == head and len(piped) == head + 1
    target = tmp_path / "copy"
    first = json.loads(run("import-log", out, "--json", store=target).stdout)
    assert first["written"] == head and first["head_hash"] == head_hash
    again = json.loads(run("import-log", out, "--json", store=target).stdout)
    assert again["written"] == 0 and again["already_present"] == head
    assert head_of(target) == (head, head_hash)
    assert run("show", "at-3-1", "--json", store=target).stdout == (
        run("show", "at-3-1", "--json", store=family).stdout
    )


@pytest.mark.needs("POSTGRES")
def test_a_deployment_moves_to_postgresql_through_the_command_line(
    family: Path, tmp_path: Path
) -> None:
    """`--store postgresql://...` works like a path: export-log from LMDB, import-log into
    PostgreSQL, the same head hash, and the read commands answer the same."""
    url = fresh_schema_url("cli")
    out = tmp_path / "log.jsonl"
    assert run("export-log", "--output", out, store=family).returncode == 0
    imported = json.loads(run("import-log", out, "--json", store=url).stdout)
    head, head_hash = head_of(family)
    assert imported["written"] == head and imported["head_hash"] == head_hash
    stats = json.loads(run("stats", "--json", store=url).stdout)
    assert stats["events"] == head and stats["head_hash"] == head_hash
    for command in (("show", "at-3-1", "--json"), ("ls", "--all", "--json")):
        assert run(*command, store=url).stdout == run(*command, store=family).stdout
    assert run("verify", store=url).returncode == 0


def test_import_log_refuses_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_type": "something else"}\n')
    target = tmp_path / "target"
    done = run("import-log", bad, store=target)
    assert done.returncode == 5
    assert "bad.jsonl:1" in done.stderr
    assert head_of(target)[0] == 0
    assert run("import-log", tmp_path / "missing.jsonl", store=target).returncode == 3


# The edges: seed, bundles


def test_seed_creates_a_session_and_reports_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = run("seed", SAMPLE, "--id", "s-1", "--truncate-to-last", "3", "--json", store=store)
    assert done.returncode == 0
    result = json.loads(done.stdout)
    assert result["ok"] is True and result["session_id"] == "s-1"
    assert result["messages_loaded"] == 3 and result["truncated"] is True
    assert result["source_format"] == "message_events"
    text = run("seed", SAMPLE, "--drop-tool-calls", "--source-label", "demo", store=store)
    assert text.returncode == 0 and text.stdout.startswith("seeded session ")
    new_id = text.stdout.split()[2].rstrip(":")
    snapshot = json.loads(run("show", new_id, "--json", store=store).stdout)
    assert all(m["role"] != "tool" for m in snapshot["transcript"])
    assert snapshot["metadata"]["seeded_from"]["label"] == "demo"


def test_seed_refusals_write_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    seed(store, "taken")
    head = head_of(store)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "message", "message": {"role": "user", "content": "hi"}}\n[1]\n')
    cases = [
        ((bad,), 5, "bad.jsonl:2"),
        ((SAMPLE, "--id", "taken"), 6, "session `taken` already exists"),
        ((SAMPLE, "--provider", "elsewhere"), 5, "provider"),
        ((tmp_path / "missing.jsonl",), 3, "no file"),
    ]
    for args, code, words in cases:
        done = run("seed", *args, store=store)
        assert done.returncode == code, (args, done.stderr)
        assert words in done.stderr
    assert head_of(store) == head


def test_export_and_import_a_bundle(family: Path, tmp_path: Path) -> None:
    bundle = json.loads(run("export", "release-1", store=family).stdout)
    assert bundle["_type"] == "harn_session_bundle"
    assert bundle["redaction"]["mode"] == "sanitized"
    out = tmp_path / "bundle.json"
    done = run("export", "release-1", "--mode", "replay_only", "-o", out, store=family)
    assert done.returncode == 0 and str(out) in done.stdout
    assert json.loads(out.read_text())["redaction"]["mode"] == "replay_only"
    target = tmp_path / "target"
    sanitized = tmp_path / "sanitized.json"
    sanitized.write_text(json.dumps(bundle))
    imported = run("import", sanitized, store=target)
    assert imported.returncode == 0 and imported.stdout.strip() == "release-1"
    again = run("import", sanitized, store=target)
    assert again.returncode == 0  # the same bundle twice writes nothing and succeeds
    shown = json.loads(run("show", "release-1", "--json", store=target).stdout)
    assert shown["length"] == SAMPLE_MESSAGES
    assert run("export", "nope", store=family).returncode == 3
    assert run("export", "release-1", "--mode", "open", store=family).returncode == 2


def test_import_refusals(family: Path, tmp_path: Path) -> None:
    bundle = json.loads(run("export", "release-1", store=family).stdout)
    target = tmp_path / "target"
    files = {
        "text.json": "not json at all",
        "list.json": "[1, 2]",
        "empty.json": "{}",
        "changed.json": json.dumps(bundle),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    for name, code in (("text.json", 5), ("list.json", 5), ("empty.json", 5)):
        done = run("import", tmp_path / name, store=target)
        assert done.returncode == code, (name, done.stderr)
        assert name in done.stderr
    assert run("import", tmp_path / "missing.json", store=target).returncode == 3
    assert run("import", tmp_path / "changed.json", store=target).returncode == 0
    bundle["transcript"]["sections"][0]["messages"][0]["content"] = "something else"
    (tmp_path / "changed.json").write_text(json.dumps(bundle))
    edited = run("import", tmp_path / "changed.json", store=target)
    assert edited.returncode == 5
    assert (
        "changed.json: import: invalid session bundle: $.bundle_id: does not match" in edited.stderr
    )
    bundle["bundle_id"] = bundle_id(bundle)  # a bundle of a session changed since
    (tmp_path / "changed.json").write_text(json.dumps(bundle))
    conflict = run("import", tmp_path / "changed.json", store=target)
    assert conflict.returncode == 6
    assert "already exists with different content" in conflict.stderr


# Progress on a terminal, quiet in a pipe


def on_terminal(
    args: list[str], *, drawn_on: str = "stderr", env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], bytes]:
    """Run `sessionlog ARGS` with its `drawn_on` stream ("stdout" or "stderr") on a pseudo-terminal
    and the other one piped: the finished process, and every byte drawn on the terminal."""
    main, secondary = pty.openpty()
    try:
        done = subprocess.run(
            [str(SCRIPT), *args],
            stdout=secondary if drawn_on == "stdout" else subprocess.PIPE,
            stderr=secondary if drawn_on == "stderr" else subprocess.PIPE,
            env=env,
            text=True,
            timeout=60,
            check=False,
        )
        os.close(secondary)
        drawn = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal closed: everything written was read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(main)
    return done, drawn


def test_progress_shows_on_a_terminal_only(family: Path) -> None:
    done, drawn = on_terminal(["--store", str(family), "verify"])
    assert done.returncode == 0 and done.stdout.startswith("ok: ")
    head, _ = head_of(family)
    assert b"verify " in drawn and b"100%" in drawn and f"{head}/{head}".encode() in drawn
    assert drawn.endswith(b"\x1b[2K")  # wiped at the end: the next output starts on a clean line
    piped = run("verify", store=family)
    assert piped.stderr == ""


def test_export_draws_its_progress_on_a_terminal_only(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with SessionStore.open(store) as sessions:
        sid = sessions.open_session("big")
        sessions.inject_many(
            sid, [{"role": "user", "content": f"line {i} of the log"} for i in range(2_500)]
        )
        steps = 2 * sessions.log.stream_version(sid) + 2_500
    done, drawn = on_terminal(
        ["--store", str(store), "export", sid, "-o", str(tmp_path / "b.json")]
    )
    assert done.returncode == 0 and done.stdout.startswith("exported sanitized bundle")
    assert b"export " in drawn and b"100%" in drawn and f"{steps}/{steps}".encode() in drawn
    assert drawn.endswith(b"\x1b[2K")
    piped = run("export", sid, "-o", tmp_path / "c.json", store=store)
    assert piped.returncode == 0 and piped.stderr == ""


# Output a terminal can trust

HOSTILE = "\x1b]0;owned\x07\x1b[2J\rfake\x9b31m\x7f"
"""A title-setting OSC, a screen wipe, a carriage return and a C1 CSI, as session text may hold."""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("hostile") / "store"
    with SessionStore.open(store) as sessions:
        sessions.open_session("h1", title="title" + HOSTILE)
        sessions.inject("h1", {"role": "user", "content": "line one\nline" + HOSTILE})
        call = {"id": "c1", "type": "function", "function": {"name": "run" + HOSTILE}}
        call["function"]["arguments"] = json.dumps({"cmd": HOSTILE})
        sessions.inject(
            "h1",
            {"role": "assistant", "content": "ok", "name": "n" + HOSTILE, "tool_calls": [call]},
        )
        sessions.fork("h1", "h1-fork")
    return store


@pytest.mark.parametrize(
    "args",
    [
        ("show", "h1"),
        ("ls",),
        ("tail",),
        ("tree", "h1"),
        ("tree", "h1", "--format", "dot"),
        ("tree", "h1", "--format", "mermaid"),
        ("as-of", "4", "h1"),
    ],
)
def test_session_text_cannot_drive_the_terminal(hostile: Path, args: tuple[str, ...]) -> None:
    done = run(*args, store=hostile)
    assert done.returncode == 0, done.stderr
    controls = {
        c for c in done.stdout if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0
    }
    assert controls == set(), sorted(map(hex, map(ord, controls)))
    assert "x1b]0;owned" in done.stdout  # shown, as its escapes


def test_session_text_drawn_on_a_terminal_stays_inert(hostile: Path) -> None:
    for args in (["ls"], ["show", "h1"]):
        done, drawn = on_terminal(["--store", str(hostile), *args], drawn_on="stdout")
        assert done.returncode == 0, done.stderr
        assert b"\x1b]0;" not in drawn and b"\x07" not in drawn and b"\x1b[2J" not in drawn
        assert b"\\x1b]0;owned" in drawn


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_output_in_an_encoding_without_the_characters(tmp_path: Path, encoding: str) -> None:
    store = tmp_path / "store"
    title = "héllo ✓ 日本 😀"
    with SessionStore.open(store) as sessions:
        sessions.open_session("u1", title=title)
        sessions.inject("u1", {"role": "user", "content": "check ✓"})

    def out(*args: str) -> str:
        done = subprocess.run(
            [str(SCRIPT), "--store", str(store), *args],
            capture_output=True,
            env={**os.environ, "PYTHONIOENCODING": encoding},
            timeout=60,
            check=False,
        )
        assert done.returncode == 0 and done.stderr == b"", done.stderr
        return done.stdout.decode(encoding)

    for args in (("ls",), ("tree", "u1"), ("tail",)):
        assert "h" in out(*args)
    assert "check \\u2713" in out("show", "u1")
    listed = out("ls", "--json")
    assert listed.isascii() and json.loads(listed)["sessions"][0]["title"] == title
    tailed = out("tail", "--json").splitlines()[0]
    assert tailed.isascii() and json.loads(tailed)["data"]["title"] == title


def test_an_error_line_is_inert_on_a_terminal(hostile: Path) -> None:
    done = run("show", "x" + HOSTILE, store=hostile)
    assert done.returncode == 3
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr and "\r" not in done.stderr
    assert done.stderr.startswith("sessionlog: show: no session `x\\x1b]0;owned\\x07")


def test_json_output_carries_no_raw_control_characters(hostile: Path) -> None:
    for args in (("show", "h1", "--json"), ("ls", "--json"), ("tail", "--json")):
        done = run(*args, store=hostile)
        assert done.returncode == 0, done.stderr
        assert not any(
            (ord(c) < 32 and c not in "\n") or 0x7F <= ord(c) < 0xA0 for c in done.stdout
        )
    shown = json.loads(run("show", "h1", "--json", store=hostile).stdout)
    assert shown["title"] == "title" + HOSTILE  # the same text, escaped only in the JSON


@pytest.mark.parametrize("command", ["serve", "mcp"])
def test_a_port_past_65535_is_a_usage_error(tmp_path: Path, command: str) -> None:
    # Refused before anything listens: the socket layer would take the port modulo 65536.
    agents = ("--agents", str(tmp_path / "agents.toml")) if command == "mcp" else ()
    done = subprocess.run(
        [str(SCRIPT), "--store", str(tmp_path / "s"), command, *agents, "--port", "99999"],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "SESSIONLOG_API_KEYS": "admin=" + secrets.token_urlsafe(32)},
        check=False,
    )
    assert done.returncode == 2
    assert "expected a port from 0 to 65535, got 99999" in done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0", "expected a number >= 1, got 0"),
        ("-2", "expected a number >= 1, got -2"),
        ("two", "expected a whole number, got 'two'"),
    ],
)
def test_serve_refuses_a_bad_past_rebuilds_max(tmp_path: Path, value: str, words: str) -> None:
    # Refused before anything listens or any store is opened, as the other numeric flags are.
    done = subprocess.run(
        [str(SCRIPT), "--store", str(tmp_path / "s"), "serve", "--past-rebuilds-max", value],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "SESSIONLOG_API_KEYS": "admin=" + secrets.token_urlsafe(32)},
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "--past-rebuilds-max" in done.stderr and words in done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "s").exists()
