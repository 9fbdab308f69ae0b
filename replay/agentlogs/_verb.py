"""`import_agent_log`: agents' own logs (a file, or a folder of them) into sessions.

Owns the options, the choice of format (`auto` looks at the content, never the name), and the
commit: one transaction per file (its session and any subagent sessions; `_commit.commit`), so
a refused file leaves nothing. The default session id of a line-format log is derived from its
first line, which appending never changes, so importing it again finds the earlier import:
unchanged, it writes nothing; grown, `_write.update` brings it up to date. A document's is
derived from its blake3.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from blake3 import blake3

from replay import _limits
from replay.agentlogs import _claude, _codex, _gemini, _openai, _pi
from replay.agentlogs._commit import commit as _commit
from replay.agentlogs._common import (
    KIND,
    AgentLogError,
    NotAnAgentLogError,
    Parsed,
    Progress,
    Source,
    insert_kept_texts,
    json_document,
    restored_records,
)
from replay.agentlogs._decode import unfinished_json
from replay.agentlogs._sniff import sniff, whole_document
from replay.agentlogs._write import Written
from sessions import InvalidArgumentError, SessionStore
from sessions._collector import collector_paused

_VERB = "import_agent_log"
_LINE_FORMATS: tuple[ModuleType, ...] = (_claude, _codex, _pi)
_DOCUMENT_FORMATS: tuple[ModuleType, ...] = (_gemini, _openai)
FORMATS: tuple[str, ...] = tuple(m.NAME for m in (*_LINE_FORMATS, *_DOCUMENT_FORMATS))
"""The formats `import_agent_log` reads, by the names its `format` option takes."""
_BY_NAME = {m.NAME: m for m in (*_LINE_FORMATS, *_DOCUMENT_FORMATS)}
_OPTIONS = frozenset(("skip_bad_lines", "recursive"))
_SUFFIXES = (".jsonl", ".json", ".traj")
_BOM = b"\xef\xbb\xbf"
_NOTHING = Written(appended=0)


@dataclass(frozen=True, slots=True)
class ImportedSession:
    """One session an import created, brought up to date (its log grew since an earlier
    import), or found already there (`written` false). `messages` is its length now;
    `appended` how many messages this import added to it, of which `replaced` took the place
    of as many an earlier import had stored (rewound, as lines appended since changed them: the
    records after the last message, a streamed part of it, the answer to its call)."""

    session_id: str
    parent_id: str | None
    messages: int
    roles: Mapping[str, int]
    counts: Mapping[str, int]
    written: bool
    appended: int = 0
    replaced: int = 0


@dataclass(frozen=True, slots=True)
class ImportedFile:
    """What one file became: its format (and whether `auto` chose it), its sessions, the lines
    skipped as damaged (with `skip_bad_lines`), its digest (of the lines read), whether it
    `updated` the sessions of an earlier import of the same log, which has grown by appended
    lines since, and the last line left for the next import as not yet complete. A file with
    no complete line yet but blank ones, whose content is not whole JSON either (empty, or a
    log whose first line is being written), has nothing to import yet: no `sessions`, and the
    `format` asked for (`auto` too: there is nothing to tell it from)."""

    path: str
    format: str
    detected: bool
    sessions: tuple[ImportedSession, ...]
    records: int
    blake3: str
    skipped_lines: tuple[tuple[int, str], ...] = ()
    subagent_files: tuple[str, ...] = ()  # subagents' own files, imported with it
    updated: bool = False
    pending_tail_bytes: int = 0
    """The bytes of the file's last line, which had no line break yet (its agent was writing
    it): left out of this import, of `blake3` and of the bytes the session keeps, and read by
    the next import once complete. A log with no complete line yet has no `sessions`; nor has
    an empty file, where this is 0."""

    @property
    def written(self) -> bool:
        return any(s.written for s in self.sessions)


@dataclass(frozen=True, slots=True)
class AgentLogImport:
    """The result of `import_agent_log`: every file imported, and the files of a folder that
    were not agent logs, or not readable regular files (left alone)."""

    files: tuple[ImportedFile, ...] = ()
    not_agent_logs: tuple[str, ...] = field(default=())

    @property
    def session_ids(self) -> list[str]:
        return [s.session_id for f in self.files for s in f.sessions]


def import_agent_log(
    store: SessionStore,
    path: str | os.PathLike[str],
    *,
    format: str = "auto",
    session_id: str | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> AgentLogImport:
    """Import the agent log at `path` (a file, or a folder of logs) into `store`.

    `format` is one of `FORMATS` or `auto` (chosen from the content; `ImportedFile.detected` says
    so). `session_id` names the main session of a single file (subagent sessions get it with a
    suffix); by default it is derived from the first line of a JSONL log (from the whole file's
    blake3 for a JSON document), so a second import of the same file writes nothing, and one of
    a grown log brings the earlier import up to date (`ImportedFile.updated`); a log rewritten
    since raises `AgentLogConflictError`, writing nothing; a last line with no line break yet,
    or a file with no complete line at all (empty, its first line being written), waits for the
    next import (`ImportedFile.pending_tail_bytes`). Options: `skip_bad_lines` (keep going past
    damaged lines, reporting each), `recursive` (descend into subfolders). A damaged line, a file
    past a bound or a refused message raises `AgentLogError` naming file:line; that file writes
    nothing. In a folder, files before it stay imported; files that are not agent logs are
    listed in `not_agent_logs`, as are entries named like logs that are not readable regular
    files. `progress(bytes_read, file_bytes)` follows the reading of each file.
    """
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise InvalidArgumentError(
            f"{_VERB}: unknown option {', '.join(map(repr, unknown))} "
            f"(expected one of: {', '.join(sorted(_OPTIONS))})"
        )
    flags = {name: options.get(name, False) for name in _OPTIONS}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"{_VERB}: option `{name}` must be a bool, got {value!r}")
    if format != "auto" and format not in _BY_NAME:
        raise InvalidArgumentError(
            f"{_VERB}: unknown format {format!r} (expected auto or one of {', '.join(FORMATS)})"
        )
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"{_VERB}: path must be a str or path, got {type(path).__name__}"
        )
    shown = os.fspath(path)
    if not isinstance(shown, str):
        raise InvalidArgumentError(f"{_VERB}: path must be a str path, got {shown!r}")
    if not os.path.isdir(shown):
        one = _import_file(store, shown, format, session_id, progress, flags["skip_bad_lines"])
        return AgentLogImport(files=(one,))
    if session_id is not None:
        raise InvalidArgumentError(f"{_VERB}: `session_id` names one session; {shown} is a folder")
    done: list[ImportedFile] = []
    others: list[str] = []
    names = list(_log_files(shown, flags["recursive"], others))
    # A subagent's file is read with its session's file, so it comes after all the others.
    names.sort(key=lambda name: os.path.basename(name).startswith("agent-"))
    taken: set[str] = set()
    for name in names:
        if name in taken:
            continue
        try:
            one = _import_file(store, name, format, None, progress, flags["skip_bad_lines"])
        except NotAnAgentLogError:
            if format != "auto":
                raise
            others.append(name)
            continue
        done.append(one)
        taken.update(one.subagent_files)
    return AgentLogImport(files=tuple(done), not_agent_logs=tuple(others))


def _log_files(folder: str, recursive: bool, others: list[str]) -> Iterator[str]:
    """The logs of `folder` by their names; an entry so named that is not a readable regular
    file (a dangling link, a pipe, a file without read permission) goes into `others`."""
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(_SUFFIXES) and not name.startswith("."):
                path = os.path.join(root, name)
                if os.path.isfile(path) and os.access(path, os.R_OK):
                    yield path
                else:
                    others.append(path)
        if not recursive:
            return


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of the log at `path`, from its content, as `import_agent_log` chooses it under
    `auto`; `AgentLogError` if none fits, or if the file has no complete line yet (empty, or its
    first line being written: nothing in it tells a format)."""
    shown = os.fspath(path)
    if _not_begun(shown) is not None:
        raise AgentLogError(shown, None, "no complete line yet: nothing tells its format")
    found = _detected(shown)
    if found != "document":
        return found
    return _document_format(shown, json_document(Source(shown)))


