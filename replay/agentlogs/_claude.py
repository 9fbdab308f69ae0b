"""Claude Code session logs (`~/.claude/projects/<project>/<session>.jsonl`) into sessions.

Each line is one record: `user` and `assistant` records carry an Anthropic Messages `message`,
linked by `uuid`/`parentUuid`. Streamed assistant records sharing one `message.id` become one
message; `tool_result` blocks become `tool` messages paired with their `tool_use` by id.
Sidechain records (`isSidechain`, a subagent's conversation) become child sessions, each linked to
the parent's `Task` call that spawned it. A prompt edited and sent again names an earlier record
as its parent: the path to the last record is the session, each abandoned branch a fork of it
(as pi's tree: `_pi_tree`); a record written twice (the same `uuid`) is read once. A compaction
(its `compact_boundary` and the compact summary after it) is a context checkpoint. `summary`,
`isMeta`, other `system` and file-history records are kept as attached metadata. It reads and
builds; it never writes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from replay.agentlogs import _checkpoints
from replay.agentlogs._branches import Forking, read_as_tree
from replay.agentlogs._common import (
    Built,
    Message,
    Parsed,
    Record,
    Source,
    function_call,
    json_lines,
    shape_checked,
    text_of,
    text_or,
    token_counts,
)
from replay.agentlogs._content import content_of
from replay.agentlogs._pi_tree import Branches, Entry
from replay.agentlogs._sniff import first_record

NAME = "claude-code"
_AGENT_ID = re.compile(r"\bagent_?[iI]d: ([\w@.-]+)")
_MAIN = "main"
_KNOWN = frozenset(
    ("user", "assistant", "summary", "system", "file-history-snapshot", "queue-operation")
)
_FIELDS = frozenset(
    (
        "type",
        "uuid",
        "parentUuid",
        "logicalParentUuid",
        "isSidechain",
        "userType",
        "cwd",
        "sessionId",
        "version",
        "gitBranch",
        "slug",
        "agentId",
        "message",
        "timestamp",
        "requestId",
        "toolUseResult",
        "isMeta",
        "isCompactSummary",
        "compactMetadata",
        "isApiErrorMessage",
        "thinkingMetadata",
        "todos",
        "summary",
        "leafUuid",
        "subtype",
        "content",
        "level",
        "toolUseID",
        "messageId",
        "snapshot",
        "isSnapshotUpdate",
        "operation",
        "isVisibleInTranscriptOnly",
    )
)
"""The top-level fields of Claude Code's records; others are counted as unknown."""
_SPAWNING_TOOLS = frozenset(("Task", "Agent"))
_WRITING_TOOLS = {
    "Write": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "NotebookEdit": "notebook_path",
}


def looks_like(record: Record) -> bool:
    """Whether a first record is Claude Code's: a message record with its session id and uuid,
    a `summary` naming its leaf, or a file-history snapshot."""
    kind = record.get("type")
    if kind in ("user", "assistant", "system"):
        return "uuid" in record and "sessionId" in record
    if kind == "summary":
        return "leafUuid" in record
    return kind == "file-history-snapshot" and "messageId" in record


@shape_checked
def parse(source: Source) -> Parsed:
    """The file's sessions. A file whose main records form one line is read once; a tree
    (`parentUuid` of an edited prompt naming an earlier record) is read again, each record
    into its branch's session, and must read the same bytes again, no more."""
    return read_as_tree(source, lambda tree, entries: _read(source, _Reader(source, tree, entries)))


def _read(source: Source, reader: _Reader) -> Parsed:
    source.held = reader.held_bytes
    for line, record in json_lines(source):
        reader.record(line, record)
    return reader.finish()


