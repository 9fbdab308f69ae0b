"""Property-based testing kit for code built on `SessionStore`: hypothesis strategies for messages,
session ids and verb calls, and `SessionMachine`, a state machine that drives a real LMDB store and a
plain model (`sessions._model`) side by side and checks they agree after every step.

Needs `hypothesis` (a test dependency); `sessions/__init__.py` never imports this module. Nothing
here may change a store except through its public verbs.

Check your own orchestrator against the engine by subclassing `SessionMachine`: add rules that
drive your code and tell the model what should happen, and check your own read models in
`check_extra(store, model)`, which runs after every step. `make_store(path)` may be overridden
too (keep it durable at `path`, and pass `token_counter=count_tokens`):

```python
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from sessions import SessionStore
from sessions.testing import SessionMachine, SessionModel


class Orchestrator:
    "Yours: asks questions on a session and counts its user turns."

    def __init__(self, store: SessionStore) -> None:
        self.store = store

    def ask(self, session_id: str, question: str) -> None:
        self.store.inject(session_id, {"role": "user", "content": question})

    def user_turns(self, session_id: str) -> int:
        return sum(m["role"] == "user" for m in self.store.messages(session_id))


class OrchestratorMachine(SessionMachine):
    @precondition(lambda self: bool(self.model.open_ids()))
    @rule(pick=st.integers(0, 1000), question=st.text(max_size=40))
    def ask(self, pick: int, question: str) -> None:
        session_id = self.pick_open(pick)
        Orchestrator(self.store).ask(session_id, question)
        self.model.inject(session_id, {"role": "user", "content": question})

    def check_extra(self, store: SessionStore, model: SessionModel) -> None:
        orchestrator = Orchestrator(store)
        for session_id in model.open_ids():
            transcript = model.sessions[session_id].transcript
            expected = sum(m["role"] == "user" for m in transcript)
            assert orchestrator.user_turns(session_id) == expected, session_id


TestOrchestrator = OrchestratorMachine.TestCase
TestOrchestrator.settings = settings(max_examples=10, stateful_step_count=20, deadline=None)
```

`histories()` draws whole lists of verb calls instead; `run_history(store, history)` runs one and
says which calls were refused, so two stores (or your wrapper and the engine) can be compared.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import projections as pj
from eventlog import (
    InvalidArgumentError,
    SessionExistsError,
    UnknownSessionError,
)
from sessions._live_rules import LiveRules
from sessions._model import (
    CLOSED,
    DELETED,
    ModelSession,
    SessionModel,
    canonical,
    check_store,
    observed,
)
from sessions._refusals import BAD_ARGUMENTS, ON_UNKNOWN_SESSION
from sessions._rules_base import PICK, has_open
from sessions._store import SessionStore
from sessions._strategies import (
    CLIENT_ID_POOL,
    GHOST_IDS,
    MOUNT_MODES,
    SESSION_ID_POOL,
    STRATEGIES,
    VerbCall,
    client_ids,
    close_statuses,
    compact_options,
    compress_clip,
    content_blocks,
    count_tokens,
    custom_compact,
    histories,
    invalid_session_ids,
    json_values,
    mask_as_message,
    mask_as_text,
    messages,
    run_history,
    scratchpads,
    session_ids,
    short_text,
    summarize,
    tool_exchanges,
    verbs,
)
from sessions._transcript_rules import TranscriptRules

__all__ = [
    "CLIENT_ID_POOL",
    "SESSION_ID_POOL",
    "STRATEGIES",
    "ModelSession",
    "SessionMachine",
    "SessionModel",
    "VerbCall",
    "canonical",
    "check_store",
    "client_ids",
    "close_statuses",
    "compact_options",
    "compress_clip",
    "content_blocks",
    "count_tokens",
    "custom_compact",
    "histories",
    "invalid_session_ids",
    "json_values",
    "mask_as_message",
    "mask_as_text",
    "messages",
    "observed",
    "run_history",
    "scratchpads",
    "session_ids",
    "short_text",
    "summarize",
    "tool_exchanges",
    "verbs",
]


class _Abort(Exception):
    """Raised inside a transaction to abandon it."""


_DESTINATIONS = st.one_of(st.none(), st.sampled_from(SESSION_ID_POOL), session_ids())


def _has_gone(machine: SessionMachine) -> bool:
    return bool(machine.model.ids_with_status(CLOSED) + machine.model.ids_with_status(DELETED))


class SessionMachine(TranscriptRules, LiveRules, RuleBasedStateMachine):
    """A real `SessionStore` (LMDB in a temp dir of its own, removed in teardown) and a
    `SessionModel`, driven by the same commands; after every step the store must agree with the
    model, its log must verify, and every few steps a rebuilt projection must equal the
    incremental one.

    Subclass to check your own code: override `check_extra(store, model)` (called after every
    step), `make_store(path)` or `make_model()`, and add rules that call `self.store` and update
    `self.model`. `pick_open(pick)` chooses an open session; `expect_refused(error, call)`
    checks a call raises `error` and writes nothing.
    """

    rebuild_every_steps: ClassVar[int] = 5
    past_models_max: ClassVar[int] = 30

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="sessionlog-machine-"))
        try:
            self.store_path = self.directory / "store"
            self.store = self.make_store(self.store_path)
            self.model = self.make_model()
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self.steps_checked = 0
        self.newest_fork: str | None = None
        self.opened_with: dict[str, dict[str, Any]] = {}  # what open_session opened each id with
        self.past: list[tuple[int, SessionModel]] = []

    # Hooks for subclasses

    def make_store(self, path: Path) -> SessionStore:
        """The store under test, durable at `path` (the `reopen` rule opens it again)."""
        return SessionStore.open(path, sync=False, hot_sessions=3, token_counter=count_tokens)

    def make_model(self) -> SessionModel:
        return SessionModel(count_tokens)

    def check_extra(self, store: SessionStore, model: SessionModel) -> None:
        """Check your own read models against `store` and `model`; runs after every step."""

    # Building a tree to start from

    @initialize(depth=st.integers(0, 6), seed=st.lists(messages(), max_size=3))
    def start_with_a_fork_chain(self, depth: int, seed: list[dict[str, Any]]) -> None:
        """A root session and a chain of `depth` forks, each one message longer."""
        parent = self.store.open_session("alpha")
        self.model.open(parent)
        for message in seed:
            self.store.inject(parent, message)
            self.model.inject(parent, message)
        for level in range(depth):
            child = self.store.fork(parent, f"chain-{level}")
            self.model.fork(parent, child)
            self.store.inject(child, {"role": "user", "content": f"level {level}"})
            self.model.inject(child, {"role": "user", "content": f"level {level}"})
            parent = self.newest_fork = child

    # Opening and closing

    @rule(
        sid=st.sampled_from(SESSION_ID_POOL) | session_ids(),
        title=st.none() | short_text(12),
        mount_mode=st.none() | st.sampled_from(MOUNT_MODES),
    )
    def open_session(self, sid: str, title: str | None, mount_mode: str | None) -> None:
        options: dict[str, Any] = {}
        if title is not None:
            options["title"] = title
        if mount_mode is not None:
            options["workspace_policy"] = {"default_mount_mode": mount_mode}
        if self.model.is_open(sid) and options and self.opened_with.get(sid) != options:
            # Options that may differ from the opening call's: refused as a conflict, or (when
            # they happen to match what a fork copied) the same id back; nothing written.
            # Each option given is compared with the opening call's: one that differs is a
            # conflict; one the opening call left out is compared with a default the model does
            # not keep, so either outcome is allowed for it.
            opened = self.opened_with.get(sid)
            differs = opened is not None and any(
                name in opened and opened[name] != value for name, value in options.items()
            )
            same = opened is not None and all(
                opened.get(name) == value for name, value in options.items()
            )
            try:
                got = self._expect_no_write(lambda: self.store.open_session(sid, **options))
            except SessionExistsError:
                if same:
                    raise AssertionError(
                        f"open_session({sid!r}, {options}) refused its own options"
                    ) from None
                got = sid
            else:
                if differs:
                    raise AssertionError(f"open_session({sid!r}, {options}) ignored its options")
        elif self.model.is_open(sid):  # idempotent: same id back, nothing written
            got = self._expect_no_write(lambda: self.store.open_session(sid, **options))
        else:
            got = self.store.open_session(sid, **options)
            self.model.open(sid, title=title, workspace_policy=options.get("workspace_policy"))
            self.opened_with[sid] = options
        if got != sid:
            raise AssertionError(f"open_session({sid!r}) returned {got!r}")

    @rule()
    def open_minted(self) -> None:
        sid = self.store.open_session()
        if sid in self.model.sessions:
            raise AssertionError(f"minted id {sid!r} was already in use")
        self.model.open(sid)

    @precondition(_has_gone)
    @rule(pick=PICK)
    def reopen_gone(self, pick: int) -> None:
        """Open again an id that was closed or deleted: a fresh, empty session."""
        gone = self.model.ids_with_status(CLOSED) + self.model.ids_with_status(DELETED)
        sid = gone[pick % len(gone)]
        self.store.open_session(sid)
        self.model.open(sid)
        self.opened_with[sid] = {}

    @precondition(has_open)
    @rule(pick=PICK, status=close_statuses())
    def close_session(self, pick: int, status: str | dict[str, Any] | None) -> None:
        sid = self.pick_open(pick)
        self.store.close_session(sid, status)
        self.model.close(sid)

    @precondition(has_open)
    @rule(pick=PICK)
    def delete(self, pick: int) -> None:
        sid = self.pick_open(pick)
        self.store.delete(sid, reason="test")
        self.model.close(sid, DELETED)

    @precondition(has_open)
    @rule(pick=PICK, title=st.none() | short_text(12))
    def rename(self, pick: int, title: str | None) -> None:
        sid = self.pick_open(pick)
        self.store.rename(sid, title)
        self.model.rename(sid, title)

    # Forks

    def _fork(self, source: str, destination: str | None, keep_first: int | None) -> None:
        def call() -> str:
            if keep_first is None:
                return self.store.fork(source, destination)
            return self.store.fork_at(source, keep_first, destination)

        if destination is not None and self.model.is_open(destination):
            self.expect_refused(SessionExistsError, call)
            return
        child = call()
        self.opened_with.pop(child, None)
        if destination is not None and child != destination:
            raise AssertionError(f"fork onto {destination!r} returned {child!r}")
        if destination is None and child in self.model.sessions:
            raise AssertionError(f"fork minted {child!r}, which was already in use")
        self.model.fork(source, child, keep_first)
        self.newest_fork = child

    @precondition(has_open)
    @rule(pick=PICK, destination=_DESTINATIONS)
    def fork(self, pick: int, destination: str | None) -> None:
        self._fork(self.pick_open(pick), destination, None)

    @precondition(has_open)
    @rule(pick=PICK, keep_first=st.integers(0, 14), destination=_DESTINATIONS)
    def fork_at(self, pick: int, keep_first: int, destination: str | None) -> None:
        self._fork(self.pick_open(pick), destination, keep_first)

    @precondition(
        lambda self: self.newest_fork is not None and self.model.is_open(self.newest_fork)
    )
    @rule(keep_first=st.none() | st.integers(0, 14), destination=_DESTINATIONS)
    def fork_deeper(self, keep_first: int | None, destination: str | None) -> None:
        """Fork the newest fork again, so lineage grows deep."""
        assert self.newest_fork is not None
        self._fork(self.newest_fork, destination, keep_first)

    @precondition(lambda self: has_open(self) and _has_gone(self))
    @rule(pick=PICK, keep_first=st.none() | st.integers(0, 14), same_parent=st.booleans())
    def refork_gone(self, pick: int, keep_first: int | None, same_parent: bool) -> None:
        """Fork onto an id that was closed or deleted, often from the parent it had."""
        gone = self.model.ids_with_status(CLOSED) + self.model.ids_with_status(DELETED)
        destination = gone[pick % len(gone)]
        source = self.model.sessions[destination].parent_id
        if not (same_parent and source is not None and self.model.is_open(source)):
            source = self.pick_open(pick)
        self._fork(source, destination, keep_first)

    # Whole-store rules

    @rule()
    def reopen(self) -> None:
        """Close the store and open it again from the same directory."""
        self.store.close()
        self.store = self.make_store(self.store_path)

    @rule()
    def rebuild(self) -> None:
        self.check_rebuild()

    @precondition(lambda self: bool(self.past))
    @rule(pick=PICK)
    def time_travel(self, pick: int) -> None:
        """`as_of(position)` shows the store as the model was right after that position."""
        position, then = self.past[pick % len(self.past)]
        with self.store.as_of(position) as past:
            check_store(past, then)

    @precondition(has_open)
    @rule(
        pick=PICK,
        batch=st.lists(messages(), min_size=1, max_size=3),
        keep_last=st.none() | st.integers(0, 4),
        refuse_inside=st.booleans(),
        abort=st.sampled_from((None, "inner", "outer")),
    )
    def transaction(
        self,
        pick: int,
        batch: list[dict[str, Any]],
        keep_last: int | None,
        refuse_inside: bool,
        abort: str | None,
    ) -> None:
        """Commands inside `store.transaction()` (with a savepoint inside it) see their own
        writes and commit together; a refused command inside writes nothing; an exception
        leaving a block undoes exactly that block."""
        sid = self.pick_open(pick)
        head, expected = self.store.log.head, self.model.copy()
        try:
            with self.store.transaction():
                for message in batch:
                    self.store.inject(sid, message)
                    expected.inject(sid, message)
                if refuse_inside:
                    self.expect_refused(UnknownSessionError, lambda: self.store.reset(GHOST_IDS[0]))
                inner = expected.copy()
                try:
                    with self.store.transaction():
                        if keep_last is not None:
                            self.store.trim(sid, keep_last)
                            inner.trim(sid, keep_last)
                        self.store.set_scratchpad(sid, {"batch": len(batch)})
                        inner.set_scratchpad(sid, {"batch": len(batch)})
                        check_store(self.store, inner)
                        if abort == "inner":
                            raise _Abort
                    expected = inner
                except _Abort:
                    pass
                check_store(self.store, expected)
                if abort == "outer":
                    raise _Abort
        except _Abort:
            expected = self.model  # the whole transaction is undone
        if abort == "outer" and self.store.log.head != head:
            raise AssertionError(f"an aborted transaction wrote: {head} -> {self.store.log.head}")
        self.model = expected

    # Refused commands

    @rule(
        verb=st.sampled_from(sorted(ON_UNKNOWN_SESSION)),
        pick=PICK,
        ghost=st.sampled_from(GHOST_IDS),
        gone=st.booleans(),
    )
    def refused_unknown_session(self, verb: str, pick: int, ghost: str, gone: bool) -> None:
        """A verb on an id that was never opened, or was closed or deleted."""
        # A closed session is still read by `length` and `messages`: only deleted ones are gone.
        closed = [] if verb in ("length", "messages") else self.model.ids_with_status(CLOSED)
        not_open = closed + self.model.ids_with_status(DELETED)
        sid = not_open[pick % len(not_open)] if gone and not_open else ghost
        call = VerbCall(verb, (sid, *ON_UNKNOWN_SESSION[verb]))
        exc = self.expect_refused(UnknownSessionError, lambda: call.apply(self.store))
        if not isinstance(exc, KeyError):
            raise AssertionError("UnknownSessionError must also be a KeyError")

    @precondition(has_open)
    @rule(pick=PICK, case=st.sampled_from(BAD_ARGUMENTS))
    def refused_bad_arguments(
        self, pick: int, case: tuple[type[Exception], str, tuple[Any, ...], dict[str, Any]]
    ) -> None:
        error, verb, args, kwargs = case
        call = VerbCall(verb, (self.pick_open(pick), *args), kwargs)
        self.expect_refused(error, lambda: call.apply(self.store))

    @precondition(has_open)
    @rule(pick=PICK, bad=invalid_session_ids())
    def invalid_session_id(self, pick: int, bad: Any) -> None:
        """Queries tolerate any id; verbs refuse a malformed one with `InvalidArgumentError`."""
        if self.store.exists(bad) or self.store.snapshot(bad) is not None:
            raise AssertionError(f"{bad!r} names a session")
        if self.store.ancestry(bad) is not None:
            raise AssertionError(f"{bad!r} has an ancestry")
        source = self.pick_open(pick)
        for call in (
            lambda: self.store.open_session(bad),
            lambda: self.store.length(bad),
            lambda: self.store.inject(bad, {"role": "user"}),
            lambda: self.store.fork(source, bad),
        ):
            self.expect_refused(InvalidArgumentError, call)

    # Invariants

    @invariant()
    def store_agrees_with_model(self) -> None:
        check_store(self.store, self.model)
        self.check_extra(self.store, self.model)

    @invariant()
    def log_verifies(self) -> None:
        report = self.store.log.verify(isolated=False)
        if not report.ok:
            raise AssertionError(f"log verify failed: {report}")
        with self.store.log.view() as view:
            projected, head = pj.projected_position(view), view.head
        if projected != head:
            raise AssertionError(f"projection reflects {projected}, log head is {head}")

    @invariant()
    def rebuilt_equals_incremental(self) -> None:
        self.steps_checked += 1
        if self.steps_checked % self.rebuild_every_steps == 0:
            self.check_rebuild()

    @invariant()
    def remember_for_time_travel(self) -> None:
        head = self.store.log.head
        if head and (not self.past or self.past[-1][0] != head):
            self.past.append((head, self.model.copy()))
            del self.past[: -self.past_models_max]

    def check_rebuild(self) -> None:
        """The projection rebuilt from the whole log equals the one kept incrementally."""
        with self.store.log.view() as view:
            before = dict(pj.dump(view))
        self.store.rebuild()
        with self.store.log.view() as view:
            after = dict(pj.dump(view))
        if before != after:
            differ = sorted(
                k for k in before.keys() | after.keys() if before.get(k) != after.get(k)
            )
            raise AssertionError(f"rebuild changed the projection at keys {differ[:10]}")

    def teardown(self) -> None:
        try:
            self.store.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
