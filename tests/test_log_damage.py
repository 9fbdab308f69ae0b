"""Damage is reported at its position, never a crash.

Fault model: bytes of `data.mdb` change underneath the store (a bad disk, a stray write, an
attacker with plain file access), while no process has it open. Every call then either returns
the right answer, or raises a typed error of the `SessionLogError` tree naming the position, or
(for `verify`) returns a report naming the position or region; it never raises a builtin error,
and never dies: LMDB aborts a process that reads a zeroed B-tree page, so `verify` walks the store
in a child process and reports the region the child died in.
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from eventlog import ANY, EventLog, IntegrityError
from eventlog._codec import BODY_START, HASH_START, chain_hash
from eventlog.events import Message, MessageInjected
from replay import export_log, import_log
from sessions import SessionStore
from tests._raw_lmdb import event_key, noise, raw_log
from tests.conftest import PROFILE
from tests.test_cli import run

EVENTS = 40


def build(path: Path) -> None:
    with EventLog.open(path) as log:
        for k in range(EVENTS):
            message = Message(role="user", content=f"message number {k} " + "x" * 200)
            log.append(f"s-{k % 3}", [MessageInjected(message=message)], expected_version=ANY)


def bad_utf8(path: Path, position: int, *, rehash: bool) -> None:
    """Set the first byte of the event's message text to 0xFF (never valid UTF-8); with
    `rehash`, also recompute the event's own hash, as someone hiding the change would."""
    with raw_log(path) as store:
        record = bytearray(store.record(position) or b"")
        text = record.index(f"message number {position - 1} ".encode())
        record[text] = 0xFF
        if rehash:
            before = store.record(position - 1) if position > 1 else None
            prev = bytes(32) if before is None else bytes(before[HASH_START:BODY_START])
            record[HASH_START:BODY_START] = chain_hash(prev, record)
        assert store.put_record(position, bytes(record))


@pytest.mark.parametrize("rehash", [False, True], ids=["plain", "rehashed"])
def test_invalid_utf8_in_an_event_is_named_at_its_position(tmp_path: Path, rehash: bool) -> None:
    path = tmp_path / "log"
    build(path)
    position = 17
    bad_utf8(path, position, rehash=rehash)
    with EventLog.open(path) as log:
        for isolated in (True, False):
            report = log.verify(isolated=isolated)
            assert not report.ok
            assert report.first_bad_position == position
            assert report.events_checked == position - 1
            assert f"position {position}" in (report.problem or "")
        with pytest.raises(IntegrityError) as raised:
            log.read(limit=EVENTS)
        assert raised.value.position == position
        with log.view() as view, pytest.raises(IntegrityError) as raised:
            view.events_at([position])
        assert raised.value.position == position
        with pytest.raises(IntegrityError) as raised:
            log.read_stream(f"s-{(position - 1) % 3}", limit=EVENTS)
        assert raised.value.position == position


def test_invalid_utf8_in_the_newest_event_fails_the_open(tmp_path: Path) -> None:
    path = tmp_path / "log"
    build(path)
    bad_utf8(path, EVENTS, rehash=True)
    for opener in (EventLog.open, SessionStore.open):
        with pytest.raises(IntegrityError) as raised:
            opener(path)
        assert raised.value.position == EVENTS


def test_a_session_store_over_invalid_utf8_refuses_to_catch_up(tmp_path: Path) -> None:
    # The projection has never seen the log (built with a bare EventLog): opening the store folds
    # it, and the fold meets the damaged event.
    path = tmp_path / "log"
    build(path)
    bad_utf8(path, 5, rehash=True)
    with pytest.raises(IntegrityError) as raised:
        SessionStore.open(path)
    assert raised.value.position in (5, 6)  # its decode, or the next event's broken link


def test_an_import_of_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    source = tmp_path / "source"
    with SessionStore.open(source) as store:
        sid = store.open_session()
        for k in range(5):
            store.inject(sid, {"role": "user", "content": f"message number {k} text"})
        out = io.BytesIO()
        export_log(store, out)
    lines = out.getvalue().splitlines()
    damaged = json.loads(lines[3])
    record = bytearray(base64.b64decode(damaged["record"]))
    record[record.index(b"message number")] = 0xFF
    prev = bytes.fromhex(json.loads(lines[2])["hash"])
    record[HASH_START:BODY_START] = chain_hash(prev, record)
    damaged["record"] = base64.b64encode(bytes(record)).decode()
    lines[3] = json.dumps(damaged).encode()
    with SessionStore.open(tmp_path / "target") as target:
        with pytest.raises(IntegrityError) as raised:
            import_log(target, io.BytesIO(b"\n".join(lines) + b"\n"))
        assert "position 3" in str(raised.value)
        assert target.log.head == 0


