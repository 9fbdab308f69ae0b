"""HTTP plumbing shared by the model providers: API keys, one pooled `httpx.AsyncClient` per
event loop, a request that retries what is worth retrying, and `HttpProvider`, the base of the
providers that speak a model's API over it.

Retried: 429 and 5xx answers (after `Retry-After` when the server sends one, else exponential
backoff with full jitter), connect and read timeouts, and connections dropped before the answer
was whole. Nothing is recorded until a completion is assembled, so a retry never duplicates a
fact. A whole call, every attempt and wait included, ends by `total_timeout_s`. Cancelling the
awaiting task closes the response and its connection: the request really stops. Not retried:
an answer past a bound (a whole body past `ANSWER_BYTES_MAX`, a stream's line or event past
`sse_line_bytes_max`), which the same server would send again. `httpx` is imported only when a
provider first sends something (the `runtime` extra).

An API key never leaves this module except in the request header: errors carry the server's
words with the key scrubbed out, and providers do not show it in their `repr`.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from eventlog.errors import ConfigurationError
from sessions.runtime._params import check_params
from sessions.runtime._providers import Completion, ContextLengthError, Messages, Params, ToolSpecs

if TYPE_CHECKING:
    import httpx

ERROR_TEXT_MAX = 2_000
"""Characters of a server's error body kept in an error message."""
ERROR_BODY_BYTES_MAX = 64 * 1024
"""Bytes of an error answer's body read at most: only its first `ERROR_TEXT_MAX` characters are
kept, and a server that streams an endless error body must not fill the process's memory."""
ANSWER_BYTES_MAX = 64 * 1024 * 1024
"""Bytes of a whole (not streamed) answer read at most; a larger one is refused. A reply the
runtime can record is far smaller (`reply_bytes_max`)."""
KEY_PIECE_MIN = 8
"""The shortest start of an API key that `scrub` redacts on its own: providers quote the first
few hundred characters of what a server sent, which may end in the middle of an echoed key."""


