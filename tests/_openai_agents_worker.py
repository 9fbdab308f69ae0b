"""A process that runs an OpenAI Agents SDK conversation through `SessionlogSession` and is killed.

Usage: `python tests/_openai_agents_worker.py STORE_PATH MARKER`. It runs the shared script of
`tests/test_openai_agents.py` (a user turn whose model calls a tool, then answers); the tool
creates `MARKER` and then sleeps, so the test can SIGKILL the process while the tool call is in
flight, after the turn's input was stored and before its output was.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from integrations.openai_agents import SessionlogSession


def main(store_path: str, marker: str) -> None:
    set_tracing_disabled(True)

    @function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        Path(marker).write_text("in the tool")
        time.sleep(600)  # killed here
        return f"sunny in {city}"

    model = ScriptedModel(
        [
            [function_call("weather", {"city": "Oslo"}, call_id="call-1")],
            [assistant_message("It is sunny.")],
        ]
    )
    agent = Agent(name="forecaster", model=model, tools=[weather])
    session = SessionlogSession("conversation", store=store_path)
    asyncio.run(Runner.run(agent, "Weather in Oslo?", session=session))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
