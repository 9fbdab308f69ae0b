"""What each `sessionlog` command does: open the store, call one library function, print the result.

No command holds logic of its own about sessions or the log; a command that needs more than a
call and a rendering is a sign the library lacks a verb. Failures the library reports as values
(a seed that is not ok, a verify that found damage) become `Failure`s with their exit code here.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

import projections as pj
from eventlog import EventLog, VerifyReport
from sessionlog import _limits, _render
from sessionlog._render import Node, Progress
from sessions import LocalKeyProvider, SessionStore

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


def store_exists(path: str) -> bool:
    """Whether `path` holds a store (a database server is taken to: its open says otherwise)."""
    return path.startswith(SERVER_SCHEMES) or (Path(path) / "data.mdb").is_file()


def no_store(path: str) -> Failure:
    return Failure(f"no store at {path} (give --store PATH or set {STORE_ENV})", EXIT_NOT_FOUND)


@contextmanager
def opened(
    args: argparse.Namespace, *, write: bool = False, create: bool = False
) -> Iterator[SessionStore]:
    """The store named on the command line: read-only unless the command writes; a missing one
    is refused (a mistyped path must not become an empty store), or with `create` built aside
    and moved into place only when the command succeeds, so a refused input leaves nothing."""
    path = store_path(args)
    if store_exists(path):
        keys = LocalKeyProvider.from_env_if_set()
        with SessionStore.open(path, readonly=not (write or create), keys=keys) as store:
            yield store
    elif create:
        with _new_store(Path(path)) as store:
            yield store
    else:
        raise no_store(path)


@contextmanager
def _new_store(path: Path) -> Iterator[SessionStore]:
    made = next((p for p in reversed([path, *path.parents]) if not p.exists()), None)
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.new-"))
    try:
        with SessionStore.open(aside) as store:
            yield store
        if path.is_dir():  # an existing directory without a store: the files move into it
            _move_store_into(aside, path)
        else:
            os.rename(aside, path)  # fails if another store took the path meanwhile
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        if made is not None and made != path:
            shutil.rmtree(made, ignore_errors=True)  # the folders made for it, if it failed
        raise


def _move_store_into(aside: Path, path: Path) -> None:
    """Move a store's files into the directory `path` without replacing a store that another
    process created there meanwhile: a hard link never overwrites."""
    try:
        os.link(aside / "data.mdb", path / "data.mdb")
    except FileExistsError:
        raise Failure(
            f"a store appeared at {path} while this one was being made; run the command again",
            EXIT_CONFLICT,
        ) from None
    with suppress(FileExistsError):  # a lock file left behind is reset by its next opener
        os.link(aside / "lock.mdb", path / "lock.mdb")
    shutil.rmtree(aside)


@contextmanager
def output_file(name: str) -> Iterator[BinaryIO]:
    """A file written under a temporary name in the same directory and renamed to `name` only
    when complete: an interrupted or failed command leaves no partial file behind."""
    target = Path(name)
    descriptor, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".partial"
    )
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(descriptor, 0o666 & ~mask)  # the mode a plain open() would give
        with os.fdopen(descriptor, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def readable_file(name: str) -> Path:
    path = Path(name)
    if not path.is_file():
        raise Failure(f"no file {name}", EXIT_NOT_FOUND)
    return path


_JSON_CONTROLS = {code: f"\\u{code:04x}" for code in range(0x7F, 0xA0)}
"""DEL and the C1 controls (CSI is one), which `json.dumps` leaves raw: as `\\u` escapes."""


def json_text(value: object, indent: int | None = None) -> str:
    """`value` as JSON for standard output: non-ASCII characters written as they are where it
    carries UTF-8, else as `\\u` escapes, so the JSON stays valid whatever the terminal's
    encoding (the fallback `backslashreplace` of `main` would write invalid `\\U` escapes)."""
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    utf8 = codecs.lookup(encoding).name == "utf-8"
    text = json.dumps(value, indent=indent, ensure_ascii=not utf8, default=str)
    return text.translate(_JSON_CONTROLS)  # the same JSON, never a raw C1 control on a terminal


def emit_json(value: object) -> None:
    print(json_text(value, indent=2))


def _summary_of(store: SessionStore, session_id: str, where: str) -> dict[str, Any]:
    summary = store.summary(session_id)
    if summary is None:
        raise Failure(f"{where}: no session `{session_id}`", EXIT_NOT_FOUND)
    return summary


def again(args: argparse.Namespace, *words: str) -> str:
    """A command line that repeats this one's store, for a hint the user can copy."""
    store = f"--store {shlex.quote(store_path(args))} " if getattr(args, "store", None) else ""
    return f"sessionlog {store}{' '.join(words)}"


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
    _render.emit(_render.session_table(shown))
    if page["next_cursor"] is not None:
        status = f" --status {args.status}" if args.status else ""
        more = f"ls --limit {args.limit}{status} --cursor {shlex.quote(page['next_cursor'])}"
        print(f"(more: {again(args, more)})")
    return EXIT_OK


