"""Every bound sessionlog enforces, in one place, each with the reason it exists.

Names end with their unit. Code elsewhere imports these constants instead of writing numbers; a
limit that is reached raises `LimitExceededError` naming the limit, the value and where it came from
(`check_at_most`, at the end, is that check written once).
"""

from typing import Final

from eventlog.errors import LimitExceededError

# The log

messages_per_event_max: Final = 1_000
"""Messages `inject_many` puts in one `messages_injected` event: enough that a batch costs one
record and one hash, few enough that reading one message of it decodes little else."""

event_bytes_max: Final = 4 * 1024 * 1024
"""One encoded event. Large tool outputs are kept verbatim, but an event this size already costs a
noticeable slice of a transaction; bigger payloads belong in a blob store referenced by the event."""

events_per_append_max: Final = 10_000
"""Events in one `append` call. Bounds the memory a single call holds before it commits."""

transaction_bytes_max: Final = 256 * 1024 * 1024
"""Encoded bytes written by one transaction (events and projection state). The LMDB map is grown
before each write transaction so at least twice this much is free, which is what makes growth
automatic: a transaction that stays under this bound cannot run out of map space."""

stream_name_bytes_max: Final = 256
"""A stream name in UTF-8. It is part of LMDB keys, which must stay under 511 bytes with the version
suffix, and of every event's stored bytes."""

meta_bytes_max: Final = 4 * 1024
"""An event's encoded `meta` (client id, causation, correlation). Meta is routing data, not payload."""

idempotency_key_chars_max: Final = 200
"""`meta["idempotency_key"]`: a request id or a UUID, never a document. It is a unique index key on
a server backend, where index entries must stay well under a page."""

read_page_events_max: Final = 10_000
"""Events returned by one `read` or `read_stream` call. Each page is one read transaction, and long
read transactions pin old pages and make the LMDB file grow."""

read_page_events_default: Final = 1_000
"""The page size when the caller does not choose one."""

kv_key_bytes_max: Final = 480
"""A projection key. LMDB refuses keys of 511 bytes or more; the margin leaves room for prefixes."""

kv_value_bytes_max: Final = 16 * 1024 * 1024
"""A projection value. Projections keep small records; a value this big is a bug in a projection."""

export_line_bytes_max: Final = 8 * event_bytes_max
"""One line of a whole-log export. A line carries an event twice: its stored bytes in base64 (4/3
of their size) and its readable JSON, which can reach six times the stored size when every
character must be escaped (``\\u0001``); a longer line is not an export, and reading it whole would
let a damaged file exhaust memory."""

pending_record_bytes_max: Final = 256 * 1024
"""A transaction keeps the decoded events it appends, to hand them to in-process subscribers after
its commit, while their records total at most this. Past it, it keeps only how many there are, and
delivery reads them back from the log a page at a time: one huge transaction (a seeded transcript,
an import) must not hold every decoded event until it commits, and decoded events of many small
messages take up to twenty times their stored bytes. A command's events stay far below it."""

subscribers_max: Final = 10_000
"""In-process subscribers on one log. Each one runs on every commit; more is a leak, not a design."""

value_depth_max: Final = 64
"""How deeply caller data (message content, metadata, options, scratchpads, attributes) may nest,
counting the outermost dict or list as 1. Real tool arguments and content blocks nest a handful
of levels; every encoder, decoder and renderer on the way (msgpack, JSON, a bundle's envelope
around the value) recurses once per level, so a bound far below the interpreter's recursion
limit is what lets a value that was accepted always be exported, shown and imported again."""

position_max: Final = 2**63 - 1
"""The largest log position or stream version anything may name: positions are 8-byte keys, and
a server backend keeps them in a signed 64-bit column. A larger `after` is not a position."""

# The engine

session_id_bytes_max: Final = 128
"""A session id in UTF-8. Ids travel in URLs, logs and LMDB keys; UUIDv7 needs 36."""

messages_per_transcript_max: Final = 1_000_000
"""Messages one transcript may hold. Far above any model context, low enough to stop a runaway loop."""

files_per_message_max: Final = 10
"""File references attached to one message, as the session semantics fix it."""

# Bearer sessions

token_chars_max: Final = 512
"""A bearer token as sent in an Authorization header; headers longer than this are refused by most
proxies anyway, and an unbounded token is a hashing cost an attacker chooses."""

token_chars_min: Final = 32
"""A caller-supplied bearer token. Shorter strings cannot carry enough entropy to be a credential."""

token_entropy_bits_min: Final = 128
"""The estimated entropy of a caller-supplied token (see `sessions/_tokens.py`): 128 bits is what
an online or offline guessing attack cannot reach, and what every generated token far exceeds."""

token_distinct_chars_min: Final = 10
"""Different characters in a caller-supplied token. Fewer means a pattern or a word, not a secret;
even 32 random hex characters show about 15."""

principal_chars_max: Final = 256
"""A bearer session's principal: an identity (user, tenant, service), not a document."""

bearer_attributes_bytes_max: Final = 4 * 1024
"""A bearer session's attributes as JSON. They are small labels (role, tenant) read on every
authenticated request; anything bigger belongs in the caller's own store, keyed by principal."""

scratchpad_bytes_max: Final = 64 * 1024
"""An encoded scratchpad. It is the agent's small working memory, rewritten whole on every set."""

live_clients_per_session_max: Final = 256
"""Live clients attached to one session at once. Each attach rewrites the session record."""

list_page_sessions_max: Final = 200
"""Sessions in one `list_sessions` page."""

hot_sessions_default: Final = 128
"""Sessions whose decoded transcripts the engine keeps in memory by default (least recently used
go first; eviction only drops a cache, never data)."""


# Checking a bound


def check_at_most(
    actual: int, limit: int, limit_name: str, what: str, *, index: int | None = None
) -> None:
    """Refuse `actual` when it is over `limit`, the bound called `limit_name`: a
    `LimitExceededError` saying that `what` went past it, with `index` set to the failing item
    when the value belongs to one item of a batch."""
    if actual > limit:
        error = LimitExceededError(what, limit_name, limit, actual)
        error.index = index
        raise error
