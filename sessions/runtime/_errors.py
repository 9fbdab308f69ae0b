"""The delegation runtime's own errors, in the one tree rooted at `SessionLogError`.

They lived in `eventlog.errors` until the runtime owned them; `sessions.runtime` exports them.
"""

from __future__ import annotations

from eventlog import SessionLogError


class SessionBusyError(SessionLogError):
    """A prompt was sent to a session that is already running one; nothing was written. The
    runtime never queues a prompt behind the caller's back."""

    def __init__(self, session_id: str, request_id: str | None) -> None:
        self.session_id = session_id
        self.request_id = request_id
        super().__init__(
            f"prompt: session `{session_id}` is busy with request `{request_id}`; wait for it or "
            "cancel it, then prompt again"
        )


class RequestConflictError(SessionLogError, ValueError):
    """A prompt carried a request id that the session already ran with another prompt; nothing
    was written and no model was called. A request id names one prompt of a session: a retry
    sends the same prompt again (and gets the first run's outcome), a new prompt a new id."""

    def __init__(self, session_id: str, request_id: str, position: int | None) -> None:
        self.session_id = session_id
        self.request_id = request_id
        self.position = position
        where = "is running" if position is None else f"started at log position {position}"
        super().__init__(
            f"prompt: request `{request_id}` of session `{session_id}` was already sent with "
            f"another prompt (which {where}); a retry must send the same prompt, and a new "
            "prompt needs a new request id",
            where="prompt",
        )


class SessionFailedError(SessionLogError):
    """A prompt was sent to a session whose status is `failed`; close it and create another."""


class InputRejectedError(SessionLogError):
    """An input filter rejected a prompt: `input_rejected` was recorded and no provider called."""

    def __init__(self, session_id: str, filter_name: str, reason: str) -> None:
        self.session_id = session_id
        self.filter_name = filter_name
        self.reason = reason
        super().__init__(
            f"prompt: input filter `{filter_name}` rejected the prompt to session "
            f"`{session_id}`: {reason}"
        )


class ProviderError(SessionLogError):
    """The provider failed while answering a prompt, or answered what cannot be read or recorded;
    `prompt_failed` was recorded. After a failure that may pass (kind ``transient``: rate
    limited, overloaded, timed out, disconnected, retries spent) or a context refused as too long
    the session is idle again and may be prompted; after any other it is `failed`. The
    provider's own exception is the `__cause__`."""


class PromptCancelledError(SessionLogError):
    """The prompt was cancelled (by `cancel`, `close` or expiry) before the provider answered;
    `prompt_cancelled` was recorded and the session is idle again."""


class RuntimeStoppedError(SessionLogError):
    """A prompt met a runtime that is stopping or has stopped, and the log holds no outcome of
    its request. Once `stop` has begun the runtime starts no prompt, so nothing was run or
    written for this call. A retry whose request has an outcome recorded gets that outcome
    instead, also one that was waiting for its request when `stop` cancelled it. Send the
    request again to a running runtime."""

    def __init__(self, session_id: str, request_id: str) -> None:
        self.session_id = session_id
        self.request_id = request_id
        super().__init__(
            f"prompt: the runtime has stopped, and request `{request_id}` of session "
            f"`{session_id}` has no outcome recorded; nothing was run for this call: send it "
            "again to a running runtime",
            where="prompt",
        )
