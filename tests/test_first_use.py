"""What a newcomer meets first: the package's name, commands that only read, closed sessions,
and messages that point the way. Each through the console script (a real subprocess) or the
public API, on real LMDB stores in temporary directories.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shlex
import shutil
import signal
import subprocess
import time
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from eventlog import StorageError
from sessions import SessionExistsError, SessionStore, UnknownSessionError
from tests._raw_lmdb import raw_log
from tests.test_cli import SAMPLE, SCRIPT, on_terminal, run, seed

ROOT = Path(__file__).resolve().parent.parent
READING = (
    ("ls",),
    ("show", "s"),
    ("tree", "s"),
    ("as-of", "1", "s"),
    ("stats",),
    ("tail",),
    ("verify",),
    ("export", "s"),
    ("export-log",),
)


def files_of(folder: Path) -> dict[str, str]:
    """Every file under `folder` with the blake2 of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.blake2b(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def closed_family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`p` (closed) with an active fork `kid` and a grandchild; `gone` deleted."""
    store = tmp_path_factory.mktemp("closed") / "store"
    seed(store, "p")
    with SessionStore.open(store) as sessions:
        sessions.fork_at("p", 3, "kid")
        sessions.fork("kid", "grandkid")
        sessions.close_session("p", "done")
        sessions.open_session("gone")
        sessions.inject("gone", {"role": "user", "content": "soon deleted"})
        sessions.delete("gone")
    return store


# Names and packaging


def test_the_distribution_is_sessionlog_engine_with_the_sessionlog_command() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "sessionlog-engine"
    assert project["scripts"] == {"sessionlog": "sessionlog.cli:main"}
    assert project["license"] == "MIT"  # the SPDX string form, not the deprecated table
    assert "rich" in " ".join(project["dependencies"])
    done = run("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"sessionlog {metadata.version('sessionlog-engine')}"
    readme = (ROOT / "README.md").read_text()
    assert "pip install 'sessionlog-engine[postgres]'" in readme
    assert "'sessionlog[postgres]'" not in readme
    caveats = readme.split("## Caveats", 1)[1].split("\n## ", 1)[0]
    for name in ("eventlog", "projections", "sessions", "replay"):
        assert f"`{name}`" in caveats, name


def test_make_demo_installs_only_what_the_demo_needs(tmp_path: Path) -> None:
    venv = tmp_path / "venv"  # no virtualenv yet: make says what it would install
    demo = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "demo", f"VENV={venv}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installs = [line for line in demo.splitlines() if "pip install" in line and "-e" in line]
    assert installs and all("[test]" not in line for line in installs), demo
    test = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "pytest", f"VENV={venv}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "-e '.[test]'" in test


# Commands that only read never write


def test_reading_commands_refuse_a_folder_without_a_store(family_of_one: Path) -> None:
    # `var/demo` for `var/demo/sessions`: a folder that exists and holds a store below it.
    folder = family_of_one.parent
    before = files_of(folder)
    for args in READING:
        done = run(*args, store=folder)
        assert done.returncode == 3, (args, done.stderr)
        assert f"no store at {folder}" in done.stderr
    assert files_of(folder) == before  # no data.mdb, no lock.mdb, nothing else
    assert not (folder / "data.mdb").exists() and not (folder / "lock.mdb").exists()


def test_reading_commands_change_no_byte_of_a_store(family_of_one: Path, tmp_path: Path) -> None:
    before = files_of(family_of_one)
    for args in READING:
        done = run(*args, store=family_of_one)
        assert done.returncode == 0, (args, done.stderr)
    # lock.mdb is LMDB's table of live readers, which every reader signs in and out of.
    assert files_of(family_of_one)["data.mdb"] == before["data.mdb"]
    assert sorted(files_of(family_of_one)) == ["data.mdb", "lock.mdb"]


@pytest.fixture
def family_of_one(tmp_path: Path) -> Path:
    store = tmp_path / "var" / "sessions"
    seed(store, "s")
    return store


def test_commands_that_create_check_their_input_first(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1]\n")
    store = tmp_path / "new" / "deeper" / "store"
    for args in (("seed", bad), ("import", bad), ("import-log", bad)):
        done = run(*args, store=store)
        assert done.returncode == 5, (args, done.stderr)
        assert not (tmp_path / "new").exists(), args  # not the store, nor its folders
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
    ok = run("seed", SAMPLE, "--id", "s", store=store)
    assert ok.returncode == 0 and (store / "data.mdb").is_file()
    assert [p.name for p in store.parent.iterdir()] == ["store"]  # nothing left aside
    folder = tmp_path / "empty"  # an existing folder without a store: the store goes into it
    folder.mkdir()
    assert run("seed", SAMPLE, store=folder).returncode == 0
    assert sorted(p.name for p in folder.iterdir()) == ["data.mdb", "lock.mdb"]


def test_outputs_appear_whole_or_not_at_all(family_of_one: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.json").write_text("before")
    refused = run("export", "nope", "-o", out / "kept.json", store=family_of_one)
    assert refused.returncode == 3
    assert (out / "kept.json").read_text() == "before"
    for args, name in ((("export", "s"), "bundle.json"), (("export-log",), "log.jsonl")):
        done = run(*args, "-o", out / name, store=family_of_one)
        assert done.returncode == 0, done.stderr
        assert (out / name).read_text().endswith("\n")
        assert oct((out / name).stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert sorted(p.name for p in out.iterdir()) == ["bundle.json", "kept.json", "log.jsonl"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_export_killed_midway_leaves_no_file_under_its_name(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with SessionStore.open(store, sync=False) as sessions, sessions.transaction():
        sessions.open_session("big")
        for i in range(20_000):
            sessions.inject("big", {"role": "user", "content": f"message {i} " + "x" * 200})
    out = tmp_path / "out"
    out.mkdir()
    target = out / "log.jsonl"
    argv = [str(SCRIPT), "--store", str(store), "export-log", "-o", str(target)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as exporter:
        deadline = time.monotonic() + 30
        partial: list[Path] = []
        while not partial and time.monotonic() < deadline and exporter.poll() is None:
            partial = [p for p in out.iterdir() if p.stat().st_size > 0]
        exporter.send_signal(signal.SIGKILL)
        exporter.wait()
    assert partial, "the export finished before it could be killed"
    assert not target.exists()  # only the temporary file, under another name
    assert all(p.name.startswith(".log.jsonl.") for p in out.iterdir())


# Closed sessions stay readable


def test_a_closed_session_is_read_marked_closed(closed_family: Path) -> None:
    shown = run("show", "p", store=closed_family)
    assert shown.returncode == 0, shown.stderr
    assert "closed" in shown.stdout.split("[1]")[0]
    snapshot = json.loads(run("show", "p", "--json", store=closed_family).stdout)
    assert snapshot["status"] == "closed" and snapshot["length"] == 8
    bundle = json.loads(run("export", "p", store=closed_family).stdout)
    assert bundle["source"]["status"] == "closed"
    for of in ("kid", "grandkid", "p"):  # an active fork of a closed parent draws its family
        tree = run("tree", of, store=closed_family)
        assert tree.returncode == 0, tree.stderr
        lines = tree.stdout.splitlines()
        assert lines[0].startswith("p  8 messages  closed")
        assert any("grandkid" in line for line in lines)
    listed = json.loads(run("ls", "--json", store=closed_family).stdout)["sessions"]
    assert {s["session_id"]: s["status"] for s in listed}["p"] == "closed"


def test_a_closed_session_is_read_by_the_library_and_refuses_writes(closed_family: Path) -> None:
    from replay import export_bundle
    from sessions import UnknownSessionError

    with SessionStore.open(closed_family, readonly=True) as store:
        assert store.snapshot("p")["status"] == "closed"  # type: ignore[index]
        assert store.ancestry("grandkid")["root_id"] == "p"  # type: ignore[index]
        assert store.ancestry("p")["child_ids"] == ["kid"]  # type: ignore[index]
        assert export_bundle(store, "p", mode="local")["source"]["session_id"] == "p"
    scratch = closed_family.parent / "scratch"
    shutil.copytree(closed_family, scratch)
    with SessionStore.open(scratch) as store:
        head = store.log.head
        with pytest.raises(UnknownSessionError, match="inject: session `p` is closed"):
            store.inject("p", {"role": "user", "content": "late"})
        assert store.log.head == head


def test_only_delete_makes_a_session_unreadable_and_as_of_shows_its_past(
    closed_family: Path,
) -> None:
    for args in (("show", "gone"), ("export", "gone"), ("tree", "gone")):
        assert run(*args, store=closed_family).returncode == 3, args
    with SessionStore.open(closed_family, readonly=True) as store:
        assert store.snapshot("gone") is None
        opened = store.log.read_stream("gone")[1].position  # its message
    past = json.loads(run("as-of", str(opened), "gone", "--json", store=closed_family).stdout)
    assert [m["content"] for m in past["transcript"]] == ["soon deleted"]


# Messages that point the way


def _use_after_fork(path: str, reopen: bool, answers: multiprocessing.Queue[str]) -> None:
    try:
        if reopen:
            with SessionStore.open(path) as again:
                answers.put(f"reopened {again.length('a')}")
        else:
            answers.put(f"length {_inherited.length('a')}")  # type: ignore[name-defined]
    except StorageError as exc:
        answers.put(f"refused: {exc}")


def _open_in_child(path: str, answers: multiprocessing.Queue[str]) -> None:
    with SessionStore.open(path) as store:
        store.inject("a", {"role": "user", "content": "from the child"})
        answers.put(f"wrote {store.length('a')}")


def test_after_fork_the_message_says_what_works_and_that_works(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    global _inherited
    _inherited = SessionStore.open(path)
    context = multiprocessing.get_context()  # the default start method
    answers: multiprocessing.Queue[str] = context.Queue()
    try:
        _inherited.open_session("a")
        if context.get_start_method() == "fork":
            for reopen in (False, True):  # using the inherited store, then opening it again
                child = context.Process(target=_use_after_fork, args=(path, reopen, answers))
                child.start()
                child.join(30)
                said = answers.get(timeout=10)
                assert said.startswith("refused: ") and "fork" in said, said
                assert "open the store in the child only if the parent did not have it" in said
                assert "'spawn'" in said
        spawn = multiprocessing.get_context("spawn")
        spawned_answers: multiprocessing.Queue[str] = spawn.Queue()
        spawned = spawn.Process(target=_open_in_child, args=(path, spawned_answers))
        spawned.start()  # the advice, followed: spawn while the parent holds the store open
        spawned.join(60)
        assert spawned_answers.get(timeout=10) == "wrote 1"
    finally:
        _inherited.close()
    child = context.Process(target=_open_in_child, args=(path, answers))
    child.start()  # and the other advice: the parent closed it before starting the child
    child.join(60)
    assert answers.get(timeout=10) == "wrote 2"


def test_os_fork_then_open_again_gets_the_advice(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "store")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only os calls after the attempt, and a hard exit
        try:
            SessionStore.open(tmp_path / "store")
            said = "opened"
        except StorageError as exc:
            said = str(exc)
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    said = os.read(read, 4096).decode()
    os.close(read)
    store.close()
    assert status == 0
    assert "was open when this process forked" in said and "'forkserver'" in said


def test_a_postgresql_store_without_the_driver_names_the_extra(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "psycopg"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'psycopg'\", name='psycopg')\n"
    )
    done = run(
        "ls",
        store="postgresql://127.0.0.1/nothing",
        env={"PYTHONPATH": str(shadow.parent)},
    )
    assert done.returncode == 2, done.stderr
    assert "internal error" not in done.stderr
    assert "pip install 'sessionlog-engine[postgres]'" in done.stderr


def test_messages_use_the_command_line_words(family_of_one: Path, tmp_path: Path) -> None:
    responses = tmp_path / "responses.jsonl"
    responses.write_text(
        json.dumps({"type": "provider_call_response", "provider": "p", "text": "one"}) + "\n"
    )
    partial = run("seed", responses, store=family_of_one)
    assert partial.returncode == 5
    assert "--no-validate" in partial.stderr and "validate=False" not in partial.stderr
    taken = run("seed", SAMPLE, "--id", "s", store=family_of_one)
    assert taken.returncode == 6
    assert "already exists" in taken.stderr and "rename_session" not in taken.stderr
    assert "--id" in taken.stderr
    limit = run("ls", "--limit", "0", store=family_of_one)
    assert limit.returncode == 2 and limit.stderr.startswith("sessionlog: ls: --limit")
    for words in ("list_sessions", "as_of", "export_bundle", "rename_session", "validate="):
        for done in (partial, taken, limit):
            assert words not in done.stderr


def test_tail_of_an_unknown_session_is_an_error(family_of_one: Path) -> None:
    done = run("tail", "--session", "nope", store=family_of_one)
    assert done.returncode == 3
    assert "no session `nope`" in done.stderr
    assert run("tail", "--session", "s", store=family_of_one).stdout.count("\n") == 2


def test_tail_follow_ends_with_130_on_ctrl_c(family_of_one: Path) -> None:
    argv = [str(SCRIPT), "--store", str(family_of_one), "tail", "--follow"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as follower:
        assert follower.stdout is not None
        follower.stdout.readline()  # it is running and has printed the first event
        follower.send_signal(signal.SIGINT)
        _, errors = follower.communicate(timeout=10)
    assert follower.returncode == 130, errors
    assert b"Traceback" not in errors


def test_tail_follow_is_told_when_its_store_is_replaced(tmp_path: Path) -> None:
    store = tmp_path / "store"
    seed(store, "first")
    argv = [str(SCRIPT), "--store", str(store), "tail", "--follow", "--json"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as tail:
        try:
            assert tail.stdout is not None
            assert json.loads(tail.stdout.readline())["stream"] == "first"
            shutil.rmtree(store)  # what the demo does at its next run
            seed(store, "second")
            _, errors = tail.communicate(timeout=20)
        finally:
            if tail.poll() is None:
                tail.kill()
    assert tail.returncode == 1
    assert f"the store at {store} was replaced" in errors
    assert "tail --follow" in errors.split("replaced", 1)[1]


def test_seed_dash_reads_standard_input(tmp_path: Path) -> None:
    store = tmp_path / "store"
    argv = [str(SCRIPT), "--store", str(store), "seed", "-", "--id", "piped", "--json"]
    done = subprocess.run(
        argv, input=SAMPLE.read_bytes(), capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["session_id"] == "piped" and result["messages_loaded"] == 8
    bad = subprocess.run(argv[:-3], input=b"[1]\n", capture_output=True, timeout=60, check=False)
    assert bad.returncode == 5 and b"<stdin>:1" in bad.stderr


def test_the_ls_more_line_can_be_copied(tmp_path: Path) -> None:
    store = tmp_path / "my store"  # a space: the line must quote it
    with SessionStore.open(store) as sessions:
        for name in ("a", "b", "c"):
            sessions.open_session(name)
    first = run("ls", "--limit", "2", "--status", "active", store=store)
    more = first.stdout.splitlines()[-1]
    assert more.startswith("(more: sessionlog --store ") and more.endswith(")")
    command = shlex.split(more[len("(more: ") : -1])
    assert command[:3] == ["sessionlog", "--store", str(store)]
    assert "--limit" in command and "--status" in command
    second = subprocess.run(
        [str(SCRIPT), *command[1:]], capture_output=True, text=True, check=True
    ).stdout
    rows = [line.split()[0] for line in second.splitlines()[2:]]
    assert rows == ["c"]


# show pages, tree reads the projection


def test_show_pages_with_after_and_limit(tmp_path: Path) -> None:
    store = tmp_path / "store"
    count = 2_500  # more than one page of `show_page_messages_default`
    with SessionStore.open(store, sync=False) as sessions:
        sessions.open_session("long")
        sessions.inject_many("long", [{"role": "user", "content": f"m{i}"} for i in range(count)])
        assert [m["content"] for m in sessions.messages("long", after=1_998, limit=4)] == [
            "m1998",
            "m1999",
            "m2000",
            "m2001",
        ]
    whole = run("show", "long", store=store).stdout
    assert whole.count("\n[") == count and f"[{count}] user\n    m{count - 1}" in whole
    page = run("show", "long", "--after", "3", "--limit", "2", store=store).stdout
    numbered = [line for line in page.splitlines() if line.startswith("[")]
    assert numbered == ["[4] user", "[5] user"]
    assert "    m3\n" in page and "    m4\n" in page and "    m5" not in page
    assert page.rstrip().endswith("show long --after 5 --limit 2)")
    assert f"--store {store}" in page.splitlines()[-1]
    as_json = json.loads(run("show", "long", "--after", "2499", "--json", store=store).stdout)
    assert as_json["length"] == count and as_json["transcript"] == [
        {"role": "user", "content": "m2499"}
    ]


def test_tree_draws_each_node_from_the_projection(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with SessionStore.open(store, sync=False) as sessions:
        sessions.open_session("root")
        sessions.inject_many("root", [{"role": "user", "content": "x"}] * 50)
        kid = sessions.fork_at("root", 10, "kid")
        summary = sessions.summary(kid)
        snapshot = sessions.snapshot(kid)
    assert summary is not None and snapshot is not None
    assert "transcript" not in summary
    assert summary == {k: v for k, v in snapshot.items() if k != "transcript"}
    text = run("tree", "kid", store=store).stdout.splitlines()
    assert text[0] == "root  50 messages"
    assert text[1] == "└── kid  10 messages  forked at message 10  <-"


def test_open_session_with_other_options_is_a_conflict_through_the_api(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "store") as store:
        store.open_session("a", system_prompt="You are terse.")
        assert store.open_session("a", system_prompt="You are terse.") == "a"
        with pytest.raises(
            SessionExistsError, match=r"already open with another system_prompt"
        ) as e:
            store.open_session("a", system_prompt="Be verbose.")
        assert "terse" not in str(e.value)  # what it holds is named, never quoted


def test_a_write_to_a_closed_session_says_it_is_closed(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "store") as store:
        store.open_session("a")
        store.close_session("a")
        with pytest.raises(UnknownSessionError, match=r"inject: session `a` is closed") as e:
            store.inject("a", {"role": "user", "content": "late"})
        assert e.value.closed and store.length("a") == 0
        with pytest.raises(UnknownSessionError, match=r"inject: no session `b`") as never:
            store.inject("b", {"role": "user", "content": "x"})
        assert not never.value.closed


# docs/seeds.md


def test_seeds_md_maps_every_verb_it_names_and_states_each_difference() -> None:
    import re

    import replay
    from sessions.runtime import Runtime

    text = (ROOT / "docs" / "seeds.md").read_text()
    named = set(re.findall(r"`(?:Runtime\.)?([a-z_]+)\(", text))
    named = {n for n in named if not n.startswith(("agent_", "sessions_", "tasks_"))}  # theirs
    assert len(named) >= 20
    missing = [
        name
        for name in sorted(named)
        if not any(hasattr(owner, name) for owner in (SessionStore, Runtime, replay))
    ]
    assert missing == [], missing
    differences = text.count("Where we differ, and why:")
    assert differences == 4
    for claim in (
        "never evicted",
        "`delegate` persists by default",
        "reason `idle`",
        "default to persistent",
        "snake_case and times are RFC 3339",
        "closed session stays readable",
        "different options is refused",
    ):
        assert claim in text, claim
    assert "docs/seeds.md" in (ROOT / "README.md").read_text()


# rich draws the terminal; pipes get plain text


def _on_terminal(args: list[str], columns: int) -> str:
    """What `sessionlog ARGS` draws on a terminal `columns` wide, without its escape codes."""
    import re

    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm"}
    done, drawn = on_terminal(args, drawn_on="stdout", env=env)
    assert done.returncode == 0, done.stderr
    return re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", drawn.decode()).replace("\r\n", "\n")


def test_tables_fit_the_terminal_and_pipes_get_plain_text(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with SessionStore.open(store) as sessions:
        for i in range(3):
            sessions.open_session(f"session-with-a-rather-long-id-{i}", title="t" * 80)
        sessions.fork("session-with-a-rather-long-id-0", "child")
    narrow = _on_terminal(["--store", str(store), "ls"], columns=60)
    lines = narrow.rstrip("\n").split("\n")
    assert len(lines) == 2 + 4 and max(len(line) for line in lines) <= 60, narrow
    assert "…" in narrow and "ID" in lines[0]
    tree = _on_terminal(["--store", str(store), "tree", "child"], columns=60)
    assert "└── child" in tree
    piped = run("ls", store=store).stdout
    assert "\x1b" not in piped
    assert max(len(line) for line in piped.splitlines()) > 60  # a pipe has no width to fit
    assert piped.splitlines()[1].startswith("-")


def test_show_prints_each_page_as_it_is_read(tmp_path: Path) -> None:
    """The header and the first page are out before a later page is even read: damage in the
    second page's record stops `show` there (exit 4), after the first page was printed."""

    from eventlog._codec import BODY_START

    store = tmp_path / "store"
    with SessionStore.open(store) as sessions:
        sessions.open_session("long")  # position 1
        first = [{"role": "user", "content": f"m{i}"} for i in range(1_000)]
        sessions.inject_many("long", first)  # position 2: the first page
        sessions.inject_many("long", [{"role": "user", "content": "later"}] * 500)  # position 3
        sessions.rename("long", "a long one")  # position 4, so the open-time check passes
        assert sessions.log.read_stream("long")[2].position == 3
    with raw_log(store) as raw:
        record = bytearray(raw.record(3) or b"")
        record[BODY_START + 3] ^= 0x40
        assert raw.put_record(3, bytes(record))
    done = subprocess.run(
        [str(SCRIPT), "--store", str(store), "show", "long"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 4, done.stderr
    assert "a long one" in done.stdout.split("[1]")[0]  # the header came first
    assert "[1000] user\n    m999" in done.stdout and "[1001]" not in done.stdout
    assert "position 3" in done.stderr


def test_the_distribution_lists_every_package_in_the_tree() -> None:
    # A subpackage missing from the list installs from a checkout (editable) but not from a wheel,
    # so the mistake shows only to a user who installs the release.
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    top = {name for name in listed if "." not in name}
    in_tree = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for name in top
        for init in (ROOT / name).rglob("__init__.py")
    }
    assert in_tree - listed == set()
    assert listed - in_tree == set()
