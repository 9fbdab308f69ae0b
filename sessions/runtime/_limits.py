"""Every bound the delegation runtime enforces, each with the reason it exists.

The engine's own bounds (session ids, event bytes, transcript length) live in `eventlog.limits`;
these are the runtime's additions. A value past one raises `LimitExceededError` naming it.
"""

from typing import Final

prompt_chars_max: Final = 1_000_000
"""One prompt's text. Far above any model's context; it keeps one prompt event well under the
log's `event_bytes_max` even when every character takes four UTF-8 bytes."""

request_id_chars_max: Final = 128
"""A request or loop id supplied by the caller. Ids are part of projection keys (under 480 bytes
with the session id: a request id of many multi-byte characters that would not fit is refused)
and of every lifecycle event of the prompt; UUIDv7 needs 36."""

model_chars_max: Final = 256
"""A model identifier. Real ones are under 100 characters."""

system_prompt_chars_max: Final = 256 * 1024
"""A system prompt in runtime parameters. It travels with every loop record's settings snapshot."""

stop_sequences_max: Final = 16
"""Stop sequences in one parameter set. Providers accept four to sixteen."""

stop_sequence_chars_max: Final = 1_000
"""One stop sequence."""

provider_specific_bytes_max: Final = 16 * 1024
"""Provider-native parameters, encoded. They are recorded with every loop; bulk data does not
belong in generation settings."""

input_filters_max: Final = 64
"""Input filters on one runtime. Each runs before every provider call."""

tools_max: Final = 128
"""Tools offered with one prompt; the APIs accept about this many, and each tool's schema is
sent with every model call of the loop."""

max_steps_default: Final = 10
"""Model calls in one prompt's tool loop unless the caller says otherwise, as seed 004 sets it."""

max_steps_max: Final = 1_000
"""Model calls one prompt may ask for. Each step's events stay in the log forever."""

tool_result_chars_max: Final = 1_000_000
"""One tool result's text, as sent to the model; longer results are cut (the context policy prunes
large ones from later calls anyway)."""

reap_interval_s_default: Final = 30.0
"""How often the periodic reaper looks for sessions past their TTL or idle limit."""

ttl_s_default: Final = 3_600.0
"""A session's lifetime before `reap` closes it as expired, as seed 002 sets it: one hour."""

idle_s_default: Final = 600.0
"""Idle time before `reap` closes a session, as seed 002 sets it: ten minutes."""

reply_bytes_max: Final = 2 * 1024 * 1024
"""One model reply, encoded. It is recorded in one event (`step_completed` or `prompt_completed`),
which must stay under `event_bytes_max` with its envelope and, in an encrypted session, as
base64 ciphertext (a third larger); a larger reply fails the prompt (``invalid_reply``) before
the write would."""

sse_line_bytes_max: Final = 16 * 1024 * 1024
"""One line of a provider's event stream, and the data of one event (its `data:` lines joined).
An event carries a piece of the reply, or at most the whole of it (some servers send one chunk):
a reply the runtime can record (`reply_bytes_max`) fits even JSON-escaped six times over. A
server that streams one line, or one event, without end is cut off here (``invalid_reply``)
instead of growing the process's memory until `total_timeout_s`."""