def _detected(path: str) -> str:
    """`auto`'s choice from the first lines: the line format a record of them looks like, or
    `document` for a file that may be one JSON document (its reading tells which, or that it
    is none, or where it is damaged); `NotAnAgentLogError` for any other file, JSON lines of
    another kind included."""
    found = sniff(path, _LINE_FORMATS)
    if found.name is not None:
        return found.name
    if found.json and not found.lines:
        return "document"
    raise NotAnAgentLogError(
        path, None, f"not an agent log this version reads ({', '.join(FORMATS)})"
    )


def _check_named(path: str, module: ModuleType) -> None:
    """Refuse (`NotAnAgentLogError`) a file its first lines say is not a log of the line format
    `module`: JSON lines or one JSON document of which no record looks like one, or no JSON.
    A file begun as JSON whose first line does not decode is read as that log, which reports
    the damaged line as `auto` does."""
    found = sniff(path, (module,))
    if found.name is not None:
        return
    if found.json and not found.lines and not whole_document(path):
        return
    raise NotAnAgentLogError(path, None, f"not a log of format {module.NAME}")


def _document_format(path: str, document: Any) -> str:
    for module in _DOCUMENT_FORMATS:
        if module.looks_like_document(document):
            return str(module.NAME)
    raise NotAnAgentLogError(
        path, None, f"a JSON document, but not an agent log ({', '.join(FORMATS)})"
    )


