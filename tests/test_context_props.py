"""Context policies as properties: for any session the context view keeps every message that is
neither summarized nor pruned, never separates a tool call from its result, and is the same after
a rebuild; a long session with large tool outputs stays within its window at every step; the
seed's message fields survive every projection, export and replay; the runtime sends the view.
"""

from __future__ import annotations

import asyncio
import io
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from eventlog import LimitExceededError
from eventlog import events as ev
from replay import export_bundle, export_log, import_bundle, import_log
from sessions import ContextPolicy, SessionStore
from sessions.runtime import Completion, Runtime


def chars(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    return len(content) if isinstance(content, str) else 0


def summarize(messages: list[dict[str, Any]], *, max_tokens: int, temperature: float) -> str:
    if len(messages) % 5 == 0:
        raise RuntimeError("the summarizer is down")  # failures are part of every session
    return f"summary of {len(messages)}"


POLICY = ContextPolicy(
    window_tokens=1_500,
    summarize_ratio=0.5,
    summarizer=summarize,
    keep_turns=2,
    prunable_chars_min=300,
    aggressive_prunable_chars_min=100,
    soft_trim_head_chars=40,
    soft_trim_tail_chars=40,
)

step = st.one_of(
    st.tuples(st.just("user"), st.integers(50, 500)),
    st.tuples(
        st.just("call"), st.sampled_from(["ls", "cat"]), st.integers(0, 1), st.integers(1, 900)
    ),
    st.tuples(st.just("orphan"), st.integers(1, 400)),  # a result whose call was never recorded
    st.tuples(st.just("answer"), st.integers(1, 200)),
    st.tuples(st.just("maintain"), st.booleans()),
)


def play(store: SessionStore, sid: str, steps: list[tuple[Any, ...]]) -> None:
    for number, item in enumerate(steps):
        kind = item[0]
        if kind == "user":
            store.inject(sid, {"role": "user", "content": "u" * item[1]})
        elif kind == "call":
            _, tool, argument, size = item
            call = {"id": f"c{number}", "name": tool, "arguments": {"a": argument}}
            store.inject_many(
                sid,
                [
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"c{number}", "content": "r" * size},
                ],
            )
        elif kind == "orphan":
            store.inject(
                sid, {"role": "tool", "tool_call_id": f"x{number}", "content": "o" * item[1]}
            )
        elif kind == "answer":
            store.inject(sid, {"role": "assistant", "content": "a" * item[1]})
        else:
            report = store.maintain_context(sid, policy=POLICY, context_error=item[1])
            event(f"checkpoint={report['checkpoint']}")
            event(f"pruned={bool(report['pruned'])}")
            event(f"summary_failed={bool(report['summary_failed'])}")
            check_view(store, sid)


def latest_checkpoint(transcript: list[dict[str, Any]]) -> int:
    for index in range(len(transcript) - 2, -1, -1):
        first, second = transcript[index], transcript[index + 1]
        pair = (first["role"], second["role"]) == ("user", "assistant")
        if pair and first.get("summary") and second.get("summary"):
            return index
    return 0


def check_view(store: SessionStore, sid: str) -> None:
    transcript = store.snapshot(sid)["transcript"]
    view = store.context(sid)
    start = latest_checkpoint(transcript)
    kept = transcript[start:]
    # Nothing dropped: the view is the transcript from its checkpoint, message for message; a
    # message differs only in the content of a pruned tool result.
    assert len(view) == len(kept)
    for shown, recorded in zip(view, kept, strict=True):
        if shown != recorded:
            assert recorded["role"] == "tool"
            assert len(recorded["content"]) >= POLICY.aggressive_prunable_chars_min
            assert {k: v for k, v in shown.items() if k != "content"} == {
                k: v for k, v in recorded.items() if k != "content"
            }
            assert len(shown["content"]) < len(recorded["content"])
    # Never split: a result in the view has its call in the view, when the call exists at all.
    called = {
        call["id"]: index
        for index, message in enumerate(transcript)
        for call in message.get("tool_calls") or ()
    }
    in_view = {call["id"] for message in view for call in message.get("tool_calls") or ()}
    for message in view:
        call_id = message.get("tool_call_id")
        if call_id is not None and call_id in called:
            assert call_id in in_view


@given(st.lists(step, min_size=8, max_size=60))
def test_the_view_keeps_what_is_not_summarized_or_pruned_and_survives_rebuild(
    steps: list[tuple[Any, ...]],
) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        SessionStore.open(Path(tmp) / "s", sync=False, token_counter=chars) as store,
    ):
        sid = store.open_session()
        play(store, sid, steps)
        store.maintain_context(sid, policy=POLICY)
        check_view(store, sid)
        view = store.context(sid)
        fresh = SessionStore(store.log, hot_sessions=0)  # no cache: read from the projection
        assert fresh.context(sid) == view
        store.rebuild()
        assert store.context(sid) == view
        assert fresh.context(sid) == view


