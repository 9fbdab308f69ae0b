"""`import_agent_log` on real agents' logs: counts equal an independent reading of each sample,
nothing the agent wrote is lost, calls pair with results, and the sessions behave like any other
(verify, fork, sanitized export, bundle round trip). Damage and bounds give typed errors at
file:line with nothing written."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3

import replay
from replay import _limits
from replay.agentlogs import KIND, AgentLogError
from sessionlog.cli import main
from sessions import InvalidArgumentError, SessionStore
from tests._agent_log_counts import COUNTERS, FIXTURES, SAMPLES

IDS = [path.name[:24] for _, path in SAMPLES]


def imported(store: SessionStore, path: Path, **options: Any) -> list[dict[str, Any]]:
    result = replay.import_agent_log(store, path, **options)
    (found,) = result.files
    snapshots = [store.snapshot(s.session_id) for s in found.sessions]
    assert all(s is not None for s in snapshots)
    return [s for s in snapshots if s is not None]


def source_lines(message: dict[str, Any]) -> set[int]:
    source = message["metadata"]["source"]
    lines = set(source["lines"])
    lines.update(item["line"] for item in source.get("attached", []))
    lines.update(item["line"] for item in source.get("attached_after", []))
    return lines


@pytest.mark.parametrize(("fmt", "path"), SAMPLES, ids=IDS)
def test_counts_equal_an_independent_reading(store: SessionStore, fmt: str, path: Path) -> None:
    expected = COUNTERS[fmt](path)
    snapshots = imported(store, path)
    messages = [m for s in snapshots for m in s["transcript"]]
    roles = Counter(m["role"] for m in messages if not m.get("summary"))
    assert dict(roles) == expected["roles"]
    calls = [c for m in messages for c in m.get("tool_calls") or []]
    assert len(calls) == expected["tool_calls"]
    assert sum(m["role"] == "tool" for m in messages) == expected["tool_results"]
    dangling = {i for m in messages for i in m["metadata"].get("dangling_tool_calls", [])}
    assert dangling == expected["dangling"]
    if expected["error_results"] is not None:
        errors = sum(m["metadata"].get("is_error") is True for m in messages)
        assert errors == expected["error_results"]
    assert len(snapshots) - 1 == expected["sidechains"]
    compactions = sum(bool(m.get("summary")) and m["role"] == "assistant" for m in messages)
    assert compactions == expected["compactions"]


@pytest.mark.parametrize(("fmt", "path"), SAMPLES, ids=IDS)
def test_every_record_is_kept_and_the_source_is_named(
    store: SessionStore, fmt: str, path: Path
) -> None:
    snapshots = imported(store, path)
    covered: set[int] = set()
    for snapshot in snapshots:
        for message in snapshot["transcript"]:
            covered |= source_lines(message)
        about = snapshot["metadata"]["agent_log"]
        covered.update(item["line"] for item in about.get("attached_records", []))
        assert about["kind"] == KIND
        assert about["format"] == fmt
        assert about["file"] == path.name
        assert about["blake3"] == blake3(path.read_bytes()).hexdigest()
    if path.suffix == ".jsonl":
        lines = path.read_bytes().split(b"\n")
        assert covered == {n for n, line in enumerate(lines, start=1) if line.strip()}
    else:
        document = json.loads(path.read_bytes())
        held = document["messages"] if "messages" in document else document["history"]
        assert covered == set(range(1, len(held) + 1))


@pytest.mark.parametrize(("fmt", "path"), SAMPLES, ids=IDS)
def test_the_kept_records_are_the_file_line_for_line(
    store: SessionStore, fmt: str, path: Path
) -> None:
    kept: dict[int, str] = {}
    for snapshot in imported(store, path):
        kept.update(replay.agent_log_records(store, snapshot["session_id"]))
    if path.suffix == ".jsonl":  # the very text of each line: the file can be audited byte for byte
        lines = path.read_text().split("\n")
        assert kept == {n: line for n, line in enumerate(lines, start=1) if line.strip()}
        rebuilt = "".join(kept[n] + "\n" for n in sorted(kept)).encode()
        assert blake3(rebuilt).hexdigest() == snapshot["metadata"]["agent_log"]["blake3"]
    else:  # a document's items, each its very text in the file, in order
        document = json.loads(path.read_bytes())
        held = document["messages"] if "messages" in document else document["history"]
        assert {n: json.loads(text) for n, text in kept.items()} == dict(enumerate(held, start=1))
        text, at = path.read_text(), 0
        for n in sorted(kept):
            at = text.index(kept[n], at) + len(kept[n])


@pytest.mark.parametrize(("fmt", "path"), SAMPLES, ids=IDS)
def test_tool_results_pair_with_earlier_calls_by_id(
    store: SessionStore, fmt: str, path: Path
) -> None:
    for snapshot in imported(store, path):
        made: set[str] = set()
        for message in snapshot["transcript"]:
            made.update(c["id"] for c in message.get("tool_calls") or [])
            if message["role"] == "tool" and message.get("tool_call_id"):
                assert message["tool_call_id"] in made
                assert not message["metadata"].get("orphan_result")


def first_prompt(fmt: str, path: Path) -> str:
    """The first thing the user typed, read from the source by each format's own rule."""
    if fmt == "claude-code":
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("type") == "user" and not record.get("isMeta"):
                content = record["message"]["content"]
                return content if isinstance(content, str) else content[0]["text"]
    if fmt == "codex":
        for line in path.read_text().splitlines():
            item = json.loads(line)["payload"]
            if item.get("type") == "message" and item.get("role") == "user":
                text = item["content"][0]["text"]
                if not text.startswith("<environment_context>"):
                    return str(text)
    if fmt == "pi":
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("message", {}).get("role") == "user":
                return str(record["message"]["content"][0]["text"])
    document = json.loads(path.read_bytes())
    held = document.get("messages") or document["history"]
    first = next(m for m in held if m.get("type", m.get("role")) == "user" and not m.get("is_demo"))
    return str(first["content"])


