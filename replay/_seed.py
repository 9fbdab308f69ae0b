"""`seed_from_jsonl`: a new session from an `llm_transcript.jsonl` file, in one atomic commit.

Owns the seeding options, the result, and the order of work: check options (raising), read and
decide everything (returning `ok: false` on bad input), then write the session and its messages in
one `store.transaction()`. A result that is not ok leaves the log exactly as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from eventlog import check_encodable, limits
from replay import _limits
from replay._transcript import (
    PROVIDER_RESPONSES_ONLY,
    KeptMessages,
    Transcript,
    TranscriptError,
    read_transcript,
)
from sessions import InvalidArgumentError, SessionLogError, SessionStore

_VERB = "seed_from_jsonl"
SEED_TEXT_OPTIONS = (
    "provider",
    "model",
    "source_agent",
    "source_session_id",
    "source_kind",
    "source_label",
)
"""The options of `seed_from_jsonl` that are plain strings saying what made the transcript and
where it came from (the CLI has a flag for each)."""
_TEXT_OPTIONS = ("rename_session", *SEED_TEXT_OPTIONS)
_FLAG_OPTIONS = {"drop_tool_calls": False, "validate": True}
_OPTION_NAMES = frozenset((*_TEXT_OPTIONS, *_FLAG_OPTIONS, "truncate_to_last", "source_provenance"))
_PROVENANCE = {
    "source_agent": "agent",
    "source_session_id": "session_id",
    "source_kind": "kind",
    "source_label": "label",
    "source_provenance": "provenance",
}
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SeedResult:
    """What `seed_from_jsonl` did. `ok` false means nothing was written and `error` says why.

    `turns_loaded` equals `messages_loaded`: Harn's seeding verb reports the number of loaded
    transcript entries under both names, and every loaded message (user, assistant or tool) is one
    turn of the transcript, so callers written against Harn read the count they expect.
    `source` is the provenance: the file's name and blake3, and the `source_*` options given."""

    ok: bool
    session_id: str | None = None
    turns_loaded: int = 0
    messages_loaded: int = 0
    source_records: int = 0
    source_format: str | None = None
    partial: bool = False
    truncated: bool = False
    provider: str | None = None
    model: str | None = None
    tool_format: str | None = None
    error: str | None = None
    source: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def to_dict(self) -> dict[str, Any]:
        """A fresh plain dict of every field (`source` copied too)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["source"] = dict(self.source)
        return data

    def __getitem__(self, key: str) -> Any:
        if key not in _FIELD_NAMES:
            raise KeyError(key)
        return getattr(self, key)

    def keys(self) -> Iterator[str]:
        return iter(_FIELD_NAMES)


_FIELD_NAMES = tuple(f.name for f in fields(SeedResult))


@dataclass(frozen=True, slots=True)
class _Options:
    truncate_to_last: int | None
    drop_tool_calls: bool
    validate: bool
    rename_session: str | None
    provider: str | None
    model: str | None
    provenance: Mapping[str, Any]


def _parse_options(options: Mapping[str, Any]) -> _Options:
    """Check every option; a wrong key or type raises before anything is read."""
    unknown = sorted(set(options) - _OPTION_NAMES)
    if unknown:
        raise InvalidArgumentError(
            f"{_VERB}: unknown option {', '.join(map(repr, unknown))} "
            f"(expected one of: {', '.join(sorted(_OPTION_NAMES))})"
        )
    text: dict[str, str | None] = {}
    for name in _TEXT_OPTIONS:
        value = options.get(name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InvalidArgumentError(
                f"{_VERB}: option `{name}` must be a non-empty str or None, got {value!r}"
            )
        text[name] = value
    flags: dict[str, bool] = {}
    for name, default in _FLAG_OPTIONS.items():
        value = options.get(name)
        if value is not None and not isinstance(value, bool):
            raise InvalidArgumentError(
                f"{_VERB}: option `{name}` must be a bool or None, got {type(value).__name__}"
            )
        flags[name] = default if value is None else value
    keep = options.get("truncate_to_last")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
        raise InvalidArgumentError(
            f"{_VERB}: option `truncate_to_last` must be an int >= 0 or None, got {keep!r}"
        )
    extra = options.get("source_provenance")
    if extra is not None:
        if not isinstance(extra, Mapping) or not all(isinstance(k, str) for k in extra):
            raise InvalidArgumentError(
                f"{_VERB}: option `source_provenance` must be a dict with str keys or None, "
                f"got {type(extra).__name__}"
            )
        extra = dict(extra)
        check_encodable(extra, what=f"{_VERB}: option `source_provenance`")
    provenance = {
        short: (extra if name == "source_provenance" else text[name])
        for name, short in _PROVENANCE.items()
    }
    return _Options(
        truncate_to_last=keep,
        drop_tool_calls=flags["drop_tool_calls"],
        validate=flags["validate"],
        rename_session=text["rename_session"],
        provider=text["provider"],
        model=text["model"],
        provenance={k: v for k, v in provenance.items() if v is not None},
    )


def seed_from_jsonl(
    store: SessionStore,
    path: str | os.PathLike[str],
    *,
    progress: Callable[[int, int], object] | None = None,
    **options: Any,
) -> SeedResult:
    """Create a session holding the messages of the `llm_transcript.jsonl` file at `path`.

    Options (all optional): `drop_tool_calls`, `truncate_to_last`, `validate` (default true),
    `rename_session` (the new session's id; by default a fresh UUIDv7), `provider` and `model`
    (guardrails against the transcript's), and provenance recorded with the session:
    `source_agent`, `source_session_id`, `source_kind`, `source_label` (strings) and
    `source_provenance` (a dict). Unknown options and wrong option types raise
    `InvalidArgumentError`; a file that cannot be read or seeded gives `ok=False` with `error`,
    and then no session exists and the log is unchanged.

    The session records the transcript's system prompt and tool format, and in its metadata
    `seeded_from`: the file's base name and blake3, the source format, counts, provider, model and
    the provenance options. The base name, not the path: a path describes the machine that seeded
    the session, travels into exported bundles, and the hash already identifies the content.

    `progress(bytes_read, file_bytes)`, if given, follows the reading; it is a hook, not an
    option, and is recorded nowhere.
    """
    shown = _checked_path(path)
    opts = _parse_options(options)
    source: dict[str, Any] = {"file": os.path.basename(shown), **opts.provenance}
    try:
        transcript = read_transcript(
            shown,
            drop_tool_calls=opts.drop_tool_calls,
            truncate_to_last=opts.truncate_to_last,
            progress=progress,
        )
    except TranscriptError as exc:
        return SeedResult(ok=False, error=str(exc), source=MappingProxyType(source))
    source["blake3"] = transcript.blake3
    messages, lines, truncated = transcript.messages, transcript.lines, transcript.truncated
    partial = transcript.source_format == PROVIDER_RESPONSES_ONLY
    failed = SeedResult(
        ok=False,
        source_records=transcript.records,
        source_format=transcript.source_format,
        partial=partial,
        truncated=truncated,
        provider=transcript.provider,
        model=transcript.model,
        tool_format=transcript.tool_format,
        source=MappingProxyType(source),
    )
    problem = _invalid(shown, transcript, messages, opts) if opts.validate else None
    if problem is not None:
        return _replace(failed, error=problem)
    seeded_from = _seeded_from(source, transcript, partial=partial, truncated=truncated)
    try:
        session_id = _commit(store, transcript, messages, opts, seeded_from)
    except _Refused as refused:
        return _replace(failed, error=_refusal_text(shown, lines, refused))
    loaded = len(messages)
    return _replace(
        failed, ok=True, session_id=session_id, turns_loaded=loaded, messages_loaded=loaded
    )


def _checked_path(path: object) -> str:
    """`path` as a str, or `InvalidArgumentError` saying why it is not a usable path."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"{_VERB}: path must be a str or path, got {type(path).__name__}"
        )
    shown = os.fspath(path)
    if not isinstance(shown, str) or "\0" in shown:
        raise InvalidArgumentError(f"{_VERB}: path must be a str path without NUL, got {shown!r}")
    return shown


def _seeded_from(
    source: dict[str, Any], transcript: Any, *, partial: bool, truncated: bool
) -> dict[str, Any]:
    """The `seeded_from` metadata: where the messages came from, and what they were."""
    return {
        **source,
        "source_format": transcript.source_format,
        "source_records": transcript.records,
        "partial": partial,
        "truncated": truncated,
        "provider": transcript.provider,
        "model": transcript.model,
        "tool_format": transcript.tool_format,
    }


def _replace(result: SeedResult, **changes: Any) -> SeedResult:
    data = {f.name: getattr(result, f.name) for f in fields(result)}
    data.update(changes)
    return SeedResult(**data)


def _invalid(
    path: str, transcript: Transcript, messages: KeptMessages, opts: _Options
) -> str | None:
    """Why the reconstruction cannot be trusted, or None. `truncate_to_last=0` asks for an empty
    session on purpose, so it is not an error to end up with no messages then."""
    wants_empty = opts.truncate_to_last == 0
    if not transcript.found and not wants_empty:
        return f"{path}: the transcript has no prompt-visible messages"
    if not messages and not wants_empty:
        return f"{path}: the seed options dropped every message of the transcript"
    if transcript.source_format == PROVIDER_RESPONSES_ONLY:
        return (
            f"{path}: the transcript has provider responses but no message events or request "
            "snapshots, so exact prefix reconstruction is impossible (pass validate=False for a "
            "best-effort, assistant-only session)"
        )
    for name, expected, actual in (
        ("provider", opts.provider, transcript.provider),
        ("model", opts.model, transcript.model),
    ):
        if expected is not None and actual != expected:
            return (
                f"{path}: the transcript's {name} is {actual or 'unknown'!r} (as its last request "
                f"names it), expected {expected!r} (the `{name}` option)"
            )
    return None


# Writing: one transaction, rolled back by raising `_Refused` out of it.


class _Refused(SessionLogError):
    """Raised inside the seeding transaction to undo it; carries the reason and, when the engine
    refused one message, that message's index in the kept messages."""

    def __init__(
        self, reason: str, engine_error: SessionLogError | None = None, at: int | None = None
    ) -> None:
        self.reason = reason
        self.engine_error = engine_error
        super().__init__(reason, index=at)


def _commit(
    store: SessionStore,
    transcript: Transcript,
    messages: KeptMessages,
    opts: _Options,
    seeded_from: dict[str, Any],
) -> str:
    with store.transaction():
        wanted = opts.rename_session
        # Checked inside the transaction: the write lock is held, so no one can take the id
        # between this check and the open (which would otherwise return the existing session).
        if wanted is not None and store.exists(wanted):
            raise _Refused(f"session `{wanted}` already exists (the `rename_session` option)")
        session_id = store.open_session(
            wanted,
            system_prompt=transcript.system_prompt,
            tool_format=transcript.tool_format,
            metadata={"seeded_from": seeded_from},
        )
        # One batch at a time is decoded from the kept buffer: the engine never holds the
        # whole transcript as objects (its events come out as from one call).
        done = 0
        count = limits.messages_per_event_max
        for batch in messages.batches(count, _limits.seed_batch_bytes):
            try:
                done += store.inject_many(session_id, batch)
            except InvalidArgumentError as exc:
                at = None if exc.index is None else done + exc.index
                raise _Refused(str(exc), exc, at) from exc
    return session_id


def _refusal_text(path: str, lines: Sequence[int], refused: _Refused) -> str:
    """The error of a refused seed; a message the engine refused is named by its line, and the
    error's own `where` (a place in one batch, meaningless in the file) is left out."""
    engine = refused.engine_error
    if engine is None:
        return f"{path}: {refused.reason}"
    if refused.index is None:  # not one message's fault (a bound on the whole transcript, say)
        return f"{path}: the session engine refused the transcript: {refused.reason}"
    detail = str(engine)
    if engine.where is not None and detail.startswith(engine.where):
        detail = detail.removeprefix(engine.where).lstrip(": ")
    return f"{path}:{lines[refused.index]}: the session engine refused this message: {detail}"