def test_the_cli_reports_invalid_utf8_as_damage(tmp_path: Path) -> None:
    path = tmp_path / "log"
    build(path)
    bad_utf8(path, 9, rehash=True)
    done = run("verify", store=path)
    assert done.returncode == 4, done.stderr
    assert "position 9" in done.stderr


def zero_page(path: Path, page: int) -> None:
    with (path / "data.mdb").open("r+b") as handle:
        handle.seek(page * 4096)
        handle.write(bytes(4096))


def test_verify_survives_a_page_that_makes_lmdb_abort(tmp_path: Path) -> None:
    # Find a page whose zeroing makes a read in this very process abort (checked in a child), then
    # show that `verify` reports it and the caller lives on.
    path = tmp_path / "log"
    build(path)
    pages = (path / "data.mdb").stat().st_size // 4096
    original = (path / "data.mdb").read_bytes()
    probe = (
        "import sys\nfrom eventlog import EventLog\n"
        "log = EventLog.open(sys.argv[1])\nlog.verify(isolated=False)\n"
    )
    for page in range(2, pages):
        (path / "data.mdb").write_bytes(original)
        zero_page(path, page)
        died = subprocess.run(
            [sys.executable, "-c", probe, str(path)], capture_output=True, timeout=60, check=False
        )
        if died.returncode == -6:  # SIGABRT
            break
    else:
        pytest.fail("no zeroed page made LMDB abort; the store is too small to show it")
    with EventLog.open(path) as log:
        report = log.verify()
        assert not report.ok
        assert report.first_bad_position is not None
        assert "SIGABRT" in (report.problem or "")
        assert f"after position {report.events_checked}" in (report.problem or "")
    done = run("verify", store=path)
    assert done.returncode == 4, done.stderr
    assert "SIGABRT" in done.stderr
    assert os.path.exists(path / "data.mdb")


# The sweep: damage anywhere in data.mdb, many cases per worker process.

# Cases per kind of damage. The `ci` profile samples; `deep` zeroes and randomises every page.
SWEEP_CASES = {"dev": 6, "ci": 8, "deep": 400}
CASES_PER_WORKER = 40
T0 = "2026-01-01T00:00:00Z"


def build_store(path: Path) -> list[str]:
    """A store with sessions, a fork, a scratchpad, messages spanning overflow pages, and bearer
    tokens (one of them revoked); returns the tokens."""
    with SessionStore.open(path) as store:
        ids = []
        for k in range(6):
            sid = store.open_session(f"s-{k}", system_prompt=f"prompt {k}")
            ids.append(sid)
            for m in range(16):
                size = 9000 if (k + m) % 11 == 0 else 120  # some span several pages
                text = noise(random.Random(k * 100 + m), size)  # packs poorly: many pages
                store.inject(sid, {"role": "user", "content": f"{k}.{m} " + text})
        store.fork_at(ids[0], keep_first=4, destination_id="child")
        store.set_scratchpad(ids[1], {"notes": "remember this"})
        tokens = [
            store.tokens.create(f"user-{k}", "2030-01-01T00:00:00Z", created_at=T0).token
            for k in range(4)
        ]
        store.tokens.expire(tokens[0], now=T0)
    return [token for token in tokens if token is not None]


def sweep_cases(size: int, profile: str) -> list[dict[str, object]]:
    rng = random.Random(13)
    per_kind = SWEEP_CASES.get(profile, SWEEP_CASES["dev"])
    pages = size // PAGE_BYTES
    cases: list[dict[str, object]] = []
    if profile == "deep":
        every = list(range(pages))
        cases += [{"kind": "zero_page", "page": page} for page in every]
        cases += [{"kind": "random_page", "page": page} for page in every]
    else:
        cases += [{"kind": "zero_page", "page": p} for p in rng.sample(range(pages), per_kind)]
        cases += [{"kind": "random_page", "page": p} for p in rng.sample(range(pages), per_kind)]
    # The two meta pages, where LMDB keeps its roots, always get a bit flip.
    cases += [{"kind": "bit", "offset": rng.randrange(2 * PAGE_BYTES)} for _ in range(per_kind)]
    cases += [{"kind": "bit", "offset": rng.randrange(size)} for _ in range(per_kind * 2)]
    cases += [{"kind": "bytes", "offset": rng.randrange(size)} for _ in range(per_kind)]
    for number, case in enumerate(cases):
        case.update(id=number, seed=rng.randrange(2**32))
    return cases