class _Reader:
    def __init__(self, source: Source, tree: Branches | None, entries: list[Entry]) -> None:
        self.source = source
        self.main = Built(_MAIN, source)
        self.forking = None if tree is None else Forking(tree, self.main, source)
        self.sessions: dict[str, Built] = {_MAIN: self.main}
        if self.forking is not None:
            self.sessions = dict(self.forking.sessions)
        self.entries = entries  # the tree of the main records, on the first reading
        self.sidechains = 0
        self.sidechain_of: dict[str, str] = {}  # uuid of a sidechain record -> its session key
        self.held_id: dict[str, object] = {}  # session key -> message.id of its held message
        self.tasks: list[tuple[str, object]] = []  # (call id, prompt) of the main session's spawns
        self.task_ids: set[object] = set()
        self.agents: dict[str, str] = {}  # call id of a spawn -> the agent id its result names
        self.records = 0
        self.main_records = 0
        self.taken: dict[str, str] = {}  # uuid of each record read -> its session's key
        self.about: dict[str, Any] = {}
        self.looked_for = [
            ("version", "version"),
            ("sessionId", "session_id"),
            ("cwd", "cwd"),
            ("agentId", "agent_id"),
        ]

    def held_bytes(self) -> int:
        if len(self.sessions) == 1:
            return self.main.held_bytes()
        return sum(built.held_bytes() for built in self.sessions.values())

    def record(self, line: int, record: Record) -> None:
        self.records += 1
        if self.looked_for:  # what the file says about itself, from the first record saying it
            for key, name in list(self.looked_for):
                if isinstance(record.get(key), str):
                    self.about[name] = record[key]
                    self.looked_for.remove((key, name))
        uuid = record.get("uuid")
        if isinstance(uuid, str) and uuid in self.taken:
            # Claude Code writes a record again on resume: it is kept, but read once.
            built = self.sessions[self.taken[uuid]]
            built.counts["duplicate_records"] += 1
            built.attach(line, record)
            return
        built = self._session_of(line, record)
        if isinstance(uuid, str):
            self.taken[uuid] = built.key
            if record.get("isSidechain") is not True:
                self._entry(line, record, uuid)
        built.check_fields(record, _FIELDS)
        kind = record.get("type")
        message = record.get("message")
        if kind == "assistant" and isinstance(message, dict):
            self._assistant(built, line, record, message)
        elif kind == "user" and isinstance(message, dict) and record.get("isMeta") is not True:
            self._user(built, line, record, message)
        elif kind == "system" and record.get("subtype") == "compact_boundary":
            _checkpoints.boundary(built, line, record)
        else:
            if kind == "summary" and isinstance(record.get("summary"), str):
                built.title = built.title or record["summary"]
                built.counts["summaries"] += 1
            elif record.get("isMeta") is True:
                built.counts["meta_records"] += 1
            built.attach(line, record, known=isinstance(kind, str) and kind in _KNOWN)
        if self.forking is not None:
            self.forking.read(line, built)

    def _entry(self, line: int, record: Record, uuid: str) -> None:
        """Note a main record in the tree. Only an edited prompt (a user record that is no
        tool result) and a compaction boundary (`logicalParentUuid`) branch off where their
        parent link says; every other record follows the one before it in the file, as Claude
        Code writes them (parallel tool results name each its own call's record)."""
        parent = record.get("parentUuid")
        if record.get("subtype") == "compact_boundary" and parent is None:
            parent = record.get("logicalParentUuid")
        if _prompt(record) and (parent is None or self.taken.get(parent) == _MAIN):
            self.entries.append(Entry(line, uuid, parent))
        else:
            self.entries.append(Entry(line, uuid))

    def _session_of(self, line: int, record: Record) -> Built:
        if record.get("isSidechain") is not True:
            self.main_records += 1
            return self.main if self.forking is None else self.forking.session_of(line)
        parent = record.get("parentUuid")
        key = self.sidechain_of.get(parent) if isinstance(parent, str) else None
        if key is None:  # a sidechain's root: a new subagent conversation
            self.sidechains += 1
            key = f"sidechain-{self.sidechains}"
            self.sessions[key] = Built(key, self.source)
        uuid = record.get("uuid")
        if isinstance(uuid, str):
            self.sidechain_of[uuid] = key
        return self.sessions[key]

    def _assistant(self, built: Built, line: int, record: Record, message: Record) -> None:
        message_id = message.get("id")
        held = built.held
        same = (
            held is not None
            and held["role"] == "assistant"
            and message_id is not None
            and self.held_id.get(built.key) == message_id
        )
        if same:
            target = built.merge(line, record)
        else:
            target = built.add({"role": "assistant"}, line, record)
            self.held_id[built.key] = message_id
        if isinstance(message.get("model"), str):
            target["model"] = message["model"]
            if message["model"] not in built.models:
                built.models.append(message["model"])
        usage = message.get("usage")
        if isinstance(usage, dict):
            target["usage"] = _usage(usage)
        if message.get("stop_reason") is not None:
            target["metadata"]["stop_reason"] = message["stop_reason"]
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in blocks if isinstance(blocks, list) else []:
            self._assistant_block(built, target, block)

    def _assistant_block(self, built: Built, target: Message, block: object) -> None:
        if not isinstance(block, dict):
            target["metadata"].setdefault("other_blocks", []).append(block)
            return
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            before = target.get("content")
            target["content"] = block["text"] if not before else f"{before}\n\n{block['text']}"
        elif kind in ("thinking", "redacted_thinking"):
            target["metadata"].setdefault("reasoning", []).append(block)
        elif kind == "tool_use" and block.get("id") in _call_ids(target):
            built.counts["duplicate_tool_calls"] += 1  # its record is kept; the call made once
        elif kind == "tool_use" and isinstance(block.get("id"), str):
            name = text_or(block.get("name"), "unknown")
            call = function_call(block["id"], name, block.get("input", {}))
            target.setdefault("tool_calls", []).append(call)
            built.call(call)
            spec = block.get("input")
            if name in _WRITING_TOOLS and isinstance(spec, dict):
                built.wrote(spec.get(_WRITING_TOOLS[name]))
            if built is self.main and name in _SPAWNING_TOOLS:
                self.tasks.append(
                    (block["id"], spec.get("prompt") if isinstance(spec, dict) else None)
                )
                self.task_ids.add(block["id"])
        else:
            target["metadata"].setdefault("other_blocks", []).append(block)

    def _user(self, built: Built, line: int, record: Record, message: Record) -> None:
        content = message.get("content")
        if record.get("isCompactSummary") is True:  # what the request after a compaction began
            _checkpoints.summary(built, content_of(built.counts, content), line, record)
            self.held_id.pop(built.key, None)  # no later record merges into the summary
            return
        blocks = content if isinstance(content, list) else []
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        rest = [b for b in blocks if not (isinstance(b, dict) and b.get("type") == "tool_result")]
        carried: Record | None = record
        for block in results:
            call_id = block.get("tool_use_id")
            if built is self.main and isinstance(call_id, str) and call_id in self.task_ids:
                agent = _spawned_agent(record, block)
                if agent is not None and isinstance(call_id, str):
                    self.agents[call_id] = agent
            answered = built.result(call_id)
            inner = block.get("content")
            tool: Message = {
                "role": "tool",
                "tool_call_id": call_id if isinstance(call_id, str) else None,
                "content": content_of(built.counts, inner),
            }
            added = built.add(tool, line, carried)
            carried = None  # one record, several results: the first result carries it
            if block.get("is_error") is True:
                added["metadata"]["is_error"] = True
                built.counts["error_results"] += 1
            if not answered:
                added["metadata"]["orphan_result"] = True
        if isinstance(content, str) or rest or not results:
            kept = content if isinstance(content, str) else rest
            user: Message = {"role": "user", "content": content_of(built.counts, kept)}
            built.add(user, line, carried)

    def finish(self) -> Parsed:
        forks = [] if self.forking is None else self.forking.forks()
        children = [built for built in self.sessions.values() if built.key.startswith("sidechain-")]
        if children and not self.main_records:
            return self._subagent_file(children)
        for fork in forks:
            fork.title = fork.title or fork.first_prompt
            fork.finish()
        self.main.counts["branches"] = len(forks)
        unused = list(self.tasks)
        for child in children:
            child.title = child.first_prompt
            child.finish()
            match = next((t for t in unused if t[1] == child.first_prompt), None)
            match = match or (unused[0] if unused else None)
            child.spawn_ref = {"session": _MAIN, "kind": "subagent"}
            if match is not None:
                unused.remove(match)
                child.spawn_ref["tool_call_id"] = match[0]
        self.main.counts["sidechain_sessions"] = len(children)
        self.main.title = self.main.title or self.main.first_prompt
        self.main.finish()
        return Parsed(
            sessions=[self.main, *forks, *children],
            tool_version=self.about.get("version"),
            source_session_id=self.about.get("session_id"),
            records=self.records,
            extra={"cwd": self.about.get("cwd")},
            spawns=[(call, prompt, self.agents.get(call)) for call, prompt in self.tasks],
        )

    def _subagent_file(self, children: list[Built]) -> Parsed:
        """A file holding only sidechain records: a subagent's conversation that newer versions
        write to a file of its own (`agent-<id>.jsonl`). It becomes the file's session (no empty
        parent), noting the parent's source session id and the agent id."""
        for child in children:
            child.title = child.first_prompt
            child.info["subagent_of"] = {
                "source_session_id": self.about.get("session_id"),
                "agent_id": self.about.get("agent_id"),
            }
            child.finish()
        return Parsed(
            sessions=children,
            tool_version=self.about.get("version"),
            source_session_id=self.about.get("session_id"),
            records=self.records,
            extra={"cwd": self.about.get("cwd")},
        )


