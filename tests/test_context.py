"""Context policies, rule by rule at their exact boundaries: summarization checkpoints (threshold,
5 vs 6 messages, kept turns, failures), pruning (49,999 vs 50,000 characters, the 3rd vs 4th
assistant message, soft and hard ratios, skills, aggressive mode), doom loops (2 vs 3 identical
calls) and the policy's validation. Token counts here are characters, so every total is exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from eventlog import events as ev
from sessions import ContextPolicy, InvalidArgumentError, SessionStore


def chars(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    return len(content) if isinstance(content, str) else 0


def summarize(messages: list[dict[str, Any]], *, max_tokens: int, temperature: float) -> str:
    return f"summary of {len(messages)} messages"


@pytest.fixture
def store_options() -> dict[str, Any]:
    """The shared `store` fixture, counting tokens by characters."""
    return {"token_counter": chars}


def call(call_id: str, tool: str = "read", **arguments: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": call_id, "name": tool, "arguments": arguments}],
    }


def result(call_id: str, text: str, **fields: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text, **fields}


def events_of(store: SessionStore, sid: str, kind: type[ev.Event]) -> list[Any]:
    return [e.data for e in store.log.read_stream(sid, limit=10_000) if isinstance(e.data, kind)]


# Summarization checkpoints

CHECKPOINT = ContextPolicy(window_tokens=1_000, summarizer=summarize)


def users(store: SessionStore, count: int, size: int) -> str:
    sid = store.open_session()
    store.inject_many(sid, [{"role": "user", "content": f"{i}" * size} for i in range(count)])
    return sid


def test_five_messages_are_never_summarized_six_are(store: SessionStore) -> None:
    five = users(store, 5, 200)  # 1,000 tokens: over the threshold, one message short
    assert store.maintain_context(five, policy=CHECKPOINT)["checkpoint"] is False
    assert events_of(store, five, ev.ContextCompacted) == []
    six = users(store, 6, 170)  # 1,020 tokens
    report = store.maintain_context(six, policy=CHECKPOINT)
    assert report["checkpoint"] is True
    (compacted,) = events_of(store, six, ev.ContextCompacted)
    assert (compacted.insert_at, compacted.summarized_count) == (2, 2)  # the last 4 turns kept
    assert (compacted.tokens_before, compacted.tokens_after) == (1_020, report["tokens"])


def test_the_threshold_is_80_percent_of_the_window_used(store: SessionStore) -> None:
    under = users(store, 6, 133)  # 798 tokens
    store.inject(under, {"role": "user", "content": "x"})  # 799
    assert store.maintain_context(under, policy=CHECKPOINT)["checkpoint"] is False
    at = users(store, 6, 133)
    store.inject(at, {"role": "user", "content": "xx"})  # 800
    assert store.maintain_context(at, policy=CHECKPOINT)["checkpoint"] is True


def test_context_starts_at_the_checkpoint_and_snapshot_shows_everything(
    store: SessionStore,
) -> None:
    sid = users(store, 6, 170)
    before = store.snapshot(sid)["transcript"]
    store.maintain_context(sid, policy=CHECKPOINT)
    everything = store.snapshot(sid)["transcript"]
    assert len(everything) == 8
    assert everything[:2] == before[:2] and everything[4:] == before[2:]
    boundary, summary = everything[2:4]
    assert boundary["role"] == "user" and boundary["summary"] and boundary["synthetic"]
    assert summary == {
        "role": "assistant",
        "content": "summary of 2 messages",
        "synthetic": True,
        "summary": True,
    }
    assert store.context(sid) == everything[2:]


def test_summarizer_gets_the_older_messages_and_its_budget(store: SessionStore) -> None:
    seen: list[Any] = []

    def summarizer(messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        seen.append((messages, params))
        return {"content": "short", "model": "sum-1", "usage": {"output_tokens": 2}}

    policy = ContextPolicy(
        window_tokens=1_000, summarizer=summarizer, summary_tokens_max=99, summary_temperature=0.1
    )
    sid = users(store, 6, 170)
    first_two = store.snapshot(sid)["transcript"][:2]
    store.maintain_context(sid, policy=policy)
    assert seen == [(first_two, {"max_tokens": 99, "temperature": 0.1})]
    summary = store.context(sid)[1]
    assert (summary["model"], summary["usage"]) == ("sum-1", {"output_tokens": 2})


def test_a_new_checkpoint_summarizes_the_previous_one(store: SessionStore) -> None:
    sid = users(store, 6, 170)
    store.maintain_context(sid, policy=CHECKPOINT)
    store.inject_many(sid, [{"role": "user", "content": "n" * 300} for _ in range(2)])
    assert store.maintain_context(sid, policy=CHECKPOINT)["checkpoint"] is True
    view = store.context(sid)
    assert view[1]["content"] == "summary of 4 messages"  # the old pair and two turns
    assert len(view) == 6 and store.length(sid) == 12


def test_turns_are_kept_with_their_tool_results(store: SessionStore) -> None:
    policy = ContextPolicy(window_tokens=1_000, summarizer=summarize, keep_turns=1)
    sid = store.open_session()
    store.inject_many(
        sid,
        [
            {"role": "user", "content": "a" * 300},
            {"role": "user", "content": "b" * 300},
            call("c1"),
            {"role": "user", "content": "interjection " * 20},
            result("c1", "r" * 200),
            {"role": "assistant", "content": "done"},
        ],
    )
    assert store.maintain_context(sid, policy=policy)["checkpoint"] is True
    view = store.context(sid)
    assert [m.get("tool_call_id") for m in view].index("c1") > 2
    assert any(m.get("tool_calls") for m in view)  # the call stayed with its result


@pytest.mark.parametrize(
    ("answer", "kind"),
    [(RuntimeError("model down"), "summarizer"), (42, "invalid_summary"), ("", "invalid_summary")],
)
def test_a_failing_summarizer_is_recorded_and_never_fatal(
    store: SessionStore, answer: object, kind: str
) -> None:
    def summarizer(messages: list[dict[str, Any]], **params: Any) -> object:
        if isinstance(answer, BaseException):
            raise answer
        return answer

    sid = users(store, 6, 170)
    report = store.maintain_context(
        sid, policy=ContextPolicy(window_tokens=1_000, summarizer=summarizer)
    )
    assert report["checkpoint"] is False and report["summary_failed"]
    (failed,) = events_of(store, sid, ev.ContextCompactionFailed)
    assert (failed.kind, failed.tokens_before, failed.message_count) == (kind, 1_020, 2)
    assert len(store.context(sid)) == 6  # nothing else changed
    store.inject(sid, {"role": "user", "content": "still works"})
    assert store.length(sid) == 7


def test_without_a_summarizer_nothing_is_summarized(store: SessionStore) -> None:
    sid = users(store, 8, 200)
    assert (
        store.maintain_context(sid, policy=ContextPolicy(window_tokens=1_000))["checkpoint"]
        is False
    )
    assert len(store.context(sid)) == 8


# Pruning

PRUNE = ContextPolicy(window_tokens=200_000)  # soft trim over 60,000, hard clear over 100,000


def with_result(store: SessionStore, size: int, *, after: int = 3, **fields: Any) -> str:
    """A user message of 20,000 characters, a call, its result of `size` characters, then
    `after` assistant messages."""
    sid = store.open_session()
    store.inject_many(
        sid,
        [
            {"role": "user", "content": "u" * 20_000},
            call("c1"),
            result("c1", "r" * (size - 10) + "0123456789", **fields),
            *({"role": "assistant", "content": f"step {i}"} for i in range(after)),
        ],
    )
    return sid


def test_results_of_49_999_characters_are_kept_50_000_are_trimmed(store: SessionStore) -> None:
    kept = with_result(store, 49_999, after=4)
    assert store.maintain_context(kept, policy=PRUNE)["pruned"] == 0
    assert store.context(kept) == store.snapshot(kept)["transcript"]
    trimmed = with_result(store, 50_000, after=4)
    assert store.maintain_context(trimmed, policy=PRUNE)["pruned"] == 1
    shown = store.context(trimmed)[2]["content"]
    assert shown.startswith("r" * 1_500) and shown.endswith("r" * 1_490 + "0123456789")
    assert "47000 characters of this tool result trimmed" in shown
    assert len(store.snapshot(trimmed)["transcript"][2]["content"]) == 50_000  # history intact


def test_the_3rd_last_assistant_message_is_protected_the_4th_is_not(store: SessionStore) -> None:
    # after=2: the call is the 3rd-last assistant message, so its result is protected.
    third = with_result(store, 80_000, after=2)
    assert store.maintain_context(third, policy=PRUNE)["pruned"] == 0
    fourth = with_result(store, 80_000, after=3)
    assert store.maintain_context(fourth, policy=PRUNE)["pruned"] == 1


def test_soft_trim_acts_only_when_the_context_exceeds_30_percent(store: SessionStore) -> None:
    # 20,000 + 50,000 + the step messages: over 60,000. Shrink the user message to stay under.
    sid = store.open_session()
    store.inject_many(
        sid,
        [
            {"role": "user", "content": "u" * (60_000 - 50_000 - 6 * 4)},
            call("c1"),
            result("c1", "r" * 50_000),
            *({"role": "assistant", "content": f"step {i}"} for i in range(4)),
        ],
    )  # exactly 60,000 tokens: not over
    assert store.maintain_context(sid, policy=PRUNE)["pruned"] == 0
    store.inject(sid, {"role": "user", "content": "x"})  # 60,001
    assert store.maintain_context(sid, policy=PRUNE)["pruned"] == 1


def test_hard_clear_acts_over_50_percent_oldest_first(store: SessionStore) -> None:
    sid = store.open_session()
    batch: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i in range(3):
        batch += [call(f"c{i}"), result(f"c{i}", f"{i}" * 60_000)]
    batch += [{"role": "assistant", "content": f"step {i}"} for i in range(3)]
    store.inject_many(sid, batch)
    report = store.maintain_context(sid, policy=PRUNE)
    shown = [m["content"] for m in store.context(sid) if m["role"] == "tool"]
    # Soft trims leave about 3,100 each; no hard clear is needed after them.
    assert report["pruned"] == 3 and all(len(text) < 3_200 for text in shown)
    big = ContextPolicy(window_tokens=200_000, soft_trim_head_chars=40_000)  # trims keep 41,500
    other = store.open_session()
    store.inject_many(other, batch)
    store.maintain_context(other, policy=big)
    shown = [m["content"] for m in store.context(other) if m["role"] == "tool"]
    assert shown[0] == "[tool result cleared from the context: 60000 characters]"
    assert len(shown[1]) > 41_000 and len(shown[2]) > 41_000  # under 100,000 after one clear
    (pruned,) = events_of(store, other, ev.ContextPruned)
    assert [r.action for r in pruned.results] == ["hard_clear", "soft_trim", "soft_trim"]
    assert pruned.tokens_before > 180_000 and pruned.tokens_after <= 100_000


def test_skill_results_are_never_pruned(store: SessionStore) -> None:
    by_name = with_result(store, 80_000, after=3, name="load_skill")
    skills = ContextPolicy(window_tokens=200_000, skill_tools=frozenset({"load_skill"}))
    assert store.maintain_context(by_name, policy=skills)["pruned"] == 0
    flagged = with_result(store, 80_000, after=3, metadata={"skill": True})
    assert store.maintain_context(flagged, policy=PRUNE)["pruned"] == 0


def test_after_a_context_length_error_pruning_is_aggressive(store: SessionStore) -> None:
    sid = store.open_session()
    store.inject_many(
        sid,
        [
            {"role": "user", "content": "u" * 20_000},
            call("c1"),
            result("c1", "r" * 20_000),
            *({"role": "assistant", "content": f"step {i}"} for i in range(3)),
        ],
    )  # 40,000: under 30% (60,000), and the result under 50,000 characters
    assert store.maintain_context(sid, policy=PRUNE)["pruned"] == 0
    report = store.maintain_context(sid, policy=PRUNE, context_error=True)
    assert report["pruned"] == 1
    (pruned,) = events_of(store, sid, ev.ContextPruned)
    assert pruned.aggressive is True


def test_pruning_is_recorded_once_and_survives_reopen_and_rebuild(tmp_path: Path) -> None:
    with SessionStore.open(tmp_path / "s", token_counter=chars) as store:
        sid = with_result(store, 80_000, after=3)
        store.maintain_context(sid, policy=PRUNE)
        assert store.maintain_context(sid, policy=PRUNE)["pruned"] == 0  # already decided
        view = store.context(sid)
    with SessionStore.open(tmp_path / "s", token_counter=chars) as store:
        assert store.context(sid) == view
        store.rebuild()
        assert store.context(sid) == view
        assert len(events_of(store, sid, ev.ContextPruned)) == 1


def test_a_fork_shares_checkpoints_but_decides_its_own_pruning(store: SessionStore) -> None:
    sid = with_result(store, 80_000, after=3)
    store.maintain_context(sid, policy=PRUNE)
    child = store.fork(sid)
    assert store.context(child) == store.snapshot(child)["transcript"]  # not pruned yet
    store.maintain_context(child, policy=PRUNE)
    assert store.context(child) == store.context(sid)


# Doom loops


def loop(store: SessionStore, repeats: int, **arguments: Any) -> str:
    sid = store.open_session()
    store.inject(sid, {"role": "user", "content": "list the files"})
    for i in range(repeats):
        store.inject_many(sid, [call(f"c{i}", "ls", **arguments), result(f"c{i}", "a.py")])
    return sid


def test_two_identical_calls_are_fine_three_are_a_doom_loop(store: SessionStore) -> None:
    two = loop(store, 2, path=".")
    assert store.maintain_context(two)["doom_loop"] is False
    three = loop(store, 3, path=".")
    assert store.maintain_context(three)["doom_loop"] is True
    warning = store.context(three)[-1]
    assert warning["role"] == "user" and warning["synthetic"] is True
    assert warning["metadata"]["doom_loop"]["repeats"] == 3
    assert "`ls` was called 3 times" in warning["metadata"]["doom_loop"]["reason"]
    (detected,) = events_of(store, three, ev.DoomLoopDetected)
    assert (detected.tool, detected.repeats) == ("ls", 3)


def test_one_warning_per_loop(store: SessionStore) -> None:
    sid = loop(store, 3, path=".")
    store.maintain_context(sid)
    store.inject_many(sid, [call("c9", "ls", path="."), result("c9", "a.py")])
    assert store.maintain_context(sid)["doom_loop"] is False
    assert len(events_of(store, sid, ev.DoomLoopDetected)) == 1


def test_different_arguments_or_an_answer_break_the_run(store: SessionStore) -> None:
    sid = loop(store, 2, path=".")
    store.inject_many(sid, [call("x", "ls", path="src"), result("x", "b.py")])
    assert store.maintain_context(sid)["doom_loop"] is False
    other = loop(store, 2, path=".")
    store.inject(other, {"role": "assistant", "content": "found a.py"})
    store.inject_many(other, [call("y", "ls", path="."), result("y", "a.py")])
    assert store.maintain_context(other)["doom_loop"] is False


def test_arguments_compare_as_json_not_as_text(store: SessionStore) -> None:
    sid = store.open_session()
    for i, text in enumerate(['{"a": 1, "b": 2}', '{"b":2,"a":1}', '{"a":1, "b":2}']):
        openai = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": text}}
        store.inject_many(
            sid, [{"role": "assistant", "tool_calls": [openai]}, result(f"c{i}", "same")]
        )
    assert store.maintain_context(sid)["doom_loop"] is True


# The policy


@pytest.mark.parametrize(
    "bad",
    [
        {"window_tokens": 0},
        {"summarize_ratio": 0},
        {"soft_trim_ratio": 1.5},
        {"hard_clear_ratio": float("nan")},
        {"keep_turns": -1},
        {"prunable_chars_min": True},
        {"doom_loop_repeats": 1},
        {"skill_tools": {"a"}},
        {"summarizer": "no"},
        {"summary_temperature": "hot"},
    ],
)
def test_a_bad_policy_is_refused_with_its_field(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError, match=next(iter(bad))):
        ContextPolicy(**bad)


def test_a_checkpoint_keeps_an_anthropic_tool_result_with_its_tool_use(store: SessionStore) -> None:
    """A user message of `tool_result` blocks answers a call: it starts no turn, and the split
    never keeps it without the assistant `tool_use` before it."""
    sid = store.open_session()
    for turn in range(4):
        use = {"type": "tool_use", "id": f"t{turn}", "name": "ls", "input": {}}
        answer = {"type": "tool_result", "tool_use_id": f"t{turn}", "content": "r" * 100}
        store.inject_many(
            sid,
            [
                {"role": "user", "content": f"question {turn} " + "q" * 250},
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [answer]},
                {"role": "assistant", "content": f"done {turn}"},
            ],
        )
    policy = ContextPolicy(window_tokens=1_000, summarizer=summarize, keep_turns=1)
    assert store.maintain_context(sid, policy=policy)["checkpoint"] is True
    view = store.context(sid)
    assert view[0]["summary"] and view[1]["content"] == "summary of 12 messages"
    assert view[2]["content"].startswith("question 3")  # the whole last turn, call and result
    assert view[3]["content"][0]["id"] == "t3" and view[4]["content"][0]["tool_use_id"] == "t3"
    assert len(view) == 6


@pytest.mark.parametrize(
    ("message", "tokens_min"),
    [
        ({"role": "user", "content": "漢" * 4_000}, 4_000),
        (
            {"role": "item", "item": {"type": "function_call_output", "output": "x" * 40_000}},
            10_000,
        ),
        (
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [{"type": "text", "text": "y" * 40_000}],
                    }
                ],
            },
            10_000,
        ),
        ({"role": "user", "content": [{"type": "image", "source": {"url": "u"}}]}, 1_000),
        ({"role": "user", "content": "see", "files": [{"path": "a.png"}]}, 1_000),
    ],
    ids=["cjk", "item", "nested-tool-result", "image", "file"],
)
def test_the_default_counter_counts_what_the_model_is_sent(
    message: dict[str, Any], tokens_min: int
) -> None:
    """Non-ASCII text, items, nested blocks and attachments used to count as (almost) nothing,
    so such a context overflowed its window without a checkpoint or a prune."""
    from sessions._messages import default_token_counter

    assert default_token_counter(message) >= tokens_min
    assert default_token_counter({"role": "user", "content": "a" * 400}) == 100  # ASCII as before


def test_a_context_of_items_is_summarized_with_the_default_counter(tmp_path: Path) -> None:
    policy = ContextPolicy(window_tokens=1_000, summarizer=summarize, keep_turns=1)
    with SessionStore.open(tmp_path / "s", context_policy=policy) as store:
        sid = store.open_session()
        for turn in range(4):
            output = {"type": "function_call_output", "call_id": f"c{turn}", "output": "o" * 900}
            store.inject_many(
                sid, [{"role": "user", "content": f"q{turn}"}, {"role": "item", "item": output}]
            )
        report = store.maintain_context(sid)
        assert report["checkpoint"] is True and report["tokens"] < 1_000


def test_the_store_default_policy_is_used(tmp_path: Path) -> None:
    policy = ContextPolicy(window_tokens=1_000, summarizer=summarize)
    with SessionStore.open(tmp_path / "s", token_counter=chars, context_policy=policy) as store:
        sid = users(store, 6, 170)
        assert store.maintain_context(sid)["checkpoint"] is True


def test_unknown_sessions_and_read_only_stores_are_refused(store: SessionStore) -> None:
    from sessions import UnknownSessionError

    with pytest.raises(UnknownSessionError):
        store.context("nobody")
    with pytest.raises(UnknownSessionError):
        store.maintain_context("nobody")
    sid = users(store, 1, 1)
    past = store.as_of(store.log.head)
    assert past.context(sid) == store.context(sid)
    with pytest.raises(InvalidArgumentError, match="read-only"):
        past.maintain_context(sid)
