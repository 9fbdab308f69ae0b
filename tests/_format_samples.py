"""One sample of every event in the catalog, with fixed times, for the stored-bytes format test.

The bytes these encode to are frozen in `tests/fixtures/log-format-v1.jsonl`. Change a sample and
the test fails: that is the point. A new event type adds a new sample at the end and a new line
to the fixture (written by `python -m tests._format_samples > tests/fixtures/log-format-v1.jsonl`,
once, reviewed by hand). The store layouts are frozen the same way in
`tests/fixtures/log-store-v1.jsonl` to `log-store-v4.jsonl` (`--store-v1` to `--store-v4`); a new
sample changes those files too, since they hold every record.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from eventlog import events as ev

T0 = datetime(2026, 11, 22, 8, 0, 0, 123456, tzinfo=UTC)
T1 = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)

MESSAGE = ev.Message(
    role="assistant",
    content=[{"type": "text", "text": "done"}],
    name="helper",
    tool_calls=[{"id": "call_1", "name": "ls", "arguments": {"path": "."}}],
    files=[ev.FileRef(path="src/a.py", mime_type="text/x-python", size_bytes=12)],
    usage=ev.Usage(input_tokens=10, output_tokens=3, reasoning_tokens=1),
    model="mock-1",
    synthetic=True,
    metadata={"live_session": {"client_id": "tui"}},
    extra={"x_vendor": [1, 2]},
)

SAMPLES: list[tuple[str, ev.Event]] = [
    (
        "s-1",
        ev.SessionOpened(
            session_id="s-1",
            created_at=T0,
            agent_id="agent",
            title="first",
            formation={"kind": "explicit"},
            system_prompt="be brief",
            tool_format="native",
            workspace_anchor={"root": "/w"},
            workspace_policy={"default_mount_mode": "ro"},
            metadata={"provider": "mock"},
        ),
    ),
    ("s-1", ev.MessageInjected(message=ev.Message(role="user", content="hi"))),
    ("s-1", ev.MessageInjected(message=MESSAGE)),
    (
        "s-2",
        ev.SessionForked(
            session_id="s-2",
            parent_id="s-1",
            parent_version=3,
            created_at=T0,
            keep_first=1,
            branched_at_event_index=1,
        ),
    ),
    ("s-2", ev.SessionReset(reason="again")),
    ("s-1", ev.SessionTrimmed(keep_last=1, kept_count=1)),
    (
        "s-1",
        ev.SessionCompacted(
            strategy="llm",
            replace_start=0,
            replace_end=1,
            replacement=[ev.Message(role="assistant", content="summary", summary=True)],
            tokens_before=100,
            tokens_after=10,
        ),
    ),
    ("s-1", ev.ScratchpadSet(scratchpad={"plan": [1]}, version=1, source="agent")),
    ("s-1", ev.ScratchpadCleared(version=2, reason="done")),
    ("s-1", ev.LiveSessionClient(client_id="tui", action="attached", mode="controller")),
    (
        "s-1",
        ev.LiveSessionClient(
            client_id="mobile",
            action="taken_over",
            mode="controller",
            previous_controller_id="tui",
            metadata={"reason": "handoff"},
        ),
    ),
    ("s-1", ev.LiveSessionPermissionRoute(client_id="mobile", request={"tool": "rm"})),
    ("s-1", ev.WorkspaceAnchorSet(anchor={"root": "/w2"})),
    ("s-1", ev.WorkspacePolicySet(policy={"default_mount_mode": "rw"})),
    ("s-1", ev.WorkspaceRootAdded(root="/data", mount_mode="ro", mounted_at="/mnt/data")),
    ("s-1", ev.WorkspaceRootRemoved(root="/data")),
    ("s-1", ev.SessionRenamed(title="renamed")),
    (
        "s-1",
        ev.PromptStarted(
            request_id="r1",
            prompt=ev.Message(role="user", content="go"),
            provider="mock",
            params={"temperature": 0.5},
            loop_id="l1",
        ),
    ),
    (
        "s-1",
        ev.PromptCompleted(
            request_id="r1",
            reply=ev.Message(role="assistant", content="ok"),
            stop_reason="end_turn",
            usage=ev.Usage(input_tokens=5, output_tokens=2),
        ),
    ),
    ("s-1", ev.PromptFailed(request_id="r2", error="boom", kind="provider")),
    ("s-1", ev.PromptCancelled(request_id="r3", reason="user")),
    ("s-1", ev.InputRejected(filter="no-secrets", reason="looks like a key")),
    ("s-2", ev.SessionDeleted(reason="cleanup")),
    ("s-1", ev.AgentSessionClosed(reason="timeout", status={"reason": "timeout"})),
    (
        "bearer-h1",
        ev.BearerSessionCreated(
            handle="h1",
            principal="user_123",
            created_at=T0,
            expires_at=T1,
            attributes={"role": "operator"},
        ),
    ),
    ("bearer-h1", ev.BearerSessionTouched(last_seen_at=T1)),
    ("bearer-h1", ev.BearerSessionExpired(expired_at=T1, reason="revoked")),
    # Added with the delegation runtime: the loop fields and the input-filter warnings.
    (
        "s-1",
        ev.PromptStarted(
            request_id="r4",
            prompt=ev.Message(role="user", content="HELLO"),
            provider="mock",
            params={"model": "m", "provider_specific": {"seed": 1}},
            loop_id="l4",
            parent_loop_id="l1",
            parallel_group="g",
            warnings=[{"filter": "caps", "reason": "all caps"}],
        ),
    ),
    # Added with the context policies: checkpoints, their failures, pruning and doom loops.
    (
        "s-1",
        ev.ContextCompacted(
            insert_at=2,
            boundary=ev.Message(role="user", content="[checkpoint]", synthetic=True, summary=True),
            summary=ev.Message(
                role="assistant",
                content="the story so far",
                synthetic=True,
                summary=True,
                model="mock-1",
                usage=ev.Usage(input_tokens=40, output_tokens=4),
            ),
            summarized_start=0,
            summarized_count=2,
            tokens_before=900,
            tokens_after=120,
        ),
    ),
    (
        "s-1",
        ev.ContextCompactionFailed(
            error="TimeoutError: no answer", tokens_before=900, message_count=6
        ),
    ),
    (
        "s-1",
        ev.ContextPruned(
            results=[
                ev.PrunedResult(
                    position=3,
                    action="soft_trim",
                    chars=60_000,
                    head_chars=1_500,
                    tail_chars=1_500,
                    notice="[trimmed]",
                ),
                ev.PrunedResult(position=4, index=1, action="hard_clear", chars=9, notice="[x]"),
            ],
            aggressive=True,
            tokens_before=700,
            tokens_after=300,
        ),
    ),
    (
        "s-1",
        ev.DoomLoopDetected(
            message=ev.Message(
                role="user",
                content="stop repeating ls",
                synthetic=True,
                metadata={"doom_loop": {"tool": "ls", "repeats": 3}},
            ),
            tool="ls",
            repeats=3,
        ),
    ),
    # Added with runtime adoption: a session opened elsewhere, driven by the runtime.
    (
        "s-1",
        ev.RuntimeAdopted(provider="mock", agent_id="a-1", runtime_params={"temperature": 0.2}),
    ),
    # Added with batched injects: one record for the messages of one inject_many.
    (
        "s-1",
        ev.MessagesInjected(
            messages=[
                ev.Message(role="user", content="first"),
                ev.Message(role="assistant", content="second", model="m-1"),
            ]
        ),
    ),
    # Added with items, rewinds and idempotency keys (the framework integrations).
    (
        "s-1",
        ev.MessageInjected(
            message=ev.Message(
                role="item",
                item={"type": "function_call", "call_id": "c-1", "blob": b"\x00\xff"},
            ),
            idempotency_key="k-1",
        ),
    ),
    ("s-1", ev.SessionRewound(to_length=1, removed=1, reason="pop")),
    # Added with the runtime's tool loop.
    (
        "s-1",
        ev.StepCompleted(
            request_id="r4",
            step=1,
            reply=ev.Message(
                role="assistant",
                content="",
                tool_calls=[{"id": "c1", "name": "ls", "arguments": {"path": "."}}],
            ),
            stop_reason="tool_use",
            usage=ev.Usage(input_tokens=4, output_tokens=1),
        ),
    ),
    (
        "s-1",
        ev.ToolCallStarted(
            request_id="r4",
            call_id="c1",
            name="ls",
            arguments={"path": "."},
            loop_id="l-c1",
            parallel_group="g1",
        ),
    ),
    (
        "s-1",
        ev.ToolCallFinished(
            request_id="r4",
            call_id="c1",
            result=ev.Message(role="tool", content="a.txt", tool_call_id="c1"),
            loop_id="l-c1",
        ),
    ),
    ("s-1", ev.SessionMetadataSet(metadata={"team": "red"}, removed=["stale"])),
    ("s-4", ev.SessionOpened(session_id="s-4", created_at=T0, key_slot=1)),
    (
        "s-4",
        ev.MessageInjected(message=ev.Message(role="user", sealed=b"\x01header+nonce+ciphertext")),
    ),
    ("s-4", ev.SessionForgotten(reason="erasure request", key_slot=1)),
    ("s-2", ev.SessionArchived(archive="session-0a1b-g1", events_count=4, digest="9f" * 32)),
]


def build_log_lines() -> list[str]:
    """Append every sample to a fresh in-memory log; one JSON line per stored record."""
    from eventlog import ANY, EventLog

    lines = []
    with EventLog.memory() as log:
        for index, (stream, event) in enumerate(SAMPLES):
            log.append(stream, [event], expected_version=ANY, meta={"i": index}, recorded_at=T0)
        with log._storage.reader() as txn:
            for position, record in txn.records_after(0, len(SAMPLES)):
                lines.append(json.dumps({"position": position, "hex": bytes(record).hex()}))
    return lines


STORE_KV = (b"sample/projection", b"state")
"""One projection entry beside the samples in the store fixtures."""
STORE_CLUSTER_KV = (b"@s-1\x00/state", b"clustered")
"""One projection entry of stream `s-1` (`eventlog.cluster_key`), in the fixtures from format 4 on,
which stores it beside the stream's index."""


