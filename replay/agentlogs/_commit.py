"""The commit of one file's sessions: finding an earlier import of the same log under the ids
the file may have, and writing the sessions (made, found unchanged, or brought up to date) in one
transaction, so a refused file leaves nothing. The slow reads are done before the transaction
opens, the file's prefixes hashed and the stored messages compared; inside, only what the store
holds is looked up. It never parses a file, and writes nothing outside the transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from replay import _limits
from replay.agentlogs._common import KIND, Built, Parsed
from replay.agentlogs._write import (
    AgentLogConflictError,
    Compared,
    NotComparedError,
    Prefixes,
    PrefixNotHashedError,
    Written,
    create,
    grown_from,
    read_before,
    rewritten,
    update,
)
from sessions import SessionStore

_VERB = "import_agent_log"


def _ids(parsed: Parsed, main_id: str) -> dict[str, str]:
    return {
        built.key: main_id if index == 0 else f"{main_id}.{built.key}"
        for index, built in enumerate(parsed.sessions)
    }


def _held(store: SessionStore, sid: str) -> dict[str, Any] | None:
    """The `agent_log` metadata of the session `sid` (empty when it was not imported); None
    when there is no such session."""
    if not store.exists(sid):
        return None
    summary = store.summary(sid) or {}
    held = (summary.get("metadata") or {}).get("agent_log")
    return held if isinstance(held, dict) and held.get("kind") == KIND else {}


def commit(
    store: SessionStore,
    path: str,
    parsed: Parsed,
    about: dict[str, Any],
    lines: bool,
    session_id: str | None,
    first: str | None,
) -> tuple[dict[str, str], dict[str, Written], bool]:
    """Write every session of the file in one transaction: the ids, what was written into
    each (nothing when the file is there already), and whether an earlier import of the log,
    grown since, was brought up to date (only a log of a line format, `lines`, grows).
    `first`: the digest of a JSONL log's first line (None for a document), which names a log
    when no `session_id` is given. Before the transaction opens, the prefixes of the files the earlier
    import read are hashed, and the messages of the sessions it would bring up to date compared
    with the fresh reading; when what the store holds changed meanwhile, that is done again and
    the import tried again (`_limits.agent_log_prefix_tries_max`)."""
    prefixes, compared, tries = Prefixes(), Compared(), 1
    missed: list[tuple[str, object]] = []
    while True:
        earlier = list(_earlier(store, parsed, about, session_id, first) if lines else ())
        prefixes.hash([*_prefixes_wanted(store, path, parsed, about, earlier), *missed])
        compared.read(store, _sessions_wanted(path, parsed, about, earlier, prefixes))
        prefixes.inside = compared.inside = tries >= _limits.agent_log_prefix_tries_max
        try:
            with store.transaction():
                return _commit_in(
                    store, path, parsed, about, lines, session_id, first, prefixes, compared
                )
        except PrefixNotHashedError as exc:  # the transaction wrote nothing
            missed.append((exc.path, exc.size))
        except NotComparedError:  # nor here: the session is compared again as it is now
            pass
        tries += 1


def _imported_whole(
    store: SessionStore, about: dict[str, Any], session_id: str | None
) -> str | None:
    """The id under which this very file was imported whole, by the id every import took before
    first-line ids (the digest of the whole file), when no `session_id` is given; else None."""
    whole = f"{about['format']}-{about['blake3'][:32]}"
    if session_id is None and (_held(store, whole) or {}).get("blake3") == about["blake3"]:
        return whole
    return None


def _slots(about: dict[str, Any], session_id: str | None, first: str | None) -> list[str]:
    """The session ids the main session of the file may have, in the order they are tried."""
    name = about["format"]
    if session_id is not None:
        return [session_id]
    if first is None:  # a document, rewritten whole; or a log whose first line is not complete yet
        return [f"{name}-{about['blake3'][:32]}"]
    head = f"{name}-{first[:32]}"
    count = _limits.agent_log_first_line_slots_max
    return [head, *(f"{head}-{n}" for n in range(2, count + 1))]


def _earlier(
    store: SessionStore,
    parsed: Parsed,
    about: dict[str, Any],
    session_id: str | None,
    first: str | None,
) -> Iterator[tuple[dict[str, str], dict[str, Any]]]:
    """The earlier imports of a line-format log in its format that `_commit_in` would compare
    this one with, as the store holds them now, found by lookups alone: each with the ids of its
    sessions, under each id the import would try until one is free, holds this very import, or
    was read from a file of this name."""
    name, digest = about["format"], about["blake3"]
    if _imported_whole(store, about, session_id) is not None:
        return
    for slot in _slots(about, session_id, first):
        ids, held = _ids(parsed, slot), _held(store, slot)
        if held is None or (
            held.get("blake3") == digest and _unchanged(store, parsed, ids, digest)
        ):
            return
        if held.get("format") == name:
            yield ids, held
        if held.get("file") == about["file"]:
            return  # `_commit_in` stops here too: brought up to date, or refused


def _prefixes_wanted(
    store: SessionStore,
    path: str,
    parsed: Parsed,
    about: dict[str, Any],
    earlier: list[tuple[dict[str, str], dict[str, Any]]],
) -> Iterator[tuple[str, object]]:
    """The file prefixes `_commit_in` would compare with the `earlier` imports: of the log, what
    each read (and what this one read, when that one read more); of each subagent's file, what
    the import of its session read, if that changed."""
    for ids, held in earlier:
        yield path, held.get("bytes")
        if _longer(held, about):
            yield path, about["bytes"]
        for built in parsed.sessions:
            own = _held(store, ids[built.key]) or {}
            if built.path != path and own.get("blake3") != built.info.get(
                "blake3", about["blake3"]
            ):
                yield built.path, own.get("bytes")


def _sessions_wanted(
    path: str,
    parsed: Parsed,
    about: dict[str, Any],
    earlier: list[tuple[dict[str, str], dict[str, Any]]],
    prefixes: Prefixes,
) -> Iterator[tuple[str, Built]]:
    """The sessions `_commit_in` would bring up to date, each with its fresh reading: those of
    the first of the `earlier` imports whose bytes the log, as hashed, begins with."""
    for ids, held in earlier:
        if grown_from(prefixes, path, held, about["bytes"], known=True):
            yield from ((ids[built.key], built) for built in parsed.sessions)
            return


def _longer(held: dict[str, Any], about: dict[str, Any]) -> bool:
    before = held.get("bytes")
    return type(before) is int and before > about["bytes"]


def _commit_in(
    store: SessionStore,
    path: str,
    parsed: Parsed,
    about: dict[str, Any],
    lines: bool,
    session_id: str | None,
    first: str | None,
    prefixes: Prefixes,
    compared: Compared,
) -> tuple[dict[str, str], dict[str, Written], bool]:
    """`commit`'s work inside its transaction: the files' prefixes are compared by their
    digests in `prefixes`, never read, and sessions' messages by what `compared` found."""
    name, digest = about["format"], about["blake3"]
    whole = _imported_whole(store, about, session_id)
    if whole is not None:
        return _ids(parsed, whole), {}, False
    slots = _slots(about, session_id, first)
    for slot in slots:
        ids, held = _ids(parsed, slot), _held(store, slot)
        if held is None:
            made = {ids[b.key]: create(store, path, b, ids, about) for b in parsed.sessions}
            return ids, made, False
        if held.get("blake3") == digest and _unchanged(store, parsed, ids, digest):
            return ids, {}, False
        same = lines and held.get("format") == name
        if same and grown_from(prefixes, path, held, about["bytes"]):
            return ids, update(store, path, parsed, ids, about, prefixes, compared), True
        if same and read_before(prefixes, path, held, about):
            return ids, {}, False  # another import, of more of the log, came first
        if session_id is not None or first is None or held.get("file") == about["file"]:
            problem = f"session `{slot}` already exists and was not imported from this file"
            problem += f" ({path})"
            if lines and held.get("file") == about["file"]:
                problem = rewritten(path, slot, held)
            raise AgentLogConflictError(f"{_VERB}: {problem}; give another session id")
    raise AgentLogConflictError(
        f"{_VERB}: {len(slots)} other logs share the first line of {path}, each imported "
        f"under the session id it would take (`{slots[0]}` and on); give it a session id"
    )


def _unchanged(store: SessionStore, parsed: Parsed, ids: dict[str, str], digest: str) -> bool:
    """Whether every session the file reads into was imported from the files as they are now:
    a subagent's file can grow, or appear, while the session's own file is unchanged."""
    for built in parsed.sessions:
        held = _held(store, ids[built.key])
        if not held or held.get("blake3") != built.info.get("blake3", digest):
            return False
    return True
