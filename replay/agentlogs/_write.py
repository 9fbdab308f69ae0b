"""Writing the sessions read from one agent log: made new, or those of an earlier import of the
same log, grown by appended lines since, brought up to date to equal a fresh import of it.

Owns what a session is opened with, the injecting of kept messages, and the checks that an
earlier import is a prefix of the file (its bytes, and the transcript they became). It runs
inside the verb's transaction and never opens one. The slow parts are done before the
transaction opens: `Prefixes` reads and hashes the files' prefixes, `Compared` reads the stored
messages and finds where they leave the fresh reading; inside, the checks only compare digests
and the sessions' stream versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
from blake3 import blake3

from eventlog import limits
from eventlog.events import Message
from replay import _limits
from replay.agentlogs._common import AgentLogError, Built, Parsed
from sessions import InvalidArgumentError, SessionExistsError, SessionLogError, SessionStore

_VERB = "import_agent_log"
_TITLE_CHARS_MAX = 120
_PROMPT_CHARS_MAX = 4000  # the summary's copy; the message itself keeps every character
_HASH_READ_BYTES = 1 << 20
_REWOUND = "import_agent_log: the log grew, and its new lines changed these messages"
_message = msgspec.msgpack.Decoder(Message).decode


class AgentLogConflictError(SessionExistsError):
    """The session id an import would use already holds a session from another source, or from
    an earlier version of the same log that the file no longer extends (it was rewritten, not
    appended to), or one the new lines would change in a way a session cannot be changed."""


@dataclass(frozen=True, slots=True)
class Written:
    """What an import wrote into one session: the messages it appended, and how many of them
    replaced messages an earlier import had stored (rewound, as the new lines changed them)."""

    appended: int
    replaced: int = 0


class PrefixNotHashedError(Exception):
    """A check in the transaction needs a file prefix `Prefixes` did not hash before it: the
    earlier import it checks against changed since (another import committed). Raised to leave
    the transaction, hash the prefix outside it, and try again; never seen by callers."""

    def __init__(self, path: str, size: int) -> None:
        super().__init__(f"{path}: the first {size} bytes were not hashed")
        self.path = path
        self.size = size


class Prefixes:
    """Digests of the first bytes of files, each a prefix an earlier import read, taken before
    the write transaction in which `grown_from` compares them with what the store holds: reading
    a log of tens of megabytes takes long, and every other writer of the store would wait on it.
    A prefix the transaction needs and did not get raises `PrefixNotHashedError`, unless
    `inside` (the last try), when it is hashed there and then."""

    def __init__(self) -> None:
        self.inside = False
        self._found: dict[tuple[str, int], str | OSError | None] = {}

    def hash(self, wanted: Iterable[tuple[str, object]]) -> None:
        """Hash each prefix (`path`, bytes) in `wanted` not hashed yet, reading each file once;
        a size that is not a byte count is left out, as `grown_from` refuses it unread."""
        sizes: dict[str, set[int]] = {}
        for path, size in wanted:
            if type(size) is int and size >= 0 and (path, size) not in self._found:
                sizes.setdefault(path, set()).add(size)
        for path, some in sizes.items():
            self._found.update(((path, size), found) for size, found in _digests(path, some))

    def begins_with(self, path: str, size: int, digest: str, *, known: bool = False) -> bool:
        """Whether the file at `path` began with `size` bytes of blake3 `digest` when hashed.
        `known`: as far as the prefixes hashed so far tell, false for one not hashed or not
        readable (before the transaction, which decides on those)."""
        if (path, size) not in self._found:
            if known:
                return False
            if not self.inside:
                raise PrefixNotHashedError(path, size)
            self.hash([(path, size)])
        if known and isinstance(self._found[(path, size)], OSError):
            return False
        found = self._found[(path, size)]
        if isinstance(found, OSError):
            raise AgentLogError(path, None, f"cannot read: {found.strerror or found}") from found
        return found == digest


class NotComparedError(Exception):
    """`update` needs where a session's stored messages leave the fresh reading, and `Compared`
    did not find it before the transaction for the session as it is now: another writer changed
    the session since (an import of the same log, someone's own message, a rewind). Raised to
    leave the transaction, compare outside it again, and try again; never seen by callers."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session `{session_id}` changed since its messages were compared")
        self.session_id = session_id


