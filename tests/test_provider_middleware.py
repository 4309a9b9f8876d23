"""Provider middleware (the reference's ``llm/stream`` wrapping) and what compaction
records after a reroute (compaction reference §5.2: "Provider and model are recorded
after any llm/stream reroute")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import trio

from harness.agent import AgentCompaction, Say, ScriptedProvider
from harness.compaction import load_basic_compaction_config, summarize
from harness.faults import Probe, explore
from harness.providers import MiddlewareProvider, ModelRequest, StreamChunk, StreamNext, TextDelta
from harness.session import freeze, thaw
from tests.test_agent_compaction import LONG, agent_on, two_turns
from tests.test_compaction_phases import Recording, input_of


def reroute(provider: str, model: str) -> Any:
    async def middleware(request: ModelRequest, nxt: StreamNext) -> AsyncIterator[StreamChunk]:
        async for chunk in nxt(attrs.evolve(request, provider=provider, model=model)):
            yield chunk

    return middleware


async def test_a_middleware_wraps_the_stream_lazily_and_a_reroute_picks_the_provider() -> None:
    default = ScriptedProvider([[Say("from default")]], name="main", model="m1")
    other = ScriptedProvider([[Say("from other")]], name="other", model="o1")
    seen: list[str] = []

    async def shout(request: ModelRequest, nxt: StreamNext) -> AsyncIterator[StreamChunk]:
        seen.append(f"shout {request.model}")
        async for chunk in nxt(request):
            yield TextDelta(chunk.index, chunk.text.upper()) if isinstance(chunk, TextDelta) else chunk

    stack = MiddlewareProvider(default, [shout], providers=[other])
    remove = stack.use(reroute("other", "o2"))  # innermost: shout sees the original request
    request = ModelRequest(session_id="s", provider="main", model="m1", messages=(freeze({"role": "user", "content": []}),))
    stream = stack.stream(request)
    assert stream.dispatched is None and seen == []  # lazy: nothing ran yet
    texts = [c.text async for c in stream if isinstance(c, TextDelta)]
    assert "".join(texts) == "FROM OTHER" and seen == ["shout m1"]
    assert stream.dispatched is not None and (stream.dispatched.provider, stream.dispatched.model) == ("other", "o2")
    assert [r.model for r in other.requests] == ["o2"] and default.requests == []
    remove()
    assert "".join([c.text async for c in stack.stream(request) if isinstance(c, TextDelta)]) == "FROM DEFAULT"
    assert (stack.name, stack.model) == ("main", "m1")


async def test_summarize_records_the_rerouted_pair() -> None:
    other = ScriptedProvider([[Say("- the summary")]], name="cheap", model="cheap-1")
    stack = MiddlewareProvider(ScriptedProvider([]), [reroute("cheap", "cheap-1")], providers=[other])
    out = await summarize(stack, input_of("x"), session_id="s", max_tokens=10, provider_name="sp", model="sm")
    assert (out.provider, out.model) == ("cheap", "cheap-1")
    assert [(r.provider, r.model, r.purpose) for r in other.requests] == [("cheap", "cheap-1", "compaction")]


async def test_a_compaction_summary_event_records_the_rerouted_pair() -> None:
    async with agent_on([[Say(LONG)], [Say(LONG)]], window=100_000) as (agent, _, _summaries):
        await two_turns(agent)
        rerouted = ScriptedProvider([[Say("- the user asked; the model answered")]], name="cheap", model="cheap-1")
        stack = MiddlewareProvider(agent.provider, [reroute("cheap", "cheap-1")], providers=[rerouted])
        compaction = AgentCompaction(load_basic_compaction_config({}), summary_provider=stack)
        assert await compaction.compact_now(agent) is not None
        (summary,) = [thaw(e.data) for e in agent.session.events if e.type == "compaction/summary"]
        assert (summary["provider"], summary["model"]) == ("cheap", "cheap-1")


def test_summarize_through_a_middleware_under_a_cancellation_at_every_step() -> None:
    # harness.faults: the caller cancelled at every scheduler step; the summary either
    # returns (recording the rerouted pair) or Cancelled propagates, and the provider's
    # stream is always closed.
    async def scenario(probe: Probe) -> None:
        inner = Recording([[Say("- first part"), Say(" - second part")]])
        stack = MiddlewareProvider(ScriptedProvider([]), [reroute("rec", "rec-2")], providers=[inner])  # type: ignore[list-item]
        with trio.CancelScope() as caller:
            probe.canceller("caller", caller.cancel)
            probe.arm()
            out = await summarize(stack, input_of("x"), session_id="s", max_tokens=10)
            probe.check(out.model == "rec-2", "the rerouted model was not recorded")
        probe.disarm()
        probe.check(inner.closed or inner.chunks == 0, "the provider's stream was not closed")

    report = explore(scenario, name="summarize-middleware")
    assert report.ok, report.distinct()
    assert report.steps["caller"] >= 5
