"""Hypothesis strategies for session-store tests, and the deterministic callables they use.

Messages, ids, options and whole verb calls, drawn so that calls meet each other: ids come mostly
from small pools. Public through `sessions.testing`; needs `hypothesis`. Nothing here touches a
store except `VerbCall.apply` and `run_history`, which call its public verbs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from eventlog import SessionLogError
from sessions._model import KNOWN_FIELDS
from sessions._store import SessionStore

STRATEGIES = ("truncate", "observation_mask", "llm", "custom")
# A small pool makes drawn ids collide, so verbs meet open, closed and reopened sessions. It
# holds non-ASCII ids, an inner space, a slash, and one id of exactly `session_id_bytes_max` bytes.
SESSION_ID_POOL: tuple[str, ...] = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "ünï-cødé",
    "with space",
    "s/1",
)
SESSION_ID_POOL += ("x" * 128,)
GHOST_IDS = ("ghost", "never-opened-👻")  # the machine never opens these
CLIENT_ID_POOL = ("tui", "portal", "mobile", "ci-bot")
ROOTS = ("/repo", "/data", "/scratch")
MOUNT_MODES = ("read_only", "read_write")


# Deterministic stand-ins for the caller's callables: the model calls them too.


def count_tokens(message: Mapping[str, Any]) -> int:
    """One token per message plus one per eight characters of its content and tool calls."""
    text = json.dumps(
        [message.get("content"), message.get("tool_calls")], sort_keys=True, ensure_ascii=False
    )
    return 1 + len(text) // 8


def summarize(messages: list[dict[str, Any]]) -> str:
    """A summarizer: the roles it was given, in order."""
    return f"{len(messages)} messages: " + " ".join(str(m.get("role")) for m in messages)


def custom_compact(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A custom compactor: the first message, a note, and the last two."""
    if len(messages) <= 3:
        return messages
    note = {"role": "system", "content": f"[{len(messages) - 3} messages compacted]"}
    return [messages[0], note | {"synthetic": True}, *messages[-2:]]


def mask_as_text(message: dict[str, Any]) -> str:
    """A mask callback answering with placeholder text."""
    return f"[output of {message.get('tool_call_id', message['role'])} withheld]"


def mask_as_message(message: dict[str, Any]) -> dict[str, Any]:
    """A mask callback answering with a whole replacement message."""
    masked = {"role": message["role"], "content": "[withheld]"}
    if "tool_call_id" in message:
        masked["tool_call_id"] = message["tool_call_id"]
    return masked


def compress_clip(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A compress callback: string contents clipped to 40 characters."""
    return [
        {**m, "content": m["content"][:40]} if isinstance(m.get("content"), str) else m
        for m in messages
    ]


# Strategies


def short_text(max_size: int = 24) -> st.SearchStrategy[str]:
    """Any text up to `max_size` characters."""
    return st.text(max_size=max_size)


def json_values() -> st.SearchStrategy[Any]:
    """Plain data a message or scratchpad may hold: None, bools, ints, floats, text, lists, dicts."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**53), max_value=2**53)
        | st.floats(allow_nan=False, allow_infinity=False)
        | short_text()
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(short_text(8), inner, max_size=3)
        ),
        max_leaves=6,
    )


def _long_text() -> st.SearchStrategy[str]:
    # Tool outputs long enough to be masked, drawn cheaply as a repeated word.
    return st.builds(
        lambda word, times: word * times, st.text(min_size=1, max_size=8), st.integers(1, 40)
    )


def content_blocks() -> st.SearchStrategy[list[Any]]:
    """Content as a list of blocks: text, image, tool-result blocks, or bare strings."""
    block = st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": short_text() | _long_text()}),
        st.fixed_dictionaries(
            {"type": st.just("image"), "source": st.fixed_dictionaries({"url": short_text()})}
        ),
        st.fixed_dictionaries(
            {"type": st.just("tool_result"), "tool_use_id": short_text(8), "content": _long_text()}
        ),
        short_text(),
    )
    return st.lists(block, max_size=3)


def _contents() -> st.SearchStrategy[str | list[Any]]:
    return st.one_of(short_text(), _long_text(), content_blocks())