@dataclass(frozen=True, slots=True)
class Difference:
    """How a session's stored messages (`length` of them) compare with a fresh reading of its
    log: the first `same` are equal to it, and `foreign` is the first one after those that was
    not read from a log (someone's own message), None when there is none."""

    length: int
    same: int
    foreign: int | None


class Compared:
    """Where each session an import brings up to date first differs from the fresh reading,
    found before the write transaction: reading and decoding every stored message of a long
    session takes hundreds of milliseconds, and every other writer of the store would wait on it.
    Each is kept with the session's stream version and the log's cut when read; in the
    transaction a session still at both is not read again. Any other raises `NotComparedError`,
    unless `inside` (the last try), when the session is compared there and then."""

    def __init__(self) -> None:
        self.inside = False
        self._found: dict[str, tuple[tuple[int, int], Difference | None]] = {}

    def read(self, store: SessionStore, wanted: Iterable[tuple[str, Built]]) -> None:
        """Compare each session (id, its fresh reading) in `wanted` not compared at its present
        version yet. One the store cannot read (gone, forgotten, damaged) is left to the
        transaction, which reads it again and raises as it always did."""
        for sid, built in wanted:
            # Before the messages: a commit between the two moves `seen` on, so what is read is
            # never kept as the session at a later version.
            seen = _seen(store, sid)
            kept = self._found.get(sid)
            if kept is not None and kept[0] == seen:
                continue
            try:
                self._found[sid] = (seen, difference(store, sid, built))
            except SessionLogError:  # not an outcome: the transaction's own reading decides
                self._found[sid] = (seen, None)

    def of(self, store: SessionStore, sid: str, built: Built) -> Difference:
        """In the transaction: the difference of session `sid` from `built`, as found before it
        when the session has not changed since, else as read now on the last try."""
        kept = self._found.get(sid)
        if kept is None or kept[0] != _seen(store, sid):
            if not self.inside:
                raise NotComparedError(sid)
        elif kept[1] is not None:
            return kept[1]
        return difference(store, sid, built)


def _seen(store: SessionStore, sid: str) -> tuple[int, int]:
    """What changes whenever the messages of session `sid` may have: the version of its stream
    (every event of the session, a message, a rewind, a reopening, a forget, moves it on) and
    the position the log was cut at (a cut can take messages away without an event)."""
    return store.log.stream_version(sid), store.log.anchor[0]


def difference(store: SessionStore, sid: str, built: Built) -> Difference:
    """Read every stored message of session `sid` and compare them with `built`, in order."""
    stored, _ = store.message_structs(sid)
    kept, same = built.kept, 0
    while same < min(len(stored), len(kept)) and stored[same] == _message(kept.packed(same)):
        same += 1
    foreign = (i for i in range(same, len(stored)) if "source" not in stored[i].metadata)
    return Difference(len(stored), same, next(foreign, None))


def _digests(path: str, sizes: set[int]) -> Iterator[tuple[int, str | OSError | None]]:
    """The blake3 (hex) of the first `size` bytes of the file, for each of `sizes`, from one
    reading: None for a file shorter than that, the error for one that cannot be read."""
    hasher, at, todo = blake3(), 0, sorted(sizes)
    try:
        with open(path, "rb") as file:
            while todo:
                if at == todo[0]:
                    yield todo.pop(0), hasher.hexdigest()
                    continue
                chunk = file.read(min(todo[0] - at, _HASH_READ_BYTES))
                if not chunk:
                    break
                hasher.update(chunk)
                at += len(chunk)
    except OSError as exc:
        yield from ((size, exc) for size in todo)
        return
    yield from ((size, None) for size in todo)


