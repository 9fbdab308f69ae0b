"""A process that compacts a `SessionlogSession` through the OpenAI Agents SDK's
`OpenAIResponsesCompactionSession`, and kills itself at a chosen point of the replacement.

Usage: `python tests/_openai_agents_compaction_worker.py STORE_PATH URL MODE MARKER`, where `URL`
answers `POST /responses/compact` (the test's server). MODE is `manual-` (a forced
`run_compaction`) or `automatic-` (a `Runner` turn whose compaction the SDK starts), then `inside`
(killed with the history already cut inside the replacement's open transaction, as its output is
about to be appended) or `after` (killed once the replacement's commit returned).
`fallback-inside` compacts a session without the hooks, which the SDK replaces as clear then add,
and is killed as it adds. The process writes MODE into MARKER just before it is killed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from agents.memory.openai_responses_compaction_session import OpenAIResponsesCompactionSession
from agents.testing import ScriptedModel, assistant_message
from openai import AsyncOpenAI

from integrations.openai_agents import SessionlogSession
from sessions import SessionStore


def die(marker: Path, mode: str) -> None:
    marker.write_text(mode)
    os.kill(os.getpid(), signal.SIGKILL)


class Dying(SessionlogSession):
    """Killed inside its replacement's transaction, or after its commit, as `when` says."""

    when = ""
    last_words: Callable[[], None] = staticmethod(lambda: None)

    async def _commit(
        self, replace: Callable[..., bool], sid: str, output: list[Any], *args: Any
    ) -> bool:
        if self.when == "inside":
            replace = self._cut_then_killed(replace)
        done = await super()._commit(replace, sid, output, *args)
        if self.when == "after":
            self.last_words()
        return done

    def _cut_then_killed(self, replace: Callable[..., bool]) -> Callable[..., bool]:
        def replacing(store: SessionStore, *args: Any) -> bool:
            def killed(*_: Any, **__: Any) -> None:  # the history is cut; nothing committed
                self.last_words()

            store.inject_many = killed  # type: ignore[method-assign]
            return replace(store, *args)

        return replacing


class Hookless:
    """The four methods of the protocol, and no hook: killed as it adds, after a clear."""

    def __init__(self, session: SessionlogSession, last_words: Callable[[], None]) -> None:
        self.session_id = session.session_id
        self.session_settings = session.session_settings
        self.get_items = session.get_items
        self.pop_item = session.pop_item
        self.clear_session = session.clear_session
        self.last_words = last_words

    async def add_items(self, items: list[Any]) -> None:
        self.last_words()


async def compact(store_path: str, url: str, mode: str, marker: str) -> None:
    set_tracing_disabled(True)
    session = Dying("s", store=store_path)
    session.when = mode.rsplit("-", 1)[1]
    session.last_words = lambda: die(Path(marker), mode)
    client = AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
    underlying: Any = session
    if mode.startswith("fallback"):
        underlying = Hookless(session, session.last_words)
        session.when = ""
    wrapped = OpenAIResponsesCompactionSession(
        "s", underlying_session=underlying, client=client, should_trigger_compaction=lambda c: True
    )
    if mode.startswith("automatic"):
        model = ScriptedModel([[assistant_message("a2", item_id="m-2")]])
        await Runner.run(Agent(name="a", model=model), "q2", session=wrapped)
    else:
        await wrapped.run_compaction({"force": True})


if __name__ == "__main__":
    asyncio.run(compact(*sys.argv[1:5]))
    sys.exit("the worker was never killed")