def _tool_calls(call_ids: list[str]) -> list[dict[str, Any]]:
    return [
        {"id": cid, "type": "function", "function": {"name": "run", "arguments": "{}"}}
        for cid in call_ids
    ]


# Keys outside the catalog: kept verbatim by the store, even one named `extra`.
_EXTRA_KEYS = short_text(12).filter(lambda key: key not in KNOWN_FIELDS and key != "role")


@st.composite
def messages(
    draw: st.DrawFn, roles: tuple[str, ...] = ("user", "assistant", "system", "tool")
) -> dict[str, Any]:
    """A valid message dict: any role, text or block content, tool calls on assistant messages,
    a `tool_call_id` on tool results, optional catalog fields, and extra fields of any name."""
    role = draw(st.sampled_from(roles))
    message: dict[str, Any] = {"role": role}
    if draw(st.booleans()) or role == "tool":
        message["content"] = draw(_contents())
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = _tool_calls(draw(st.lists(short_text(6), min_size=1, max_size=2)))
    if role == "tool":
        message["tool_call_id"] = draw(short_text(8))
    optional = {
        "name": short_text(12),
        "model": st.sampled_from(("mock-1", "mock-2")),
        "synthetic": st.booleans(),
        "metadata": st.dictionaries(short_text(8), json_values(), max_size=2),
        "usage": st.fixed_dictionaries(
            {"input_tokens": st.integers(1, 10_000), "output_tokens": st.integers(1, 10_000)}
        ),
        "files": st.lists(
            st.one_of(short_text(16), st.fixed_dictionaries({"path": short_text(16)})),
            max_size=3,
        ),
        "tool_call_id": st.none(),  # an unset field given as None is dropped
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), max_size=3, unique=True)):
        if key not in message:
            message[key] = draw(optional[key])
    for key in draw(st.lists(_EXTRA_KEYS, max_size=2)):
        message[key] = draw(json_values())
    return message


@st.composite
def tool_exchanges(draw: st.DrawFn) -> list[dict[str, Any]]:
    """An assistant message calling one to three tools, then one tool result per call."""
    call_ids = draw(st.lists(short_text(6), min_size=1, max_size=3))
    exchange: list[dict[str, Any]] = [{"role": "assistant", "tool_calls": _tool_calls(call_ids)}]
    for cid in call_ids:
        exchange.append({"role": "tool", "tool_call_id": cid, "content": draw(_contents())})
    return exchange


def _valid_id(text: str) -> bool:
    return (
        bool(text)
        and text.strip() == text
        and not text.startswith("$")
        and not any(ord(ch) < 32 or ord(ch) == 127 for ch in text)
        and len(text.encode("utf-8")) <= 128
    )


def session_ids() -> st.SearchStrategy[str]:
    """Valid session ids: mostly from `SESSION_ID_POOL` (so they collide), sometimes any id but
    the `GHOST_IDS`."""
    anything = st.text(min_size=1, max_size=40).filter(
        lambda t: _valid_id(t) and t not in GHOST_IDS
    )
    return st.sampled_from(SESSION_ID_POOL) | anything


def invalid_session_ids() -> st.SearchStrategy[Any]:
    """Ids no session can have: empty, padded, reserved, control characters, too long, a lone
    surrogate, a non-string."""
    return st.sampled_from(
        [
            *("", " alpha", "alpha ", "$system", "a\x01b", "a\x00b", "\ud800", 7, b"alpha"),
            *("x" * 129, "é" * 65, "y" * 600),
        ]
    )


def client_ids() -> st.SearchStrategy[str]:
    return st.sampled_from(CLIENT_ID_POOL)


def scratchpads() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(short_text(10), json_values(), max_size=4)


def close_statuses() -> st.SearchStrategy[str | dict[str, Any] | None]:
    """What `close_session` accepts as a status: nothing, a reason, or a dict."""
    return st.one_of(
        st.none(),
        st.sampled_from(("done", "timeout", "")),
        st.fixed_dictionaries({"reason": st.sampled_from(("timeout", "error"))}),
    )