def grown_from(
    prefixes: Prefixes, path: str, held: dict[str, Any], size: int, *, known: bool = False
) -> bool:
    """Whether the file at `path`, of `size` bytes now, begins with the bytes an earlier import
    read (`held`: its `bytes` and `blake3`), so that it can only have grown by appending.
    `known`: as far as `prefixes` tells before the transaction (`Prefixes.begins_with`)."""
    before, digest = held.get("bytes"), held.get("blake3")
    if type(before) is not int or not isinstance(digest, str) or not 0 <= before <= size:
        return False
    return prefixes.begins_with(path, before, digest, known=known)


def read_before(prefixes: Prefixes, path: str, held: dict[str, Any], about: dict[str, Any]) -> bool:
    """Whether the earlier import `held` read more of the log at `path` than this one (`about`:
    its `bytes` and `blake3`), both prefixes of the file as it is now: two imports of a growing
    log raced, and the one that read it later committed first."""
    before = held.get("bytes")
    if type(before) is not int or before <= about["bytes"]:
        return False
    return grown_from(prefixes, path, held, before) and grown_from(prefixes, path, about, before)


def open_options(built: Built, about: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    own = {
        **about,
        "session_key": built.key,
        "models": built.models,
        "counts": dict(built.counts),
        "roles": dict(built.roles),
        "first_prompt": (built.first_prompt or "")[:_PROMPT_CHARS_MAX] or None,
        "files_written": built.files_written,
        "unknown_field_names": built.unknown_fields,
        **built.info,
    }
    if built.key == next(iter(ids)):
        own["children"] = [sid for key, sid in ids.items() if key != built.key]
    title = built.title
    if title is not None:
        title = " ".join(title.split())[:_TITLE_CHARS_MAX] or None
    spawn = None
    if built.spawn_ref is not None:
        spawn = {**built.spawn_ref, "session_id": ids[built.spawn_ref["session"]]}
        del spawn["session"]
    return {
        "metadata": {"agent_log": own},
        "system_prompt": built.system_prompt,
        "title": title,
        "agent_id": about["format"],
        "parent_spawn_ref": spawn,
    }


def create(
    store: SessionStore, path: str, built: Built, ids: dict[str, str], about: dict[str, Any]
) -> Written:
    """Open the session of `built` (or fork it from its branch) and inject its messages."""
    sid = ids[built.key]
    try:
        options = open_options(built, about, ids)
        if built.fork_of is None:
            store.open_session(sid, **options)
        else:  # a branch of a tree-shaped log: it shares the prefix it left
            store.fork_at(ids[built.fork_of[0]], built.fork_of[1], sid)
            store.update_metadata(sid, options["metadata"])
        inject(store, path, sid, built)
    except AgentLogError:
        raise
    except InvalidArgumentError as exc:
        raise AgentLogError(
            path, None, f"the session engine refused session `{sid}`: {exc}"
        ) from exc
    return Written(appended=built.length)


def inject(store: SessionStore, path: str, sid: str, built: Built, start: int = 0) -> None:
    """Inject the kept messages of `built` from `start` on; a message the engine refuses is
    reported at the line it was read from."""
    kept = built.kept
    batches = kept.batches(limits.messages_per_event_max, _limits.seed_batch_bytes, start)
    for first, batch in batches:
        try:
            store.inject_many(sid, batch)
        except InvalidArgumentError as exc:
            if exc.index is None:
                raise
            problem = f"a message made from this record cannot be stored: {exc}"
            raise AgentLogError(path, kept.line_of(first + exc.index), problem) from exc


def update(
    store: SessionStore,
    path: str,
    parsed: Parsed,
    ids: dict[str, str],
    about: dict[str, Any],
    prefixes: Prefixes,
    compared: Compared,
) -> dict[str, Written]:
    """Bring the sessions an earlier import of this log made up to date with `parsed`, a fresh
    reading of the whole grown file, so that each equals what importing the file afresh makes:
    a session the file now reads into is made; in each other, the messages stored equal to the
    fresh reading's stay, and from the first that differs (as a rule the last: the records after
    it, a streamed part of it, or the answer to its call came in the new lines) the session is
    rewound and the fresh messages appended. Refused, raising `AgentLogConflictError`: a file of
    the earlier import that was rewritten, a session continued after its import, and a change a
    session cannot take (what spawned it, the branch it leaves, its system prompt). A file's
    prefix is compared by its digest in `prefixes`, hashed before the transaction, and a
    session's messages with the fresh reading by `compared`, before it too."""
    main = store.summary(ids[parsed.sessions[0].key]) or {}
    children = (main.get("metadata") or {}).get("agent_log", {}).get("children") or []
    gone = [sid for sid in children if sid not in ids.values()]
    if gone:
        raise _conflict(f"{path} grew, and no longer reads into session `{gone[0]}`")
    checked = {path: None}  # the files found to extend what was imported (the caller did this)
    written: dict[str, Written] = {}
    for built in parsed.sessions:
        sid = ids[built.key]
        if not store.exists(sid):
            written[sid] = create(store, path, built, ids, about)
            continue
        options = open_options(built, about, ids)
        now = store.summary(sid) or {}
        held = (now.get("metadata") or {}).get("agent_log") or {}
        own = options["metadata"]["agent_log"]
        if held.get("blake3") != own["blake3"] and built.path not in checked:
            if not grown_from(prefixes, built.path, held, own["bytes"]):
                raise _conflict(rewritten(built.path, sid, held))
            checked[built.path] = None
        _check_unchanging(now, built, options, ids)
        written[sid] = _brought_up_to_date(store, path, sid, built, compared.of(store, sid, built))
        store.update_metadata(sid, options["metadata"])
        if built.fork_of is None and now.get("title") != options["title"]:
            store.rename(sid, options["title"])
    return written


def _brought_up_to_date(
    store: SessionStore, path: str, sid: str, built: Built, found: Difference
) -> Written:
    if found.foreign is not None:  # not read from the log: someone's own
        raise _conflict(
            f"session `{sid}` was continued after its import (message {found.foreign} was not "
            f"read from {path}), so the new lines of the log cannot be added to it",
        )
    if found.same < found.length:
        store.rewind(sid, found.same, reason=_REWOUND)
    inject(store, path, sid, built, found.same)
    return Written(appended=len(built.kept) - found.same, replaced=found.length - found.same)


def _check_unchanging(
    now: dict[str, Any], built: Built, options: dict[str, Any], ids: dict[str, str]
) -> None:
    """Refuse what an earlier session would have to change and cannot: the session it was
    forked from and where, what spawned it, its system prompt."""
    sid = ids[built.key]
    if built.fork_of is not None:
        parent, keep = ids[built.fork_of[0]], built.fork_of[1]
        if (now.get("parent_id"), now.get("branched_at_event_index")) != (parent, keep):
            raise _conflict(
                f"the log grew, and branch `{sid}` now leaves `{parent}` after {keep} messages "
                f"(`{now.get('parent_id')}` after {now.get('branched_at_event_index')} before)"
            )
        return
    for name, what in (
        ("parent_spawn_ref", "what spawned it"),
        ("system_prompt", "its system prompt"),
    ):
        if now.get(name) != options[name]:
            raise _conflict(
                f"the log grew, and session `{sid}` would change {what} ({name}: "
                f"{now.get(name)!r} before, {options[name]!r} now)",
            )


def rewritten(path: str, sid: str, held: dict[str, Any]) -> str:
    return (
        f"{path} was rewritten since session `{sid}` was imported from it: its first "
        f"{held.get('bytes')!r} bytes are not the ones imported (blake3 "
        f"{str(held.get('blake3'))[:16]}...), so it is not that log grown by appended lines"
    )


def _conflict(problem: str) -> AgentLogConflictError:
    return AgentLogConflictError(f"{_VERB}: {problem}; nothing was written")