PAGE_BYTES = 4096


def test_damage_anywhere_is_a_correct_answer_a_refusal_or_a_report(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    tokens = build_store(pristine)
    size = (pristine / "data.mdb").stat().st_size
    assert size // PAGE_BYTES > 40, "the store must span enough pages to damage"
    cases = sweep_cases(size, PROFILE)
    outcomes: dict[str, int] = {}
    bad: list[str] = []
    for first in range(0, len(cases), CASES_PER_WORKER):
        batch = cases[first : first + CASES_PER_WORKER]
        done = subprocess.run(
            [sys.executable, "-m", "tests._damage_worker", str(pristine), str(tmp_path)],
            input=json.dumps({"tokens": tokens, "cases": batch}),
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
            cwd=Path(__file__).resolve().parent.parent,
        )
        results = [json.loads(line) for line in done.stdout.splitlines()]
        if done.returncode != 0 or len(results) != len(batch):
            dead = batch[len(results)] if len(results) < len(batch) else None
            pytest.fail(
                f"the worker died (status {done.returncode}) on case {dead}: {done.stderr[-2000:]}"
            )
        for result in results:
            outcomes[result["outcome"]] = outcomes.get(result["outcome"], 0) + 1
            if result["outcome"] == "bad":
                bad.append(f"{result['case']}: {result['detail']}")
    assert not bad, f"{len(bad)} of {len(cases)} cases went wrong:\n" + "\n".join(bad[:10])
    # The sweep must have exercised both kinds of outcome, or it shows nothing.
    assert outcomes.get("reported", 0) > 0 and outcomes.get("correct", 0) > 0, outcomes


def test_a_changed_key_that_keeps_the_order_is_reported(tmp_path: Path) -> None:
    # A bit flip in the key of a stored event (28 -> 29) inside its B-tree leaf: the records still
    # come out of a walk in order and chain perfectly, but position 28 can no longer be found.
    path = tmp_path / "log"
    build(path)
    data = bytearray((path / "data.mdb").read_bytes())
    with raw_log(path) as raw:
        stored = raw.stored(28)  # packed, in format 3, where that paid
        assert stored is not None
    needle = event_key(28) + stored[:16]
    # Copy-on-write leaves older copies of the leaf in free pages: change them all.
    found = 0
    while (at := data.find(needle)) >= 0:
        data[at + 7] ^= 0x01
        found += 1
    assert found >= 1
    (path / "data.mdb").write_bytes(data)
    with EventLog.open(path) as log:
        for isolated in (True, False):
            report = log.verify(isolated=isolated)
            assert not report.ok
            assert report.first_bad_position == 28, report
            assert "position 28 is missing" in (report.problem or "")


def test_a_cold_snapshot_names_a_changed_message_of_an_interleaved_session(
    tmp_path: Path,
) -> None:
    # With no cached transcripts every snapshot reads each message from the log and checks it:
    # a changed byte in one message fails that session's snapshot at its position, and the
    # sessions whose messages sit around it still read as they did.
    path = tmp_path / "store"
    with SessionStore.open(path) as store:
        sessions = [store.open_session() for _ in range(3)]
        for k in range(30):
            store.inject(sessions[k % 3], {"role": "user", "content": f"message {k} " + "x" * 99})
        before = {sid: store.snapshot(sid) for sid in sessions}
        position = store.log.head - 10
        [changed] = store.log.read(after=position - 1, limit=1)
    with raw_log(path) as raw:
        record = bytearray(raw.record(position) or b"")
        record[-5] ^= 0x01
        assert raw.put_record(position, bytes(record))
    with SessionStore.open(path, hot_sessions=0) as store:
        with pytest.raises(IntegrityError) as raised:
            store.snapshot(changed.stream)
        assert raised.value.position == position
        for sid in sessions:
            if sid != changed.stream:
                assert store.snapshot(sid) == before[sid]