def build_store_lines(format_version: int) -> list[str]:
    """Append every sample to a fresh LMDB store of `format_version`, with `STORE_KV` beside them;
    one JSON line per LMDB entry (its database, None for the main one; key; value), in the order
    LMDB keeps them. The records are `build_log_lines`'s; what this freezes is the layout."""
    import tempfile

    import lmdb

    from eventlog import ANY, EventLog

    with tempfile.TemporaryDirectory() as where:
        with EventLog.open(where, format_version=format_version) as log:
            for index, (stream, event) in enumerate(SAMPLES):
                log.append(stream, [event], expected_version=ANY, meta={"i": index}, recorded_at=T0)
            with log.transaction() as tx:
                tx.kv_put(*STORE_KV)
                if format_version >= 4:
                    tx.kv_put(*STORE_CLUSTER_KV)
        env = lmdb.open(where, readonly=True, max_dbs=8, lock=False)
        try:
            with env.begin() as txn:
                tables: list[bytes | None] = [None]
                if format_version == 1:
                    tables = [name for name, _ in txn.cursor()]
                lines = []
                for table in tables:
                    db = env.open_db(table, txn=txn, create=False) if table else None
                    for key, value in txn.cursor(db=db):
                        name = None if table is None else table.decode()
                        entry = {"db": name, "key": key.hex(), "value": value.hex()}
                        lines.append(json.dumps(entry))
        finally:
            env.close()
    return lines


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--store-v1"]:
        print("\n".join(build_store_lines(1)))
    elif sys.argv[1:] == ["--store-v2"]:
        print("\n".join(build_store_lines(2)))
    elif sys.argv[1:] == ["--store-v3"]:
        print("\n".join(build_store_lines(3)))
    elif sys.argv[1:] == ["--store-v4"]:
        print("\n".join(build_store_lines(4)))
    else:
        print("\n".join(build_log_lines()))