def show(args: argparse.Namespace) -> int:
    paged = args.after or args.limit is not None
    with opened(args) as store:
        if args.json and not paged:
            snapshot = store.snapshot(args.session_id)
            if snapshot is None:
                raise Failure(f"show: no session `{args.session_id}`", EXIT_NOT_FOUND)
            emit_json(snapshot)
            return EXIT_OK
        summary = _summary_of(store, args.session_id, "show")
        if args.json:
            messages = store.messages(args.session_id, after=args.after, limit=args.limit)
            emit_json({**summary, "after": args.after, "transcript": messages})
            return EXIT_OK
        _render.emit(_render.session_header(summary))
        print(flush=True)
        shown = _print_messages(store, args)
    end = args.after + shown
    if end < summary["length"] and args.limit is not None:
        limit = f" --limit {args.limit}"
        print(f"(more: {again(args, f'show {shlex.quote(args.session_id)} --after {end}{limit}')})")
    return EXIT_OK


def _print_messages(store: SessionStore, args: argparse.Namespace) -> int:
    """Print the wanted messages a page at a time, so the first lines show at once whatever the
    transcript's length; returns how many were printed."""
    printed, wanted = 0, args.limit
    while wanted is None or printed < wanted:
        step = _limits.show_page_messages_default
        if wanted is not None:
            step = min(step, wanted - printed)
        page = store.messages(args.session_id, after=args.after + printed, limit=step)
        lines = []
        for offset, message in enumerate(page, args.after + printed + 1):
            lines.extend(_render.message_lines(offset, message))
        if lines:
            print("\n".join(lines), flush=True)
        printed += len(page)
        if len(page) < step:
            break
    return printed


def as_of(args: argparse.Namespace) -> int:
    with opened(args) as store:
        if not 0 <= args.position <= store.log.head:
            raise Failure(
                f"as-of: POSITION must be from 0 to {store.log.head} (the log's last position), "
                f"got {args.position}",
                EXIT_USAGE,
            )
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
        _render.emit(_render.session_header(snapshot))
        print()
        for number, message in enumerate(snapshot["transcript"], 1):
            print("\n".join(_render.message_lines(number, message)))
    return EXIT_OK


def tree(args: argparse.Namespace) -> int:
    with opened(args) as store:
        ancestry = store.ancestry(args.session_id)
        if ancestry is None:
            raise Failure(f"tree: no session `{args.session_id}`", EXIT_NOT_FOUND)
        root, left_out = load_tree(store, ancestry["root_id"])
    if args.format == "text":
        _render.emit(_render.text_tree(root, mark=args.session_id))
    else:
        print(_render.dot_tree(root) if args.format == "dot" else _render.mermaid_tree(root))
    if left_out:
        print(f"({left_out} more sessions past tree_sessions_max)", file=sys.stderr)
    return EXIT_OK


def load_tree(store: SessionStore, root_id: str) -> tuple[Node, int]:
    """The sessions under `root_id`, breadth first, at most `tree_sessions_max` of them; returns
    the tree and how many were left out. Each node is one projection read (`summary`), never
    the session's messages."""
    root = _node(_summary_of(store, root_id, "tree"))
    queue, count, left_out = deque([(root, root.child_ids)]), 1, 0
    while queue:
        parent, child_ids = queue.popleft()
        for child_id in child_ids:
            if count >= _limits.tree_sessions_max:
                left_out += 1
                continue
            summary = store.summary(child_id)
            if summary is None:  # deleted since the parent was read
                continue
            node = _node(summary)
            parent.children.append(node)
            count += 1
            queue.append((node, node.child_ids))
    return root, left_out


def _node(summary: dict[str, Any]) -> Node:
    return Node(
        session_id=summary["session_id"],
        title=summary.get("title"),
        length=summary["length"],
        fork_at=summary.get("branched_at_event_index") if summary.get("parent_id") else None,
        status=summary["status"],
        child_ids=list(summary["child_ids"]),
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
        _render.emit(_render.pairs(stats_rows(figures)))
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
        "messages": "messages (active+closed)",
        "bytes_on_disk": "bytes on disk",
        "head_hash": "head hash",
    }
    return [(label, figures[key]) for key, label in names.items() if key in figures]


# The log


