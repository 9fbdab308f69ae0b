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

seed_memory_file_ratio: Final = 3
"""What reading a transcript may hold, as a multiple of the file's size: the messages kept so far
(re-encoded, about the size of their source) plus the Python objects the line being decoded will
become, estimated before it is decoded. Writing the session then needs about the kept size once
more, so a whole seed stays within about four times the file. A line whose objects would not fit
(a few bytes of JSON per object, millions of them) is refused before it is decoded."""

seed_memory_floor_bytes: Final = 1024 * 1024
"""The budget of a small file: three times a few hundred bytes would refuse an ordinary line for
the interpreter's per-object overhead alone."""

seed_batch_bytes: Final = 1024 * 1024
"""Kept messages are handed to the session engine in batches of about this many encoded bytes (or
`messages_per_event_max` messages, one event's worth), so only one batch at a time is ever held as
Python objects, at a few times its encoded size, while the session is written."""

agent_log_line_bytes_max: Final = 64 * 1024 * 1024
"""One line of an agent's JSONL log. Claude Code, Codex and pi write one record per line, and a
record holds at most one tool output or one pasted file; a longer line is refused at its
file:line before it is decoded, for the same reason as `transcript_line_bytes_max`."""

agent_log_document_bytes_max: Final = 256 * 1024 * 1024
"""A whole-JSON agent log (Gemini CLI sessions, trajectories): such a file is one session and
must be decoded whole, so its size is the memory bound. Past this it is refused unread."""

agent_log_memory_file_ratio: Final = 3
"""What importing one JSONL log may hold, as a multiple of its size (at least
`seed_memory_floor_bytes`): the messages kept (re-encoded, about the size of their source) plus
the objects the next line will decode into, estimated before decoding it."""

agent_log_first_line_slots_max: Final = 8
"""Session ids tried for one line-format log by default: the digest of its first line names the
first, and each other log sharing that first line (a copy that went its own way, a resumed
session repeating its summary line) takes the next. Each try is one lookup, so this bounds the
work of finding an earlier import; past it the file must be given a `session_id`."""

agent_log_prefix_tries_max: Final = 4
"""Write transactions one import of a grown log opens at most. Before each, the file's prefix an
earlier import read is hashed (up to a whole log) and the messages its sessions hold are read and
compared with the fresh reading (tens of thousands): the store's one writer must not wait on
either. When another writer commits to the log's sessions in between (an import of the log, a
message of someone's own), what the store then holds was not hashed or compared, and the import
leaves the transaction to do so and tries again. The last try does it inside, so a store that
keeps changing delays an import, but never refuses it."""
