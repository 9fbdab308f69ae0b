"""The session engine against a plain model, driven by `sessions.testing.SessionMachine`.

One machine runs on each durable backend: LMDB in temp dirs under the active hypothesis profile, and
PostgreSQL in a schema per machine (see `tests/_pg.py`) with a quarter of the profile's examples,
as each step costs a few hundred round trips to the server. The example in the
docstring of `sessions.testing` runs here as written, and again with a wrong orchestrator that the
machine must catch; the strategies and `check_store` get tests of their own.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.stateful import run_state_machine_as_test

import sessions.testing
from eventlog import events as ev
from sessions import LocalKeyProvider, SessionStore
from sessions._seal import SEALED_TEXT
from sessions.testing import (
    SESSION_ID_POOL,
    SessionMachine,
    SessionModel,
    canonical,
    check_store,
    count_tokens,
    histories,
    messages,
    observed,
    run_history,
)
from tests import _pg
from tests.conftest import STORE_KINDS, assert_rebuild_changes_nothing, open_store, store_target_of


class PostgresSessionMachine(SessionMachine):
    """The same machine with its store in a PostgreSQL schema; `reopen` reopens the same schema
    (named after the machine's temp dir)."""

    def make_store(self, path: Path) -> SessionStore:
        schema = "m_" + hashlib.sha256(str(path).encode()).hexdigest()[:16]
        url = f"{_pg.database_url()}?schema={schema}"
        return SessionStore.open(url, sync=False, hot_sessions=3, token_counter=count_tokens)


class EncryptedSessionMachine(SessionMachine):
    """The same machine on an encrypted LMDB store: every read goes through the keys, `reopen`
    reopens with them, and after every step no message, title or scratchpad value of the log is
    stored in the clear."""

    KEYS = LocalKeyProvider(bytes(range(32)))

    def make_store(self, path: Path) -> SessionStore:
        return SessionStore.open(
            path, sync=False, hot_sessions=3, token_counter=count_tokens, keys=self.KEYS
        )

    def check_extra(self, store: SessionStore, model: SessionModel) -> None:
        for envelope in store.log.read(after=0, limit=10_000):
            data = envelope.data
            for message in sealed_messages(data):
                assert message.sealed is not None and message.content is None, envelope
            title = getattr(data, "title", None)
            assert title is None or title.startswith(SEALED_TEXT), envelope
            if isinstance(data, ev.ScratchpadSet):
                assert all(v.startswith(SEALED_TEXT) for v in data.scratchpad.values()), envelope


def sealed_messages(data: ev.Event) -> list[ev.Message]:
    if isinstance(data, ev.MessagesInjected):
        return list(data.messages)
    if isinstance(data, ev.SessionCompacted):
        return list(data.replacement)
    found = getattr(data, "message", None)
    return [found] if isinstance(found, ev.Message) else []


def test_the_session_machine_with_encryption() -> None:
    run_state_machine_as_test(EncryptedSessionMachine, settings=SessionMachine.TestCase.settings)


MACHINES: dict[str, type[SessionMachine]] = {
    "lmdb": SessionMachine,
    "postgres": PostgresSessionMachine,
}


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_the_session_machine(kind: str) -> None:
    chosen = SessionMachine.TestCase.settings
    if kind == "postgres":
        _pg.database_url()  # skips here (or fails, when required) rather than inside the machine
        chosen = settings(chosen, max_examples=max(5, (chosen.max_examples or 20) // 4))
    run_state_machine_as_test(MACHINES[kind], settings=chosen)


def docstring_example() -> str:
    doc = sessions.testing.__doc__
    assert doc is not None
    start = doc.index("```python\n") + len("```python\n")
    return doc[start : doc.index("```", start)]


def run_example(orchestrator: type | None = None, **overrides: Any) -> dict[str, Any]:
    """Exec the docstring example (optionally with another `Orchestrator`) and run its test."""
    namespace: dict[str, Any] = {"__name__": "sessions_testing_example"}
    exec(compile(docstring_example(), "sessions/testing.py (docstring)", "exec"), namespace)
    if orchestrator is not None:
        namespace["Orchestrator"] = orchestrator(namespace["Orchestrator"])
    case = namespace["TestOrchestrator"]
    if overrides:
        case.settings = settings(case.settings, **overrides)
    case("runTest").runTest()
    return namespace


def test_docstring_example_runs_its_rule_and_its_check() -> None:
    calls = {"ask": 0, "user_turns": 0}

    def counted(base: type) -> type:
        class Counted(base):  # type: ignore[valid-type, misc]
            def ask(self, session_id: str, question: str) -> None:
                calls["ask"] += 1
                super().ask(session_id, question)

            def user_turns(self, session_id: str) -> int:  # called by check_extra only
                calls["user_turns"] += 1
                return int(super().user_turns(session_id))

        return Counted

    # Derandomized so the count of rule calls is a fact about the code, not about the seed.
    run_example(counted, derandomize=True, max_examples=30)
    assert calls["ask"] > 0
    assert calls["user_turns"] > 0


def test_docstring_example_catches_a_wrong_orchestrator() -> None:
    def miscounting(base: type) -> type:
        class Miscounting(base):  # type: ignore[valid-type, misc]
            def user_turns(self, session_id: str) -> int:
                return len(self.store.messages(session_id))  # counts every role

        return Miscounting

    with pytest.raises(AssertionError):
        run_example(
            miscounting,
            database=None,
            phases=[Phase.explicit, Phase.generate],  # no shrinking: the failure is enough
            max_examples=50,
        )


def test_a_machine_builds_a_fork_chain_six_deep_and_survives_reopen() -> None:
    machine = SessionMachine()
    directory = machine.directory
    try:
        machine.start_with_a_fork_chain(depth=4, seed=[{"role": "user", "content": "root"}])
        machine.fork_deeper(keep_first=None, destination=None)
        machine.fork_deeper(keep_first=2, destination="beta")
        assert machine.newest_fork == "beta"
        assert machine.model.depth("beta") == 6
        machine.reopen()
        machine.compact(pick=machine.model.open_ids().index("beta"), options={"keep_last": 1})
        machine.store_agrees_with_model()
        machine.log_verifies()
        machine.rebuild()
        ancestry = machine.store.ancestry("beta")
        assert ancestry is not None
        assert ancestry["root_id"] == "alpha"
        assert machine.store.length("beta") == 1
    finally:
        machine.teardown()
    assert not directory.exists()


def test_check_store_names_each_kind_of_divergence() -> None:
    machine = SessionMachine()
    try:
        machine.start_with_a_fork_chain(depth=1, seed=[{"role": "user", "content": "hi"}])
        machine.attach(pick=0, client="tui", mode="controller", takeover=False)
        check_store(machine.store, machine.model)
        divergences = [
            lambda m: m.sessions["alpha"].transcript.append({"role": "user"}),
            lambda m: setattr(m.sessions["alpha"], "scratchpad_version", 3),
            lambda m: setattr(m.sessions["alpha"], "controller_id", None),
            lambda m: m.sessions["alpha"].child_ids.clear(),
            lambda m: m.close("chain-0"),
            lambda m: m.open("gamma"),
        ]
        for diverge in divergences:
            model = machine.model.copy()
            diverge(model)
            with pytest.raises(AssertionError):
                check_store(machine.store, model)
    finally:
        machine.teardown()


def test_a_refused_call_that_writes_is_reported() -> None:
    machine = SessionMachine()
    try:
        machine.start_with_a_fork_chain(depth=0, seed=[])
        with pytest.raises(AssertionError, match="refused call wrote"):

            def writes_then_refuses() -> None:
                machine.store.inject("alpha", {"role": "user"})
                raise KeyError("refused")

            machine.expect_refused(KeyError, writes_then_refuses)
        with pytest.raises(AssertionError, match="expected"):
            machine.expect_refused(KeyError, lambda: None)
    finally:
        machine.teardown()


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(message=messages())
def test_messages_come_back_in_their_canonical_form(message: dict[str, Any]) -> None:
    with SessionStore.memory() as store:
        store.open_session("s")
        store.inject("s", message)
        assert store.messages("s") == [canonical(message)]


@pytest.mark.parametrize("kind", STORE_KINDS)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(history=histories())
def test_histories_replay_alike_on_memory_and_each_backend(
    kind: str, history: list[sessions.testing.VerbCall]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        target = store_target_of(kind, Path(directory) / "store")
        durable = open_store(kind, target, sync=False, token_counter=count_tokens)
        reference = SessionStore.memory(token_counter=count_tokens)
        with durable, reference:
            assert run_history(durable, history) == run_history(reference, history)
            assert durable.log.verify(isolated=False).ok
            for sid in SESSION_ID_POOL:
                a, b = durable.snapshot(sid), reference.snapshot(sid)
                assert (a is None) == (b is None)
                if a is not None and b is not None:
                    assert observed(a) == observed(b)
            assert_rebuild_changes_nothing(durable)


def test_model_compaction_follows_the_documented_rules() -> None:
    model = SessionModel(count_tokens)
    call = {"role": "assistant", "tool_calls": [{"id": "c1"}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "x" * 300}
    history = [
        {"role": "user", "content": "q"},
        call,
        result,
        {"role": "user", "content": "thanks"},
    ]
    # keep_last=2 would split the call from its result: the boundary moves back to the call.
    assert model.compacted(history, {"keep_last": 2}) == history[1:]
    masked = model.compacted(history, {"compact_strategy": "observation_mask", "keep_last": 1})
    assert masked[2]["content"] == "[tool output masked: 300 characters]"
    assert model.compacted(history, {"keep_last": 9, "token_threshold": 10_000}) == history


def test_model_and_engine_keep_an_anthropic_tool_result_with_its_call() -> None:
    # A user message holding a tool_result block answers the call before it, as a role-tool
    # message does: neither the engine nor the model may keep it without that call.
    call = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "run", "input": {}}],
    }
    answer = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x" * 300}],
    }
    history = [{"role": "user", "content": "q"}, call, answer, {"role": "user", "content": "ok"}]
    model = SessionModel(count_tokens)
    with SessionStore.memory(token_counter=count_tokens) as store:
        sid = store.open_session()
        store.inject_many(sid, history)
        store.compact(sid, keep_last=2)  # the boundary falls on the answer: it moves to the call
        engine = store.snapshot(sid)["transcript"]
    expected = model.compacted(history, {"keep_last": 2})
    assert expected == history[1:]
    assert [canonical(m) for m in engine] == [canonical(m) for m in expected]
