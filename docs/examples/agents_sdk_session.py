"""An OpenAI Agents SDK conversation stored by trio-harness: written by an asyncio
program, resumed by a Trio program (two processes).

    python docs/examples/agents_sdk_session.py ROOT asyncio   # two SDK runs, stored under ROOT
    python docs/examples/agents_sdk_session.py ROOT trio      # a Trio program reads them back

Offline: the SDK's agent runs on a small local model (no key, no network; tracing
off). With a real one, drop ``model=`` and set OPENAI_API_KEY. Needs the ``agents``
extra (``pip install 'trio-harness[agents]'``). See docs/asyncio.md.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import trio
from agents import Agent, Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import harness
from harness.bridge import AgentsSession, TrioAgentsSession


class CountingModel(Model):
    """Answers with the number of user messages it was sent (the history included)."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        given = kwargs["input"] if "input" in kwargs else args[1]
        users = sum(1 for i in given if i.get("role") == "user") if isinstance(given, list) else 1
        text = ResponseOutputText(type="output_text", text=f"You have said {users} thing(s).", annotations=[])
        reply = ResponseOutputMessage(id=f"msg_{users}", type="message", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[reply], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("this example does not stream")


async def asyncio_program(root: str) -> None:
    set_tracing_disabled(True)
    agent = Agent(name="assistant", instructions="Be brief.", model=CountingModel())
    async with harness.open_runtime_in_thread(root) as portal:
        session = AgentsSession(portal, "chat-1")  # the one line an SDK user adds
        for prompt in ("Hello", "Still there?"):
            result = await Runner.run(agent, prompt, session=session)
            print(f"asyncio: {prompt} -> {result.final_output}")


def text_of(item: Any) -> str:
    """A message item's text: a user's plain string, or an assistant's text parts."""
    content = item.get("content")
    return content if isinstance(content, str) else " ".join(str(part.get("text")) for part in content)


async def trio_program(root: str) -> None:
    async with harness.open_runtime(root) as rt:
        items = await TrioAgentsSession(rt, "chat-1").get_items()
        for item in items:
            print(f"trio: {item.get('role')}: {text_of(item)}")
        print(f"trio: {len(items)} items resumed")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in ("asyncio", "trio"):
        sys.exit("usage: agents_sdk_session.py ROOT asyncio|trio")
    if sys.argv[2] == "asyncio":
        asyncio.run(asyncio_program(sys.argv[1]))
    else:
        trio.run(trio_program, sys.argv[1])
