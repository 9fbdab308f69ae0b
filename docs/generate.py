"""Writes the reference pages of docs/ from the code itself, so they cannot drift from it.

`python docs/generate.py` rewrites `events.md` (the event catalog, every payload field),
`api.md` (every public verb with its signature and what it does, and the error tree) and
`cli.md` (the `--help` of every command) and `openapi.json` (the HTTP service's OpenAPI document);
`--check` only compares, and fails when a page is out
of date (a test runs it). The words come from the docstrings, which are the one place to edit.
"""

from __future__ import annotations

import argparse
import inspect
import io
import os
import re
import sys
import typing
from collections.abc import Callable, Iterable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal: the same width everywhere

import replay  # noqa: E402
from eventlog import EventLog, errors, events  # noqa: E402
from sessionlog import cli  # noqa: E402
from sessions import SessionStore, runtime  # noqa: E402
from sessions._tokens import BearerSessions  # noqa: E402
from sessions.aio import AsyncSessionStore  # noqa: E402
from sessions.runtime import Runtime  # noqa: E402

DOCS = Path(__file__).resolve().parent
HEADER = "<!-- Written by docs/generate.py from the code: edit the docstrings, then run it. -->\n"


def _doc(thing: object) -> str:
    return inspect.cleandoc(getattr(thing, "__doc__", None) or "").strip()


def _type_name(kind: object) -> str:
    text = str(kind) if not isinstance(kind, type) else kind.__name__
    for prefix in ("eventlog.events.", "typing.", "datetime."):
        text = text.replace(prefix, "")
    return text.replace("NoneType", "None")


def _fields_table(struct: type[msgspec.Struct]) -> list[str]:
    hints = typing.get_type_hints(struct)
    rows = ["| field | type | default |", "|---|---|---|"]
    for item in msgspec.structs.fields(struct):
        if item.default is not msgspec.NODEFAULT:
            default = f"`{item.default!r}`"
        elif item.default_factory is not msgspec.NODEFAULT:
            default = f"`{item.default_factory()!r}`"
        else:
            default = "required"
        rows.append(f"| `{item.name}` | `{_type_name(hints[item.name])}` | {default} |")
    return rows


def events_page() -> str:
    out = [
        HEADER,
        "# The event catalog",
        "",
        "Every event is a frozen msgspec struct, tagged with the name below, stored as the `data`",
        "of an envelope (`position`, `stream`, `version`, `recorded_at`, `meta`, `hash`). The tag",
        "is what is stored, so renaming a class never changes stored bytes. How the catalog may",
        "change is in [evolution.md](evolution.md). Session events live on the session's stream;",
        "bearer events on `$bearer/<handle>`.",
        "",
        "## Records inside events",
        "",
    ]
    for record in (events.Message, events.Usage, events.FileRef, events.PrunedResult):
        out += [f"### {record.__name__}", "", _doc(record), "", *_fields_table(record), ""]
    out += ["## Events", ""]
    for kind in events.EVENT_TYPES:
        tag = kind.__struct_config__.tag
        out += [f"### `{tag}`", "", _doc(kind) or "(no description)", "", *_fields_table(kind), ""]
    return "\n".join(out).rstrip() + "\n"


def _public(cls: type) -> Iterable[tuple[str, Callable[..., Any]]]:
    for name, member in inspect.getmembers(cls, callable):
        if not name.startswith("_") and (member.__doc__ or "").strip():
            yield name, member


def _signature(thing: Callable[..., Any]) -> str:
    """The signature as written in the code (annotations unquoted, no `self`)."""
    text = str(inspect.signature(thing)).replace("(self, ", "(").replace("(self)", "()")
    return re.sub(r"(: |-> )'([^']*)'", r"\1\2", text)


def _verbs(title: str, intro: str, owner: type, names: Iterable[str] | None = None) -> list[str]:
    out = [f"## {title}", "", intro, ""]
    members = dict(_public(owner))
    for name in names or sorted(members):
        member = members[name]
        out += [f"### `{name}{_signature(member)}`", "", _doc(member), ""]
    return out