def test_a_long_session_stays_within_its_window_at_every_step(tmp_path: Path) -> None:
    """10,000 messages, every fifth tool output 60,000 characters: before each model call the
    context, counted by the store's default counter, fits the window."""
    policy = ContextPolicy(
        window_tokens=64_000, summarizer=lambda messages, **_: f"{len(messages)} messages"
    )
    with SessionStore.open(tmp_path / "s", sync=False, context_policy=policy) as store:
        sid = store.open_session()
        messages = checkpoints = pruned = 0
        turn = 0
        while messages < 10_000:
            store.inject(sid, {"role": "user", "content": f"turn {turn}: " + "p" * 200})
            messages += 1
            for step in range(1 + turn % 3):
                report = store.maintain_context(sid)
                assert report["tokens"] <= policy.window_tokens, (messages, report)
                checkpoints += report["checkpoint"]
                pruned += report["pruned"]
                size = 60_000 if (turn + step) % 5 == 0 else 2_000
                call = {"id": f"t{turn}s{step}", "name": "read", "arguments": {"n": messages}}
                store.inject_many(
                    sid,
                    [
                        {"role": "assistant", "content": "", "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": call["id"], "content": "x" * size},
                    ],
                )
                messages += 2
            store.inject(sid, {"role": "assistant", "content": f"done with turn {turn}"})
            messages += 1
            turn += 1
        report = store.maintain_context(sid)
        assert report["tokens"] <= policy.window_tokens
        counted = sum(store.token_counter(m) for m in store.context(sid))
        assert counted == report["tokens"]
        assert checkpoints > 10 and pruned > 10
        assert store.length(sid) >= 10_000


FILES = [{"path": f"src/{i}.py", "mime_type": "text/x-python", "size_bytes": i} for i in range(10)]
RICH = {
    "role": "assistant",
    "content": "read them",
    "files": FILES,
    "usage": {"input_tokens": 7, "output_tokens": 3, "cache_read_tokens": 2},
    "model": "model-9",
    "synthetic": True,
    "metadata": {"k": "v"},
}


def rich_session(store: SessionStore) -> str:
    sid = store.open_session("rich")
    store.inject_many(sid, [{"role": "user", "content": "u" * 300} for _ in range(6)])
    store.inject(sid, RICH)
    policy = ContextPolicy(
        window_tokens=2_000, summarizer=lambda m, **_: f"summary of {len(m)}", keep_turns=1
    )
    assert store.maintain_context(sid, policy=policy)["checkpoint"] is True
    return sid


def test_message_fields_survive_projection_export_and_replay(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "a", token_counter=chars) as store:
        sid = rich_session(store)
        transcript = store.snapshot(sid)["transcript"]
        view = store.context(sid)
        assert view[-1] == RICH and transcript[-1] == RICH
        assert view[0]["summary"] and view[0]["synthetic"] and view[1]["summary"]
        bundle = export_bundle(store, sid, mode="local")
        log = io.BytesIO()
        export_log(store, log)
    with SessionStore.open(tmp_path / "b", token_counter=chars) as other:
        assert import_bundle(other, bundle) == sid
        assert other.snapshot(sid)["transcript"] == transcript
        assert other.context(sid) == view  # the checkpoint is its messages: it travels with them
    with SessionStore.open(tmp_path / "c", token_counter=chars) as copy:
        import_log(copy, io.BytesIO(log.getvalue()))
        assert copy.snapshot(sid)["transcript"] == transcript
        assert copy.context(sid) == view
        copy.rebuild()
        assert copy.context(sid) == view


def test_more_than_ten_files_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "s") as store:
        sid = store.open_session()
        before = store.log.head
        with pytest.raises(LimitExceededError, match="files_per_message_max"):
            store.inject(sid, {**RICH, "files": [*FILES, {"path": "one/too/many"}]})
        assert store.log.head == before and store.length(sid) == 0


class Recording:
    name = "recording"
    defaults: Mapping[str, Any] = {}

    def __init__(self) -> None:
        self.seen: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Completion:
        self.seen.append(messages)
        return Completion(text="ok")


def test_the_runtime_sends_the_provider_the_context_view(tmp_path: Path) -> None:
    provider = Recording()
    with SessionStore.open(tmp_path / "s", token_counter=chars) as store:

        async def body() -> None:
            async with Runtime(store, providers=[provider], default_provider="recording") as rt:
                sid = (await rt.create("agent"))["session_id"]
                store.inject_many(sid, [{"role": "user", "content": "u" * 300} for _ in range(6)])
                policy = ContextPolicy(window_tokens=2_000, summarizer=summarize)
                store.maintain_context(sid, policy=policy)
                await rt.prompt(sid, "next")
                assert provider.seen[-1] == store.context(sid)[:-1]  # all but the reply
                assert provider.seen[-1][0]["summary"] is True
                assert len(provider.seen[-1]) < store.length(sid) - 1

        asyncio.run(body())


def test_checkpoint_events_hold_outcomes_only(tmp_path: Path) -> None:
    """Replay needs no summarizer: the summary text is in the event."""
    with SessionStore.open(tmp_path / "s", token_counter=chars) as store:
        sid = rich_session(store)
        (event,) = [
            e.data
            for e in store.log.read_stream(sid, limit=100)
            if isinstance(e.data, ev.ContextCompacted)
        ]
        assert event.summary.content == "summary of 5"
        assert store.context(sid)[:2] == store.snapshot(sid)["transcript"][5:7]