class ProviderHTTPError(Exception):
    """The model's API answered with an error status (after any retries)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ProviderTimeoutError(ProviderHTTPError):
    """The API did not connect or did not answer in time (after any retries)."""


class ProviderConnectionError(ProviderHTTPError):
    """The connection failed or dropped before the answer was whole (after any retries)."""


@dataclass(frozen=True)
class HttpSettings:
    """How a provider talks HTTP. Times are seconds."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    """Longest silence between two pieces of an answer (a stream's chunks, or the whole body)."""
    total_timeout_s: float = 600.0
    """Longest a whole call may take, every attempt and backoff included: a server that keeps a
    stream alive with comments (or trickles it) but never finishes is cut off here with
    `ProviderTimeoutError`, and nothing is retried past it."""
    retries: int = 3
    """Attempts after the first for a retryable failure."""
    backoff_s: float = 0.5
    """First backoff; each retry doubles it, up to `backoff_max_s`, with full jitter."""
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 60.0
    """A `Retry-After` longer than this is not waited for: the error is raised instead."""

    def __post_init__(self) -> None:
        for name in (
            "connect_timeout_s",
            "read_timeout_s",
            "total_timeout_s",
            "backoff_max_s",
            "retry_after_max_s",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigurationError(f"HttpSettings: `{name}` must be > 0 seconds: {value!r}")
        if isinstance(self.backoff_s, bool) or not isinstance(self.backoff_s, (int, float)):
            raise ConfigurationError(
                f"HttpSettings: `backoff_s` must be a number: {self.backoff_s!r}"
            )
        if self.backoff_s < 0:
            raise ConfigurationError(f"HttpSettings: `backoff_s` must be >= 0: {self.backoff_s!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigurationError(
                f"HttpSettings: `retries` must be an int >= 0: {self.retries!r}"
            )


def resolve_key(
    api_key: str | None, env: str | None, secrets_file: str | os.PathLike[str] | None, where: str
) -> str | None:
    """The API key: given outright, else the environment variable `env`, else the line
    ``ENV=value`` of `secrets_file` (blank lines and ``#`` comments skipped). None when the
    variable is unset and no secrets file is named (a local server needs no key);
    `ConfigurationError`, never showing a value, when the secrets file lacks it."""
    if api_key is not None:
        if not isinstance(api_key, str) or not api_key.strip():
            raise ConfigurationError(f"{where}: `api_key` must be a non-empty str")
        return api_key.strip()
    if env is None:
        return None
    found = os.environ.get(env)
    if found and found.strip():
        return found.strip()
    if secrets_file is None:
        return None  # a local server (vLLM, llama.cpp, Ollama) needs no key
    if secrets_file is not None:
        path = Path(secrets_file)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigurationError(
                f"{where}: cannot read the secrets file {path.name!r}: {exc.strerror}"
            ) from None
        for number, line in enumerate(lines, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            name, sep, value = text.partition("=")
            if not sep:
                raise ConfigurationError(
                    f"{where}: secrets file {path.name!r} line {number} is not NAME=value"
                )
            if name.strip() == env and value.strip():
                return value.strip().strip("\"'")
    raise ConfigurationError(
        f"{where}: no API key: set ${env} or the line {env}=... in the secrets file"
    )


async def read_capped(resp: httpx.Response, limit: int) -> bytes:
    """At most `limit` bytes of `resp`'s body: what follows is left unread (the response is
    closed with its connection)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.aiter_bytes():
        parts.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


async def read_answer_body(resp: httpx.Response, where: str) -> bytes:
    """A whole answer's body, refused (`ProviderHTTPError`) past `ANSWER_BYTES_MAX` bytes."""
    body = await read_capped(resp, ANSWER_BYTES_MAX + 1)
    if len(body) > ANSWER_BYTES_MAX:
        raise ProviderHTTPError(f"{where}: an answer of more than {ANSWER_BYTES_MAX:,} bytes")
    return body


def scrub(text: str, secret: str | None) -> str:
    """`text` with `secret` replaced, and any run of `KEY_PIECE_MIN` or more of its first
    characters (a quote of what a server sent, cut in the middle of the key), cut to
    `ERROR_TEXT_MAX` characters."""
    if secret:
        text = text.replace(secret, "[redacted]")
        if len(secret) > KEY_PIECE_MIN:
            pieces: list[str] = []
            start = 0
            while (found := text.find(secret[:KEY_PIECE_MIN], start)) >= 0:
                quoted = text[found : found + len(secret)]
                held = os.path.commonprefix([quoted, secret])  # noqa: RUF071 - characters, not paths
                pieces += [text[start:found], "[redacted]"]
                start = found + len(held)
            text = "".join(pieces) + text[start:]
    return text[:ERROR_TEXT_MAX]


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a `Retry-After` header asks for (delta-seconds or an HTTP date); None if absent
    or unreadable."""
    if value is None:
        return None
    text = value.strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def backoff_s(settings: HttpSettings, attempt: int) -> float:
    """Full jitter: uniform in [0, min(max, base * 2**attempt)]."""
    ceiling = min(settings.backoff_max_s, settings.backoff_s * (2**attempt))
    return random.uniform(0.0, ceiling)


class Transport:
    """One pooled `httpx.AsyncClient` per event loop (a client is bound to the loop it first ran
    on), the settings, and the key to scrub from errors."""

    def __init__(self, settings: HttpSettings, secret: str | None) -> None:
        self.settings = settings
        self._secret = secret
        # By loop, weakly: a client is bound to the loop it first ran on, and a loop that is
        # gone must not hand its client (or its id) to the next one.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]
        self._clients = weakref.WeakKeyDictionary()

    def client(self) -> httpx.AsyncClient:
        try:
            import httpx
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                "HTTP providers need httpx: pip install 'sessionlog-engine[runtime]'"
            ) from exc
        loop = asyncio.get_running_loop()
        found = self._clients.get(loop)
        if found is None or found.is_closed:
            timeout = httpx.Timeout(
                self.settings.read_timeout_s, connect=self.settings.connect_timeout_s
            )
            found = self._clients[loop] = httpx.AsyncClient(timeout=timeout)
        return found

    async def aclose(self) -> None:
        """Close the client of the running loop (the others belong to loops already gone)."""
        found = self._clients.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await found.aclose()

    def scrub(self, text: str) -> str:
        return scrub(text, self._secret)

    async def send(
        self,
        url: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        consume: Callable[[httpx.Response], Any],
        refusal: Callable[[int, str], Exception | None],
        where: str,
    ) -> Any:
        """POST `body` and hand the streamed response to `consume` (awaited), retrying what is
        worth it, all within `total_timeout_s`. `refusal(status, text)` may turn a non-retryable
        error into its own exception (a context-length refusal)."""
        deadline = asyncio.timeout(self.settings.total_timeout_s)
        try:
            async with deadline:
                return await self._attempts(url, headers, body, consume, refusal, where)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise ProviderTimeoutError(
                f"{where}: no whole answer within total_timeout_s="
                f"{self.settings.total_timeout_s:g} s"
            ) from None

    async def _attempts(
        self,
        url: str,
        headers: Mapping[str, str],
        body: dict[str, Any],
        consume: Callable[[httpx.Response], Any],
        refusal: Callable[[int, str], Exception | None],
        where: str,
    ) -> Any:
        import httpx

        settings = self.settings
        attempt = 0
        while True:
            wait: float | None
            try:
                async with self.client().stream("POST", url, json=body, headers=headers) as resp:
                    if resp.status_code < 400:
                        try:
                            return await consume(resp)
                        except (ProviderHTTPError, ContextLengthError) as exc:
                            # A provider quotes what the server sent (an in-stream error, a
                            # line that is not JSON), which may echo the key.
                            exc.args = tuple(
                                self.scrub(arg) if isinstance(arg, str) else arg for arg in exc.args
                            )
                            raise
                    text = (await read_capped(resp, ERROR_BODY_BYTES_MAX)).decode(
                        "utf-8", "replace"
                    )
                    error = self._status_error(resp.status_code, text, refusal, where)
                    retryable = resp.status_code == 429 or resp.status_code >= 500
                    if not retryable or attempt >= settings.retries:
                        raise error
                    wait = retry_after_s(resp.headers.get("retry-after"))
                    if wait is not None and wait > settings.retry_after_max_s:
                        raise error
            except httpx.TimeoutException as exc:
                if attempt >= settings.retries:
                    raise ProviderTimeoutError(
                        f"{where}: no answer in time after {attempt + 1} attempts "
                        f"({type(exc).__name__})"
                    ) from None
                wait = None
            except (httpx.TransportError, StreamDropped) as exc:
                if attempt >= settings.retries:
                    raise ProviderConnectionError(
                        f"{where}: the connection failed after {attempt + 1} attempts: "
                        f"{self.scrub(str(exc)) or type(exc).__name__}"
                    ) from None
                wait = None
            await asyncio.sleep(backoff_s(settings, attempt) if wait is None else wait)
            attempt += 1

    def _status_error(
        self, status: int, text: str, refusal: Callable[[int, str], Exception | None], where: str
    ) -> Exception:
        special = refusal(status, text)
        if special is not None:
            return special
        return ProviderHTTPError(
            f"{where}: HTTP {status}: {self.scrub(text.strip())}", status=status
        )


class StreamDropped(Exception):
    """A stream ended before its final event: retried like a dropped connection."""


def context_refusal(status: int, text: str, where: str, words: Sequence[str]) -> Exception | None:
    """`ContextLengthError` when an answer of `status` refuses the messages as too long (it says
    one of `words`); None for any other error."""
    lowered = text.lower()
    if status in (400, 413) and any(word in lowered for word in words):
        return ContextLengthError(f"{where}: the model refused the messages as too long")
    return None


class HttpOptions(TypedDict, total=False):
    """The options every HTTP provider takes besides its name, `base_url` and `api_key_env`."""

    defaults: Mapping[str, Any] | None
    """Parameters of every call, under the call's own."""
    api_key: str | None
    secrets_file: str | os.PathLike[str] | None
    stream: bool
    """Read answers as a stream (default True)."""
    settings: HttpSettings | None
    headers: Mapping[str, str] | None
    """Headers sent with every request, besides the key's."""


class HttpProvider:
    """What the HTTP providers share: the name and defaults, the endpoint's URL, the headers with
    the API key (from `api_key`, else `$api_key_env`, else that name's line in `secrets_file`),
    and one `complete` that sends the body and reads the answer. A subclass says how the key is
    sent (`key_header`), builds the body (`request_body`) and reads an answer (`read_answer`)."""

    endpoint = ""
    """The path after `base_url` that requests go to."""
    context_words: Sequence[str] = ()
    """Words of an error answer that refuses the messages as too long (see `context_refusal`)."""

    def __init__(
        self, name: str, base_url: str, api_key_env: str | None, **options: Unpack[HttpOptions]
    ) -> None:
        kind = type(self).__name__
        defaults, headers = options.get("defaults"), options.get("headers")
        api_key, secrets_file = options.get("api_key"), options.get("secrets_file")
        stream, settings = options.get("stream", True), options.get("settings")
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"{kind}: name must be a non-empty str: {name!r}")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"{kind}: base_url must be an http(s) URL: {base_url!r}")
        self.name = name
        self.defaults: Mapping[str, Any] = check_params(defaults, f"provider `{name}` defaults")
        self.url = base_url.rstrip("/") + self.endpoint
        self.stream = bool(stream)
        key = resolve_key(api_key, api_key_env, secrets_file, self.where)
        self._headers = {"content-type": "application/json", **dict(headers or {})}
        if key is not None:
            self._headers.update(self.key_header(key))
        self._transport = Transport(settings or HttpSettings(), key)

    @property
    def where(self) -> str:
        """How errors name this provider."""
        return f"provider `{self.name}`"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, url={self.url!r})"

    def scrub(self, text: str) -> str:
        """`text` with this provider's API key (or a cut-off start of it) redacted, cut as an
        error's text is (`scrub`)."""
        return self._transport.scrub(text)

    async def aclose(self) -> None:
        await self._transport.aclose()

    def key_header(self, key: str) -> dict[str, str]:
        """The header that carries the API key."""
        raise NotImplementedError

    def request_body(self, messages: Messages, params: Params, tools: ToolSpecs) -> dict[str, Any]:
        """The JSON body for these messages, merged parameters and tool specs."""
        raise NotImplementedError

    async def read_answer(self, resp: httpx.Response, where: str) -> Completion:
        """The completion in a successful answer (streamed or whole, as `stream` says)."""
        raise NotImplementedError

    def model(self, params: Mapping[str, Any]) -> Any:
        """The `model` of the merged parameters, which every request needs."""
        model = params.get("model")
        if model is None:
            raise ConfigurationError(
                f"{self.where}: no `model`: set it in the provider's defaults, the session's "
                "runtime_params or the prompt's"
            )
        return model

    async def complete(
        self, messages: Messages, params: dict[str, Any], *, tools: ToolSpecs | None = None
    ) -> Completion:
        where = self.where
        body = self.request_body(messages, params, tools or ())

        async def read(resp: httpx.Response) -> Completion:
            return await self.read_answer(resp, where)

        def refusal(status: int, text: str) -> Exception | None:
            return context_refusal(status, text, where, self.context_words)

        completion: Completion = await self._transport.send(
            self.url, self._headers, body, read, refusal, where
        )
        return completion