def api_page() -> str:
    out = [
        HEADER,
        "# API reference",
        "",
        "The public surface, verb by verb. Every refusal raises an error from the tree at the end",
        "and writes nothing; messages say what was expected, what came and where.",
        "",
    ]
    out += _verbs(
        "SessionStore",
        "`from sessions import SessionStore`: the engine. Lifecycle verbs on an unknown or closed "
        "id raise `UnknownSessionError`; `exists`, `open_session`, `snapshot` and `ancestry` "
        "tolerate unknown ids.",
        SessionStore,
    )
    out += _verbs("store.tokens", "Bearer sessions (`store.tokens`).", BearerSessions)
    awaited = sorted(
        name
        for name, member in inspect.getmembers(AsyncSessionStore, inspect.iscoroutinefunction)
        if not name.startswith("_") and name != "open" and hasattr(SessionStore, name)
    )
    out += _verbs(
        "AsyncSessionStore",
        "`from sessions.aio import AsyncSessionStore`: the engine for asyncio code. Each call runs "
        "on the store's own worker thread, never on the event loop. These verbs are awaited "
        "namesakes of the `SessionStore` ones: " + ", ".join(f"`{n}`" for n in awaited) + ".",
        AsyncSessionStore,
    )
    out += _verbs(
        "EventLog",
        "`store.log`, or `from eventlog import EventLog` on its own: the append-only log.",
        EventLog,
    )
    out += _verbs(
        "Runtime",
        "`from sessions.runtime import Runtime`: the asyncio delegation runtime.",
        Runtime,
    )
    out += ["## replay", "", "`import replay`: the edges of the engine.", ""]
    for name in sorted(replay.__all__):
        thing = getattr(replay, name)
        if inspect.isfunction(thing):
            out += [f"### `{name}{_signature(thing)}`", "", _doc(thing), ""]
    out += [
        "## Errors",
        "",
        "One tree, rooted at `SessionLogError`; each error carries `index`, `where`,",
    ]
    out += ["`expected` and `got` as fields where they apply (None otherwise):", ""]
    for module, cls in _error_tree():
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        first = _doc(cls).split("\n\n")[0].replace("\n", " ")
        out.append(f"- `{cls.__name__}` ({bases}, `{module}`): {first}")
    return "\n".join(out).rstrip() + "\n"


def _error_tree() -> list[tuple[str, type]]:
    """Every public error class, with the module a caller imports it from: the log's tree, the
    runtime's errors and replay's."""
    found: dict[str, tuple[str, type]] = {}
    for name, module in (
        ("eventlog.errors", errors),
        ("sessions.runtime", runtime),
        ("replay", replay),
    ):
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            public = module is errors or cls_name in module.__all__
            if public and issubclass(cls, errors.SessionLogError):
                found.setdefault(cls_name, (name, cls))
    return [found[name] for name in sorted(found)]


def _help(argv: list[str]) -> str:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        try:
            cli.main([*argv, "--help"])
        except SystemExit:
            pass
    return buffer.getvalue().rstrip()


def cli_page() -> str:
    parser = cli.build_parser()
    commands: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands = list(action.choices)
    out = [
        HEADER,
        "# The `sessionlog` command",
        "",
        "A thin layer over the library: every command calls one library function. The store is",
        "`--store PATH` (or a `postgresql://` URL), else `SESSIONLOG_STORE`, else `var/sessions`.",
        "",
        "```text",
        _help([]),
        "```",
        "",
    ]
    for command in commands:
        out += [f"## `sessionlog {command}`", "", "```text", _help([command]), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def openapi_page() -> str:
    from service import _openapi  # the service's document, as `GET /v1/openapi.json` serves it

    return _openapi.document_bytes().decode()


PAGES: dict[str, Callable[[], str]] = {
    "events.md": events_page,
    "api.md": api_page,
    "cli.md": cli_page,
    "openapi.json": openapi_page,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when stale")
    args = parser.parse_args(argv)
    stale = []
    for name, render in PAGES.items():
        text = render()
        path = DOCS / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python docs/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
