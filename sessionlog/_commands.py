"""What each `sessionlog` command does: open the store, call one library function, print the result.

No command holds logic of its own about sessions or the log; a command that needs more than a
call and a rendering is a sign the library lacks a verb. Failures the library reports as values
(a seed that is not ok, a verify that found damage) become `Failure`s with their exit code here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eventlog import EventLog
from sessionlog import _limits, _render
from sessionlog._render import Node, Progress
from sessions import SessionStore

STORE_ENV = "SESSIONLOG_STORE"
STORE_DEFAULT = os.path.join("var", "sessions")

# Exit codes, one per kind of failure, so scripts can tell them apart.
EXIT_OK = 0
EXIT_ERROR = 1  # any other failure of the library (storage, capacity, ...)
EXIT_USAGE = 2  # the command line itself is wrong (argparse uses 2 too)
EXIT_NOT_FOUND = 3  # no such session, store or file
EXIT_INTEGRITY = 4  # the hash chain or an index is broken
EXIT_BAD_INPUT = 5  # a file given to read is not what the command reads
EXIT_CONFLICT = 6  # the store already holds something else under that name, or changed meanwhile
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report it
EXIT_INTERNAL = 70  # a bug of ours (EX_SOFTWARE)


class Failure(Exception):
    """A command failed in a way the command line reports as one line and an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# The store


SERVER_SCHEMES = ("postgresql://", "postgres://")


def store_path(args: argparse.Namespace) -> str:
    given = getattr(args, "store", None)
    return given or os.environ.get(STORE_ENV) or STORE_DEFAULT


@contextmanager
def opened(args: argparse.Namespace, *, create: bool = False) -> Iterator[SessionStore]:
    """The store named on the command line; a command that only reads refuses a missing one
    rather than create an empty store where the user mistyped a path."""
    path = store_path(args)
    served = path.startswith(SERVER_SCHEMES)  # a database server: it exists or the open says so
    if not create and not served and not Path(path).is_dir():
        raise Failure(f"no store at {path} (give --store PATH or set {STORE_ENV})", EXIT_NOT_FOUND)
    with SessionStore.open(path) as store:
        yield store


def readable_file(name: str) -> Path:
    path = Path(name)
    if not path.is_file():
        raise Failure(f"no file {name}", EXIT_NOT_FOUND)
    return path


def emit_json(value: object) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _snapshot_of(store: SessionStore, session_id: str, where: str) -> dict[str, Any]:
    snapshot = store.snapshot(session_id)
    if snapshot is None:
        raise Failure(f"{where}: no session `{session_id}`", EXIT_NOT_FOUND)
    return snapshot


# Reading sessions


def ls(args: argparse.Namespace) -> int:
    with opened(args) as store:
        page = store.list_sessions(cursor=args.cursor, limit=args.limit, status=args.status)
        shown = list(page["sessions"])
        while args.all and page["next_cursor"] is not None:
            page = store.list_sessions(
                cursor=page["next_cursor"], limit=args.limit, status=args.status
            )
            shown.extend(page["sessions"])
    if args.json:
        emit_json({"sessions": shown, "next_cursor": page["next_cursor"]})
        return EXIT_OK
    print(_render.session_table(shown))
    if page["next_cursor"] is not None:
        print(f"(more: sessionlog ls --cursor {page['next_cursor']})")
    return EXIT_OK


def show(args: argparse.Namespace) -> int:
    with opened(args) as store:
        snapshot = _snapshot_of(store, args.session_id, "show")
    if args.json:
        emit_json(snapshot)
    else:
        print(_render.transcript(snapshot))
    return EXIT_OK


def as_of(args: argparse.Namespace) -> int:
    with opened(args) as store:
        past = store.as_of(args.position)
        try:
            snapshot = past.snapshot(args.session_id)
        finally:
            past.close()
    if snapshot is None:
        raise Failure(
            f"as-of: no session `{args.session_id}` as of position {args.position}",
            EXIT_NOT_FOUND,
        )
    if args.json:
        emit_json(snapshot)
    else:
        print(f"as of position {args.position:,}")
        print(_render.transcript(snapshot))
    return EXIT_OK


def tree(args: argparse.Namespace) -> int:
    with opened(args) as store:
        ancestry = store.ancestry(args.session_id)
        if ancestry is None:
            raise Failure(f"tree: no session `{args.session_id}`", EXIT_NOT_FOUND)
        root, left_out = load_tree(store, ancestry["root_id"])
    drawn = {
        "text": lambda: _render.text_tree(root, mark=args.session_id),
        "dot": lambda: _render.dot_tree(root),
        "mermaid": lambda: _render.mermaid_tree(root),
    }[args.format]()
    print(drawn)
    if left_out:
        print(f"({left_out} more sessions past tree_sessions_max)", file=sys.stderr)
    return EXIT_OK


