"""How the command line draws things: tables, transcripts, ancestry trees, events, a progress bar.

`rich` draws them: on a terminal with styles, tables that fit its width and a progress bar with
rate and time left; piped or redirected, the same things come out as plain text (no styles, no
width limit, no bar) that scripts can read. Nothing here opens a store or decides anything about
sessions, and nothing prints session text raw: its control characters are shown as escapes (`safe`).
The demo draws with these too, so both print the same way.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich import box
from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as _RichProgress
from rich.progress import Task as _Task
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from eventlog import Envelope, to_builtins
from sessionlog import _limits

# Output

_CONTROLS = {
    code: f"\\x{code:02x}"
    for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))
    if code not in (0x09, 0x0A)
}
"""Control characters other than tab and newline, each shown as its `\\xNN` escape: session
content is anyone's text, and ESC, CSI or OSC sequences printed raw would drive the terminal
(rewrite the screen, set its title, plant links or answerback); a carriage return would overwrite
the line before it."""


def safe(text: str) -> str:
    """`text` with every terminal control character made visible and inert (see `_CONTROLS`)."""
    return text.translate(_CONTROLS)


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream: treat it as a pipe
        return False


def emit(renderable: RenderableType, stream: TextIO | None = None) -> None:
    """Print `renderable`: drawn by rich on a terminal, plain text elsewhere."""
    stream = stream if stream is not None else sys.stdout
    if is_terminal(stream):
        Console(file=stream, highlight=False, emoji=False).print(renderable)
    else:
        stream.write(plain(renderable) + "\n")


# A table's header rule in ASCII, for plain output: what scripts and old terminals read.
_PLAIN_HEAD = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def plain(renderable: RenderableType) -> str:
    """`renderable` as plain text: no styles, no width limit, no trailing blanks."""
    if isinstance(renderable, Table) and renderable.box is not None:
        renderable.box = _PLAIN_HEAD
    out = io.StringIO()
    console = Console(
        file=out,
        width=_limits.plain_columns_max,
        color_system=None,
        force_terminal=False,
        highlight=False,
        emoji=False,
    )
    console.print(renderable, crop=False, overflow="ignore")
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip("\n").split("\n"))


# Tables


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> Table:
    """Columns of cells, each cut at `cell_chars_max`; on a terminal, squeezed to fit its width."""
    drawn = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for header in headers:
        drawn.add_column(header, overflow="ellipsis", no_wrap=True)
    for row in rows:
        drawn.add_row(*(Text(cut(_text(value), _limits.cell_chars_max)) for value in row))
    return drawn


def pairs(items: Iterable[tuple[str, object]]) -> Table:
    """A two-column grid of names and values, for one thing's properties."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for name, value in items:
        grid.add_row(name, Text(_text(value)))
    return grid


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return safe(str(value))


def cut(text: str, limit: int) -> str:
    """`text` on one line, shortened to `limit` characters with an ellipsis when longer."""
    flat = safe(" ".join(text.split()))
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)] + "…"


def when(iso: str | None) -> str:
    """An ISO timestamp shortened to the second, in UTC, for a table cell."""
    if not iso:
        return "-"
    return iso.replace("T", " ")[:19]


# Sessions


def session_table(sessions: Sequence[Mapping[str, Any]]) -> Table:
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


def session_header(snapshot: Mapping[str, Any]) -> Table:
    """What `show` prints above the messages: id, title, status, counts, family, clients."""
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
    return pairs(header)


def message_lines(number: int, message: Mapping[str, Any]) -> list[str]:
    """One message for a person to read: `[n] role (notes)`, then its text and tool calls."""
    out = [safe(f"[{number}] {message.get('role', '?')}" + _about(message))]
    text = content_text(message.get("content"))
    out.extend("    " + safe(line) for line in text.splitlines() or [""])
    for call in message.get("tool_calls") or []:
        out.append("    -> " + cut(_call_text(call), _limits.cell_chars_max))
    return out


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
    status: str = "active"
    child_ids: list[str] = field(default_factory=list)
    children: list[Node] = field(default_factory=list)


def text_tree(root: Node, mark: str | None = None) -> Tree:
    """The tree with its branches drawn; `mark` (a session id) gets an arrow."""

    def label(node: Node) -> Text:
        parts = [node.session_id]
        if node.title:
            parts.append(f'"{cut(node.title, 40)}"')
        parts.append(f"{node.length} messages")
        if node.fork_at is not None:
            parts.append(f"forked at message {node.fork_at}")
        if node.status != "active":
            parts.append(node.status)
        text = Text(safe("  ".join(parts)) + ("  <-" if node.session_id == mark else ""))
        text.stylize("bold", 0, len(node.session_id))
        return text

    drawn = Tree(label(root), guide_style="dim")
    stack = [(root, drawn)]
    while stack:
        node, branch = stack.pop()
        for child in node.children:
            stack.append((child, branch.add(label(child))))
    return drawn


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
    return safe(head) + (f"  {cut(glimpse, _limits.cell_chars_max)}" if glimpse else "")


# Progress


class _Rate(ProgressColumn):
    """Items per second, as the library's hooks count them (events, lines, messages)."""

    def render(self, task: _Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f}/s", style="progress.data.speed")


class Progress:
    """A progress bar on a terminal (done/total, percent, rate, time left); silent when the
    stream is not one (piped, a file).

    Call it as `progress(done, total)`: the library's long operations take such a hook. The bar
    redraws at most `progress_redraws_per_s` times a second, on its own thread, so it never slows
    the work it reports on, and it is wiped when the work ends.
    """

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = is_terminal(self.stream)
        self._bar = _RichProgress(
            TextColumn(label),
            BarColumn(),
            TaskProgressColumn(),
            MofNCompleteColumn(),
            _Rate(),
            TimeRemainingColumn(),
            console=Console(file=self.stream),
            transient=True,
            disable=not self.enabled,
            refresh_per_second=_limits.progress_redraws_per_s,
        )
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._task is None:
            self._bar.start()
            self._task = self._bar.add_task("", total=total)
        self._bar.update(self._task, completed=done, total=total)

    def close(self) -> None:
        """Wipe the bar, so what the command prints next starts on a clean line."""
        if self._task is not None:
            self._bar.stop()
            self._task = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
