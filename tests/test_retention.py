"""Retention on every durable backend: which closed sessions a sweep retires, what it archives,
and what `truncate_log` keeps readable, refuses, and leaves verifiable."""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import projections as pj
from eventlog import (
    GENESIS_HASH,
    ConcurrencyError,
    ForgottenError,
    InvalidArgumentError,
    TruncatedError,
    WrongKeyError,
)
from eventlog._chain import check_run
from sessions import ArchiveSink, DirectorySink, LocalKeyProvider, RetentionPolicy, SessionStore
from sessions._retention import SweepReport, archive_batch, due_sessions, record_archived
from tests.conftest import STORE_KINDS
from tests.test_cli import run

DAY = timedelta(days=1)
KEY = LocalKeyProvider(bytes(range(32)))


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def later(days: float) -> datetime:
    return datetime.now(UTC) + timedelta(days=days)


def closed_sessions(store: SessionStore, count: int, prefix: str = "old") -> list[str]:
    ids = []
    for i in range(count):
        sid = store.open_session(f"{prefix}-{i:02d}")
        store.inject(sid, {"role": "user", "content": f"message {i}"})
        store.inject(sid, {"role": "assistant", "content": f"answer {i}"})
        store.close_session(sid)
        ids.append(sid)
    return ids


def session_lines(sink: ArchiveSink, name: str, session_id: str) -> list[dict[str, Any]]:
    """The lines of one session in a sweep's archive: its events, then what a reader sees."""
    lines = [json.loads(line) for line in sink.read(name)]
    return [line for line in lines if session_id in (line.get("stream"), line.get("session_id"))]


def archive_policy(tmp_path: Path, **options: object) -> RetentionPolicy:
    return RetentionPolicy(
        max_age=DAY, action="archive", sink=DirectorySink(tmp_path / "archive"), **options
    )  # type: ignore[arg-type]


def test_the_policy_refuses_what_it_cannot_mean(tmp_path: Path) -> None:
    for bad in (
        {"max_age": 3},
        {"max_age": -DAY},
        {"max_age": DAY, "grace": -DAY},
        {"max_age": timedelta.max},  # last activity + this is past any date
        {"max_age": DAY, "grace": timedelta.max},
        {"max_age": DAY, "action": "shred"},
        {"max_age": DAY, "action": "archive"},
        {"max_age": DAY, "batch_sessions": 0},
        {"max_age": DAY, "batch_sessions": True},
    ):
        with pytest.raises(InvalidArgumentError):
            RetentionPolicy(**bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="timezone-aware"):
        SessionStore.memory().sweep(RetentionPolicy(max_age=DAY), now=datetime(2030, 1, 1))


def test_the_policy_in_days_refuses_numbers_that_are_no_age() -> None:
    """What the command line's `--max-age-days` and `--grace-days` pass (floats: `nan` and `inf`
    parse) is a typed error naming the option, not a ValueError or OverflowError of timedelta."""
    for days in (float("nan"), float("inf"), 1e12, -1.0, "3", True):
        with pytest.raises(InvalidArgumentError, match="max_age_days"):
            RetentionPolicy.in_days(days)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="grace_days"):
            RetentionPolicy.in_days(1, days)  # type: ignore[arg-type]
    assert RetentionPolicy.in_days(1.5, 0).max_age == timedelta(days=1.5)


def test_a_sweep_archives_due_sessions_once_and_reports_the_rest(
    store: SessionStore, tmp_path: Path
) -> None:
    old = closed_sessions(store, 5)
    store.open_session("open")
    store.inject("open", {"role": "user", "content": "still talking"})
    policy = archive_policy(tmp_path, grace=DAY)

    early = store.sweep(policy, now=later(0.5))
    assert (early.examined, early.archived, early.expiring) == (6, [], [])
    expiring = store.sweep(policy, now=later(1.5))
    assert expiring.expiring == old and expiring.archived == []

    report = store.sweep(policy, now=later(2.5))
    assert report.archived == old and report.expiring == [] and report.examined == 6
    assert store.sweep(policy, now=later(2.5)).archived == []  # nothing twice
    assert policy.sink is not None
    for sid in old:
        with store.log.view() as view:
            state = pj.load_state(view, sid)
        assert state is not None and state.archive is not None
        *lines, readable = session_lines(policy.sink, state.archive, sid)
        assert [m["content"] for m in readable["readable"]["transcript"]] == [
            f"message {old.index(sid)}",
            f"answer {old.index(sid)}",
        ]
        assert [line["type"] for line in lines] == [
            "session_opened",
            "message_injected",
            "message_injected",
            "agent_session_closed",
        ]
        assert lines[1]["data"]["message"]["content"] == f"message {old.index(sid)}"
        last = store.log.read_stream(sid, after=4)
        assert last[0].type == "session_archived" and last[0].data.events_count == 4
    assert store.snapshot("open")["length"] == 1