def tail(args: argparse.Namespace) -> int:
    path = store_path(args)
    with opened(args) as store:
        if args.session is not None and store.log.stream_version(args.session) == 0:
            raise Failure(f"tail: no session `{args.session}` in {path}", EXIT_NOT_FOUND)
        stop = _FollowStop(path) if args.follow else None
        events = store.log.tail(
            after=args.after,
            stream=args.session,
            follow=args.follow,
            poll_interval_s=_limits.follow_poll_interval_s,
            stop=stop,
        )
        for envelope in events:
            line = (
                json_text(_render.event_dict(envelope))
                if args.json
                else _render.event_line(envelope)
            )
            print(line, flush=args.follow)
    if stop is not None and stop.replaced:
        raise Failure(
            f"tail: the store at {path} was replaced (removed, or made anew) while it was "
            f"followed; to follow the new one, run `{again(args, 'tail --follow')}` again",
            EXIT_ERROR,
        )
    if stop is not None and stop.interrupted:
        return EXIT_INTERRUPTED  # Ctrl-C, as the help says; SIGTERM is a clean stop
    return EXIT_OK


class _FollowStop:
    """When `tail --follow` ends: on Ctrl-C (exit 130), on SIGTERM (exit 0), or when the store
    it follows is replaced, which an open LMDB file never shows by itself: the new store is
    other files at the same path, so its data file's identity is checked at every poll."""

    def __init__(self, path: str) -> None:
        self.interrupted = False
        self.terminated = False
        self.replaced = False
        self._path = None if path.startswith(SERVER_SCHEMES) else Path(path) / "data.mdb"
        self._identity = self._identify()
        signal.signal(signal.SIGINT, self._interrupt)
        signal.signal(signal.SIGTERM, self._terminate)

    def _identify(self) -> tuple[int, int] | None:
        if self._path is None:
            return None
        try:
            found = self._path.stat()
        except FileNotFoundError:
            return None
        return (found.st_dev, found.st_ino)

    def _interrupt(self, signum: int, frame: object) -> None:
        self.interrupted = True

    def _terminate(self, signum: int, frame: object) -> None:
        self.terminated = True

    def __call__(self) -> bool:
        if self._path is not None and self._identify() != self._identity:
            self.replaced = True
        return self.interrupted or self.terminated or self.replaced


def verify(args: argparse.Namespace) -> int:
    path = store_path(args)
    if not store_exists(path):
        raise no_store(path)
    with Progress("verify") as progress:
        report = _verify_report(path, progress, projections=args.projections)
    if args.json:
        emit_json(report.as_json())
    elif report.ok:
        since = f" after the anchor at {report.anchor_position:,}" if report.anchor_position else ""
        print(
            f"ok: {report.events_checked:,} events{since} in {report.streams_checked:,} streams, "
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


def _verify_report(
    path: str, progress: Callable[[int, int], object], *, projections: bool
) -> VerifyReport:
    """A store on disk is walked in a child process and never opened here: a page damaged so
    that LMDB aborts the reader must end as a report (exit 4), not as this process dying."""
    if not path.startswith(SERVER_SCHEMES):
        if projections:
            return pj.verify_files(path, progress=progress)
        return EventLog.verify_files(path, progress=progress)
    with EventLog.open(path, readonly=True) as log:
        if projections:
            return pj.verify(log, progress=progress)
        return log.verify(progress=progress)


def rebuild(args: argparse.Namespace) -> int:
    with opened(args, write=True) as store, Progress("rebuild") as progress:
        position = store.rebuild(progress=progress)
    print(f"rebuilt every projection from the log, through position {position:,}")
    return EXIT_OK


def forget(args: argparse.Namespace) -> int:
    with opened(args, write=True) as store:
        store.forget(args.session, args.reason, expected_version=args.expected_version)
    print(f"forgot `{args.session}`: its data key is destroyed, its content unreadable for good")
    return EXIT_OK


def rotate_keys(args: argparse.Namespace) -> int:
    new = LocalKeyProvider.from_file(args.new_key_file)
    with opened(args, write=True) as store:
        count = store.rotate_keys(new)
    print(f"re-wrapped {count:,} data keys under {new.key_id}; use the new key from now on")
    return EXIT_OK


def compact_store(args: argparse.Namespace) -> int:
    path = store_path(args)
    if path.startswith(SERVER_SCHEMES):
        raise Failure(
            "compact-store: a PostgreSQL store is compacted by the server: run VACUUM (space for "
            "new rows) or VACUUM FULL (returns it to the disk; locks the tables) on its schema",
            EXIT_USAGE,
        )
    if not store_exists(path):
        raise no_store(path)
    before, after = EventLog.compact_files(path)
    if args.json:
        emit_json({"bytes_before": before, "bytes_after": after})
    else:
        print(f"compacted {path}: {before:,} -> {after:,} bytes ({after / max(before, 1):.2f}x)")
    return EXIT_OK