def load_tree(store: SessionStore, root_id: str) -> tuple[Node, int]:
    """The sessions under `root_id`, breadth first, at most `tree_sessions_max` of them; returns
    the tree and how many were left out."""
    root = _node(_snapshot_of(store, root_id, "tree"))
    queue, count, left_out = [(root, _children(store, root_id))], 1, 0
    while queue:
        parent, child_ids = queue.pop(0)
        for child_id in child_ids:
            if count >= _limits.tree_sessions_max:
                left_out += 1
                continue
            snapshot = store.snapshot(child_id)
            if snapshot is None:  # deleted since the parent was read
                continue
            node = _node(snapshot)
            parent.children.append(node)
            count += 1
            queue.append((node, snapshot["child_ids"]))
    return root, left_out


def _children(store: SessionStore, session_id: str) -> list[str]:
    ancestry = store.ancestry(session_id)
    return list(ancestry["child_ids"]) if ancestry else []


def _node(snapshot: dict[str, Any]) -> Node:
    return Node(
        session_id=snapshot["session_id"],
        title=snapshot.get("title"),
        length=snapshot["length"],
        fork_at=snapshot.get("branched_at_event_index") if snapshot.get("parent_id") else None,
    )


def stats(args: argparse.Namespace) -> int:
    with opened(args) as store:
        counts = {"active": 0, "closed": 0, "deleted": 0}
        messages = 0
        for status in counts:
            cursor: str | None = None
            while True:
                page = store.list_sessions(
                    cursor=cursor, limit=_limits.ls_page_sessions_default, status=status
                )
                counts[status] += len(page["sessions"])
                messages += sum(s["length"] for s in page["sessions"] if status != "deleted")
                cursor = page["next_cursor"]
                if cursor is None:
                    break
        figures = store_figures(store)
    figures.update(sessions_active=counts["active"], sessions_closed=counts["closed"])
    figures.update(sessions_deleted=counts["deleted"], messages=messages)
    if args.json:
        emit_json(figures)
    else:
        print(_render.pairs(stats_rows(figures)))
    return EXIT_OK


def store_figures(store: SessionStore) -> dict[str, Any]:
    """The log's own figures: events, bytes on disk, head hash."""
    return {
        "store": store.log.description,
        "events": store.log.head,
        "bytes_on_disk": store.log.size_bytes(),
        "head_hash": store.log.head_hash.hex(),
    }


def stats_rows(figures: dict[str, Any]) -> list[tuple[str, object]]:
    names = {
        "store": "store",
        "events": "events",
        "sessions_active": "sessions (active)",
        "sessions_closed": "sessions (closed)",
        "sessions_deleted": "sessions (deleted)",
        "messages": "messages (open sessions)",
        "bytes_on_disk": "bytes on disk",
        "head_hash": "head hash",
    }
    return [(label, figures[key]) for key, label in names.items() if key in figures]


# The log


def tail(args: argparse.Namespace) -> int:
    stop = _StopOnSignal() if args.follow else None
    with opened(args) as store:
        events = store.log.tail(
            after=args.after,
            stream=args.session,
            follow=args.follow,
            poll_interval_s=_limits.follow_poll_interval_s,
            stop=stop,
        )
        for envelope in events:
            line = (
                json.dumps(_render.event_dict(envelope), ensure_ascii=False)
                if args.json
                else _render.event_line(envelope)
            )
            print(line, flush=args.follow)
    return EXIT_OK


class _StopOnSignal:
    """True once SIGINT or SIGTERM arrived: `tail --follow` then ends cleanly with exit 0."""

    def __init__(self) -> None:
        import signal

        self.stopped = False
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._stop)

    def _stop(self, signum: int, frame: object) -> None:
        self.stopped = True

    def __call__(self) -> bool:
        return self.stopped


def verify(args: argparse.Namespace) -> int:
    path = store_path(args)
    if not path.startswith(SERVER_SCHEMES) and not Path(path).is_dir():
        raise Failure(f"no store at {path}", EXIT_NOT_FOUND)
    with EventLog.open(path, readonly=True) as log, Progress("verify") as progress:
        report = log.verify(progress=progress)
    found = {
        "ok": report.ok,
        "events_checked": report.events_checked,
        "streams_checked": report.streams_checked,
        "head_hash": report.head_hash.hex(),
        "first_bad_position": report.first_bad_position,
        "problem": report.problem,
    }
    if args.json:
        emit_json(found)
    elif report.ok:
        print(
            f"ok: {report.events_checked:,} events in {report.streams_checked:,} streams, "
            f"head hash {report.head_hash.hex()}"
        )
    if not report.ok:
        where = report.first_bad_position
        raise Failure(
            "verify: the store is damaged"
            + (f" at position {where}" if where is not None else "")
            + f": {report.problem} ({report.events_checked:,} events before it are sound)",
            EXIT_INTEGRITY,
        )
    return EXIT_OK


def rebuild(args: argparse.Namespace) -> int:
    with opened(args) as store, Progress("rebuild") as progress:
        position = store.rebuild(progress=progress)
    print(f"rebuilt every projection from the log, through position {position:,}")
    return EXIT_OK