def test_a_session_with_an_open_fork_is_kept(store: SessionStore, tmp_path: Path) -> None:
    parent = store.open_session("parent")
    store.inject(parent, {"role": "user", "content": "shared"})
    child = store.fork(parent, "child")
    grandchild = store.fork(child, "grandchild")
    store.close_session(parent)
    store.close_session(child)
    policy = archive_policy(tmp_path)
    report = store.sweep(policy, now=later(2))
    assert report.kept == ["child", "parent"] and report.archived == []
    store.close_session(grandchild)
    assert store.sweep(policy, now=later(2)).archived == ["child", "grandchild", "parent"]


def test_truncate_log_keeps_open_sessions_readable_and_refuses_to_cut_them(
    store: SessionStore, tmp_path: Path
) -> None:
    closed_sessions(store, 4)
    live = store.open_session("live")
    store.inject(live, {"role": "user", "content": "keep me"})
    forked = store.fork(live, "forked")
    store.inject(forked, {"role": "user", "content": "mine"})
    sink = DirectorySink(tmp_path / "archive")
    opened_at = store.log.read_stream(live, after=0, limit=1)[0].position
    head = store.log.head
    records = store.log.read_records(after=0, limit=head)
    before = {sid: store.snapshot(sid) for sid in (live, forked)}

    with pytest.raises(InvalidArgumentError, match="`live` still reads position") as refused:
        store.truncate_log(opened_at + 1, sink=sink)
    assert refused.value.got == opened_at + 1
    assert store.log.anchor[0] == 0 and sink.names() == []

    anchor, anchor_hash = store.truncate_log(opened_at, sink=sink)
    assert anchor == opened_at - 1
    assert {sid: store.snapshot(sid) for sid in (live, forked)} == before
    report = store.log.verify()
    assert report.ok and report.anchor_position == anchor
    assert store.verify(projections=True).projection_keys_checked is None
    lines = [json.loads(line) for line in sink.read(f"log-{1:012d}-{anchor:012d}")]
    assert [line["position"] for line in lines] == list(range(1, opened_at))
    raw = [bytes(record) for _, record in records[:anchor]]
    assert check_run(GENESIS_HASH, raw, 1)[-1].hash == anchor_hash
    with pytest.raises(TruncatedError):
        store.rebuild()
    with pytest.raises(TruncatedError):
        store.log.read_stream("old-00")
    store.inject(live, {"role": "user", "content": "after the cut"})
    assert store.snapshot(live)["length"] == 2
    store.close()


def test_truncate_log_of_nothing_new_changes_nothing(store: SessionStore, tmp_path: Path) -> None:
    closed_sessions(store, 2)
    sink = DirectorySink(tmp_path / "archive")
    assert store.truncate_log(5, sink=sink)[0] == 4
    assert store.truncate_log(3, sink=sink)[0] == 4
    with pytest.raises(InvalidArgumentError):
        store.truncate_log(store.log.head + 2, sink=sink)
    assert sink.names() == [f"log-{1:012d}-{4:012d}"]
    store.close()


