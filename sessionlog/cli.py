"""`sessionlog`, the command line: the parser, its help, and the one place errors become exit codes.

Owns the flags and how failures are reported (one line on stderr, an exit code per kind); the
commands themselves live in `_commands` and `_edges` and stay thin wrappers over the library.
It must never print a traceback for an operating error, nor hold any session logic.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any, NoReturn

import replay
from eventlog import limits
from replay import BundleConflictError
from service import _limits as service_limits  # plain constants: no server library needed
from sessionlog import _agentlogs, _commands, _edges, _limits
from sessionlog._commands import (
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_INTEGRITY,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    STORE_DEFAULT,
    STORE_ENV,
    Failure,
)
from sessionlog._render import safe
from sessionlog._retention import add_policy_options, retention_commands
from sessions import (
    ConcurrencyError,
    ControllerConflictError,
    IntegrityError,
    InvalidArgumentError,
    SessionExistsError,
    SessionLogError,
    UnknownSessionError,
)

Command = Callable[[argparse.Namespace], int]

DISTRIBUTION = "sessionlog-engine"
"""The name the project is installed under (`sessionlog` on the package index is another's)."""

SUMMARY = "Inspect and manage a sessionlog store: sessions, their forks, and the event log."
EXAMPLES = f"""\
Examples:
  sessionlog seed transcript.jsonl --id demo       a session from an llm_transcript.jsonl
  sessionlog import-agent-log ~/.claude/projects --recursive   sessions from agents' own logs
  sessionlog ls                                    the sessions, a page at a time
  sessionlog show demo                             its transcript (--json for machines)
  sessionlog tree demo --format mermaid            its forks, as a picture
  sessionlog tail --follow --session demo          its events as they are committed
  sessionlog verify                                check the hash chain and the indexes
  sessionlog --store backup export-log -o log.jsonl

Store: --store PATH, else ${STORE_ENV}, else {STORE_DEFAULT}.
Exit codes: 0 ok, 1 other error, 2 usage, 3 not found, 4 integrity, 5 bad input file,
6 conflict, 130 interrupted."""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's layout with capitalised section names: Usage / Commands / Options / Examples."""

    def add_usage(
        self,
        usage: str | None,
        actions: object,
        groups: object,
        prefix: str | None = None,
    ) -> None:
        super().add_usage(usage, actions, groups, prefix or "Usage: ")  # type: ignore[arg-type]

    def _format_action(self, action: argparse.Action) -> str:
        # The commands, listed without argparse's extra `COMMAND` line above them.
        if isinstance(action, argparse._SubParsersAction):
            return "".join(self._format_action(sub) for sub in action._get_subactions())
        return super()._format_action(action)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit code 2, with a pointer to the help."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _parser(prog: str, description: str, examples: Sequence[str] = ()) -> _Parser:
    epilog = "Examples:\n" + "\n".join(f"  {e}" for e in examples) if examples else None
    return _Parser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=_Formatter,
        add_help=False,
    )