@pytest.mark.parametrize(("fmt", "path"), SAMPLES, ids=IDS)
def test_the_first_user_prompt_is_intact(store: SessionStore, fmt: str, path: Path) -> None:
    (main_session, *_) = imported(store, path)
    prompts = [
        m for m in main_session["transcript"] if m["role"] == "user" and not m.get("synthetic")
    ]
    if not prompts:  # the summary-only Claude Code file
        assert main_session["length"] == 0
        return
    assert prompts[0]["content"] == first_prompt(fmt, path)


def test_importing_the_same_file_twice_writes_nothing(store: SessionStore) -> None:
    path = FIXTURES / "codex" / "codex-pomodor-timer.jsonl"
    first = replay.import_agent_log(store, path)
    head = store.log.head
    again = replay.import_agent_log(store, path)
    assert store.log.head == head
    assert first.files[0].written and not again.files[0].written
    assert again.session_ids == first.session_ids


def test_auto_says_which_format_it_chose_from_the_content(
    store: SessionStore, tmp_path: Path
) -> None:
    renamed = tmp_path / "whatever.json"  # a Codex rollout under a misleading name
    shutil.copy(FIXTURES / "codex" / "codex-pomodor-timer.jsonl", renamed)
    result = replay.import_agent_log(store, renamed)
    assert (result.files[0].format, result.files[0].detected) == ("codex", True)
    assert replay.detect_format(renamed) == "codex"
    for fmt, path in SAMPLES:
        assert replay.detect_format(path) == fmt
    other = tmp_path / "notes.jsonl"
    other.write_text('{"hello": "world"}\n')
    with pytest.raises(AgentLogError, match="not an agent log"):
        replay.detect_format(other)


def test_a_folder_imports_its_logs_and_leaves_other_files_alone(
    store: SessionStore, tmp_path: Path
) -> None:
    folder = tmp_path / "projects"
    shutil.copytree(FIXTURES / "claude-code", folder)
    (folder / "notes.json").write_text('{"a": 1}')
    flat = replay.import_agent_log(store, folder)
    assert flat.files == () and flat.not_agent_logs == (str(folder / "notes.json"),)
    deep = replay.import_agent_log(store, folder, recursive=True)
    assert len(deep.files) == 5
    assert {f.format for f in deep.files} == {"claude-code"}