def test_compact_store_shrinks_the_files_after_a_truncation(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with SessionStore.open(path) as store:
        for i in range(150):
            sid = store.open_session(f"s-{i:03d}")
            text = "".join(random.Random(i).choices(string.printable, k=2000))  # packs poorly
            store.inject(sid, {"role": "user", "content": text})
            store.close_session(sid)
        live = store.open_session("live")
        store.inject(live, {"role": "user", "content": "kept"})
        cut = store.log.read_stream(live, after=0, limit=1)[0].position
        before = store.snapshot(live)
    archive = tmp_path / "archive"
    swept = run("sweep", "--max-age-days", "0", "--archive", archive, "--json", store=path)
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout)["archived"] == 150
    refused = run("truncate-log", "--before", cut + 1, "--archive", archive, store=path)
    assert refused.returncode != 0 and "`live` still reads position" in refused.stderr
    cutting = run("truncate-log", "--before", cut, "--archive", archive, "--json", store=path)
    assert cutting.returncode == 0, cutting.stderr
    assert json.loads(cutting.stdout)["anchor_position"] == cut - 1
    bad = run("sweep", "--max-age-days", "-1", store=path)
    assert bad.returncode != 0 and "max_age" in bad.stderr
    done = run("compact-store", "--json", store=path)
    assert done.returncode == 0, done.stderr
    sizes = json.loads(done.stdout)
    assert sizes["bytes_after"] * 3 < sizes["bytes_before"], sizes
    assert (path / "data.mdb").stat().st_size == sizes["bytes_after"]
    with SessionStore.open(path) as store:
        assert store.snapshot(live) == before
        assert store.log.verify().ok
    verified = run("verify", store=path)
    assert verified.returncode == 0 and f"after the anchor at {cut - 1:,}" in verified.stdout
    missing = run("compact-store", store=tmp_path / "nothing")
    assert missing.returncode == 3 and "no store" in missing.stderr


def test_a_sweep_of_an_encrypted_store_archives_the_plaintext_then_forgets(
    tmp_path: Path,
) -> None:
    policy = archive_policy(tmp_path, batch_sessions=2)
    assert policy.sink is not None
    with SessionStore.open(tmp_path / "store", keys=KEY) as store:
        old = closed_sessions(store, 3)
        report = store.sweep(policy, now=later(2))
        assert report.archived == old and report.forgotten == old and report.plain == []
        for sid in old:
            with store.log.view() as view:
                state = pj.load_state(view, sid)
            assert state is not None and state.forgotten and state.archive is not None
            *lines, readable = session_lines(policy.sink, state.archive, sid)
            message = readable["readable"]["transcript"][0]["content"]
            assert message == f"message {old.index(sid)}"
            assert message not in json.dumps(lines)  # the events hold only ciphertext
        assert store.sweep(policy, now=later(2)).forgotten == []
        assert store.verify(projections=True).ok


def test_forget_alone_shreds_encrypted_sessions_and_reports_plain_ones(tmp_path: Path) -> None:
    policy = RetentionPolicy(max_age=DAY)
    with SessionStore.open(tmp_path / "store", keys=KEY) as store:
        secret = closed_sessions(store, 2)
    with SessionStore.open(tmp_path / "plain") as plain:
        closed_sessions(plain, 1)
        report = plain.sweep(policy, now=later(2))
        assert report.plain == ["old-00"] and report.forgotten == []
    with SessionStore.open(tmp_path / "store", keys=KEY) as store:
        report = store.sweep(policy, now=later(2))
        assert report.forgotten == secret and report.archived == []


class ReopeningSink(DirectorySink):
    """A sink during whose write the session `reopen` is opened again (another writer)."""

    def __init__(self, path: Path, store: SessionStore, reopen: str) -> None:
        super().__init__(path)
        self.store, self.reopen = store, reopen

    def put(self, name: str, lines: Iterable[bytes]) -> None:
        super().put(name, lines)
        self.store.open_session(self.reopen)
        self.store.inject(self.reopen, {"role": "user", "content": "back again"})


def test_a_session_reopened_during_a_sweep_is_neither_recorded_nor_forgotten(
    tmp_path: Path,
) -> None:
    with SessionStore.open(tmp_path / "store", keys=KEY) as store:
        old = closed_sessions(store, 3)
        sink = ReopeningSink(tmp_path / "archive", store, old[1])
        policy = RetentionPolicy(max_age=DAY, action="archive", sink=sink)
        report = store.sweep(policy, now=later(2))
        assert report.archived == [old[0], old[2]] and report.forgotten == [old[0], old[2]]
        assert store.snapshot(old[1])["transcript"][-1]["content"] == "back again"
        with store.log.view() as view:
            state = pj.load_state(view, old[1])
        assert state is not None and not state.forgotten and state.archive is None


