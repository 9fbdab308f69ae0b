"""Ids a caller gives inside a record field of an event (a sub-agent's `parent_spawn_ref`), as an
encrypted session keeps them (`KEYED_REFS`): each a digest under the session's key with its text
sealed beside it, and back. The keying and sealing are handed in: nothing here holds a key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventlog import InvalidArgumentError
from eventlog import events as ev
from sessions._keyring import is_keyed
from sessions._sealed_fields import KEYED_REFS

SPAWN_REF = KEYED_REFS[ev.SessionOpened]
"""A sub-agent's `parent_spawn_ref` and its keyed ids, as a session's state holds them too."""


def ref_label(refs: tuple[str, tuple[str, ...]], name: str) -> str:
    """What the sealed copy of the id `name` in the record field `refs[0]` is sealed as."""
    return f"{refs[0]}\x00{name}"


def keyed_ref(
    ref: dict[str, Any],
    refs: tuple[str, tuple[str, ...]],
    keyed: Callable[[str], str | None],
    seal: Callable[[str, str], str],
) -> dict[str, Any]:
    """`ref` (the record field `refs[0]`) as an encrypted session stores it: each text id that
    `refs[1]` names replaced by `keyed(text)` and sealed by `seal(label, text)` in
    `sealed_<name>`; other entries as they are. A caller's record that already carries a
    `sealed_<name>` of its own is refused: that is the engine's entry."""
    field, names = refs
    kept = dict(ref)
    for name in names:
        if f"sealed_{name}" in ref:
            raise InvalidArgumentError(
                f"a `{field}` given to an encrypted session carries `sealed_{name}`; it is the "
                "engine's entry"
            )
        text = ref.get(name)
        if isinstance(text, str):
            kept[name] = keyed(text)
            kept[f"sealed_{name}"] = seal(ref_label(refs, name), text)
    return kept


def open_ref(
    ref: dict[str, Any] | None,
    refs: tuple[str, tuple[str, ...]],
    open_text: Callable[[str | None, str], str | None],
) -> dict[str, Any] | None:
    """`ref` (the record field `refs[0]`) as the caller gave it: each id `refs[1]` names that
    is kept as its keyed digest replaced by its sealed copy, opened by `open_text(sealed,
    label)` (None once the key is gone), and the copy dropped. Ids stored as they are (a plain
    session's, or an encrypted one's written before they were digested) are left so."""
    if ref is None:
        return None
    shown = dict(ref)
    for name in refs[1]:
        if is_keyed(shown.get(name)):
            shown[name] = open_text(shown.pop(f"sealed_{name}", None), ref_label(refs, name))
    return shown