def _options(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The Options section every parser has: the store, and help."""
    group = parser.add_argument_group("Options")
    group.add_argument(
        "--store",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help=f"the store directory (default: ${STORE_ENV}, else {STORE_DEFAULT})",
    )
    group.add_argument("-h", "--help", action="help", help="show this help and exit")
    return group


class _Command:
    """One command's parser: `positional` adds to its Arguments, `add_argument` to its Options."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        parser._positionals.title = "Arguments"
        self.parser = parser
        self.options = _options(parser)

    def positional(self, *names: str, **how: Any) -> None:
        self.parser.add_argument(*names, **how)

    def add_argument(self, *names: str, **how: Any) -> None:
        self.options.add_argument(*names, **how)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    if value > limits.position_max:  # no position, count or page reaches this far
        raise argparse.ArgumentTypeError(
            f"expected a number up to {limits.position_max}, got {text[:40]}"
        )
    return value


def _at_least_one(text: str) -> int:
    """A bound that 0 would turn into a refusal of everything it bounds."""
    if text.strip().lstrip("-").isdigit() and int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {int(text)}")
    return _positive(text)


def _port(text: str) -> int:
    """A TCP port: past 65535 the socket layer would silently listen on the number modulo 65536
    while the server announces the one given."""
    value = _positive(text)
    if value > 65_535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {value}")
    return value


def build_parser() -> _Parser:
    parser = _parser("sessionlog", SUMMARY)
    parser.usage = "sessionlog [--store PATH] COMMAND [ARGS]"
    parser.epilog = EXAMPLES
    commands = parser.add_subparsers(
        title="Commands", metavar="COMMAND", dest="command", required=True, parser_class=_Parser
    )
    _options(parser).add_argument(
        "--version", action="version", version=f"sessionlog {_version()}", help="show the version"
    )

    def command(name: str, summary: str, run: Command, *examples: str) -> _Command:
        sub = commands.add_parser(
            name,
            prog=f"sessionlog {name}",
            help=summary,
            description=summary,
            epilog="Examples:\n" + "\n".join(f"  sessionlog {e}" for e in examples),
            formatter_class=_Formatter,
            add_help=False,
        )
        sub.set_defaults(run=run)
        return _Command(sub)

    _reading_commands(command)
    _log_commands(command)
    retention_commands(command, _positive)
    _key_commands(command)
    _edge_commands(command)
    return parser


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown (not installed)"


def _reading_commands(command: Callable[..., _Command]) -> None:
    o = command("ls", "list sessions, a page at a time", _commands.ls, "ls", "ls --all --json")
    o.add_argument(
        "--limit",
        type=_positive,
        default=_limits.ls_page_sessions_default,
        help="sessions per page (default %(default)s)",
    )
    o.add_argument("--cursor", metavar="ID", help="start after this session id (from a page)")
    o.add_argument("--status", choices=("active", "closed", "deleted"), help="only these")
    o.add_argument("--all", action="store_true", help="every page, not just the first")
    o.add_argument("--json", action="store_true", help="the pages as JSON")

    o = command(
        "show",
        "a session's transcript, printed a page at a time as it is read",
        _commands.show,
        "show ID",
        "show ID --after 100 --limit 20",
        "show ID --json",
    )
    o.positional("session_id", metavar="ID", help="the session")
    o.add_argument(
        "--after", metavar="N", type=_positive, default=0, help="skip the first N messages"
    )
    o.add_argument(
        "--limit", metavar="N", type=_positive, help="show at most N messages (default: all)"
    )
    o.add_argument(
        "--json",
        action="store_true",
        help="the whole snapshot as JSON (with --after/--limit: those messages only)",
    )

    o = command(
        "tree",
        "a session's ancestry as a tree, with fork points",
        _commands.tree,
        "tree ID",
        "tree ID --format dot | dot -Tsvg > tree.svg",
    )
    o.positional("session_id", metavar="ID", help="any session of the family")
    o.add_argument(
        "--format",
        choices=("text", "dot", "mermaid"),
        default="text",
        help="text (default), Graphviz dot, or a Mermaid flowchart",
    )

    o = command(
        "as-of",
        "a session as it was right after a log position",
        _commands.as_of,
        "as-of 120 ID",
        "as-of 120 ID --json",
    )
    o.positional("position", type=_positive, help="a log position (0 = empty)")
    o.positional("session_id", metavar="ID", help="the session")
    o.add_argument("--json", action="store_true", help="the snapshot as JSON")

    o = command("stats", "events, sessions, bytes on disk, head hash", _commands.stats, "stats")
    o.add_argument("--json", action="store_true", help="the figures as JSON")


def _key_commands(command: Callable[..., _Command]) -> None:
    """The commands of an encrypted store: forget a session, rotate the keys."""
    o = command(
        "forget",
        "crypto-shred an encrypted session: destroy its data key (the store's key-encryption "
        "key comes from $SESSIONLOG_KEK)",
        _commands.forget,
        "forget chat-1 --reason 'erasure request'",
    )
    o.add_argument("session", metavar="SESSION", help="the session to forget")
    o.add_argument("--reason", metavar="TEXT", help="recorded in the session_forgotten event")
    o.add_argument(
        "--expected-version",
        type=int,
        metavar="N",
        help="forget only if the session's stream is still at version N (what you inspected); "
        "else refuse with nothing destroyed",
    )

    o = command(
        "rotate-keys",
        "re-wrap every data key under a new key-encryption key (the current one comes from "
        "$SESSIONLOG_KEK); no event changes",
        _commands.rotate_keys,
        "rotate-keys --new-key-file new.kek",
    )
    o.add_argument(
        "--new-key-file", metavar="PATH", required=True, help="the new key (64 hex digits)"
    )


def _log_commands(command: Callable[..., _Command]) -> None:
    o = command(
        "tail",
        "events as they are committed, by any process",
        _commands.tail,
        "tail --after 100",
        "tail --follow --session ID --json",
    )
    o.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep waiting for new events (until Ctrl-C: exit 130)",
    )
    o.add_argument("--session", metavar="ID", help="only this session's events")
    o.add_argument(
        "--after",
        metavar="POSITION",
        type=_positive,
        default=0,
        help="start after this log position (default 0: the beginning)",
    )
    o.add_argument("--json", action="store_true", help="one JSON object per line")

    o = command(
        "verify",
        "check the hash chain and the stream index",
        _commands.verify,
        "verify",
        "verify --projections --json",
    )
    o.add_argument("--json", action="store_true", help="the report as JSON")
    o.add_argument(
        "--projections",
        action="store_true",
        help="also rebuild every projection from the log and compare it with the stored one",
    )

    command("rebuild", "recompute every projection from the log", _commands.rebuild, "rebuild")

    o = command(
        "compact-store",
        "rewrite the data file without its free pages (after truncating the log); refused "
        "while any other process has the store open",
        _commands.compact_store,
        "compact-store",
        "--store var/sessions compact-store --json",
    )
    o.add_argument("--json", action="store_true", help="the sizes before and after as JSON")

    o = command(
        "export-log",
        "the whole log as JSON lines",
        _edges.export_log,
        "export-log -o log.jsonl",
        "export-log | gzip > log.jsonl.gz",
    )
    o.add_argument("--output", "-o", metavar="FILE", help="write here (default: stdout)")

    o = command(
        "import-log",
        "a whole-log export into this store",
        _edges.import_log,
        "--store copy import-log log.jsonl",
    )
    o.positional("file", metavar="FILE", help="a file `export-log` wrote")
    o.add_argument("--json", action="store_true", help="the result as JSON")


