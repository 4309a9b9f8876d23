"""Issue 16, provider output: malformed tool-call arguments, unknown finish reasons,
garbage streams, usage of the wrong types. The provider answers with its typed
``ProviderError`` family or a well-formed reply; an agent turn over it ends (completed,
or with a typed error in its ``turn/end``), its log satisfies the relational invariants,
the other sessions are served, and the runtime closes and resumes cleanly."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

import harness
from harness.agent import ToolSet, tool
from harness.errors import HarnessError, PersistedSessionNotFoundError
from harness.fuzz import budget, explored
from harness.providers import (
    Finish,
    ModelRequest,
    ProviderError,
    StreamChunk,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from harness.providers._openai import OpenAICompatibleProvider, RetryPolicy
from harness.session import freeze
from tests.fake_openai import FakeOpenAI, Stream, chunk, fake_openai, usage

pytestmark = pytest.mark.fuzz

KEY = "sk-fuzz-0123456789abcdef"
NO_RETRY = RetryPolicy(max_retries=0, initial_delay=0.001, max_delay=0.001, jitter=0.0)


@tool("add", "Add two numbers", {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}})
async def add(args: Any) -> str:
    return str(args["a"] + args["b"])


def _provider(server: FakeOpenAI) -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(base_url=server.base_url, api_key=KEY, trust_env=False, retry=NO_RETRY)


weird_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False),
              st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6,
)
arguments = st.one_of(
    st.just('{"a": 1, "b": 2}'), st.text(max_size=30),
    st.sampled_from(["", "{", "}", "null", "[]", '{"a": NaN}', '{"a": 1e999}', '{"a": "\\ud800"}', '{"a":1,"a":2}',
                     '{"a": 18446744073709551616}', "[" * 300 + "]" * 300, '"just a string"', "\x00"]),
    weird_json,
)
finish_reasons = st.one_of(
    st.sampled_from(["stop", "tool_calls", "length", "content_filter", "function_call", "insufficient_system_resource",
                     "eos", "", "STOP", "null"]),
    st.none(), st.text(max_size=12), st.integers(), weird_json,
)
tool_fragments = st.fixed_dictionaries(
    {},
    optional={
        "index": st.one_of(st.integers(min_value=-3, max_value=3), st.integers(), weird_json),
        "id": st.one_of(st.just("c1"), st.text(max_size=6), weird_json),
        "type": st.just("function"),
        "function": st.one_of(
            st.fixed_dictionaries({}, optional={"name": st.one_of(st.sampled_from(["add", "nope", ""]), weird_json),
                                                "arguments": arguments}),
            weird_json,
        ),
    },
)
usages = st.one_of(
    st.just(usage()),
    st.builds(
        lambda p, c: {"choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c}},
        weird_json, weird_json,
    ),
    st.builds(lambda u: {"choices": [], "usage": u}, weird_json),
)
events = st.one_of(
    st.builds(lambda t: chunk(content=t), st.text(max_size=20)),
    st.builds(lambda t: chunk(reasoning=t), st.text(max_size=20)),
    st.builds(lambda f: chunk(tool_calls=f), st.lists(tool_fragments, max_size=3)),
    st.builds(lambda r: chunk(finish=r), finish_reasons),  # type: ignore[arg-type]
    usages,
    st.builds(lambda c: {"choices": c}, weird_json),
    st.builds(lambda d: {"choices": [{"index": 0, "delta": d, "finish_reason": None}]}, weird_json),
    st.builds(lambda e: {"error": e}, weird_json),
    weird_json,
    # Raw SSE text, not JSON: garbage lines, comments, other event names, broken UTF-8.
    st.sampled_from(["data: {not json\n\n", ": keep-alive\n\n", "event: error\ndata: {}\n\n", "data:\n\n", "\n\n\n",
                     "data: [DONE]\n\n", "retry: 5\n\n", "id: 7\n\n", "data: \"\\ud800\"\n\n", "garbage without colon\n\n",
                     "data: " + "[" * 2000 + "\n\n", "data: 1e999999\n\n"]),
    st.text(max_size=40).map(lambda s: f"data: {s}\n\n"),
)
def _sse_text(event: Any) -> str:
    # Python's json, not orjson (which the fake server uses): it writes 70-bit integers.
    return event if isinstance(event, str) else f"data: {json.dumps(event)}\n\n"


replies = st.builds(
    Stream,
    st.lists(events.map(_sse_text), max_size=8),
    done=st.booleans(),
    split=st.one_of(st.none(), st.integers(min_value=1, max_value=16)),
    end=st.sampled_from(["close", "close", "abort"]),
)


async def _collect(p: OpenAICompatibleProvider) -> list[StreamChunk]:
    req = ModelRequest("s1", "deepseek", "deepseek-chat", [freeze({"id": "u1", "role": "user", "content": [
        {"type": "text", "text": "hi"}], "source": {"kind": "user"}})])
    stream = p.stream(req)
    try:
        return [c async for c in stream]
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


@settings(max_examples=budget(60))
@given(script=st.lists(replies, min_size=1, max_size=4))
def test_fuzz_provider_stream(script: list[Stream]) -> None:
    """The provider alone: each reply is a typed error or a well-formed chunk list."""

    async def main() -> None:
        async with fake_openai(script) as server, _provider(server) as p:
            for _ in script:
                explored("OpenAICompatibleProvider.stream")
                try:
                    chunks = await _collect(p)
                except ProviderError as exc:
                    assert exc.code and str(exc)
                    continue
                assert chunks and isinstance(chunks[-1], Finish), chunks
                for c in chunks:
                    assert isinstance(c, (TextDelta, ToolCallDelta, Usage, Finish)) or type(c).__name__ == "ReasoningDelta"
                    if isinstance(c, Usage):
                        # Usage is logged: it must be storable JSON (no 70-bit ints).
                        assert orjson.dumps([c.input_tokens, c.output_tokens])

    trio.run(main)


TURN_END_KINDS = ("completed", "max-tokens", "error", "aborted")
"""Every way a turn ends (docs/agent.md; ``max-tokens``: the stream finished with reason ``length``)."""


@settings(max_examples=budget(30))
@given(script=st.lists(replies, min_size=1, max_size=3), backend=st.sampled_from(["jsonl", "sqlite"]))
# Found by the CI fuzz budget: a turn cut off by the token limit ends "max-tokens".
@example(script=[Stream([_sse_text(chunk(finish="length"))], done=False, end="close")], backend="jsonl")
def test_fuzz_agent_turns_over_garbage(script: list[Stream], backend: str) -> None:
    """An agent turn over each reply ends, typed; the log stays valid, the bystander
    keeps its acknowledged turn, and a resume after the close carries on."""

    async def main(root: Path) -> None:
        target = root / "tree" if backend == "jsonl" else root / "db.sqlite"
        async with fake_openai([*script, *script]) as server, _provider(server) as p:
            async with harness.open_runtime(target, backend=backend, provider=p, tools=ToolSet([add])) as rt:
                agent = await rt.create("fuzzed", cwd="/w")
                for _ in script:
                    explored(f"Agent.run_turn over a fuzzed stream/{backend}")
                    result = await agent.run_turn("go")
                    assert result.kind in TURN_END_KINDS, result
                    if result.kind == "error":
                        assert result.reason["error"]["code"], result.reason
            async with harness.open_runtime(target, backend=backend, provider=p, tools=ToolSet([add])) as rt:
                again = await rt.resume("fuzzed")
                result = await again.run_turn("and again")
                assert result.kind in TURN_END_KINDS, result

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))


@pytest.mark.parametrize(
    "fragment",
    [
        {"id": ["unhashable"], "function": {"name": "add", "arguments": "{}"}},
        {"id": ["unhashable"], "function": {"arguments": "{}"}},
        {"id": {"a": 1}, "function": {"name": "add"}},
        {"index": 2**70, "id": "c1", "function": {"name": "add", "arguments": "{}"}},
        {"index": -1, "function": {"name": "add", "arguments": "{"}},
    ],
    ids=["list id", "list id without a name", "dict id", "huge index", "negative index"],
)
def test_odd_tool_call_fragments(fragment: dict[str, Any]) -> None:
    # After a first, well-formed call: an index-less fragment is then matched against
    # the calls seen so far (where a list id raised TypeError out of the provider).
    first = {"index": 0, "id": "c0", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    events = [_sse_text(e) for e in (chunk(role="assistant", content=""), chunk(tool_calls=[first]),
                                     chunk(tool_calls=[fragment]), chunk(finish="tool_calls"), usage())]

    async def main() -> None:
        async with fake_openai([Stream(events)]) as server, _provider(server) as p:
            try:
                chunks = await _collect(p)
            except ProviderError as exc:
                assert exc.code
            else:
                assert isinstance(chunks[-1], Finish)
            explored("OpenAICompatibleProvider.stream")

    trio.run(main)


def test_huge_usage_is_not_logged_as_a_70_bit_integer() -> None:
    """A usage count beyond 64 bits (a buggy or hostile server) must not reach the log,
    where it would be refused as non-JSON or break the write-behind encoder."""
    events = [chunk(role="assistant", content="hi"), chunk(content="", finish="stop"),
              _sse_text({"choices": [], "usage": {"prompt_tokens": 2**70, "completion_tokens": 2**64}})]

    async def main(root: Path) -> None:
        async with fake_openai([Stream(events)]) as server, _provider(server) as p:
            async with harness.open_runtime(root, provider=p) as rt:
                agent = await rt.create("usage", cwd="/w")
                result = await agent.run_turn("hi")
                assert result.kind in ("completed", "error"), result
            async with harness.open_runtime(root, provider=p) as rt:
                assert (await rt.persistence.load("usage")).id == "usage"  # type: ignore[union-attr]

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))
    explored("OpenAICompatibleProvider.stream")


def test_errors_are_harness_errors() -> None:
    assert issubclass(ProviderError, HarnessError)


user_inputs = st.one_of(
    st.text(max_size=50),
    st.sampled_from(["\ud800", "", "\x00", "x" * 100_000, "/compact", "/nope", "\u202e"]),
    weird_json,
    st.sampled_from([b"bytes", ("t",), {1, 2}]),
)


@settings(max_examples=budget(20))
@given(inputs=st.lists(user_inputs, min_size=1, max_size=4), backend=st.sampled_from(["jsonl", "sqlite"]))
def test_fuzz_agent_user_input(inputs: list[Any], backend: str) -> None:
    """What a user types (or a program passes) to ``run_turn``: each turn ends, typed,
    and the session resumes after the close (its log stays readable)."""
    from harness.agent import Say, ScriptedProvider

    async def main(root: Path) -> None:
        target = root / "tree" if backend == "jsonl" else root / "db.sqlite"
        provider = ScriptedProvider([[Say("ok")]] * (len(inputs) + 1))
        completed = 0
        async with harness.open_runtime(target, backend=backend, provider=provider) as rt:
            agent = await rt.create("typed-at", cwd="/w")
            for text in inputs:
                explored(f"Agent.run_turn user input/{backend}")
                try:
                    result = await agent.run_turn(text)
                except HarnessError as exc:
                    assert exc.code
                    continue
                assert result.kind in TURN_END_KINDS, result
                completed += result.kind == "completed"
        async with harness.open_runtime(target, backend=backend, provider=provider) as rt:
            try:
                again = await rt.resume("typed-at")
            except PersistedSessionNotFoundError:
                # Input refused before anything was logged: a session with no events is
                # never written (lazy creation), so there is nothing to resume.
                assert completed == 0
                return
            assert (await again.run_turn("still there?")).kind == "completed"

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))
