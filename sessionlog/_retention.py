"""The retention commands: `sweep` (retire closed sessions past an age) and `truncate-log` (archive
and drop the log's prefix), and the retention options `serve` shares with `sweep`.

Thin wrappers over `SessionStore.sweep` and `SessionStore.truncate_log`; `compact-store` is in
`_commands.py` beside the other whole-store commands. Nothing here decides what is due.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from sessionlog._commands import EXIT_OK, emit_json, opened
from sessions import DirectorySink, RetentionPolicy


def add_policy_options(o: Any, *, required: bool) -> None:
    """`--max-age-days`, `--grace-days` and `--archive`, for `sweep` and `serve`."""
    o.add_argument(
        "--max-age-days",
        metavar="DAYS",
        type=float,
        required=required,
        help="retire closed sessions whose last event is older than this"
        + ("" if required else " (default: no retention)"),
    )
    o.add_argument(
        "--grace-days",
        metavar="DAYS",
        type=float,
        default=0.0,
        help="then wait this much longer, reporting them as expiring (default 0)",
    )
    o.add_argument(
        "--archive",
        metavar="DIR",
        help="archive them to JSON-lines files in DIR before forgetting them (default: only "
        "forget the encrypted ones)",
    )


def policy_of(args: argparse.Namespace) -> RetentionPolicy | None:
    if args.max_age_days is None:
        return None
    return RetentionPolicy.in_days(args.max_age_days, args.grace_days, args.archive)


def sweep(args: argparse.Namespace) -> int:
    policy = policy_of(args)
    assert policy is not None, "--max-age-days is required"
    with opened(args, write=True) as store:
        report = store.sweep(policy)
    counts = {
        name: len(getattr(report, name))
        for name in ("archived", "forgotten", "expiring", "kept", "plain")
    }
    if args.json:
        emit_json({"examined": report.examined, **counts})
    else:
        print(
            f"examined {report.examined:,} sessions: archived {counts['archived']:,}, forgot "
            f"{counts['forgotten']:,}, expiring {counts['expiring']:,}, kept for open forks "
            f"{counts['kept']:,}, plain (not encrypted) {counts['plain']:,}"
        )
    return EXIT_OK


def truncate_log(args: argparse.Namespace) -> int:
    with opened(args, write=True) as store:
        anchor, anchor_hash = store.truncate_log(args.before, sink=DirectorySink(args.archive))
    if args.json:
        emit_json({"anchor_position": anchor, "anchor_hash": anchor_hash.hex()})
    else:
        print(f"the log now starts after position {anchor:,}; anchor hash {anchor_hash.hex()}")
    return EXIT_OK


def retention_commands(command: Callable[..., Any], positive: Callable[[str], int]) -> None:
    o = command(
        "sweep",
        "retire closed sessions past an age: archive them, forget the encrypted ones",
        sweep,
        "sweep --max-age-days 90 --archive archive/",
        "sweep --max-age-days 30 --grace-days 7 --json",
    )
    add_policy_options(o, required=True)
    o.add_argument("--json", action="store_true", help="the counts as JSON")

    o = command(
        "truncate-log",
        "archive the events before a position and drop them from the store (refused while an "
        "open session reads one)",
        truncate_log,
        "truncate-log --before 120000 --archive archive/",
    )
    o.add_argument(
        "--before", metavar="POSITION", type=positive, required=True, help="the first kept event"
    )
    o.add_argument(
        "--archive", metavar="DIR", required=True, help="where the dropped events are archived"
    )
    o.add_argument("--json", action="store_true", help="the new anchor as JSON")
