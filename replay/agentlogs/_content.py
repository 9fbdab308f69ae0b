"""The content a message keeps: text where the source has only text, else the source's blocks.

A log's multi-part content (a prompt with a pasted image, a tool result holding a screenshot)
is kept as the source's own block list, as the engine stores block content, so `context()` and
the exports still hold the image; only content made of text blocks alone becomes one string.
It decides a value and counts what it kept; it never reads a file.
"""

from __future__ import annotations

from collections import Counter

TEXT_KINDS: tuple[str | None, ...] = ("text",)


def content_of(
    counts: Counter[str], value: object, kinds: tuple[str | None, ...] = TEXT_KINDS
) -> object:
    """`value` as a message's content: a string as it is; a non-empty list whose every block is
    a text block of `kinds` as their texts joined by blank lines; any other list as it is, each
    of its blocks that is not such a text counted in `counts["non_text_blocks"]` (what the
    import report shows was kept beside the text); anything else as it is."""
    if not isinstance(value, list) or not value:
        return value
    other = sum(not _is_text(block, kinds) for block in value)
    if not other:
        return "\n\n".join(block["text"] for block in value)
    counts["non_text_blocks"] += other
    return value


def _is_text(block: object, kinds: tuple[str | None, ...]) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") in kinds
        and isinstance(block.get("text"), str)
    )
