"""Every bound the HTTP service enforces, in one place, each with the reason it exists.

The engine's own bounds (event bytes, transcript length, page sizes of the log) live in
`eventlog.limits`; these are the service's: how much a request may carry and how much a page or a
stream may hold in this process's memory.
"""

from typing import Final

from eventlog import limits

body_bytes_max: Final = 2 * limits.event_bytes_max
"""A request body of an ordinary call. A batch of messages is stored as events of at most
`event_bytes_max`; twice that leaves room for JSON's overhead over msgpack."""

upload_bytes_max: Final = 64 * 1024 * 1024
"""The body of `sessions:seed` and `sessions:import`: a whole transcript or bundle, written in one
transaction well inside `transaction_bytes_max`."""

messages_per_request_max: Final = 10_000
"""Messages in one inject request; a bigger batch is several requests (each still all or none)."""

page_messages_default: Final = 100
page_messages_max: Final = 1_000
"""Messages in one page of `GET .../messages`: a page is one read transaction and one response."""

page_events_default: Final = 100
page_events_max: Final = 1_000
"""Events in one page of `GET .../events`."""

snapshot_messages_max: Final = 10_000
"""Messages a snapshot (`GET /v1/sessions/{id}`) inlines; a longer transcript is read by pages."""

as_of_position_max: Final = 200_000
"""The furthest log position a past state (`?as_of=`, a fork `at_event_id`) is shown at. The engine
rebuilds a past state in memory from the first event on, so one request must not make the server
fold a log of millions of events; look further back in process with `SessionStore.as_of`."""

past_rebuilds_max: Final = 2
"""Past states rebuilt at once in one server process, by every route that shows one (the API's
`?as_of=` and a fork's `at_event_id`, the viewer's `as_of` and `version`) under one bound. Each
rebuild folds the log up to its position in memory (up to `as_of_position_max` events) on a
worker thread; unbounded, a few clients asking for different past states pin every core and hold
that many copies of the state. A request past the bound is answered 503 with `Retry-After` at
once, never queued; a past state already built (the viewer keeps the last two) costs no rebuild.
`create_app(past_rebuilds_max=...)` and `sessionlog serve --past-rebuilds-max` set another."""

past_rebuild_retry_after_s: Final = 2
"""The `Retry-After` of a request refused by `past_rebuilds_max`: about what one rebuild near
`as_of_position_max` takes."""

stream_buffer_events_max: Final = 1_024
"""Events waiting for one slow SSE consumer. Past it the stream is ended with its cursor, and the
client resumes from the log: a slow reader never grows the server's memory without bound."""

streams_per_process_max: Final = 10_000
"""Open event streams in one server process; each costs a task, a socket and a small buffer."""

heartbeat_interval_s: Final = 15.0
"""A comment line on an idle stream this often, so proxies and clients see the connection live."""

idempotency_key_chars_max: Final = 200
"""An `Idempotency-Key` header: a request id or a UUID, never a document."""

retention_interval_s_default: Final = 3600.0
"""How often a service given a retention policy sweeps the store (`create_app(retention=...)`):
closed sessions come due in days, so an hour late is nothing, and each sweep scans every session
state."""
