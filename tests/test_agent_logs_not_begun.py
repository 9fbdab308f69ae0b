"""A log with no complete line yet: its agent has just created it and is writing its first line
(or has written nothing). Under `auto` and under a named format alike, its import has nothing to
do yet: no error, no session, nothing written, the bytes after the last line break reported as
pending; once the first line is complete, an import reads the log as a fresh import of the whole
file does. A first line that is complete (its line break written) but not JSON is still damage,
reported at its line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from blake3 import blake3

import replay
from replay.agentlogs import AgentLogError, NotAnAgentLogError
from sessionlog.cli import main
from sessions import SessionStore
from tests._agent_log_counts import FIXTURES
from tests.test_agent_logs_growth import CODEX, IDS, LINE_SAMPLES, fresh, lines_of, one, state

TRAJECTORY = FIXTURES / "openai-chat" / "pydicom__pydicom-1458.traj"
CUTS = {
    "its first byte": lambda line: line[:1],
    "half of it": lambda line: line[: len(line) // 2],
    "all but its last byte": lambda line: line.rstrip(b"\r\n")[:-1],
}


@pytest.mark.parametrize("named", [False, True], ids=["auto", "named"])
@pytest.mark.parametrize("cut", sorted(CUTS))
@pytest.mark.parametrize(("fmt", "path"), LINE_SAMPLES, ids=IDS)
def test_a_first_line_being_written_is_left_for_the_next_import(
    store: SessionStore, tmp_path: Path, fmt: str, path: Path, cut: str, named: bool
) -> None:
    """The file holds only the start of its first line: nothing to import yet, whatever
    `format` says; once the line is complete and more follow, the import equals a fresh
    import of the whole file."""
    lines = lines_of(path)
    begun = CUTS[cut](lines[0])
    live = tmp_path / path.name
    live.write_bytes(begun)
    found = one(store, live, format=fmt if named else "auto")  # no skip_bad_lines: not damage
    assert (found.format, found.detected) == ((fmt, False) if named else ("auto", False))
    assert found.sessions == () and found.records == 0 and not found.written
    assert found.pending_tail_bytes == len(begun) and not found.skipped_lines
    assert found.blake3 == blake3(b"").hexdigest()  # of the complete lines: none yet
    assert store.log.head == 0
    assert not one(store, live).written and store.log.head == 0  # again: still nothing
    live.write_bytes(b"".join(lines))  # the first line complete, and the rest of the log
    grown = one(store, live, format=fmt if named else "auto")
    assert grown.written and not grown.updated and grown.pending_tail_bytes == 0
    assert grown.format == fmt
    assert state(store) == fresh(tmp_path, live)


def test_blank_lines_before_a_first_line_being_written_are_read(
    store: SessionStore, tmp_path: Path
) -> None:
    lines = lines_of(CODEX)
    live = tmp_path / CODEX.name
    live.write_bytes(b"\n \r\n" + lines[0][:30])
    found = one(store, live)
    assert found.sessions == () and found.pending_tail_bytes == 30
    assert found.blake3 == blake3(b"\n \r\n").hexdigest()
    assert store.log.head == 0
    live.write_bytes(b"\n \r\n" + b"".join(lines[:20]))
    (session,) = one(store, live).sessions
    assert session.session_id == f"codex-{blake3(lines[0]).hexdigest()[:32]}"


@pytest.mark.parametrize("fmt", ["auto", "codex", "gemini-cli"])
@pytest.mark.parametrize("content", [b"", b"\n", b" \t\r\n\n", b"  ", b"\xef\xbb\xbf"])
def test_an_empty_or_blank_file_has_nothing_to_import_yet(
    store: SessionStore, tmp_path: Path, fmt: str, content: bytes
) -> None:
    """An empty file, or one of blank lines only, is a log not begun (whatever its format
    will be), not damage and not another kind of file: nothing is written; once the log is
    there it is imported as usual."""
    live = tmp_path / "live.jsonl"
    live.write_bytes(content)
    found = one(store, live, format=fmt)
    assert found.sessions == () and found.records == 0 and not found.written
    assert found.pending_tail_bytes == len(content) - content.rfind(b"\n") - 1
    assert found.format == fmt and not found.detected
    assert store.log.head == 0
    if fmt != "gemini-cli":
        shutil.copy(CODEX, live)
        assert one(store, live, format=fmt).written


@pytest.mark.parametrize("named", [False, True], ids=["auto", "named"])
def test_a_one_line_document_being_written_waits_and_a_whole_one_is_read(
    store: SessionStore, tmp_path: Path, named: bool
) -> None:
    """A JSON document written on one line with no line break after it has no complete line
    either: cut, it waits like a log's first line; whole, it is read as the document it is."""
    fmt = "openai-chat" if named else "auto"
    data = json.dumps(json.loads(TRAJECTORY.read_bytes())).encode()
    live = tmp_path / TRAJECTORY.name
    live.write_bytes(data[: len(data) // 2])
    found = one(store, live, format=fmt)
    assert found.sessions == () and found.pending_tail_bytes == len(data) // 2
    assert store.log.head == 0
    live.write_bytes(data)
    whole = one(store, live, format=fmt)
    assert whole.format == "openai-chat" and whole.written and whole.pending_tail_bytes == 0


def test_a_whole_first_record_without_its_line_break_still_tells_its_format(
    store: SessionStore, tmp_path: Path
) -> None:
    """A first record that is whole JSON (here with a lone surrogate escape, as JavaScript
    writes one) waits for its line break as before, its format detected from it."""
    record = json.loads(lines_of(CODEX)[0])
    record["payload"]["cwd"] = "/home/a \ud83d b"
    text = json.dumps(record).encode()
    assert b"\\ud83d" in text
    live = tmp_path / CODEX.name
    live.write_bytes(text)
    found = one(store, live)
    assert (found.format, found.detected) == ("codex", True)
    assert found.sessions == () and found.pending_tail_bytes == len(text)
    assert store.log.head == 0


@pytest.mark.parametrize(("fmt", "path"), LINE_SAMPLES, ids=IDS)
def test_a_complete_first_line_that_is_not_json_is_damage(
    store: SessionStore, tmp_path: Path, fmt: str, path: Path
) -> None:
    """Its line break is written, so the line is done, and damaged: an error naming the file
    and the line (a log of that one line is read as a document would be, and reported at the
    line holding the failing byte, not at the empty line after it), under `auto` and under the
    format named alike (not a file of another kind); nothing is written."""
    lines = lines_of(path)
    broken = tmp_path / path.name
    for tail in (b"", b"".join(lines[1:3])):
        broken.write_bytes(lines[0][: len(lines[0]) // 2] + b"\n" + tail)
        for options in ({}, {"format": fmt}):
            with pytest.raises(AgentLogError) as caught:
                one(store, broken, **options)
            assert (caught.value.path, caught.value.line) == (str(broken), 1)
            assert f"{broken}:1: " in str(caught.value)
            assert not isinstance(caught.value, NotAnAgentLogError)
        assert store.log.head == 0


def test_a_damaged_first_line_before_one_being_written_is_damage(
    store: SessionStore, tmp_path: Path
) -> None:
    """A log whose first line is complete and damaged, followed by a line being written, is
    damage: what comes after a complete line is the ordinary last line."""
    lines = lines_of(CODEX)
    broken = tmp_path / CODEX.name
    broken.write_bytes(lines[0][:40] + b"\n" + lines[1][:40])
    with pytest.raises(AgentLogError):
        one(store, broken)
    assert store.log.head == 0


def test_a_folder_lists_a_log_not_begun_with_the_files_it_read(
    store: SessionStore, tmp_path: Path
) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "a-empty.jsonl").write_bytes(b"")
    (folder / "b-begun.jsonl").write_bytes(lines_of(CODEX)[0][:50])
    shutil.copy(CODEX, folder / "c-done.jsonl")
    (folder / "d-notes.json").write_text('{"a": 1}')  # whole JSON, not a log: left alone
    result = replay.import_agent_log(store, folder)
    assert [(f.format, len(f.sessions), f.pending_tail_bytes) for f in result.files] == [
        ("auto", 0, 0),
        ("auto", 0, 50),
        ("codex", 1, 0),
    ]
    assert result.not_agent_logs == (str(folder / "d-notes.json"),)


def test_cli_says_a_log_not_begun_has_nothing_to_import_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "s")
    live = tmp_path / "live.jsonl"
    live.write_bytes(lines_of(CODEX)[0][:50])
    code = main(["--store", store, "import-agent-log", str(live)])
    out = capsys.readouterr().out
    assert code == 0 and f"pending {live}: its last line (50 bytes)" in out
    assert "not yet: its first line is being written" in out
    code = main(["--store", store, "import-agent-log", str(live), "--json"])
    (found,) = json.loads(capsys.readouterr().out)["files"]
    assert code == 0 and found["pending_tail_bytes"] == 50 and found["sessions"] == []
    assert (found["format"], found["detected"]) == ("auto", False)
    live.write_bytes(b"")
    code = main(["--store", store, "import-agent-log", str(live)])
    out = capsys.readouterr().out
    assert code == 0 and f"pending {live}" not in out and "not yet: nothing written in it" in out
    live.write_bytes(lines_of(CODEX)[0][:50] + b"\n")
    code = main(["--store", store, "import-agent-log", str(live)])
    assert code == 5 and f"{live}:1: " in capsys.readouterr().err
