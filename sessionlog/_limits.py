"""The bounds of the command line, each with the reason for its value.

Only presentation and paging bounds live here; the engine's own limits are in `eventlog.limits`.
"""

from __future__ import annotations

from typing import Final

ls_page_sessions_default: Final = 50
"""Sessions per `ls` page unless `--limit` says otherwise: one screen, scrolled a little."""

tree_sessions_max: Final = 1_000
"""Sessions `tree` draws at most: a bigger family is not readable as a picture; past it the tree
says how many it left out."""

cell_chars_max: Final = 60
"""Characters of a table cell or a one-line glimpse before it is cut with an ellipsis, so a long
title or message never wraps a row into an unreadable table."""

progress_redraws_per_s: Final = 10
"""Progress bar redraws per second at most: smooth to the eye, and no cost to the work."""

plain_columns_max: Final = 10_000
"""Width of plain (piped) output: wide enough that no table row or tree line ever wraps, so a
script reads one record per line; cells are cut at `cell_chars_max` anyway."""

show_page_messages_default: Final = 1_000
"""Messages `show` reads per page: the first page prints at once, whatever the transcript's
length, and memory stays bounded."""

follow_poll_interval_s: Final = 0.05
"""How often `tail --follow` looks for new events: new events show within a blink, and an idle
poll is one short read transaction."""
