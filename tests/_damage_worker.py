"""Worker for the damage sweep (`tests/test_log_damage.py`): damages copies of one store, one case
at a time, and says what each case came to.

Run as `python -m tests._damage_worker PRISTINE SCRATCH` with a JSON list of cases on stdin. For
each case it copies the pristine `data.mdb`, applies the damage, verifies the copy without opening
it here (`projections.verify_files`: the walk runs in its own child process), and, only when the
report is ok, opens the copy and compares everything it reads with the pristine store. One JSON
line per case on stdout: {"case": ..., "outcome": ..., "detail": ...}. A builtin exception, a
wrong answer or this process dying are what the test fails on.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

import projections as pj
from eventlog import EventLog, IntegrityError, SessionLogError
from sessions import SessionStore

PAGE = 4096


def truth(path: Path, tokens: list[str]) -> dict[str, Any]:
    """Everything a reader can see of the store, for comparing a damaged copy with."""
    with SessionStore.open(path) as store:
        events = list(store.log.iter_all())
        listed = store.list_sessions(limit=200)
        ids = [row["session_id"] for row in listed["sessions"]]
        with store.log.view() as view:
            kv = pj.dump(view)
        return {
            "events": events,
            "snapshots": {sid: store.snapshot(sid) for sid in ids},
            "tokens": [store.tokens.get(token, now="2026-01-02T00:00:00Z") for token in tokens],
            "kv": kv,
        }


def damage(data: bytearray, case: dict[str, Any]) -> None:
    rng = random.Random(case["seed"])
    kind = case["kind"]
    if kind == "bit":
        offset = case["offset"]
        data[offset] ^= 1 << rng.randrange(8)
    elif kind == "bytes":
        offset = case["offset"]
        length = min(rng.randint(1, 64), len(data) - offset)
        data[offset : offset + length] = rng.randbytes(length)
    elif kind == "zero_page":
        page = case["page"]
        data[page * PAGE : (page + 1) * PAGE] = bytes(PAGE)
    elif kind == "random_page":
        page = case["page"]
        data[page * PAGE : (page + 1) * PAGE] = rng.randbytes(PAGE)
    else:
        raise AssertionError(f"unknown damage {kind!r}")


def run_case(
    pristine: Path, scratch: Path, case: dict[str, Any], expected: dict[str, Any], tokens: list[str]
) -> tuple[str, str]:
    copy = scratch / f"case-{case['id']}"
    copy.mkdir()
    try:
        data = bytearray((pristine / "data.mdb").read_bytes())
        damage(data, case)
        if data == (pristine / "data.mdb").read_bytes():
            return "unchanged", ""
        (copy / "data.mdb").write_bytes(data)
        report = pj.verify_files(copy)
        if not report.ok:
            problem = report.problem or ""
            if report.first_bad_position is None and not problem:
                return "bad", f"a failed report names nothing: {report}"
            return "reported", problem[:200]
        try:
            found = truth(copy, tokens)
        except IntegrityError as exc:
            return "bad", f"verify was ok, then reading raised {type(exc).__name__}: {exc}"
        for part in ("events", "snapshots", "tokens", "kv"):
            if found[part] != expected[part]:
                return "bad", f"verify was ok, but the {part} read differ from the original"
        return "correct", ""
    except SessionLogError as exc:
        return "bad", f"{type(exc).__name__} escaped the verify-then-read path: {exc}"
    except Exception:  # the sweep's point: any builtin error is a finding, reported in full
        return "bad", traceback.format_exc()[-1500:]
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def main(argv: list[str]) -> int:
    pristine, scratch = Path(argv[0]), Path(argv[1])
    job = json.load(sys.stdin)
    tokens = job["tokens"]
    expected = truth(pristine, tokens)
    with EventLog.open(pristine, readonly=True) as log:
        assert log.verify().ok
    for case in job["cases"]:
        outcome, detail = run_case(pristine, scratch, case, expected, tokens)
        sys.stdout.write(json.dumps({"case": case, "outcome": outcome, "detail": detail}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
