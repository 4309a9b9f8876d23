"""An agent embedded in a Trio program, on a real model when one is configured.

    DEEPSEEK_API_KEY=sk-... python docs/examples/embedded_agent.py "How many words in 'to be or not'?"

Configured by the environment (defaults: DeepSeek, as `harness chat`):

* HARNESS_PROVIDER      `openai` (an OpenAI-compatible endpoint) or `scripted` (offline);
                        default: `openai` if the API key variable is set, else `scripted`
* HARNESS_BASE_URL      e.g. http://localhost:8000/v1 (default https://api.deepseek.com)
* HARNESS_MODEL         default deepseek-chat
* HARNESS_API_KEY_ENV   the variable holding the key (default DEEPSEEK_API_KEY)

CI runs it with the scripted provider. See docs/getting-started.md.
"""

from __future__ import annotations

import os
import sys
from contextlib import AsyncExitStack
from typing import Any

import attrs
import trio

import harness
from harness.agent import Call, Say, ScriptedProvider, ToolSet, tool
from harness.providers import DEEPSEEK, ModelProvider, OpenAICompatibleProvider


@tool("word_count", "Count the words of a text", {"type": "object", "properties": {"text": {"type": "string"}}})
async def word_count(args: dict[str, Any]) -> str:
    return str(len(str(args["text"]).split()))


async def choose_provider(stack: AsyncExitStack) -> tuple[ModelProvider, str]:
    key_env = os.environ.get("HARNESS_API_KEY_ENV", "DEEPSEEK_API_KEY")
    kind = os.environ.get("HARNESS_PROVIDER") or ("openai" if os.environ.get(key_env) else "scripted")
    if kind == "scripted":
        script: list[list[Call | Say]] = [[Call("word_count", {"text": "to be or not"})], [Say("There are 4 words.")]]
        return ScriptedProvider(script), "scripted provider (offline; set a key for a real model)"
    if kind != "openai":
        sys.exit(f"HARNESS_PROVIDER must be openai or scripted, got {kind!r}")
    endpoint = attrs.evolve(DEEPSEEK, api_key_env=key_env)
    real = OpenAICompatibleProvider(endpoint, model=os.environ.get("HARNESS_MODEL"), base_url=os.environ.get("HARNESS_BASE_URL"))
    if not real.has_api_key:
        sys.exit(f"no API key: set {key_env} (or HARNESS_PROVIDER=scripted)")
    await stack.enter_async_context(real)  # closes its HTTP client at the end
    return real, f"{real.name}/{real.model} at {real.base_url}"


async def main(question: str) -> None:
    async with AsyncExitStack() as stack:
        provider, description = await choose_provider(stack)
        print(f"provider: {description}")
        async with harness.open_runtime(provider=provider, tools=ToolSet([word_count])) as rt:
            agent = await rt.create("assistant", system="Answer briefly. Use tools when they help.")
            result = await agent.run_turn(question)
            messages: list[Any] = list(agent.messages)
            for m in messages[1:]:
                for part in m["content"]:
                    if part["type"] == "text":
                        print(f"{m['role']}: {part['text']}")
            print(f"turn {result.turn}: {result.kind}")


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "How many words are in 'to be or not'?")
