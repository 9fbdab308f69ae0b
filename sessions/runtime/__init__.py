"""The delegation runtime: asyncio sessions driven through model providers, every state change an
event in the log, and status, loop records and usage as projections (seeds 002 and 003).

`async with Runtime(store) as runtime:` is the entry point; `MockProvider` is the embedded default.
`OpenAIProvider` (Chat Completions and compatible servers) and `AnthropicProvider` (Messages) talk
to real models over HTTP; they need the `runtime` extra (httpx), imported when they first send.
"""

from eventlog.errors import ConfigurationError, LeaseHeldError, LeaseLostError
from sessions.runtime._anthropic import AnthropicProvider
from sessions.runtime._errors import (
    InputRejectedError,
    PromptCancelledError,
    ProviderError,
    RequestConflictError,
    RuntimeStoppedError,
    SessionBusyError,
    SessionFailedError,
)
from sessions.runtime._filters import InputFilter, Verdict, passed, reject, warn
from sessions.runtime._http import (
    HttpSettings,
    ProviderConnectionError,
    ProviderHTTPError,
    ProviderTimeoutError,
)
from sessions.runtime._openai import OpenAIProvider
from sessions.runtime._params import camel_params, wire_params
from sessions.runtime._prompting import Tool
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
    "AnthropicProvider",
    "HttpSettings",
    "OpenAIProvider",
    "ProviderConnectionError",
    "ProviderHTTPError",
    "ProviderTimeoutError",
    "Completion",
    "ConfigurationError",
    "ContextLengthError",
    "InputFilter",
    "InputRejectedError",
    "LeaseHeldError",
    "LeaseLostError",
    "MockProvider",
    "PromptCancelledError",
    "Provider",
    "ProviderError",
    "ProviderRegistry",
    "RequestConflictError",
    "Runtime",
    "RuntimeStoppedError",
    "SessionBusyError",
    "SessionFailedError",
    "SessionRecord",
    "Tool",
    "Verdict",
    "camel_params",
    "passed",
    "reject",
    "warn",
    "wire_params",
]
