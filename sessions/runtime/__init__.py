"""The delegation runtime: asyncio sessions driven through model providers, every state change an
event in the log, and status, loop records and usage as projections (seeds 002 and 003).

`async with Runtime(store) as runtime:` is the entry point; `MockProvider` is the embedded default.
"""

from eventlog.errors import (
    ConfigurationError,
    InputRejectedError,
    LeaseHeldError,
    PromptCancelledError,
    ProviderError,
    SessionBusyError,
    SessionFailedError,
)
from sessions.runtime._filters import InputFilter, Verdict, passed, reject, warn
from sessions.runtime._providers import (
    Completion,
    ContextLengthError,
    MockProvider,
    Provider,
    ProviderRegistry,
)
from sessions.runtime._recorder import SessionRecord
from sessions.runtime._runtime import Runtime

__all__ = [
    "Completion",
    "ConfigurationError",
    "ContextLengthError",
    "InputFilter",
    "InputRejectedError",
    "LeaseHeldError",
    "MockProvider",
    "PromptCancelledError",
    "Provider",
    "ProviderError",
    "ProviderRegistry",
    "Runtime",
    "SessionBusyError",
    "SessionFailedError",
    "SessionRecord",
    "Verdict",
    "passed",
    "reject",
    "warn",
]
