"""Walking a whole store in a child process, so that damage cannot take the caller down.

LMDB maps the data file into the process and trusts its pages: a zeroed or garbage B-tree page
trips LMDB's own assertions, which abort the process (SIGABRT) instead of returning an error.
`verify` therefore walks an LMDB store in a child process that reports its progress on a pipe; if
the child dies, the caller reports the damaged region (the positions after the last page the child
finished) instead of dying with it. This module owns the child's protocol: JSON lines on stdout,
`{"progress": [done, head]}` then one `{"report": {...}}`. It must never read the store itself.

Run as `python -m eventlog._walk PATH`: the log's own walk, then every other table's pages.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventlog.errors import IntegrityError, SessionLogError

if TYPE_CHECKING:
    from eventlog._log import EventLog
    from eventlog._verify import VerifyReport

# The stderr of a child that died, kept to quote LMDB's own message (its failed assertion).
_STDERR_BYTES_MAX = 4096


def emit(message: dict[str, Any]) -> None:
    """One line of the child's protocol, flushed at once: the parent must know how far the walk
    got even if the next page kills the child."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def run_child(
    module: str,
    arguments: Sequence[str],
    progress: Callable[[int, int], object] | None,
) -> tuple[dict[str, Any] | None, int, str]:
    """Run `python -m module arguments...`; returns the report it sent (None if it died before
    sending one), the last position it said it had checked, and why it died (empty if it did not).
    """
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (package_root, env.get("PYTHONPATH", "")) if part
    )
    done = 0
    report: dict[str, Any] | None = None
    # stderr goes to a file, not a pipe: a chatty child must not block on a pipe nobody reads.
    with (
        tempfile.TemporaryFile() as stderr_file,
        subprocess.Popen(
            [sys.executable, "-m", module, *arguments],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            env=env,
        ) as child,
    ):
        try:
            assert child.stdout is not None
            for line in child.stdout:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # not ours: something the child's interpreter printed
                if not isinstance(message, dict):
                    continue
                if "progress" in message:
                    done, head = message["progress"]
                    if progress is not None:
                        progress(done, head)
                elif "report" in message:
                    report = message["report"]
            code = child.wait()
        except BaseException:
            child.kill()
            raise
        stderr_file.seek(0, os.SEEK_END)
        stderr_file.seek(max(0, stderr_file.tell() - _STDERR_BYTES_MAX))
        stderr = stderr_file.read()
    if report is not None and code == 0:
        return report, done, ""
    return None, done, _death(code, stderr.decode("utf-8", "replace"))


def _death(code: int, stderr: str) -> str:
    if code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exited with status {code}"
    said = [line.strip() for line in stderr.splitlines() if line.strip()]
    return how + (f" ({said[-1][:300]})" if said else "")


def walk_here(log: EventLog, progress: Callable[[int, int], object] | None) -> VerifyReport:
    """The log's own walk, then every other table's pages (in this process)."""
    report = log.verify(progress=progress, isolated=False)
    if not report.ok:
        return report
    problem = log.walk_other_tables()
    if problem is not None:
        return dataclasses.replace(report, ok=False, problem=problem)
    return report


def child_main(
    argv: list[str],
    walk: Callable[[EventLog, Callable[[int, int], object]], VerifyReport] = walk_here,
) -> int:
    """The child's side of the protocol: open the store at `argv[0]` read-only, `walk` it while
    sending progress, then send the report (one saying so when the store cannot be opened)."""
    from eventlog._log import EventLog
    from eventlog._verify import VerifyReport

    try:
        with EventLog.open(argv[0], readonly=True) as log:
            report = walk(log, lambda done, head: emit({"progress": [done, head]}))
    except IntegrityError as exc:
        report = VerifyReport(
            ok=False,
            events_checked=0,
            streams_checked=0,
            head_hash=bytes(32),
            first_bad_position=exc.position,
            problem=f"the store cannot be opened: {exc}",
        )
    except SessionLogError as exc:  # not damage (a lock, a permission): the caller raises
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        return 1
    emit({"report": report.as_json()})
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