def test_sidechains_become_children_linked_to_the_task_call_that_spawned_them(
    store: SessionStore,
) -> None:
    path = (
        FIXTURES / "claude-code" / "sample-project" / "5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"
    )
    parent, *children = imported(store, path)
    tasks = {
        call["id"]: json.loads(call["function"]["arguments"]).get("prompt")
        for message in parent["transcript"]
        for call in message.get("tool_calls") or []
        if call["function"]["name"] == "Task"
    }
    assert len(tasks) == 3 and len(children) == 2
    linked = set()
    for child in children:
        ref = child["parent_spawn_ref"]
        assert ref["session_id"] == parent["session_id"]
        assert tasks[ref["tool_call_id"]] == child["transcript"][0]["content"]
        linked.add(ref["tool_call_id"])
    assert len(linked) == 2
    assert parent["metadata"]["agent_log"]["children"] == [c["session_id"] for c in children]


def test_streamed_assistant_records_merge_into_one_message(store: SessionStore) -> None:
    path = (
        FIXTURES / "claude-code" / "sample-project" / "5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"
    )
    parent, *_ = imported(store, path)
    merged = [m for m in parent["transcript"] if len(m["metadata"]["source"]["records"]) == 3]
    assert merged, "three records of one streamed message"
    kept = replay.agent_log_records(store, parent["session_id"])
    ids = {json.loads(kept[n])["message"]["id"] for n in merged[0]["metadata"]["source"]["lines"]}
    assert len(ids) == 1 and len(merged[0]["tool_calls"]) == 3


def test_pi_keeps_the_provider_and_model_of_each_message(store: SessionStore) -> None:
    (session,) = imported(store, FIXTURES / "pi" / "large-session.jsonl")
    models = [m.get("model") for m in session["transcript"] if m["role"] == "assistant"]
    assert models[0] == "openai/gpt-5.1-codex"
    assert set(models[1:]) == {"anthropic/claude-sonnet-4-5"}
    assert session["metadata"]["agent_log"]["models"] == [
        "openai/gpt-5.1-codex",
        "anthropic/claude-sonnet-4-5",
    ]


def test_pi_compaction_records_become_checkpoints(store: SessionStore, tmp_path: Path) -> None:
    lines = (FIXTURES / "pi" / "large-session.jsonl").read_text().splitlines()[:40]
    compaction = {
        "type": "compaction",
        "timestamp": "2025-11-21T00:00:00.000Z",
        "summary": "The user asked for themes; the agent read the docs.",
        "firstKeptEntryIndex": 30,
        "tokensBefore": 50000,
    }
    path = tmp_path / "compacted.jsonl"
    path.write_text("\n".join([*lines[:30], json.dumps(compaction), *lines[30:]]) + "\n")
    (session,) = imported(store, path)
    pair = [m for m in session["transcript"] if m.get("summary")]
    assert [m["role"] for m in pair] == ["user", "assistant"]
    assert pair[0]["synthetic"] and pair[1]["content"] == compaction["summary"]
    assert session["metadata"]["agent_log"]["counts"]["compactions"] == 1
    assert COUNTERS["pi"](path)["compactions"] == 1


def test_the_same_task_in_codex_and_gemini_agrees_on_prompt_and_files(
    store: SessionStore,
) -> None:
    codex = replay.import_agent_log(store, FIXTURES / "codex" / "codex-pomodor-timer.jsonl")
    gemini = replay.import_agent_log(
        store, FIXTURES / "gemini-cli" / "gemini-cli-pomodoro-timer.json"
    )
    a = replay.agent_log_summary(store, codex.session_ids[0])
    b = replay.agent_log_summary(store, gemini.session_ids[0])
    assert a is not None and b is not None
    assert re.sub(r"\s", "", a["first_prompt"]) == re.sub(r"\s", "", b["first_prompt"])
    # Both wrote the page, its script and its style sheet; the agents named the style sheet
    # differently (styles.css, style.css), and the summaries say so.
    assert {Path(p).name for p in a["files_written"]} == {"index.html", "script.js", "styles.css"}
    assert {Path(p).name for p in b["files_written"]} == {"index.html", "script.js", "style.css"}
    assert replay.agent_log_summary(store, "no-such-session") is None


