"""Reading a tree-shaped log (`_pi_tree.Branches`) into one session per branch.

A branch's records go to its own `Built`; where a fork leaves the branch it came from, that
branch's length and open calls are noted, so the fork keeps that prefix (`fork_of`) and a call
made before it may be answered in it. It decides where records go; the reader reads them.
"""

from __future__ import annotations

from collections.abc import Callable

from blake3 import blake3

from replay.agentlogs._common import AgentLogError, Built, Parsed, Source
from replay.agentlogs._pi_tree import MAIN, Branches, Entry, branches


def read_as_tree(source: Source, read: Callable[[Branches | None, list[Entry]], Parsed]) -> Parsed:
    """The file read by `read(tree, entries)`: once in file order, noting its entries; when they
    form a tree, again, each record into its branch's session. The second reading must read the
    same bytes as the first, no more: the branches found in the first must fit it."""
    entries: list[Entry] = []
    parsed = read(None, entries)
    tree = branches(entries)
    if tree is None:
        return parsed
    del parsed  # the reading in file order is dropped before the reading by branch
    first = (source.size, source.digest.digest())
    source.digest, source.skipped = blake3(), []
    source.limit = source.size  # what the agent appended since is read by the next import
    parsed = read(tree, [])
    if (source.size, source.digest.digest()) != first:
        raise AgentLogError(
            source.path, None, "changed while being read (a tree is read twice): import it again"
        )
    return parsed


class Forking:
    """The sessions of a tree's branches, `main` first, and where each fork leaves."""

    def __init__(self, tree: Branches, main: Built, source: Source) -> None:
        self.tree = tree
        self.sessions: dict[str, Built] = {MAIN: main}
        for key in tree.forks:
            self.sessions[key] = Built(key, source)
        self.points = tree.points
        self.calls_at: dict[int, list[str]] = {}  # branch point -> the calls still open there
        self.started: set[str] = set()
        self.last = MAIN  # the branch of the entry read last

    def session_of(self, line: int) -> Built:
        """The session of the record at `line`: its branch's, or (a record outside the tree)
        that of the entry before it."""
        self.last = key = self.tree.owner.get(line, self.last)
        built = self.sessions[key]
        if key not in self.started:  # a branch starts: the calls open where it left may answer
            self.started.add(key)
            point = self.tree.forks[key][1] if key != MAIN else None
            if point is not None:
                built.open_calls.update(dict.fromkeys(self.calls_at.get(point, ()), -1))
        return built

    def read(self, line: int, built: Built) -> None:
        """Note the record at `line` read into `built`: a fork leaving there keeps its length."""
        if line in self.points:
            built.fork_at_lines[line] = built.length
            self.calls_at[line] = list(built.open_calls)

    def forks(self) -> list[Built]:
        """The branches but the main one, each told what it keeps of the branch it leaves, in
        the order they must be made (a fork after the branch it leaves)."""
        found = []
        for key, built in self.sessions.items():
            if key == MAIN:
                continue
            parent, point = self.tree.forks[key]
            keep = 0  # a root of its own; else what its branch holds there, its prefix too
            if point is not None:
                prefix = self.sessions[parent].fork_of
                # (not there only when the file changed between the readings: the reader says so)
                at = self.sessions[parent].fork_at_lines.get(point, 0)
                keep = (prefix[1] if prefix else 0) + at
            built.fork_of = (parent, keep)
            built.info["branch"] = {"from_line": point, "leaf_line": self.tree.leaves[key]}
            found.append(built)
        self.sessions[MAIN].info["branch"] = {"leaf_line": self.tree.leaves[MAIN]}
        return found
