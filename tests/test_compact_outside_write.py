"""`compact` runs its strategy, and the model it may call, outside the write transaction.

A slow summarizer must not hold up another thread's writes, nor another process opening and
writing the store; the outcome commits against the transcript the summarizer saw: messages
appended meanwhile are kept after the summary, any other change is a `ConcurrencyError` and
nothing is written. Ordering is asserted through events, never through timings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sessions import ConcurrencyError, ContextPolicy, SessionStore
from sessions._context_policy import decide_attempts_max
from tests.conftest import STORE_KINDS

ROOT = Path(__file__).resolve().parent.parent
HELD_S = 5.0
"""How long the summarizer waits to be released: only a test that fails runs it out."""
OTHER_PROCESS = """
import sys
from sessions import SessionStore
with SessionStore.open(sys.argv[1]) as store:
    store.inject(store.open_session("c"), {"role": "user", "content": "from another process"})
print("ok", flush=True)
"""


class SlowSummarizer:
    """Blocks inside the model call until released; records what it was given."""

    def __init__(self, order: list[str]) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.seen: list[dict[str, Any]] = []
        self.order = order

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        self.seen = messages
        self.entered.set()
        if not self.release.wait(HELD_S):
            self.order.append("summarizer timed out")
        return f"summary of {len(messages)}"


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """Every test taking the shared `store` fixture runs on LMDB and on PostgreSQL."""
    return str(request.param)


def session_of(store: SessionStore, sid: str, count: int) -> str:
    store.open_session(sid)
    for i in range(count):
        store.inject(sid, {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"})
    return sid


@contextmanager
def compacting(store: SessionStore, sid: str) -> Iterator[tuple[list[str], dict[str, Any]]]:
    """An LLM `compact` of `sid` in another thread, held inside its summarizer while the body of
    the `with` runs, then released and joined. Yields the order of what happened (the body adds
    to it) and the outcome (`kept` or `error`, filled in once the `with` ends)."""
    summarizer = SlowSummarizer([])
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["kept"] = store.compact(
                sid, compact_strategy="llm", keep_last=2, summarizer=summarizer
            )
        except Exception as exc:  # the test inspects it
            outcome["error"] = exc
        summarizer.order.append("compact returned")

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert summarizer.entered.wait(60), "the summarizer was never called"
        yield summarizer.order, outcome
    finally:
        summarizer.release.set()
        thread.join(60)
    outcome["seen"] = [m["content"] for m in summarizer.seen]


def test_a_slow_summarizer_holds_up_no_writer_here_or_in_another_process(
    store: SessionStore, store_target: str
) -> None:
    session_of(store, "a", 6)
    session_of(store, "b", 0)
    with compacting(store, "a") as (order, outcome):
        store.inject("b", {"role": "user", "content": "while summarizing"})
        order.append("inject in another thread")
        other = subprocess.run(
            [sys.executable, "-c", OTHER_PROCESS, store_target],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            check=True,
        )
        assert other.stdout.strip() == "ok", other.stderr
        order.append("open and inject in another process")
    assert order == [
        "inject in another thread",
        "open and inject in another process",
        "compact returned",
    ]
    assert outcome == {"kept": 4, "seen": ["m0", "m1", "m2", "m3"]}
    contents = [m["content"] for m in store.messages("a")]
    assert contents == ["[summary of the 4 earlier messages]", "summary of 4", "m4", "m5"]
    assert [m["content"] for m in store.messages("c")] == ["from another process"]


def test_messages_appended_during_summarization_stay_after_the_summary(
    store: SessionStore,
) -> None:
    session_of(store, "a", 6)
    with compacting(store, "a") as (order, outcome):
        store.inject("a", {"role": "user", "content": "late"})
        order.append("inject into the same session")
    assert order == ["inject into the same session", "compact returned"]
    assert outcome == {"kept": 5, "seen": ["m0", "m1", "m2", "m3"]}
    contents = [m["content"] for m in store.messages("a")]
    assert contents == ["[summary of the 4 earlier messages]", "summary of 4", "m4", "m5", "late"]
    assert store.length("a") == 5


@pytest.mark.parametrize("change", ["trim", "reset", "compact"])
def test_any_other_change_during_summarization_is_a_conflict_and_writes_nothing(
    store: SessionStore, change: str
) -> None:
    session_of(store, "a", 6)
    with compacting(store, "a") as (order, outcome):
        if change == "trim":
            store.trim("a", 3)
        elif change == "reset":
            store.reset("a")
        else:
            store.compact("a", compact_strategy="truncate", keep_last=3)
        before = (store.log.head, store.messages("a"))
        order.append(change)
    assert order == [change, "compact returned"]
    assert isinstance(outcome.get("error"), ConcurrencyError), outcome
    assert "changed while the strategy ran" in str(outcome["error"])
    assert (store.log.head, store.messages("a")) == before  # the stale summary was not written


def chars(message: Any) -> int:
    return len(str(message.get("content", "")))


@pytest.mark.parametrize("changes", [1, 5])
def test_a_context_checkpoint_never_calls_its_summarizer_inside_the_write(
    make_store: Callable[..., SessionStore], changes: int
) -> None:
    """A session that changes while the summarizer runs is decided again outside the write,
    and after `decide_attempts_max` changes in a row the checkpoint waits for the next turn."""
    calls: list[bool] = []

    def summarizer(messages: list[dict[str, Any]], **params: Any) -> str:
        calls.append(store.log.in_transaction)
        if len(calls) <= changes:  # another thread changes the session meanwhile
            inject = threading.Thread(
                target=store.inject, args=(sid, {"role": "user", "content": f"late {len(calls)}"})
            )
            inject.start()
            inject.join(60)
        return f"summary of {len(messages)}"

    policy = ContextPolicy(window_tokens=1_000, summarizer=summarizer)
    store = make_store(token_counter=chars)
    sid = store.open_session()
    store.inject_many(sid, [{"role": "user", "content": f"{i}" * 170} for i in range(6)])
    report = store.maintain_context(sid, policy=policy)
    attempts = decide_attempts_max
    assert calls == [False] * (changes + 1 if changes < attempts else attempts)
    assert report["checkpoint"] is (changes < attempts)
    summaries = [m for m in store.context(sid) if m.get("summary")]
    assert len(summaries) == (2 if changes < attempts else 0)
    assert store.length(sid) == 6 + min(changes, attempts) + len(summaries)
