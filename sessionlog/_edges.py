"""The commands at the edges of a store: seed from a transcript, bundles and whole logs in and out.

Each calls one function of `replay` and prints what it returns. A file that is not what the
command reads is a `Failure` with `EXIT_BAD_INPUT`, told apart from a bad command line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

import replay
from sessionlog._commands import (
    EXIT_BAD_INPUT,
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_OK,
    Failure,
    emit_json,
    opened,
    output_file,
    readable_file,
    store_path,
)
from sessionlog._render import Progress
from sessions import InvalidArgumentError, LocalKeyProvider, SessionStore


def seed(args: argparse.Namespace) -> int:
    with _transcript_file(args.file) as path:
        return _seed(args, path)


@contextmanager
def _transcript_file(name: str) -> Iterator[Path]:
    """The transcript to seed from: the file named, or standard input (`-`) saved to a
    temporary file first, since seeding reads the file in more than one pass."""
    if name != "-":
        yield readable_file(name)
        return
    with tempfile.TemporaryDirectory(prefix="sessionlog-seed-") as folder:
        path = Path(folder) / "stdin.jsonl"
        with path.open("wb") as file:
            shutil.copyfileobj(sys.stdin.buffer, file)
        try:
            yield path
        except Failure as failure:  # name the input as the user gave it, not the temporary file
            raise Failure(str(failure).replace(str(path), "<stdin>"), failure.code) from None


def _seed(args: argparse.Namespace, path: Path) -> int:
    options: dict[str, Any] = {name: getattr(args, name) for name in replay.SEED_TEXT_OPTIONS}
    options.update(
        rename_session=args.id,
        drop_tool_calls=args.drop_tool_calls,
        truncate_to_last=args.truncate_to_last,
        validate=not args.no_validate,
    )
    with opened(args, create=True) as store, Progress("seed") as progress:
        if args.id is not None and store.exists(args.id):
            raise Failure(
                f"seed: session `{args.id}` already exists in {store_path(args)} "
                f"(choose another --id, or leave --id out for a fresh one)",
                EXIT_CONFLICT,
            )
        result = replay.seed_from_jsonl(store, path, progress=progress, **options)
        if args.json:
            emit_json(result.to_dict())
        if not result.ok:
            taken = args.id is not None and "already exists" in (result.error or "")
            raise Failure(f"seed: {result.error}", EXIT_CONFLICT if taken else EXIT_BAD_INPUT)
    if not args.json:
        print(
            f"seeded session {result.session_id}: {result.messages_loaded:,} messages from "
            f"{result.source_records:,} records ({result.source_format})"
            + (", truncated" if result.truncated else "")
        )
    return EXIT_OK


def export(args: argparse.Namespace) -> int:
    if args.context and args.format == "bundle":
        raise Failure("export: --context goes with --format (a bundle holds the transcript)", 2)
    with opened(args) as store, Progress("export") as progress:
        if args.format == "bundle":
            body = replay.export_bundle(store, args.session_id, mode=args.mode, progress=progress)
            what = f"{args.mode} bundle {body['bundle_id']}"
        else:
            body = replay.export_messages(store, args.session_id, args.format, context=args.context)
            what = f"{args.format} request body"
    # msgspec writes the same text as json.dumps(indent=2, ensure_ascii=False), many times faster
    data = msgspec.json.format(msgspec.json.encode(body), indent=2) + b"\n"
    if args.output:
        with output_file(args.output) as file:
            file.write(data)
        print(f"exported {what} to {args.output}")
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    return EXIT_OK


def import_(args: argparse.Namespace) -> int:
    path = readable_file(args.file)
    try:
        bundle = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError too
        raise Failure(f"import: {args.file} is not JSON: {exc}", EXIT_BAD_INPUT) from exc
    if not isinstance(bundle, dict):
        raise Failure(
            f"import: {args.file}: expected a session bundle (a JSON object), "
            f"got {type(bundle).__name__}",
            EXIT_BAD_INPUT,
        )
    with opened(args, create=True) as store:
        try:
            session_id = replay.import_bundle(
                store, bundle, allow_secrets=True if args.allow_secrets else None
            )
        except replay.BundleError as exc:
            raise Failure(f"import: {args.file}: {exc}", EXIT_BAD_INPUT) from exc
    print(session_id)
    return EXIT_OK


def export_log(args: argparse.Namespace) -> int:
    with opened(args) as store, Progress("export-log") as progress:
        if args.output:
            with output_file(args.output) as file:
                result = replay.export_log(store, file, progress=progress)
        else:
            result = replay.export_log(store, sys.stdout.buffer, progress=progress)
            sys.stdout.flush()
    if args.output:
        print(
            f"exported {result.events:,} events ({result.bytes_written:,} bytes) to "
            f"{args.output}; head hash {result.head_hash}"
        )
    return EXIT_OK


def import_log(args: argparse.Namespace) -> int:
    path = readable_file(args.file)
    with opened(args, create=True) as store, Progress("import-log") as progress:
        try:
            result = replay.import_log(store, path, progress=progress)
        except InvalidArgumentError as exc:
            raise Failure(f"import-log: {exc}", EXIT_BAD_INPUT) from exc
    if args.json:
        emit_json(
            {
                "source_events": result.source_events,
                "already_present": result.already_present,
                "written": result.written,
                "head": result.head,
                "head_hash": result.head_hash,
            }
        )
    else:
        print(
            f"imported {result.written:,} events ({result.already_present:,} already present); "
            f"head {result.head:,}, hash {result.head_hash}"
        )
    return EXIT_OK


def mcp(args: argparse.Namespace) -> int:
    """Serve the delegation bridge over MCP until the client leaves (stdio) or Ctrl-C (HTTP)."""
    try:
        import mcp as _sdk  # noqa: F401 - only to say which extra is missing

        from service.mcp import load_agents, serve_http, serve_stdio
    except ImportError as exc:
        raise Failure(
            f"mcp: the bridge needs the `mcp` extra ({exc.name} is missing): "
            "pip install 'sessionlog-engine[mcp]'",
            EXIT_ERROR,
        ) from exc
    import asyncio

    config = load_agents(args.agents)
    # Opened in place (created when missing): a server's store must be where it says while it
    # runs, not built aside and moved at the end like a one-shot command's.
    with SessionStore.open(store_path(args), keys=LocalKeyProvider.from_env_if_set()) as store:
        if args.http:
            from service._serve import load_api_keys  # the file, then $SESSIONLOG_API_KEYS

            keys = load_api_keys(args.api_keys_file)
            run = serve_http(store, config, host=args.host, port=args.port, api_keys=keys)
        else:
            run = serve_stdio(store, config)
        asyncio.run(run)
    return EXIT_OK


def serve(args: argparse.Namespace) -> int:
    """Run the HTTP service until SIGTERM or Ctrl-C (the `service` extra brings its server)."""
    try:
        from service._serve import serve as run
    except ImportError as exc:  # the extra is missing: say how to get it
        raise Failure(
            f"serve: the HTTP service needs the `service` extra ({exc.name} is missing): "
            "pip install 'sessionlog-engine[service]'",
            EXIT_ERROR,
        ) from exc
    run(
        store_path(args),
        host=args.host,
        port=args.port,
        api_keys_file=args.api_keys_file,
        workers=args.workers,
        past_rebuilds_max=args.past_rebuilds_max,
        retention={
            "max_age_days": args.max_age_days,
            "grace_days": args.grace_days,
            "archive": args.archive,
        },
    )
    return EXIT_OK
