"""The bounds `replay` enforces on what it reads, each with the reason it exists.

Names end with their unit, as in `eventlog.limits`. Readers look these up at call time (as
`_limits.name`), so a test can lower one to provoke it cheaply.
"""

from typing import Final

transcript_line_bytes_max: Final = 64 * 1024 * 1024
"""One line of an `llm_transcript.jsonl` file, without its line break. A line is decoded whole, so
this bounds the memory one record costs. A request snapshot carries the whole prompt of a call,
and even a million-token context with verbose tool output stays far below it; a longer line is a
file that is not a transcript, or one we must not try to hold."""