def _parse(source: Source, format: str) -> tuple[str, bool, Parsed]:
    name = format
    detected = format == "auto"
    if detected:
        name = _detected(source.path)
    module = _BY_NAME.get(name)
    if module is not None and module in _LINE_FORMATS:
        if not detected:  # as a document is checked
            _check_named(source.path, module)
        return name, detected, module.parse(source)
    document = json_document(source)
    if detected:
        name = _document_format(source.path, document)
    elif not _BY_NAME[name].looks_like_document(document):
        raise NotAnAgentLogError(source.path, None, f"not a log of format {name}")
    return name, detected, _BY_NAME[name].parse_document(source, document)


@collector_paused()  # reading and committing build nothing it would free, but it walks them
def _import_file(
    store: SessionStore,
    path: str,
    format: str,
    session_id: str | None,
    progress: Progress | None,
    skip_bad_lines: bool,
) -> ImportedFile:
    begun = _not_begun(path)
    if begun is not None:  # nothing to read a format, or a record, from yet
        return _nothing_yet(path, format, False, *begun)
    source = Source(path, skip_bad_lines=skip_bad_lines, progress=progress)
    name, detected, parsed = _parse(source, format)
    source.document_bytes = b""  # read: what is kept of it is packed
    if not parsed.records and source.pending:  # the first record waits for its line break
        digest, skipped = source.digest.hexdigest(), tuple(source.skipped)
        return _nothing_yet(path, name, detected, digest, source.pending, skipped)
    if name == _claude.NAME:
        _claude.add_subagent_files(
            parsed,
            path,
            lambda file: Source(file, skip_bad_lines=skip_bad_lines, progress=progress),
        )
    digest = source.digest.hexdigest()
    about = {
        "kind": KIND,
        "format": name,
        "tool_version": parsed.tool_version,
        "file": os.path.basename(path),
        "blake3": digest,
        "bytes": source.size,
        "records": parsed.records,
        "source_session_id": parsed.source_session_id,
        **{k: v for k, v in parsed.extra.items() if v is not None},
    }
    if source.skipped:
        about["skipped_lines"] = [[line, why] for line, why in source.skipped]
    lines = _BY_NAME[name] in _LINE_FORMATS
    ids, written, updated = _commit(
        store, path, parsed, about, lines, session_id, source.first_line
    )
    main_id = next(iter(ids.values()))
    sessions = tuple(
        ImportedSession(
            session_id=ids[built.key],
            parent_id=None if index == 0 else ids[built.fork_of[0]] if built.fork_of else main_id,
            messages=built.length,
            roles=dict(built.roles),
            counts=dict(built.counts),
            written=ids[built.key] in written,
            appended=written.get(ids[built.key], _NOTHING).appended,
            replaced=written.get(ids[built.key], _NOTHING).replaced,
        )
        for index, built in enumerate(parsed.sessions)
    )
    return ImportedFile(
        path=path,
        format=name,
        detected=detected,
        sessions=sessions,
        records=parsed.records,
        blake3=digest,
        skipped_lines=tuple(source.skipped),
        subagent_files=tuple(parsed.files),
        updated=updated,
        pending_tail_bytes=source.pending,
    )


