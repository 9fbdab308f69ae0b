"""The small interface every peer adapter implements, and the helpers they share.

An adapter stores conversations with one library through that library's public API, with the
library's own defaults for durability. It never tunes a peer below its defaults, and it says in
`fork_method` and `batch_method` what it does where the library has no such verb.
"""

from __future__ import annotations

import importlib.metadata
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Message = dict[str, Any]


class Adapter(ABC):
    """One library storing sessions under `directory`, which it owns alone."""

    name: str = ""  # short key used on the command line and in the JSON
    title: str = ""  # what the table calls it
    distributions: tuple[str, ...] = ()  # whose versions the report quotes
    fork_method: str = ""  # how `fork` is done with this library, in a sentence
    batch_method: str = ""  # how `append_batch` is done with this library, in a sentence
    concurrent: bool = False
    """Whether one open instance takes appends from many threads at once (`concurrent_append`
    runs only for those)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @abstractmethod
    def open(self) -> None:
        """Open the store in `directory`, creating it when missing (also used to reopen)."""

    @abstractmethod
    def close(self) -> None:
        """Release everything, so a later `open` starts cold and the files are complete."""

    @abstractmethod
    def create(self) -> str:
        """A new, empty session; returns its id."""

    @abstractmethod
    def append(self, session_id: str, message: Message) -> None:
        """One message, acknowledged once the library's commit returns."""

    @abstractmethod
    def append_batch(self, session_id: str, messages: Sequence[Message]) -> None:
        """Several messages, in as few commits as the library allows (see `batch_method`)."""

    @abstractmethod
    def read(self, session_id: str) -> list[Any]:
        """The whole transcript in the library's own form."""

    @abstractmethod
    def contents(self, transcript: list[Any]) -> list[str]:
        """The text of each message of a `read` result, to check the adapter kept everything."""

    @abstractmethod
    def fork(self, session_id: str) -> str:
        """A new session holding the same transcript; returns its id (see `fork_method`)."""

    @abstractmethod
    def durability(self) -> dict[str, Any]:
        """The settings that decide whether an acknowledged append survives a power loss, read
        back from the library's own connection where it has one, with `durable` a bool."""

    def versions(self) -> dict[str, str]:
        return {name: importlib.metadata.version(name) for name in self.distributions}


def sqlite_durability(rows: dict[str, Any], *, note: str = "") -> dict[str, Any]:
    """Judge SQLite's settings: with a rollback journal every level from FULL up syncs each commit;
    in WAL mode FULL (2) or EXTRA (3) syncs the WAL on each commit, while NORMAL (1) survives a
    process crash but may lose the last commits on a power loss."""
    mode = str(rows.get("journal_mode", "")).lower()
    level = int(rows.get("synchronous", -1))
    durable = level >= 2 and mode not in ("off", "memory")
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    text = f"SQLite journal_mode={mode}, synchronous={names.get(level, level)}"
    return {
        "settings": text,
        "journal_mode": mode,
        "synchronous": level,
        "durable": durable,
        "note": note,
    }


def directory_bytes(path: Path) -> int:
    """Apparent size of every file under `path` (sparse holes count as they read)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(root, name)).st_size
    return total