def _prompt(record: Record) -> bool:
    """Whether a record is a prompt: a user message that answers no tool call."""
    message = record.get("message")
    if record.get("type") != "user" or not isinstance(message, dict):
        return False
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    return not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks)


def _call_ids(message: Message) -> list[object]:
    return [call.get("id") for call in message.get("tool_calls") or ()]


_USAGE = (
    ("input_tokens", "input_tokens"),
    ("output_tokens", "output_tokens"),
    ("cache_read_input_tokens", "cache_read_tokens"),
    ("cache_creation_input_tokens", "cache_write_tokens"),
)


def _usage(usage: Record) -> dict[str, int]:
    """Every count of `_USAGE`: one the record lacks, or holds as something else, is 0."""
    return {name: 0 for _, name in _USAGE} | token_counts(usage, _USAGE)


def _spawned_agent(record: Record, block: Record) -> str | None:
    """The agent id a spawning call's result names: `toolUseResult.agentId`, else the
    `agentId: ...` line the tool writes into the result's text."""
    result = record.get("toolUseResult")
    if isinstance(result, dict) and isinstance(result.get("agentId"), str):
        return str(result["agentId"])
    found = _AGENT_ID.search(text_of(block.get("content")) or "")
    return found.group(1) if found else None


def subagent_files(path: str, source_session_id: str | None) -> list[str]:
    """The files holding this session's subagents' conversations, where Claude Code writes
    them: `<session id>/subagents/agent-*.jsonl` beside the session's file (newer versions) or
    `agent-*.jsonl` in the same folder (older ones); each kept only when its first record names
    this session (`sessionId`) as its own."""
    if source_session_id is None:
        return []
    folder = os.path.dirname(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    found = []
    for place in (os.path.join(folder, stem, "subagents"), folder):
        try:
            names = sorted(os.listdir(place))
        except OSError:
            continue
        for name in names:
            candidate = os.path.join(place, name)
            if (
                name.startswith("agent-")
                and name.endswith(".jsonl")
                and candidate != path
                and _session_of_file(candidate) == source_session_id
            ):
                found.append(candidate)
    return found


def _session_of_file(path: str) -> object:
    """The `sessionId` of the first record of a file when it is a sidechain's (else None): the
    first line is read whole, as long as a subagent's first prompt makes it."""
    record = first_record(path)
    if record is not None and record.get("isSidechain") is True:
        return record.get("sessionId")
    return None


def add_subagent_files(parsed: Parsed, path: str, read: Callable[[str], Source]) -> None:
    """Read the subagent files of the session `parsed` holds (`subagent_files`) into child
    sessions of it, each spawned by the `Task` call whose result names its agent id (else whose
    prompt is its first message), and note the files in `parsed.files`. `read(path)` makes the
    `Source` of a file (so a damaged line is reported in that file, and nothing is written)."""
    if not parsed.sessions or parsed.sessions[0].key != _MAIN:
        return  # a subagent's own file, or a file without a main conversation
    used: set[str] = set()
    for file in subagent_files(path, parsed.source_session_id):
        source = read(file)
        own = parse(source)
        if own.sessions and own.sessions[0].key == _MAIN:
            continue  # not only sidechain records after all: not a subagent's file
        stem = os.path.splitext(os.path.basename(file))[0]
        keys = {built.key for built in parsed.sessions}
        for index, child in enumerate(own.sessions):
            child.key = stem if index == 0 else f"{stem}.{index}"
            while child.key in keys:  # the same agent's file in both places
                child.key += "+"
            agent = (child.info.get("subagent_of") or {}).get("agent_id")
            call = _spawning_call(parsed.spawns, used, agent, child.first_prompt)
            child.spawn_ref = {"session": _MAIN, "kind": "subagent"}
            if call is not None:
                used.add(call)
                child.spawn_ref["tool_call_id"] = call
            child.info.update(
                file=os.path.basename(file),
                blake3=source.digest.hexdigest(),
                bytes=source.size,
                records=own.records,
            )
            if source.skipped:
                child.info["skipped_lines"] = [[line, why] for line, why in source.skipped]
            parsed.sessions.append(child)
        parsed.files.append(file)
    parsed.sessions[0].counts["subagent_files"] = len(parsed.files)


def _spawning_call(
    spawns: list[tuple[str, object, str | None]], used: set[str], agent: object, prompt: object
) -> str | None:
    free = [spawn for spawn in spawns if spawn[0] not in used]
    for call, _, named in free:
        if agent is not None and named == agent:
            return call
    for call, asked, _ in free:
        if prompt is not None and asked == prompt:
            return call
    return None
