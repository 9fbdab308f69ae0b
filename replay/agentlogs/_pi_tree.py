"""pi's session tree: which branch each entry of a session file belongs to.

Since its version 2, every pi entry names its parent (`id`, `parentId`); pi appends each entry
as a child of the current leaf, and branching moves the leaf back to an earlier entry. On load
the leaf is the last entry of the file, so the active branch is the path from the root to the
last entry. Every other leaf's path becomes a fork of the branch it left, at the entry where it
left it. Pure: it reads the (line, id, parent) of entries and decides; it never reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAIN = "main"
_NO_FIELD = object()  # an entry without `parentId` (version 1): its parent is the entry before


@dataclass(slots=True)
class Entry:
    """One entry of the file as the tree sees it: its line, `id` and `parentId`."""

    line: int
    id: object
    parent: object = _NO_FIELD

    @staticmethod
    def of(line: int, record: dict[str, object]) -> Entry:
        return Entry(line, record.get("id"), record.get("parentId", _NO_FIELD))


@dataclass
class Branches:
    """Where each entry goes: `owner` maps a line to the key of its branch (lines not in it go
    to the main session); `forks` maps a branch's key to the branch it leaves and the line of
    the entry it leaves at (None: a root of its own, which keeps nothing); `leaves` the line of
    each branch's last entry."""

    owner: dict[int, str] = field(default_factory=dict)
    forks: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    leaves: dict[str, int] = field(default_factory=dict)

    @property
    def points(self) -> set[int]:
        """The lines at which a fork leaves its branch."""
        return {line for _, line in self.forks.values() if line is not None}


def _parents(entries: list[Entry]) -> dict[int, int | None]:
    """Each entry's parent line: the entry before when it names none (version 1), none for a
    root (`parentId` null, its own id, or an id the file does not hold: pi's orphans are roots
    too). An id used twice means its last entry, as pi's index keeps the last. pi's ids are
    strings: any other value names no entry."""
    lines = {entry.id: entry.line for entry in entries if isinstance(entry.id, str)}
    parents: dict[int, int | None] = {}
    previous: int | None = None
    for entry in entries:
        if entry.parent is _NO_FIELD:
            parent = previous
        elif entry.parent is None or entry.parent == entry.id:
            parent = None
        else:
            parent = lines.get(entry.parent) if isinstance(entry.parent, str) else None
        parents[entry.line] = None if parent == entry.line else parent
        previous = entry.line
    return parents


def branches(entries: list[Entry]) -> Branches | None:
    """The branches of a file's entries (in file order); None when they form one line."""
    parents = _parents(entries)
    order = [entry.line for entry in entries]
    if all(parents[line] == before for line, before in zip(order, [None, *order], strict=False)):
        return None
    found = Branches()
    found.leaves[MAIN] = order[-1]
    _claim(parents, found, order[-1], MAIN)
    with_children = {parent for parent in parents.values() if parent is not None}
    for line in order:
        if line in with_children or line in found.owner:
            continue
        key = f"branch-{len(found.forks) + 1}"
        found.leaves[key] = line
        point = _claim(parents, found, line, key)
        found.forks[key] = (MAIN if point is None else found.owner[point], point)
    return found


def _claim(parents: dict[int, int | None], found: Branches, leaf: int, key: str) -> int | None:
    """Give `key` the entries from `leaf` up to the first one already owned (returned: where
    the branch leaves another), or to its root (None). A cycle (damage) ends like a root."""
    seen: set[int] = set()
    line: int | None = leaf
    while line is not None and line not in found.owner and line not in seen:
        seen.add(line)
        found.owner[line] = key
        line = parents[line]
    return line if line is not None and line not in seen else None