@st.composite
def compact_options(draw: st.DrawFn) -> dict[str, Any]:
    """Valid `compact` options for every strategy, with the callables each one needs."""
    options: dict[str, Any] = {}
    ints = {
        "keep_last": st.integers(0, 8),
        "token_threshold": st.integers(0, 80),
        "tool_output_max_chars": st.integers(0, 120),
        "hard_limit_tokens": st.integers(1, 80),
    }
    for key in draw(st.lists(st.sampled_from(sorted(ints)), max_size=4, unique=True)):
        options[key] = draw(ints[key])
    for key in ("compact_strategy", "hard_limit_strategy"):
        chosen = draw(st.none() | st.sampled_from(STRATEGIES))
        if chosen is not None:
            options[key] = chosen
    used = {options.get("compact_strategy", "truncate"), options.get("hard_limit_strategy")}
    if "llm" in used:
        options["summarizer"] = summarize
    if "custom" in used:
        options["custom_compactor"] = custom_compact
    mask = draw(st.sampled_from((None, mask_as_text, mask_as_message)))
    if mask is not None:
        options["mask_callback"] = mask
    if draw(st.booleans()):
        options["compress_callback"] = compress_clip
    return options


@dataclass(frozen=True, eq=False)
class VerbCall:
    """One call of a `SessionStore` verb, printed as it would be written."""

    verb: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, store: SessionStore) -> Any:
        method: Callable[..., Any] = getattr(store, self.verb)
        return method(*self.args, **self.kwargs)

    def __repr__(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.verb}({', '.join(shown)})"


def verbs(
    ids: st.SearchStrategy[str] | None = None, clients: st.SearchStrategy[str] | None = None
) -> st.SearchStrategy[VerbCall]:
    """One verb call with drawn arguments. Ids default to four ids of the pool, so calls meet
    each other; no call mints an id, so a history replays identically on any store."""
    sid = ids if ids is not None else st.sampled_from(SESSION_ID_POOL[:4])
    client = clients if clients is not None else client_ids()
    count = st.integers(0, 10)

    def call(verb: str, *args: st.SearchStrategy[Any], **kwargs: st.SearchStrategy[Any]) -> Any:
        return st.builds(
            lambda a, k: VerbCall(verb, a, k), st.tuples(*args), st.fixed_dictionaries(kwargs)
        )

    mode = st.fixed_dictionaries(
        {"mode": st.sampled_from(("observer", "controller")), "takeover": st.booleans()}
    )
    compacts = st.builds(lambda s, o: VerbCall("compact", (s,), o), sid, compact_options())
    return st.one_of(
        call("open_session", sid),
        call("inject", sid, messages()),
        call("fork", sid, sid),
        call("fork_at", sid, count, sid),
        call("trim", sid, count),
        call("reset", sid),
        compacts,
        call("set_scratchpad", sid, scratchpads()),
        call("clear_scratchpad", sid),
        call("attach", sid, client, mode),
        call("takeover", sid, client),
        call("detach", sid, client),
        call("client_inject_prompt", sid, client, short_text()),
        call("close_session", sid, close_statuses()),
    )


def histories(
    min_size: int = 0,
    max_size: int = 30,
    ids: st.SearchStrategy[str] | None = None,
    clients: st.SearchStrategy[str] | None = None,
) -> st.SearchStrategy[list[VerbCall]]:
    """Lists of verb calls that begin by opening one to three sessions."""
    sid = ids if ids is not None else st.sampled_from(SESSION_ID_POOL[:4])
    opens = st.lists(
        st.builds(lambda s: VerbCall("open_session", (s,)), sid), min_size=1, max_size=3
    )
    rest = st.lists(verbs(sid, clients), min_size=min_size, max_size=max_size)
    return st.builds(lambda first, then: first + then, opens, rest)


def run_history(store: SessionStore, history: list[VerbCall]) -> list[str | None]:
    """Run every call; per call, None when it was accepted or the name of the error class that
    refused it. Errors outside `SessionLogError` propagate: those are bugs."""
    outcomes: list[str | None] = []
    for verb_call in history:
        try:
            verb_call.apply(store)
        except SessionLogError as exc:
            outcomes.append(type(exc).__name__)
        else:
            outcomes.append(None)
    return outcomes
