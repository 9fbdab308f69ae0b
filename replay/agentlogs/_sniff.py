"""What the first lines of a file say about its format: read for `auto`, and to check a file
against the line format a caller named.

The first lines are read whole, however long (a Codex `session_meta` carrying long instructions,
a first prompt with a pasted file), each up to `agent_log_line_bytes_max`, and only their outline
is decoded, so a long line costs a skim, not its objects. Nothing here reports a damaged line or
builds a session: the format's reader does, from the start of the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType
from typing import IO, Any

from replay import _limits
from replay.agentlogs._common import AgentLogError
from replay.agentlogs._decode import outline, whole_json

_SNIFF_LINES = 8  # lines that are not blank, looked at for a record telling the format
_SNIFF_BYTES = 256 * 1024  # no line starting past this is read, once a second one has been
_SCAN_BYTES = 1 << 20  # read at a time to find the end of a line too long to hold
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Sniffed:
    """What the first lines tell: `name`, the first of the formats asked about that a record of
    them looks like. Else `json`: the file begins as JSON does (`{` or `[`); and `lines`: its
    first line is a whole JSON value and another line follows, so it is JSON lines, not one
    JSON document."""

    name: str | None = None
    json: bool = False
    lines: bool = False


def sniff(path: str, formats: tuple[ModuleType, ...]) -> Sniffed:
    """What the first lines of the file at `path` tell about `formats` (line formats, each
    with its `looks_like`, which is given a record's outline). Up to `_SNIFF_LINES` lines that
    are not blank are read, each whole; none starting past `_SNIFF_BYTES` once two are. A line
    longer than `agent_log_line_bytes_max` ends the reading, and is refused at its line as an
    import refuses it (`AgentLogError`) when the file is a line log: JSON lines, several lines
    from the first, or one line that is a record of `formats`. Else the file may be one JSON
    document (written on one line, or over lines the first of which is not whole JSON), and
    reading it whole tells."""
    try:
        with open(path, "rb") as file:
            return _sniffed(file, path, formats)
    except OSError as exc:
        raise AgentLogError(path, None, f"cannot read: {exc.strerror or exc}") from exc


def _sniffed(file: IO[bytes], path: str, formats: tuple[ModuleType, ...]) -> Sniffed:
    bound = _limits.agent_log_line_bytes_max
    read = number = seen = 0
    json = lines = whole = False  # whole: the first line decoded
    while seen < _SNIFF_LINES and (read < _SNIFF_BYTES or seen < 2):
        line = file.readline(bound + 1)
        if not line:
            break
        number += 1
        read += len(line)
        long = len(line) > bound and not line.endswith(b"\n")
        if number == 1:
            line = line.removeprefix(_BOM)
        if not line.strip():
            continue
        seen += 1
        if seen == 1:
            json = line.lstrip()[:1] in (b"{", b"[")
        lines = lines or whole
        if long:
            if lines or (seen == 1 and not _one_document(file, formats)):
                raise AgentLogError(
                    path, number, f"line longer than agent_log_line_bytes_max = {bound:,}"
                )
            return Sniffed(json=json)
        try:
            record = outline(line)
        except (ValueError, RecursionError):  # damaged, or being written: tells nothing
            continue
        whole = whole or seen == 1
        name = _told(record, formats)
        if name is not None:
            return Sniffed(name=name)
    return Sniffed(json=json, lines=lines)


def _told(record: Any, formats: tuple[ModuleType, ...]) -> str | None:
    if type(record) is dict:
        for module in formats:
            if module.looks_like(record):
                return str(module.NAME)
    return None


def _one_document(file: IO[bytes], formats: tuple[ModuleType, ...]) -> bool:
    """Whether the file, whose first line is being read and is longer than a line may be, may
    be a JSON document written on one line: only blank lines follow that line, and the file is
    no record of `formats` (that is a log of one line, and the line too long). Never reads more
    than a document may be (a bigger file is no document)."""
    bound = _limits.agent_log_document_bytes_max
    if not _alone(file, bound):
        return False
    file.seek(0)
    data = file.read(bound + 1)
    try:
        value = outline(data.removeprefix(_BOM))
    except (ValueError, RecursionError):  # damaged: reading it as a document says where
        return len(data) <= bound
    return len(data) <= bound and _told(value, formats) is None


def _alone(file: IO[bytes], bound: int) -> bool:
    """Whether only blank lines follow the line being read, in a file of at most `bound` bytes
    (read on in pieces to its end as it was)."""
    size = os.fstat(file.fileno()).st_size
    if size > bound:
        return False
    left, ended = size - file.tell(), False
    while left > 0:
        piece = file.read(min(_SCAN_BYTES, left))
        if not piece:
            break
        left -= len(piece)
        if not ended:
            at = piece.find(b"\n")
            if at < 0:
                continue
            ended, piece = True, piece[at + 1 :]
        if piece.strip():
            return False
    return True


def whole_document(path: str) -> bool:
    """Whether the file at `path` is one JSON value, told by a skim that builds nothing; a file
    bigger than `agent_log_document_bytes_max` is no document read."""
    bound = _limits.agent_log_document_bytes_max
    try:
        with open(path, "rb") as file:
            data = file.read(bound + 1)
    except OSError as exc:
        raise AgentLogError(path, None, f"cannot read: {exc.strerror or exc}") from exc
    return len(data) <= bound and whole_json(data.removeprefix(_BOM))


def first_record(path: str) -> dict[str, Any] | None:
    """The outline of the first record of a JSONL file (its first line that is not blank, read
    whole up to `agent_log_line_bytes_max`); None when the file cannot be read, or that line is
    longer or is no JSON object."""
    bound = _limits.agent_log_line_bytes_max
    try:
        with open(path, "rb") as file:
            line = file.readline(bound + 1).removeprefix(_BOM)
            while line.isspace():
                line = file.readline(bound + 1)
    except OSError:
        return None
    if len(line) > bound and not line.endswith(b"\n"):
        return None
    try:
        record = outline(line)
    except (ValueError, RecursionError):
        return None
    return record if type(record) is dict else None