def _edge_commands(command: Callable[..., _Command]) -> None:
    o = command(
        "seed",
        "a new session from an llm_transcript.jsonl",
        _edges.seed,
        "seed run/llm_transcript.jsonl",
        "seed t.jsonl --id retry-1 --truncate-to-last 20",
    )
    o.positional("file", metavar="FILE", help="the transcript")
    o.add_argument("--id", metavar="ID", help="the new session's id (default: a fresh UUIDv7)")
    o.add_argument("--drop-tool-calls", action="store_true", help="leave tool traffic out")
    o.add_argument(
        "--truncate-to-last", metavar="N", type=_positive, help="keep only the last N messages"
    )
    o.add_argument("--no-validate", action="store_true", help="seed even a partial transcript")
    o.add_argument("--provider", help="refuse unless the transcript used this provider")
    o.add_argument("--model", help="refuse unless the transcript used this model")
    for name in replay.SEED_TEXT_OPTIONS[2:]:
        flag = "--" + name.replace("_", "-")
        o.add_argument(flag, metavar="TEXT", help="provenance, recorded with the session")
    o.add_argument("--json", action="store_true", help="the seed result as JSON")

    _import_agent_log_command(command)
    _export_command(command)
    _server_commands(command)
    o = command("import", "a session bundle into this store", _edges.import_, "import b.json")
    o.positional("file", metavar="FILE", help="a bundle `export` wrote")
    o.add_argument(
        "--allow-secrets",
        action="store_true",
        help="accept secret-looking strings in a bundle that is not local",
    )


def _export_command(command: Callable[..., _Command]) -> None:
    o = command(
        "export",
        "a session bundle (v1), or its messages as a model API's request body",
        _edges.export,
        "export ID",
        "export ID --mode replay_only -o bundle.json",
        "export ID --format anthropic-messages --context",
    )
    o.positional("session_id", metavar="ID", help="the session")
    o.add_argument(
        "--mode",
        choices=("local", "sanitized", "replay_only"),
        default="sanitized",
        help="redaction mode of a bundle (default sanitized)",
    )
    o.add_argument(
        "--format",
        choices=("bundle", *replay.MESSAGE_FORMATS),
        default="bundle",
        help="bundle (default), or the request body of openai-chat, anthropic-messages, responses",
    )
    o.add_argument(
        "--context",
        action="store_true",
        help="with --format: the context view (from the latest checkpoint), not the transcript",
    )
    o.add_argument("--output", "-o", metavar="FILE", help="write here (default: stdout)")


def _server_commands(command: Callable[..., _Command]) -> None:
    o = command(
        "serve",
        "the store as an HTTP service under /v1 (needs the `service` extra)",
        _edges.serve,
        "serve --api-keys-file keys.txt",
        "--store postgresql://localhost/app serve --port 8700 --workers 4",
    )
    _listen_options(
        o, 8700, "", "name=key lines: the administrators' keys (or set $SESSIONLOG_API_KEYS)"
    )
    o.add_argument(
        "--workers", type=_positive, default=1, help="server processes over the one store"
    )
    o.add_argument(
        "--past-rebuilds-max",
        metavar="N",
        type=_at_least_one,
        default=service_limits.past_rebuilds_max,
        help="past states (`as_of`, a fork's `at_event_id`, the viewer's versions) each server "
        f"process rebuilds at once; past that, 503 busy (default {service_limits.past_rebuilds_max})",
    )
    add_policy_options(o, required=False)

    o = command(
        "mcp",
        "the delegation bridge as an MCP server, stdio or HTTP (needs the `mcp` extra)",
        _edges.mcp,
        "mcp --agents agents.toml",
        "mcp --agents agents.toml --http --port 8701 --api-keys-file keys.txt",
    )
    o.add_argument(
        "--agents", metavar="FILE", required=True, help="agents.toml: the agents and providers"
    )
    o.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    _listen_options(o, 8701, "with --http: ", "name=key lines accepted besides bearer sessions")