def _not_begun(path: str) -> tuple[str, int] | None:
    """When the file has no complete line but blank ones, and what follows them is blank too or
    the start of a JSON value not yet whole: the blake3 of those blank lines, and how many bytes
    follow them. Such is a log its agent has just created and is writing the first line of, or
    an empty file: nothing in it tells a format yet, and nothing is damaged. None for any other
    file, whose reading says what it holds."""
    bound, digest, bom = _limits.agent_log_line_bytes_max, blake3(), _BOM
    try:
        with open(path, "rb") as file:
            line = file.readline(bound + 1)
            while line.endswith(b"\n") and line.removeprefix(bom).isspace():
                digest.update(line)
                line, bom = file.readline(bound + 1), b""
    except OSError:  # not readable: the reading reports it
        return None
    text = line.removeprefix(bom).strip()
    if line.endswith(b"\n") or len(line) > bound or text[:1] not in (b"", b"{", b"["):
        return None
    if text and not unfinished_json(text):  # a record waiting for its line break, a
        return None  # document, or damage no writing on can make whole: read, and reported
    return digest.hexdigest(), len(line)


def _nothing_yet(
    path: str,
    name: str,
    detected: bool,
    digest: str,
    pending: int,
    skipped: tuple[tuple[int, str], ...] = (),
) -> ImportedFile:
    """A file read with no complete record in it yet: no sessions, nothing written."""
    return ImportedFile(
        path=path,
        format=name,
        detected=detected,
        sessions=(),
        records=0,
        blake3=digest,
        skipped_lines=skipped,
        pending_tail_bytes=pending,
    )


def agent_log_summary(store: SessionStore, session_id: str) -> dict[str, Any] | None:
    """What an imported session says about its source: format, tool version, models, the first
    user prompt, the files its tool calls wrote, and the counts; None for a session that was not
    imported from an agent log (or does not exist)."""
    snapshot = store.snapshot(session_id)
    about = (snapshot or {}).get("metadata", {}).get("agent_log")
    if not isinstance(about, dict) or about.get("kind") != KIND:
        return None
    keys = ("format", "tool_version", "models", "first_prompt", "files_written", "counts", "roles")
    summary = {key: about.get(key) for key in keys}
    summary.update(session_id=session_id, file=about.get("file"), blake3=about.get("blake3"))
    return summary


def agent_log_records(store: SessionStore, session_id: str) -> dict[int, str]:
    """Every source record an imported session keeps, by line (a JSON document: by index into
    its messages), as its original JSON text: a JSONL log's lines exactly as the file has them,
    so the file can be audited against them (its blake3 is in the session's metadata). Empty
    for a session that was not imported from an agent log; messages added to the session after
    its import hold no record and are passed over."""
    snapshot = store.snapshot(session_id) or {}
    about = (snapshot.get("metadata") or {}).get("agent_log")
    if not isinstance(about, dict) or about.get("kind") != KIND:
        return {}
    found = {item["line"]: item["record"] for item in about.get("attached_records", [])}
    kept_texts: list[tuple[int, int, str]] = []
    for message in snapshot["transcript"]:
        source = (message.get("metadata") or {}).get("source")
        if not isinstance(source, dict):
            continue  # the session's own message, added after the import: no record of the log
        found.update(zip(source["lines"], restored_records(message), strict=False))
        for item in (*source.get("attached", ()), *source.get("attached_after", ())):
            found[item["line"]] = item["record"]
        if "content_in" in source:
            kept_texts.append((source["lines"][0], source["content_in"], message["content"]))
    insert_kept_texts(found, kept_texts)
    return found
