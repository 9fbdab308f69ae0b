"""The LMDB log, the in-memory log and a plain Python model, driven side by side by hypothesis.

Rules append with right and wrong expected versions, run transactions (some with a savepoint,
some failing at the end), write projection state, page through reads and scans, and close and
reopen the LMDB log. After every step both logs must hold exactly what the model holds, hash for
hash identical to each other (every append passes the same explicit `recorded_at`), pass
`verify()`, and have delivered every committed event to their subscriber exactly once, in order.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from eventlog import ANY, NO_STREAM, ConcurrencyError, Envelope, EventLog, ExpectedVersion
from eventlog.events import Event, Message, MessageInjected, SessionRenamed, SessionTrimmed

STREAMS = ("s-a", "s-b", "bearer/ü", "x")
KEYS = (b"a", b"a/1", b"a/2", b"ab", b"b", b"b\xff", b"\xff", b"\xff\xff")
PREFIXES = (b"", b"a", b"a/", b"b", b"\xff", b"c")
AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


class Boom(Exception):
    """Raised by a rule to abort a transaction."""


texts = st.text(max_size=12)
events_st = st.lists(
    st.one_of(
        st.builds(lambda text: MessageInjected(message=Message(role="user", content=text)), texts),
        st.builds(lambda title: SessionRenamed(title=title), st.none() | texts),
        st.builds(
            lambda keep, kept: SessionTrimmed(keep_last=keep, kept_count=kept),
            st.integers(0, 2**40),
            st.integers(0, 9),
        ),
    ),
    min_size=1,
    max_size=4,
)
metas = st.none() | st.dictionaries(st.sampled_from(["client", "cause", "n"]), texts, max_size=2)
modes = st.sampled_from(["exact", "wrong", "no_stream", "any"])
keys = st.sampled_from(KEYS)
values = st.binary(max_size=8)

append_ops = st.tuples(st.just("append"), st.sampled_from(STREAMS), events_st, modes)
put_ops = st.tuples(st.just("put"), keys, values)
delete_ops = st.tuples(st.just("delete"), keys)
basic_ops = st.one_of(append_ops, put_ops, delete_ops)
nested_ops = st.tuples(st.just("nested"), st.lists(basic_ops, max_size=4), st.booleans())
tx_ops = st.lists(st.one_of(basic_ops, nested_ops), min_size=1, max_size=6)


@dataclass
class Model:
    """What the log should hold: one tuple per event, stream versions, projection state."""

    events: list[tuple[str, int, str, Event, dict[str, Any], datetime]] = field(
        default_factory=list
    )
    versions: dict[str, int] = field(default_factory=dict)
    kv: dict[bytes, bytes] = field(default_factory=dict)

    def copy(self) -> Model:
        return Model(list(self.events), dict(self.versions), dict(self.kv))


def expected_for(mode: str, version: int, offset: int = 1) -> int | ExpectedVersion:
    if mode == "exact":
        return version
    if mode == "wrong":
        return version - offset if version >= offset else version + offset
    return NO_STREAM if mode == "no_stream" else ANY


def accepted(mode: str, version: int) -> bool:
    return mode in {"exact", "any"} or (mode == "no_stream" and version == 0)


def model_append(
    model: Model, stream: str, events: list[Event], meta: dict[str, Any] | None, at: datetime
) -> list[int]:
    version = model.versions.get(stream, 0)
    first = len(model.events) + 1
    for offset, event in enumerate(events, 1):
        tag = str(event.__struct_config__.tag)
        model.events.append((stream, version + offset, tag, event, meta or {}, at))
    model.versions[stream] = version + len(events)
    return list(range(first, first + len(events)))


def try_append(
    target: Any,
    stream: str,
    events: list[Event],
    expected: int | ExpectedVersion,
    meta: dict[str, Any] | None,
    at: datetime,
) -> tuple[Any, ...]:
    """The outcome of one append, in a form both logs and the model can be compared on."""
    try:
        return (
            "ok",
            target.append(stream, events, expected_version=expected, meta=meta, recorded_at=at),
        )
    except ConcurrencyError as exc:
        return ("conflict", exc.stream, exc.expected, exc.actual)


def scan_model(
    kv: dict[bytes, bytes],
    prefix: bytes,
    start: bytes | None,
    stop: bytes | None,
    reverse: bool,
    limit: int | None,
) -> list[tuple[bytes, bytes]]:
    chosen = sorted(
        key
        for key in kv
        if key.startswith(prefix)
        and (start is None or key >= start)
        and (stop is None or key < stop)
    )
    if reverse:
        chosen.reverse()
    if limit is not None:
        chosen = chosen[:limit]
    return [(key, kv[key]) for key in chosen]


class LogStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="sessionlog-statemachine-"))
        self.model = Model()
        self.ticks = 0
        self.memory = EventLog.memory()
        self.lmdb = EventLog.open(self.directory / "log")
        self.delivered: dict[str, list[Envelope]] = {"memory": [], "lmdb": []}
        self.memory.subscribe(self.delivered["memory"].append)
        self.lmdb.subscribe(self.delivered["lmdb"].append)

    def teardown(self) -> None:
        self.memory.close()
        self.lmdb.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def logs(self) -> tuple[EventLog, EventLog]:
        return (self.memory, self.lmdb)

    def tick(self) -> datetime:
        self.ticks += 1
        return AT + timedelta(milliseconds=self.ticks)

    # Rules

    @rule(
        stream=st.sampled_from(STREAMS),
        events=events_st,
        mode=modes,
        offset=st.integers(1, 3),
        meta=metas,
    )
    def append(
        self,
        stream: str,
        events: list[Event],
        mode: str,
        offset: int,
        meta: dict[str, Any] | None,
    ) -> None:
        version = self.model.versions.get(stream, 0)
        expected = expected_for(mode, version, offset)
        at = self.tick()
        outcomes = [try_append(log, stream, events, expected, meta, at) for log in self.logs]
        if accepted(mode, version):
            want: tuple[Any, ...] = ("ok", model_append(self.model, stream, events, meta, at))
        else:
            want = ("conflict", stream, expected, version)
        assert outcomes == [want, want]

    def run_ops(self, log: EventLog, target: Any, model: Model, ops: list[Any]) -> list[Any]:
        """Apply `ops` to `target`, a transaction of `log`, and to `model`; returns what each op
        returned, for comparing the two logs."""
        results: list[Any] = []
        for op in ops:
            if op[0] == "append":
                _, stream, events, mode = op
                version = model.versions.get(stream, 0)
                # Inside a transaction the log must count the transaction's own appends.
                assert target.stream_version(stream) == version
                expected = expected_for(mode, version)
                at = AT + timedelta(milliseconds=self.ticks, microseconds=len(results))
                outcome = try_append(target, stream, events, expected, None, at)
                if accepted(mode, version):
                    assert outcome == ("ok", model_append(model, stream, events, None, at))
                else:
                    assert outcome == ("conflict", stream, expected, version)
                results.append(outcome)
            elif op[0] == "put":
                _, key, value = op
                target.kv_put(key, value)
                model.kv[key] = value
                assert target.kv_get(key) == value
            elif op[0] == "delete":
                _, key = op
                existed = target.kv_delete(key)
                assert existed == (model.kv.pop(key, None) is not None)
                results.append(existed)
            else:
                _, inner_ops, fails = op
                inner_model = model.copy()
                try:
                    with log.transaction() as inner:
                        results.append(self.run_ops(log, inner, inner_model, inner_ops))
                        if fails:
                            raise Boom
                except Boom:
                    results.append("inner aborted")
                else:
                    model.events, model.versions, model.kv = (
                        inner_model.events,
                        inner_model.versions,
                        inner_model.kv,
                    )
            assert target.head == len(model.events)
        return results

    @rule(ops=tx_ops, fails=st.booleans())
    def transaction(self, ops: list[Any], fails: bool) -> None:
        self.tick()
        outcomes, models = [], []
        for log in self.logs:
            model = self.model.copy()
            try:
                with log.transaction() as tx:
                    outcomes.append(self.run_ops(log, tx, model, ops))
                    if fails:
                        raise Boom
            except Boom:
                model = self.model
            models.append(model)
        assert outcomes[0] == outcomes[1]
        assert models[0] == models[1]
        self.model = models[0]

    @rule()
    def reopen(self) -> None:
        self.lmdb.close()
        self.lmdb = EventLog.open(self.directory / "log")
        seen = self.delivered["lmdb"]
        self.lmdb.subscribe(seen.append, after=seen[-1].position if seen else 0)

    @rule(data=st.data(), limit=st.integers(1, 9))
    def read_pages(self, data: st.DataObject, limit: int) -> None:
        start = data.draw(st.integers(0, len(self.model.events) + 2), label="after")
        for log in self.logs:
            pages: list[Envelope] = []
            after = start
            while page := log.read(after=after, limit=limit):
                assert len(page) <= limit
                pages.extend(page)
                after = page[-1].position
            assert [e.position for e in pages] == list(range(start + 1, len(self.model.events) + 1))

    @rule(stream=st.sampled_from(STREAMS), data=st.data(), limit=st.integers(1, 5))
    def read_stream_pages(self, stream: str, data: st.DataObject, limit: int) -> None:
        version = self.model.versions.get(stream, 0)
        start = data.draw(st.integers(0, version + 1), label="after")
        want = [entry for entry in self.model.events if entry[0] == stream][start:]
        for log in self.logs:
            pages: list[Envelope] = []
            after = start
            while page := log.read_stream(stream, after=after, limit=limit):
                assert len(page) <= limit
                pages.extend(page)
                after = page[-1].version
            assert [(e.stream, e.version, e.data) for e in pages] == [
                (entry[0], entry[1], entry[3]) for entry in want
            ]

    @rule(
        prefix=st.sampled_from(PREFIXES),
        start=st.none() | keys,
        stop=st.none() | keys,
        reverse=st.booleans(),
        limit=st.none() | st.integers(0, 4),
    )
    def scan(
        self,
        prefix: bytes,
        start: bytes | None,
        stop: bytes | None,
        reverse: bool,
        limit: int | None,
    ) -> None:
        want = scan_model(self.model.kv, prefix, start, stop, reverse, limit)
        for log in self.logs:
            with log.view() as view:
                got = view.kv_scan(prefix, start=start, stop=stop, reverse=reverse, limit=limit)
            assert got == want

    # Invariants

    @invariant()
    def logs_hold_the_model(self) -> None:
        model = self.model
        reads = [list(log.iter_all()) for log in self.logs]
        for everything in reads:
            assert [
                (e.stream, e.version, e.type, e.data, e.meta, e.recorded_at) for e in everything
            ] == (model.events)
            assert [e.position for e in everything] == list(range(1, len(model.events) + 1))
        assert reads[0] == reads[1], "the two logs differ (hash, bytes or fields)"
        for log in self.logs:
            assert log.head == len(model.events)
            for stream in STREAMS:
                assert log.stream_version(stream) == model.versions.get(stream, 0)

    @invariant()
    def chains_verify_and_agree(self) -> None:
        memory_report = self.memory.verify()
        lmdb_report = self.lmdb.verify(isolated=False)
        assert memory_report.ok, memory_report.problem
        assert lmdb_report.ok, lmdb_report.problem
        assert memory_report == lmdb_report
        assert memory_report.events_checked == len(self.model.events)
        assert self.memory.head_hash == self.lmdb.head_hash == memory_report.head_hash

    @invariant()
    def projection_state_matches(self) -> None:
        want = sorted(self.model.kv.items())
        for log in self.logs:
            with log.view() as view:
                assert view.kv_scan() == want

    @invariant()
    def subscribers_heard_every_commit_once_in_order(self) -> None:
        committed = len(self.model.events)
        for seen in self.delivered.values():
            assert [e.position for e in seen] == list(range(1, committed + 1))
        assert self.delivered["memory"] == self.delivered["lmdb"]


TestLogStateMachine = LogStateMachine.TestCase