def _listen_options(o: _Command, port: int, when: str, keys_help: str) -> None:
    """Where a command serving HTTP listens, and the file of the API keys it accepts."""
    o.add_argument(
        "--host", default="127.0.0.1", help=f"{when}the address to listen on (default 127.0.0.1)"
    )
    o.add_argument("--port", type=_port, default=port, help=f"{when}the port (default {port})")
    o.add_argument("--api-keys-file", metavar="FILE", help=when + keys_help)


def _import_agent_log_command(command: Callable[..., _Command]) -> None:
    o = command(
        "import-agent-log",
        "sessions from agents' own logs: Claude Code, Codex, pi, Gemini CLI, OpenAI-style",
        _agentlogs.import_agent_log,
        "import-agent-log ~/.claude/projects --recursive",
        "import-agent-log rollout.jsonl --format codex --json",
    )
    o.positional("paths", metavar="PATH", nargs="+", help="a log file, or a folder of them")
    o.add_argument(
        "--format",
        choices=("auto", *replay.FORMATS),
        default="auto",
        help="the log's format (default auto: chosen from the content, and said)",
    )
    o.add_argument("--recursive", action="store_true", help="descend into subfolders")
    o.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="import past damaged lines, reporting each (default: stop, writing nothing)",
    )
    o.add_argument("--id", metavar="ID", help="the session id (default: from the file's digest)")
    o.add_argument("--json", action="store_true", help="the result as JSON")


# Running


def _code_of(exc: SessionLogError) -> int:
    """The exit code for a library error: its kind, not its message, decides."""
    kinds: list[tuple[type[BaseException], int]] = [
        (UnknownSessionError, EXIT_NOT_FOUND),
        (IntegrityError, EXIT_INTEGRITY),
        (BundleConflictError, EXIT_CONFLICT),
        (SessionExistsError, EXIT_CONFLICT),
        (ConcurrencyError, EXIT_CONFLICT),
        (ControllerConflictError, EXIT_CONFLICT),
        (InvalidArgumentError, EXIT_USAGE),
    ]
    return next((code for kind, code in kinds if isinstance(exc, kind)), EXIT_ERROR)


# The library's words for what the command line calls otherwise, in the order they are replaced.
_CLI_WORDS = (
    ("(pass validate=False for", "(give --no-validate for"),
    ("(the `rename_session` option)", "(--id)"),
    ("(the `provider` option)", "(--provider)"),
    ("(the `model` option)", "(--model)"),
    ("as_of: ", "as-of: "),
    ("list_sessions: `limit`", "ls: --limit"),
    ("list_sessions: `cursor`", "ls: --cursor"),
    ("list_sessions: ", "ls: "),
    ("export_bundle: `mode`", "export: --mode"),
    ("export_bundle: ", "export: "),
    ("import_bundle: ", "import: "),
    ("rename_session", "--id"),
)


def cli_words(message: str) -> str:
    """`message` in the command line's words: its commands and flags, not the library's."""
    for library, ours in _CLI_WORDS:
        message = message.replace(library, ours)
    return message


def _fail(message: str, code: int) -> int:
    # One line, whatever the message held, and inert on a terminal: it may quote a file's bytes.
    line = safe(cli_words(" ".join(message.split())))
    print(f"sessionlog: {line}", file=sys.stderr)
    return code


def _tolerant_output() -> None:
    """Write what the output's encoding cannot hold as backslash escapes, never fail on it: a
    title in Japanese on a Latin-1 terminal, or a file name that is not UTF-8, is still shown."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (the console script exits with it)."""
    _tolerant_output()
    args = build_parser().parse_args(argv)
    run: Command = args.run
    try:
        return run(args)
    except Failure as failure:
        return _fail(str(failure), failure.code)
    except SessionLogError as exc:
        return _fail(str(exc), _code_of(exc))  # the library's messages name their verb
    except FileNotFoundError as exc:
        return _fail(f"{args.command}: {exc.strerror}: {exc.filename}", EXIT_NOT_FOUND)
    except BrokenPipeError:
        # The reader went away (`sessionlog tail | head`); say nothing more to it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        return _fail(f"{args.command}: {exc}", EXIT_ERROR)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except Exception as exc:  # a bug of ours: still one line, with the way to see the traceback
        if os.environ.get("SESSIONLOG_DEBUG"):
            raise
        return _fail(
            f"{args.command}: internal error {type(exc).__name__}: {exc} "
            "(set SESSIONLOG_DEBUG=1 to see the traceback)",
            EXIT_INTERNAL,
        )
