"""`sessionlog serve`: the service on uvicorn, over one LMDB store or one PostgreSQL database.

Owns reading the API keys (a file or the environment, never the command line), opening the store
in each worker process (an LMDB environment is never carried across a fork), and the order of a
stop: on SIGTERM requests in flight finish, every event stream gets a final `shutdown` event,
then the queued writes commit and the store closes.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eventlog import InvalidArgumentError
from service import _limits
from sessions import LocalKeyProvider, RetentionPolicy, SessionStore
from sessions.asgi import check_api_keys

API_KEYS_ENV = "SESSIONLOG_API_KEYS"
"""`name=key` pairs separated by commas or newlines; the same shape as an API keys file."""

_WORKER_ENV = "SESSIONLOG_SERVE_CONFIG"


def parse_api_keys(text: str, where: str) -> dict[str, str]:
    """``{key: name}`` from lines (or commas) of ``name=key``; `#` starts a comment."""
    keys: dict[str, str] = {}
    for number, line in enumerate(text.replace(",", "\n").splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        name, sep, key = entry.partition("=")
        if not sep or not name.strip() or not key.strip():
            raise InvalidArgumentError(f"{where}:{number}: expected name=key")
        keys[key.strip()] = name.strip()
    return keys


def load_api_keys(path: str | None, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    keys: dict[str, str] = {}
    if path is not None:
        keys.update(parse_api_keys(Path(path).read_text(), path))
    if environ.get(API_KEYS_ENV):
        keys.update(parse_api_keys(environ[API_KEYS_ENV], f"${API_KEYS_ENV}"))
    return keys


def worker_app() -> Any:
    """The app of one worker process (uvicorn's factory), configured by the parent through the
    environment: the store is opened here, in the process that uses it."""
    import json

    from service._app import create_app

    config = json.loads(os.environ[_WORKER_ENV])
    kek = LocalKeyProvider.from_env_if_set()  # $SESSIONLOG_KEK: an encrypted store's key
    store = SessionStore.open(config["store"], hot_sessions=0, keys=kek)
    keys = load_api_keys(config.get("api_keys_file"))
    policy = retention_policy(**config.get("retention", {}))
    return create_app(
        store,
        api_keys=keys,
        follow=config["workers"] > 1,
        retention=policy,
        past_rebuilds_max=config.get("past_rebuilds_max", _limits.past_rebuilds_max),
    )


def retention_policy(
    max_age_days: float | None = None, grace_days: float = 0.0, archive: str | None = None
) -> RetentionPolicy | None:
    """The policy `serve --max-age-days --grace-days --archive` configures; None without an age."""
    if max_age_days is None:
        return None
    return RetentionPolicy.in_days(max_age_days, grace_days, archive)


def serve(
    store: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8700,
    api_keys_file: str | None = None,
    workers: int = 1,
    log_level: str = "info",
    retention: dict[str, Any] | None = None,
    past_rebuilds_max: int = _limits.past_rebuilds_max,
) -> None:
    """Run the service until SIGTERM or SIGINT; with `retention` (`retention_policy`'s
    arguments), each worker sweeps the store by that policy every hour. Each worker rebuilds at
    most `past_rebuilds_max` past states at once (`create_app`'s setting)."""
    import json

    import uvicorn

    if workers < 1:
        raise InvalidArgumentError(f"serve: --workers must be >= 1, got {workers}")
    if type(past_rebuilds_max) is not int or past_rebuilds_max < 1:
        raise InvalidArgumentError(
            f"serve: --past-rebuilds-max must be an int >= 1, got {past_rebuilds_max!r}"
        )
    keys = load_api_keys(api_keys_file)
    if not keys:
        raise InvalidArgumentError(
            f"serve: no API key: give --api-keys-file or set ${API_KEYS_ENV} (name=key lines)"
        )
    try:
        check_api_keys(keys)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"serve: {exc}".replace("BearerAuth: ", "")) from exc
    retention = retention or {}
    retention_policy(**retention)  # refused here, before any worker starts
    os.environ[_WORKER_ENV] = json.dumps(
        {
            "store": store,
            "api_keys_file": api_keys_file,
            "workers": workers,
            "retention": retention,
            "past_rebuilds_max": past_rebuilds_max,
        }
    )
    uvicorn.run(
        "service._serve:worker_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        timeout_graceful_shutdown=10,
        lifespan="on",
    )


@contextmanager
def draining_on_signals(drain: Any) -> Iterator[None]:
    """While inside: SIGTERM and SIGINT first call `drain()` (streams get their final event, so
    the server's wait for open connections ends), then whatever handled them before (uvicorn's
    graceful stop). Outside the main thread (a test's server in a thread) nothing is changed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(sig: int, frame: Any) -> None:
        drain()
        before = previous[signal.Signals(sig)]
        if callable(before):
            before(sig, frame)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, before in previous.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, before)
