"""What forgetting does to a family of forks, against a model: any mix of opens, injects, forks
(at any point, of forks too) and forgets on an encrypted LMDB store.

The model keeps, for each message of each transcript, the session that wrote it. A forgotten
session refuses every read (`ForgottenError`); in any other session, a message written by a
forgotten session reads as the placeholder ``{"role": ..., "metadata": {"forgotten": True}}``
(its key went with its writer), and every other message reads as written. The log verifies and
the projection equals its rebuild throughout.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sessions import ForgottenError, LocalKeyProvider, SessionStore
from tests.conftest import assert_rebuild_changes_nothing

KEYS = LocalKeyProvider(bytes(range(32)))


class ForgetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="forget-"))
        self.store = SessionStore.open(self.directory, sync=False, keys=KEYS, hot_sessions=2)
        self.transcripts: dict[str, list[tuple[str, str, str]]] = {}  # writer, role, content
        self.forgotten: set[str] = set()
        self.count = 0

    def live(self) -> list[str]:
        return sorted(sid for sid in self.transcripts if sid not in self.forgotten)

    @rule()
    def open(self) -> None:
        self.count += 1
        sid = self.store.open_session(f"s{self.count}")
        self.transcripts[sid] = []

    @precondition(lambda self: self.live())
    @rule(pick=st.integers(0, 100), role=st.sampled_from(["user", "assistant"]))
    def inject(self, pick: int, role: str) -> None:
        sid = self.live()[pick % len(self.live())]
        self.count += 1
        text = f"text-{self.count}"
        self.store.inject(sid, {"role": role, "content": text})
        self.transcripts[sid].append((sid, role, text))

    @precondition(lambda self: self.live())
    @rule(pick=st.integers(0, 100), keep=st.integers(0, 8))
    def fork_at(self, pick: int, keep: int) -> None:
        parent = self.live()[pick % len(self.live())]
        self.count += 1
        child = self.store.fork_at(parent, keep_first=keep, destination_id=f"s{self.count}")
        self.transcripts[child] = self.transcripts[parent][:keep]

    @precondition(lambda self: self.live())
    @rule(pick=st.integers(0, 100))
    def forget(self, pick: int) -> None:
        sid = self.live()[pick % len(self.live())]
        self.store.forget(sid, "asked")
        self.forgotten.add(sid)

    @rule()
    def rebuild(self) -> None:
        assert_rebuild_changes_nothing(self.store)

    @invariant()
    def reads_match_the_model(self) -> None:
        for sid, transcript in self.transcripts.items():
            if sid in self.forgotten:
                try:
                    self.store.messages(sid)
                except ForgottenError as exc:
                    assert exc.session_id == sid
                else:
                    raise AssertionError(f"{sid} was forgotten, yet it reads")
                continue
            expected: list[dict[str, Any]] = [
                {"role": role, "metadata": {"forgotten": True}}
                if writer in self.forgotten
                else {"role": role, "content": text}
                for writer, role, text in transcript
            ]
            assert self.store.messages(sid) == expected, sid

    @invariant()
    def log_verifies(self) -> None:
        assert self.store.log.verify(isolated=False).ok

    def teardown(self) -> None:
        try:
            self.store.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


TestForgetMachine = ForgetMachine.TestCase