def test_imported_sessions_verify_fork_redact_and_round_trip(store: SessionStore) -> None:
    path = (
        FIXTURES
        / "claude-code"
        / "-Users-chip-dev-ai-music"
        / ("fed8ce56-bc79-401f-a83e-af084253362f.jsonl")
    )
    (session,) = imported(store, path)
    sid = session["session_id"]
    assert store.verify(projections=True).ok
    child = store.fork_at(sid, keep_first=3)
    assert store.snapshot(child)["transcript"] == session["transcript"][:3]  # type: ignore[index]
    sanitized = replay.export_bundle(store, sid, mode="sanitized")
    assert replay.validate_bundle(sanitized) == []
    assert "/Users/chip" not in json.dumps(sanitized)
    withheld = replay.export_bundle(store, sid, mode="replay_only")
    assert replay.validate_bundle(withheld) == []
    assert "Bash" in json.dumps(withheld)  # the tool calls replay needs are still there
    local = replay.export_bundle(store, sid, mode="local")
    with SessionStore.memory() as other:
        again = replay.import_bundle(other, local)
        assert other.snapshot(again)["transcript"] == session["transcript"]  # type: ignore[index]


def test_a_damaged_line_stops_the_import_at_file_line_with_nothing_written(
    store: SessionStore, tmp_path: Path
) -> None:
    lines = (FIXTURES / "codex" / "codex-pomodor-timer.jsonl").read_bytes().split(b"\n")
    lines[9] = lines[9][: len(lines[9]) // 2]  # line 10 cut in the middle
    path = tmp_path / "cut.jsonl"
    path.write_bytes(b"\n".join(lines))
    head = store.log.head
    with pytest.raises(AgentLogError) as caught:
        replay.import_agent_log(store, path)
    assert caught.value.line == 10 and f"{path}:10:" in str(caught.value)
    assert store.log.head == head
    result = replay.import_agent_log(store, path, skip_bad_lines=True)
    assert [line for line, _ in result.files[0].skipped_lines] == [10]
    snapshot = store.snapshot(result.session_ids[0])
    assert snapshot is not None
    assert snapshot["metadata"]["agent_log"]["skipped_lines"][0][0] == 10


def test_a_huge_line_is_refused_before_it_is_decoded(
    store: SessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = FIXTURES / "pi" / "large-session.jsonl"
    longest = max(enumerate(path.read_bytes().split(b"\n"), 1), key=lambda x: len(x[1]))
    monkeypatch.setattr(_limits, "agent_log_line_bytes_max", len(longest[1]) - 1)
    with pytest.raises(AgentLogError, match="agent_log_line_bytes_max") as caught:
        replay.import_agent_log(store, path)
    assert caught.value.line == longest[0]
    assert store.log.head == 0


def test_a_damaged_document_is_reported_at_its_line(store: SessionStore, tmp_path: Path) -> None:
    text = (FIXTURES / "gemini-cli" / "gemini-cli-pomodoro-timer.json").read_text()
    path = tmp_path / "g.json"
    path.write_text(json.dumps(json.loads(text), indent=1)[:5000])
    with pytest.raises(AgentLogError, match="truncated") as caught:
        replay.import_agent_log(store, path, format="gemini-cli")
    assert caught.value.line == path.read_text().count("\n") + 1
    assert store.log.head == 0


def test_bad_options_are_refused(store: SessionStore) -> None:
    path = FIXTURES / "codex" / "codex-pomodor-timer.jsonl"
    with pytest.raises(InvalidArgumentError, match="unknown option"):
        replay.import_agent_log(store, path, colour=True)
    with pytest.raises(InvalidArgumentError, match="unknown format"):
        replay.import_agent_log(store, path, format="cursor")
    with pytest.raises(AgentLogError, match=r"not a log of format gemini-cli|JSON"):
        replay.import_agent_log(store, path, format="gemini-cli")


def test_an_id_taken_by_another_source_is_a_conflict(store: SessionStore) -> None:
    store.open_session("mine")
    with pytest.raises(replay.AgentLogConflictError, match="mine"):
        replay.import_agent_log(
            store, FIXTURES / "codex" / "codex-pomodor-timer.jsonl", session_id="mine"
        )


def test_cli_imports_a_folder_and_prints_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "s")
    code = main(["--store", store, "import-agent-log", str(FIXTURES), "--recursive"])
    out = capsys.readouterr().out
    assert code == 0
    assert "pi (detected)" in out and "gemini-cli (detected)" in out
    code = main(["--store", store, "import-agent-log", str(FIXTURES / "pi"), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["files"][0]["written"] is False
    live = tmp_path / "live.jsonl"  # its last line cut: being written, left for next time
    live.write_bytes((FIXTURES / "pi" / "large-session.jsonl").read_bytes()[:5000])
    code = main(["--store", store, "import-agent-log", str(live)])
    out = capsys.readouterr().out
    pending = 5000 - live.read_bytes().rindex(b"\n") - 1
    assert code == 0 and f"pending {live}: its last line ({pending:,} bytes)" in out
    code = main(["--store", store, "import-agent-log", str(live), "--json"])
    assert json.loads(capsys.readouterr().out)["files"][0]["pending_tail_bytes"] == pending
    broken = tmp_path / "broken.jsonl"  # a cut line followed by a line break: damage
    broken.write_bytes((FIXTURES / "pi" / "large-session.jsonl").read_bytes()[:5000] + b"\n")
    code = main(["--store", store, "import-agent-log", str(broken)])
    err = capsys.readouterr().err
    assert code == 5 and f"{broken}:" in err
    code = main(["--store", str(tmp_path / "new"), "import-agent-log", str(tmp_path / "nope")])
    assert code == 3 and "no file or folder" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_a_line_dense_in_objects_is_refused_before_it_is_decoded(
    store: SessionStore, tmp_path: Path
) -> None:
    path = (
        FIXTURES / "claude-code" / "sample-project" / "1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl"
    )
    first = path.read_text().splitlines()[0]
    dense = json.loads(first)
    dense["message"]["content"] = [{}] * 40_000  # 120 KB of text, megabytes of objects
    log = tmp_path / "dense.jsonl"
    log.write_text(first + "\n" + json.dumps(dense, separators=(",", ":")) + "\n")
    with pytest.raises(AgentLogError, match="agent_log_memory_file_ratio") as caught:
        replay.import_agent_log(store, log)
    assert caught.value.line == 2
    assert store.log.head == 0


def test_unknown_record_types_and_fields_are_counted_and_kept(
    store: SessionStore, tmp_path: Path
) -> None:
    lines = (FIXTURES / "codex" / "codex-pomodor-timer.jsonl").read_text().splitlines()
    novel = json.dumps({"type": "brand_new_kind", "payload": {"x": 1}})
    widened = json.loads(lines[2])
    widened["shiny_new_field"] = True
    path = tmp_path / "future.jsonl"
    path.write_text("\n".join([lines[0], novel, json.dumps(widened), *lines[3:]]) + "\n")
    (session,) = imported(store, path)
    about = session["metadata"]["agent_log"]
    assert about["counts"]["unknown_records"] == 1
    assert about["counts"]["unknown_fields"] == 1
    assert about["unknown_field_names"] == ["shiny_new_field"]
    kept = replay.agent_log_records(store, session["session_id"])
    assert kept[2] == novel and json.loads(kept[3]) == widened


def test_the_records_kept_are_read_past_messages_added_after_the_import(
    store: SessionStore, tmp_path: Path
) -> None:
    path = FIXTURES / "codex" / "codex-pomodor-timer.jsonl"
    (session,) = imported(store, path)
    sid = session["session_id"]
    before = replay.agent_log_records(store, sid)
    store.inject(sid, {"role": "user", "content": "a message of the session's own"})
    assert replay.agent_log_records(store, sid) == before
    assert before == dict(enumerate(path.read_text().splitlines(), 1))


def test_a_subagent_file_of_its_own_is_one_session_naming_its_parent(
    store: SessionStore, tmp_path: Path
) -> None:
    lines = (
        (FIXTURES / "claude-code" / "sample-project" / "5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl")
        .read_text()
        .splitlines()
    )
    records = [json.loads(line) for line in lines[15:22]]  # the first sidechain, lines 16-22
    assert all(r["isSidechain"] for r in records)
    for record in records:
        record["agentId"] = "a1b2c3"
    path = tmp_path / "agent-a1b2c3.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    (session,) = imported(store, path)
    assert session["length"] == 6 and session["parent_spawn_ref"] is None
    about = session["metadata"]["agent_log"]
    assert about["subagent_of"] == {
        "source_session_id": "5c0375b4-57a5-4f26-b12d-d022ee4e51b7",
        "agent_id": "a1b2c3",
    }
    assert session["transcript"][0]["content"] == records[0]["message"]["content"]


@pytest.mark.parametrize("forced", ["codex", "pi"])
def test_a_forced_line_format_the_file_is_not_is_refused(
    store: SessionStore, tmp_path: Path, forced: str
) -> None:
    """`format` naming another line format than the file's is checked as a document's is: the
    file is not a log of that format, and nothing is written (not an empty session)."""
    path = FIXTURES / "claude-code/sample-project/1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl"
    with pytest.raises(AgentLogError, match=f"not a log of format {forced}") as caught:
        replay.import_agent_log(store, path, format=forced)
    assert (caught.value.path, caught.value.line) == (str(path), None)
    assert store.log.head == 0
    folder = tmp_path / "logs"
    folder.mkdir()
    shutil.copy(path, folder)
    with pytest.raises(AgentLogError, match=f"not a log of format {forced}"):
        replay.import_agent_log(store, folder, format=forced)
    assert store.log.head == 0
    (found,) = replay.import_agent_log(store, path, format="claude-code").files
    assert (found.format, found.detected) == ("claude-code", False) and found.sessions[0].messages


def test_a_folder_leaves_alone_entries_that_are_not_readable_files(
    store: SessionStore, tmp_path: Path
) -> None:
    """A dangling link, or a pipe, named like a log is not a log: listed with the files that
    are not agent logs, while the folder's logs are imported."""
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "a-dangling.jsonl").symlink_to(tmp_path / "gone.jsonl")
    os.mkfifo(folder / "b-pipe.jsonl")  # opening it would wait for a writer
    (folder / "c-link.jsonl").symlink_to(FIXTURES / "codex" / "codex-pomodor-timer.jsonl")
    result = replay.import_agent_log(store, folder)
    assert [f.path for f in result.files] == [str(folder / "c-link.jsonl")]
    assert result.files[0].format == "codex" and result.files[0].written
    assert result.not_agent_logs == (str(folder / "a-dangling.jsonl"), str(folder / "b-pipe.jsonl"))


PNG = "iVBORw0KGgo="
CLAUDE_SAMPLE = (
    FIXTURES / "claude-code" / "sample-project" / "1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl"
)


def test_an_image_beside_text_is_kept_in_the_message_and_its_exports(
    store: SessionStore, tmp_path: Path
) -> None:
    document = json.loads(
        (FIXTURES / "openai-chat" / "marshmallow-code__marshmallow-1867.traj").read_bytes()
    )
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    asked = [{"type": "text", "text": "what is in this screenshot?"}, image]
    document["history"].insert(2, {"role": "user", "content": asked})
    path = tmp_path / "image.traj"
    path.write_text(json.dumps(document))
    (session,) = imported(store, path)
    sid = session["session_id"]
    assert session["transcript"][1]["content"] == asked
    assert session["metadata"]["agent_log"]["counts"]["non_text_blocks"] == 1
    assert store.context(sid)[1]["content"] == asked
    chat = replay.export_messages(store, sid, "openai-chat")
    assert chat["messages"][2]["content"] == [{"type": "text", "text": asked[0]["text"]}, image]
    anthropic = replay.export_messages(store, sid, "anthropic-messages")
    source = {"type": "base64", "media_type": "image/png", "data": PNG}
    assert {"type": "image", "source": source} in anthropic["messages"][0]["content"]
    responses = replay.export_messages(store, sid, "responses")
    picture = {"type": "input_image", "image_url": image["image_url"]["url"], "detail": "auto"}
    assert picture in responses["input"][1]["content"]


def test_an_image_in_a_claude_tool_result_is_kept_and_exported(
    store: SessionStore, tmp_path: Path
) -> None:
    records = [json.loads(line) for line in CLAUDE_SAMPLE.read_text().splitlines() if line]
    user = next(
        r
        for r in records
        if r.get("type") == "user"
        and isinstance(r["message"]["content"], list)
        and r["message"]["content"][0].get("type") == "tool_result"
    )
    block = user["message"]["content"][0]
    picture = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
    }
    block["content"] = [{"type": "text", "text": "screenshot:"}, picture]
    path = tmp_path / "image.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    session, *_ = imported(store, path)
    (tool,) = [m for m in session["transcript"] if m.get("tool_call_id") == block["tool_use_id"]]
    assert tool["content"] == block["content"]
    assert session["metadata"]["agent_log"]["counts"]["non_text_blocks"] == 1
    body = replay.export_messages(store, session["session_id"], "anthropic-messages")
    (result,) = [
        b
        for turn in body["messages"]
        for b in turn["content"]
        if b["type"] == "tool_result" and b["tool_use_id"] == block["tool_use_id"]
    ]
    assert result["content"] == block["content"]
    items = replay.export_messages(store, session["session_id"], "responses")["input"]
    (output,) = [i for i in items if i.get("call_id") == block["tool_use_id"] and "output" in i]
    assert output["output"][1] == {
        "type": "input_image",
        "image_url": f"data:image/png;base64,{PNG}",
        "detail": "auto",
    }


def test_a_pi_assistant_string_content_is_its_text(store: SessionStore, tmp_path: Path) -> None:
    lines = (FIXTURES / "pi" / "large-session.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line]
    said = next(
        r for r in records if r.get("type") == "message" and r["message"].get("role") == "assistant"
    )
    said["message"]["content"] = "hello world"
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (session,) = imported(store, path)
    (message,) = [m for m in session["transcript"] if m.get("content") == "hello world"]
    assert "other_blocks" not in message["metadata"]


AI_MUSIC = FIXTURES / "claude-code" / "-Users-chip-dev-ai-music"
PUSH_SESSION = AI_MUSIC / "fed8ce56-bc79-401f-a83e-af084253362f.jsonl"


@pytest.mark.parametrize("same_uuid", [True, False])
def test_a_claude_record_written_twice_is_read_once(
    store: SessionStore, tmp_path: Path, same_uuid: bool
) -> None:
    lines = PUSH_SESSION.read_text().split("\n")
    at = next(n for n, line in enumerate(lines) if '"tool_use"' in line and '"assistant"' in line)
    again = json.loads(lines[at])
    if not same_uuid:  # another record of the same message repeating a block it already sent
        again["uuid"] = "0000aaaa-repeated-block"
    path = tmp_path / "resumed.jsonl"
    path.write_text("\n".join([*lines[: at + 1], json.dumps(again), *lines[at + 1 :]]))
    (original,) = imported(store, PUSH_SESSION)
    (session,) = imported(store, path)
    ids = [c["id"] for m in session["transcript"] for c in m.get("tool_calls") or []]
    assert ids == [c["id"] for m in original["transcript"] for c in m.get("tool_calls") or []]
    counts = session["metadata"]["agent_log"]["counts"]
    assert counts["tool_calls"] == original["metadata"]["agent_log"]["counts"]["tool_calls"]
    assert counts["duplicate_records" if same_uuid else "duplicate_tool_calls"] == 1
    body = replay.export_messages(store, session["session_id"], "anthropic-messages")
    uses = [b["id"] for t in body["messages"] for b in t["content"] if b["type"] == "tool_use"]
    assert uses == ids
    kept = replay.agent_log_records(store, session["session_id"])
    assert kept[at + 2] == json.dumps(again)  # the repeated line is kept all the same


def test_an_edited_claude_prompt_makes_the_abandoned_branch_a_fork(
    store: SessionStore, tmp_path: Path
) -> None:
    lines = PUSH_SESSION.read_text().split("\n")
    records = [json.loads(line) for line in lines if line]
    sent = next(
        r for r in records if r.get("type") == "user" and r["message"]["content"] == "continue"
    )
    edited = "actually, do not push; only show git status"
    edit = {**sent, "uuid": "e0000000-edit", "message": {"role": "user", "content": edited}}
    last = records[-1]
    reply = {
        **last,
        "uuid": "e0000001-reply",
        "parentUuid": edit["uuid"],
        "message": {
            **last["message"],
            "id": "msg_branch",
            "content": [{"type": "text", "text": "OK."}],
        },
    }
    path = tmp_path / "edited.jsonl"
    path.write_text("\n".join([*lines, json.dumps(edit), json.dumps(reply)]) + "\n")
    (original,) = imported(store, PUSH_SESSION)
    main, fork = imported(store, path)
    said = [m.get("content") for m in original["transcript"]]
    kept = said.index("continue")
    assert [m.get("content") for m in main["transcript"]] == [*said[:kept], edited, "OK."]
    assert [m.get("content") for m in fork["transcript"]] == said
    assert "continue" not in [m.get("content") for m in store.context(main["session_id"])]
    assert fork["parent_id"] == main["session_id"]
    parent_line = next(n for n, r in enumerate(records, 1) if r.get("uuid") == sent["parentUuid"])
    assert fork["metadata"]["agent_log"]["branch"]["from_line"] == parent_line
    assert main["metadata"]["agent_log"]["counts"]["branches"] == 1
