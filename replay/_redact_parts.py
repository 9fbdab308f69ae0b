"""Secrets that only show across values, for `replay._redact`: a secret cut across the items of a
list of strings or the texts of adjacent content blocks, a credential named by a sibling member
(`{"name": "DB_PASSWORD", "value": ...}`), and text inside bytes that are not UTF-8. Pure functions
of plain JSON data; they say where, and the walk in `replay._redact` replaces and records.
"""

from __future__ import annotations

from typing import Any

from replay._secret_names import credential_name
from replay._secrets import Hit, binary_text, scan


def bytes_text(value: bytes) -> str:
    """The text of `value` to scan: all of it when it is UTF-8, else its runs of printable ASCII
    joined by newlines (a key inside a binary frame)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return binary_text(value)


_PAIR_NAMES = ("name", "key", "Name", "Key")
_PAIR_VALUES = ("value", "Value")


def paired_values(item: dict[Any, Any]) -> tuple[str, ...]:
    """The `value` members of `item` when it is a `{name: NAME, value: ...}` pair whose NAME is a
    credential's (a Kubernetes or ECS env list, HAR and Postman headers, AWS tags)."""
    if any(isinstance(item.get(k), str) and credential_name(item[k]) for k in _PAIR_NAMES):
        return tuple(k for k in _PAIR_VALUES if k in item)
    return ()


def split_secrets(items: list[str]) -> dict[int, str]:
    """For a list of strings, the items that hold part of a secret only visible when the items
    are read as one text (a private key one line per item, a token cut in two): index -> kind."""
    if len(items) < 2:
        return {}
    marked: dict[int, str] = {}
    for separator in ("\n", ""):
        text = separator.join(items)
        bounds: list[tuple[int, int]] = []
        at = 0
        for item in items:
            bounds.append((at, at + len(item)))
            at += len(item) + len(separator)
        for hit in scan(text):
            touched = [i for i, (lo, hi) in enumerate(bounds) if lo < hit.end and hit.start < hi]
            if len(touched) == 1 and _found_alone(items[touched[0]], hit, bounds[touched[0]][0]):
                continue  # the item shows the secret by itself: sanitizing it will do
            marked.update((i, hit.kind) for i in touched if i not in marked)
    return marked


def split_blocks(items: list[Any]) -> dict[int, str]:
    """`_split_secrets` for a list of content blocks: the `text` of adjacent blocks read as one
    (a token cut across two streamed text blocks); index -> kind."""
    marked: dict[int, str] = {}
    run: list[int] = []
    for i in range(len(items) + 1):
        text = items[i].get("text") if i < len(items) and isinstance(items[i], dict) else None
        if isinstance(text, str):
            run.append(i)
            continue
        if len(run) > 1:
            found = split_secrets([items[j]["text"] for j in run])
            marked.update((run[k], kind) for k, kind in found.items())
        run = []
    return marked


def _found_alone(item: str, hit: Hit, offset: int) -> bool:
    """Whether scanning `item` alone finds the secret `hit` (at `offset` in the joined text) too:
    a value whose name is in the item before (`"password": ` then `"x y"`) is not."""
    return any(
        own.start + offset <= hit.start and hit.end <= own.end + offset for own in scan(item)
    )