def archive_only(store: SessionStore, policy: RetentionPolicy, now: datetime) -> list[str]:
    """The first step of a sweep alone, through the sweep's own functions: the due sessions
    archived and the archive recorded, then nothing (a sweep killed before it forgets)."""
    assert policy.sink is not None
    due = due_sessions(store, policy, now, SweepReport(now=now))
    prepared = archive_batch(store, due, policy.sink)
    with store.log.transaction() as tx:
        return [
            d.session_id
            for d, event in prepared
            if record_archived(tx, d.session_id, d.version, event)
        ]


def test_the_next_sweep_forgets_what_a_killed_one_only_archived(tmp_path: Path) -> None:
    policy = archive_policy(tmp_path)
    with SessionStore.open(tmp_path / "store", keys=KEY) as store:
        old = closed_sessions(store, 2)
        assert archive_only(store, policy, later(2)) == old
        with store.log.view() as view:
            names = [pj.load_state(view, sid).archive for sid in old]  # type: ignore[union-attr]
        assert store.snapshot(old[0])["transcript"][0]["content"] == "message 0"  # not yet
        report = store.sweep(policy, now=later(2))
        assert report.archived == [] and report.forgotten == old
        with store.log.view() as view:
            states = [pj.load_state(view, sid) for sid in old]
        assert [s.archive for s in states if s] == names and all(s and s.forgotten for s in states)
        with pytest.raises(ForgottenError):
            store.snapshot(old[0])
        assert store.verify(projections=True).ok


def test_forget_with_a_stale_version_destroys_nothing(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "store", keys=KEY) as store:
        (sid,) = closed_sessions(store, 1)
        with store.log.view() as view:
            version = view.stream_version(sid)
        store.open_session(sid)  # reopened after the caller judged it
        store.inject(sid, {"role": "user", "content": "back again"})
        with pytest.raises(ConcurrencyError) as raised:
            store.forget(sid, "stale", expected_version=version)
        assert raised.value.expected == version and raised.value.actual == version + 2
        with store.log.view() as view:
            assert view.stream_version(sid) == version + 2
            state = pj.load_state(view, sid)
        assert state is not None and not state.forgotten
        assert store.snapshot(sid)["transcript"][-1]["content"] == "back again"
        with pytest.raises(InvalidArgumentError, match="expected_version"):
            store.forget(sid, "bad", expected_version=0)
        store.forget(sid, "current", expected_version=version + 2)
        with pytest.raises(ForgottenError):
            store.snapshot(sid)


def test_a_session_written_before_its_forget_commits_is_kept(tmp_path: Path) -> None:
    """An archived session a sweep only forgets, reopened by another writer after the sweep
    judged it (while the sink writes another session's archive): forget's own commit sees the
    change, so the session keeps its key and the sweep reports it kept."""
    with SessionStore.open(tmp_path / "store", keys=KEY) as store:
        first = closed_sessions(store, 1, prefix="a")
        assert archive_only(store, archive_policy(tmp_path), later(2)) == first
        second = closed_sessions(store, 1, prefix="b")
        sink = ReopeningSink(tmp_path / "archive", store, first[0])
        report = store.sweep(RetentionPolicy(max_age=DAY, action="archive", sink=sink), later(2))
        assert report.archived == second and report.forgotten == second
        assert report.kept == first
        assert store.snapshot(first[0])["transcript"][-1]["content"] == "back again"


def test_an_archive_whose_lines_fail_leaves_no_partial_copy(tmp_path: Path) -> None:
    """The lines come from the store as they are written (a session's opened transcript among
    them); when making one fails (a key that does not open the next session), the part already
    written is removed, not left beside the archives as a hidden copy."""
    sink = DirectorySink(tmp_path / "archive")

    def lines() -> Iterable[bytes]:
        yield b'{"readable": "opened-text-7f3a"}'
        raise WrongKeyError("the next session's key does not open")

    with pytest.raises(WrongKeyError):
        sink.put("batch", lines())
    assert list((tmp_path / "archive").iterdir()) == []
