"""The programs of docs/examples/ run as a user runs them: as scripts, in a subprocess.

The embedded agent runs on the scripted provider (no key) and, to cover the real-provider
path without a network, on an OpenAI-compatible fake server on loopback.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from tests.fake_openai import Stream, call_events, fake_openai, text_events

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
KEY = "sk-example-test-key"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_") and k != "DEEPSEEK_API_KEY"}
    return {**env, **extra}


async def _run(name: str, *args: str, env: dict[str, str] | None = None, status: int = 0) -> tuple[str, str]:
    done = await trio.run_process(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env if env is not None else _env(),
    )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == status, out + err
    return out, err


@pytest.mark.parametrize(
    "extra",
    [{}, {"DEEPSEEK_API_KEY": "sk-unused", "HARNESS_PROVIDER": "scripted"}],
    ids=["no-key", "chosen"],
)
async def test_embedded_agent_on_the_scripted_provider(extra: dict[str, str]) -> None:
    """Without a key it falls back to the scripted provider; with one it can be chosen."""
    out, _ = await _run("embedded_agent.py", env=_env(**extra))
    assert out.splitlines()[0] == "provider: scripted provider (offline; set a key for a real model)"
    assert "assistant: There are 4 words." in out
    assert out.rstrip().endswith("turn 1: completed")


async def test_embedded_agent_on_an_openai_compatible_endpoint() -> None:
    script = [
        Stream(call_events([("c1", "word_count", '{"text": "one two three"}')])),
        Stream(text_events("Three words.")),
    ]
    async with fake_openai(script) as server:
        env = _env(HARNESS_BASE_URL=server.base_url, HARNESS_MODEL="m-1", HARNESS_API_KEY_ENV="EXAMPLE_KEY", EXAMPLE_KEY=KEY)
        out, _ = await _run("embedded_agent.py", "Count: one two three", env=env)
    assert out.splitlines()[0] == f"provider: deepseek/m-1 at {server.base_url}"
    assert "assistant: Three words." in out and out.rstrip().endswith("turn 1: completed")
    assert [r.body["model"] for r in server.requests] == ["m-1", "m-1"]
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    tool_messages = [m for m in server.requests[1].body["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["3"]  # the example's own tool ran


async def test_embedded_agent_refuses_openai_without_a_key() -> None:
    _, err = await _run("embedded_agent.py", env=_env(HARNESS_PROVIDER="openai"), status=1)
    assert "no API key: set DEEPSEEK_API_KEY" in err


async def test_fork_and_compare(tmp_path: Path) -> None:
    out, _ = await _run("fork_and_compare.py", str(tmp_path))
    assert re.search(r"== trip: parent=None seed_length=None events=\d+", out), out
    assert re.search(r"== trip-porto: parent='trip' seed_length=\d+ events=\d+", out), out
    assert "user: Lisbon, then." in out and "assistant: Porto it is: port cellars and the Douro." in out
    assert "shared prefix: 2 messages" in out
    # Both branches are on disk, and the child's stored header names its parent.
    headers: dict[str, Any] = {}
    for path in tmp_path.rglob("session.jsonl"):
        first = orjson.loads(path.read_bytes().splitlines()[0])
        headers[first["id"]] = first
    assert set(headers) == {"trip", "trip-porto"}
    assert headers["trip-porto"]["parentSession"] == "trip"


async def test_explore_my_function() -> None:
    out, _ = await _run("explore_my_function.py")
    lines = out.splitlines()
    good = re.fullmatch(r"transfer: \d+ attempts, steps explored per canceller \(caller: (\d+), shutdown: (\d+)\) -> ok", lines[0])
    assert good is not None, out
    assert int(good[1]) > 0 and int(good[2]) > 0
    assert re.fullmatch(r"naive_transfer: \d+ attempts, .* -> [1-9]\d* distinct violation\(s\)", lines[1]), out
    assert any("money not conserved" in line for line in lines[2:]), out


async def test_agents_sdk_session_written_by_asyncio_resumed_by_trio(tmp_path: Path) -> None:
    """Issue 25 §3's done criterion, as a user runs it: two processes, one store."""
    pytest.importorskip("agents")
    out, _ = await _run("agents_sdk_session.py", str(tmp_path), "asyncio")
    assert out.splitlines() == [
        "asyncio: Hello -> You have said 1 thing(s).",
        "asyncio: Still there? -> You have said 2 thing(s).",
    ]
    out, _ = await _run("agents_sdk_session.py", str(tmp_path), "trio")
    assert out.splitlines() == [
        "trio: user: Hello",
        "trio: assistant: You have said 1 thing(s).",
        "trio: user: Still there?",
        "trio: assistant: You have said 2 thing(s).",
        "trio: 4 items resumed",
    ]
