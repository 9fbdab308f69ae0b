"""How the command line draws things: tables, transcripts, ancestry trees, events, a progress bar.

Pure text from plain data (the dicts the library returns); nothing here opens a store or decides
anything about sessions. The demo draws with these too, so both print the same way.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from eventlog import Envelope, to_builtins
from sessionlog import _limits

# Tables


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns padded to their widest cell (each cell cut at `cell_chars_max`), no trailing blanks."""
    cells = [[cut(_text(value), _limits.cell_chars_max) for value in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [headers, ["-" * w for w in widths], *cells]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def pairs(items: Iterable[tuple[str, object]]) -> str:
    """A two-column table of names and values, for one thing's properties."""
    items = list(items)
    width = max((len(name) for name, _ in items), default=0)
    return "\n".join(f"{name.ljust(width)}  {_text(value)}".rstrip() for name, value in items)


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def cut(text: str, limit: int) -> str:
    """`text` on one line, shortened to `limit` characters with an ellipsis when longer."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)] + "…"


def when(iso: str | None) -> str:
    """An ISO timestamp shortened to the second, in UTC, for a table cell."""
    if not iso:
        return "-"
    return iso.replace("T", " ")[:19]


def short_hash(hex_hash: str) -> str:
    return hex_hash[:16]


# Sessions


def session_table(sessions: Sequence[Mapping[str, Any]]) -> str:
    """The `ls` table: id, title, status, messages, last activity."""
    return table(
        ("ID", "TITLE", "STATUS", "MESSAGES", "LAST ACTIVITY"),
        (
            (s["session_id"], s.get("title"), s["status"], s["length"], when(s["last_activity_at"]))
            for s in sessions
        ),
    )


def content_text(content: object) -> str:
    """The readable text of a message's content: a string, or the text of its blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, Mapping) and isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif isinstance(block, Mapping):
                parts.append(f"[{block.get('type', 'block')}]")
            else:
                parts.append(str(block))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, default=str)


def transcript(snapshot: Mapping[str, Any]) -> str:
    """A session for a person to read: a header, then each message with its role."""
    parent = snapshot.get("parent_id")
    fork = snapshot.get("branched_at_event_index")
    header = [
        ("session", snapshot["session_id"]),
        ("title", snapshot.get("title")),
        ("status", snapshot.get("status")),
        ("messages", snapshot.get("length")),
        ("created", when(snapshot.get("created_at"))),
        ("last activity", when(snapshot.get("last_activity_at"))),
    ]
    if parent:
        header.append(("parent", parent if fork is None else f"{parent} (at message {fork})"))
    if snapshot.get("child_ids"):
        header.append(("children", ", ".join(snapshot["child_ids"])))
    if snapshot.get("live_clients"):
        header.append(("live clients", _clients(snapshot)))
    if snapshot.get("system_prompt"):
        header.append(("system prompt", cut(snapshot["system_prompt"], _limits.cell_chars_max)))
    out = [pairs(header), ""]
    for number, message in enumerate(snapshot.get("transcript", []), 1):
        out.append(f"[{number}] {message.get('role', '?')}" + _about(message))
        text = content_text(message.get("content"))
        out.extend("    " + line for line in text.splitlines() or [""])
        for call in message.get("tool_calls") or []:
            out.append("    -> " + cut(_call_text(call), _limits.cell_chars_max))
    return "\n".join(out).rstrip()


def _about(message: Mapping[str, Any]) -> str:
    notes = [message[k] for k in ("name", "model") if isinstance(message.get(k), str)]
    if message.get("summary"):
        notes.append("summary")
    if message.get("synthetic"):
        notes.append("synthetic")
    return f" ({', '.join(notes)})" if notes else ""


def _call_text(call: object) -> str:
    if isinstance(call, Mapping):
        function = call.get("function")
        name = call.get("name") or (function.get("name") if isinstance(function, Mapping) else None)
        args = call.get("arguments") or (
            function.get("arguments") if isinstance(function, Mapping) else None
        )
        return f"{name or 'tool'}({args if isinstance(args, str) else json.dumps(args)})"
    return str(call)


def _clients(snapshot: Mapping[str, Any]) -> str:
    controller = snapshot.get("live_controller_id")
    return ", ".join(
        f"{c.get('client_id')} ({'controller' if c.get('client_id') == controller else 'observer'})"
        for c in snapshot["live_clients"]
    )


# Ancestry trees


@dataclass
class Node:
    """One session of an ancestry tree, as `tree` draws it."""

    session_id: str
    title: str | None
    length: int
    fork_at: int | None
    children: list[Node] = field(default_factory=list)


def text_tree(root: Node, mark: str | None = None) -> str:
    """The tree with box-drawing branches; `mark` (a session id) gets an arrow."""
    lines: list[str] = []

    def label(node: Node) -> str:
        parts = [node.session_id]
        if node.title:
            parts.append(f'"{cut(node.title, 40)}"')
        parts.append(f"{node.length} messages")
        if node.fork_at is not None:
            parts.append(f"forked at message {node.fork_at}")
        return "  ".join(parts) + ("  <-" if node.session_id == mark else "")

    def walk(node: Node, prefix: str, last: bool, top: bool) -> None:
        lines.append(label(node) if top else prefix + ("└── " if last else "├── ") + label(node))
        inner = "" if top else prefix + ("    " if last else "│   ")
        for i, child in enumerate(node.children):
            walk(child, inner, i == len(node.children) - 1, False)

    walk(root, "", True, True)
    return "\n".join(lines)


def _nodes(root: Node) -> list[tuple[Node, Node | None]]:
    out: list[tuple[Node, Node | None]] = []
    stack: list[tuple[Node, Node | None]] = [(root, None)]
    while stack:
        node, parent = stack.pop()
        out.append((node, parent))
        stack.extend((child, node) for child in reversed(node.children))
    return out


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def dot_tree(root: Node) -> str:
    """The tree in Graphviz dot: one box per session, edges labelled with the fork point."""
    lines = ["digraph sessions {", "  rankdir=LR;", "  node [shape=box];"]
    for node, parent in _nodes(root):
        label = node.session_id + (f"\\n{_quoted(cut(node.title, 40))}" if node.title else "")
        lines.append(f'  "{node.session_id}" [label="{label}\\n{node.length} messages"];')
        if parent is not None:
            at = "" if node.fork_at is None else f' [label="at {node.fork_at}"]'
            lines.append(f'  "{parent.session_id}" -> "{node.session_id}"{at};')
    lines.append("}")
    return "\n".join(lines)


def mermaid_tree(root: Node) -> str:
    """The tree as a Mermaid flowchart (node names are positions in the walk: ids may hold dashes)."""
    names = {id(node): f"s{i}" for i, (node, _) in enumerate(_nodes(root))}
    lines = ["graph TD"]
    for node, parent in _nodes(root):
        title = f"<br/>{cut(node.title, 40)}" if node.title else ""
        label = f"{node.session_id}{title}<br/>{node.length} messages".replace('"', "#quot;")
        lines.append(f'  {names[id(node)]}["{label}"]')
        if parent is not None:
            at = "" if node.fork_at is None else f"|at {node.fork_at}|"
            lines.append(f"  {names[id(parent)]} -->{at} {names[id(node)]}")
    return "\n".join(lines)


# Events


def event_dict(envelope: Envelope) -> dict[str, Any]:
    """An event as plain JSON-ready data."""
    return {
        "position": envelope.position,
        "stream": envelope.stream,
        "version": envelope.version,
        "type": envelope.type,
        "recorded_at": envelope.recorded_at.isoformat(),
        "meta": to_builtins(envelope.meta),
        "data": to_builtins(envelope.data),
        "hash": envelope.hash.hex(),
    }


def event_line(envelope: Envelope) -> str:
    """One event on one line: position, time, stream and version, type, and a glimpse of it."""
    data = to_builtins(envelope.data)
    glimpse = ""
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        glimpse = f"{message.get('role')}: {content_text(message.get('content'))}"
    elif isinstance(data, dict):
        glimpse = " ".join(
            f"{k}={v}" for k, v in data.items() if isinstance(v, (str, int)) and k != "type"
        )
    at = envelope.recorded_at.isoformat().replace("T", " ")[:23]
    head = f"{envelope.position:>8}  {at}  {envelope.stream} v{envelope.version}  {envelope.type}"
    return head + (f"  {cut(glimpse, _limits.cell_chars_max)}" if glimpse else "")


# Progress


class Progress:
    """A one-line progress bar on a terminal; silent when the stream is not one (piped, a file).

    Call it as `progress(done, total)`: the library's long operations take such a hook. Redraws
    at most `progress_redraws_per_s` times a second so it never slows the work it reports on.
    """

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_terminal(self.stream)
        self._drawn_at = 0.0
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._drawn_at < 1 / _limits.progress_redraws_per_s and done < total:
            return
        self._drawn_at = now
        width = _terminal_width(self.stream)
        fraction = min(done / total, 1.0) if total > 0 else 1.0
        tail = f" {fraction:4.0%}  {done:,}/{total:,}"
        bar_chars = max(width - len(self.label) - len(tail) - 4, 10)
        filled = round(bar_chars * fraction)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (bar_chars - filled)}]{tail}")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        """Wipe the bar, so what the command prints next starts on a clean line."""
        if self._shown:
            self.stream.write("\r" + " " * _terminal_width(self.stream) + "\r")
            self.stream.flush()
            self._shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream: draw nothing
        return False


def _terminal_width(stream: TextIO) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):  # not a real terminal after all
        columns = _limits.terminal_columns_default
    return max(min(columns, _limits.terminal_columns_max), 20) - 1
