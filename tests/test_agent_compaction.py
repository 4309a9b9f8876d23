"""Compaction policies in the agent loop (reference §6, §7): pressure at pre-step,
context-overflow recovery at request-error, manual compaction and ``/compact``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from harness.agent import (
    Agent,
    AgentCancelledError,
    AgentCompaction,
    Call,
    Commands,
    ContextWindowExceededError,
    Delay,
    Fail,
    ModelCatalog,
    ModelInfo,
    Say,
    ScriptedProvider,
    ToolSet,
    UnknownCommandError,
    install_compact_command,
    routed_target,
    tool,
)
from harness.compaction import PREAMBLE, load_basic_compaction_config
from harness.errors import CompactionBusyError, CompactionCancelledError, ManualCompactionError
from harness.runtime import SessionHandle, open_store
from harness.session import RelationalInvariants, thaw

LONG = "lorem ipsum dolor sit amet " * 40  # 1,080 characters: 278 tokens as a message
BUSY_TEXT = "Compaction is unavailable because this process has an active compaction, or the agent is not idle."


def replies(n: int, text: str = LONG) -> list[list[Any]]:
    return [[Say(text)] for _ in range(n)]


def log_of(s: SessionHandle) -> list[tuple[int, str, Any]]:
    return [(e.seq, e.type, thaw(e.data)) for e in s.events]


def of_type(s: SessionHandle, *types: str) -> list[tuple[int, str, Any]]:
    return [x for x in log_of(s) if x[1] in types]


def first_seq(s: SessionHandle, type_: str, **match: Any) -> int:
    for seq, t, data in log_of(s):
        if t == type_ and all(data.get(k) == v for k, v in match.items()):
            return seq
    raise AssertionError(f"no {type_} {match}")


@asynccontextmanager
async def agent_on(
    script: Sequence[Sequence[Any]],
    *,
    config: dict[str, Any] | None = None,
    window: int | None = 2000,
    summaries: int = 4,
    summary_delay: float = 0.0,
    validator: bool = True,
    tools: ToolSet | None = None,
    system: str | None = None,
) -> AsyncIterator[tuple[Agent, AgentCompaction, ScriptedProvider]]:
    """An agent with compaction installed and its own summary provider, in a nursery."""
    factory = RelationalInvariants if validator else None
    async with open_store(validator_factory=factory) as store, trio.open_nursery() as nursery:
        s = await store.create()
        provider = ScriptedProvider(script, context_window=window, delta_size=4096)
        summary_reply: list[Any] = [Delay(summary_delay)] if summary_delay else []
        summarizer = ScriptedProvider([[*summary_reply, Say("- the user asked; the model answered")]] * summaries)
        compaction = AgentCompaction(load_basic_compaction_config(config or {}), summary_provider=summarizer)
        agent = Agent(s, provider, tools, nursery=nursery, system=system)
        compaction.install(agent)
        yield agent, compaction, summarizer
        nursery.cancel_scope.cancel()


# -- pressure (§6.1) ----------------------------------------------------------------------


async def test_pressure_compacts_the_head_before_the_step_and_keeps_the_prompt() -> None:
    # Window 2000: threshold 1600, retain 320. Three turns are 1,668 tokens.
    async with agent_on(replies(4)) as (agent, _, summarizer):
        s = agent.session
        for i in range(3):
            assert (await agent.run_turn(f"q{i} {LONG}")).kind == "completed"
        assert not of_type(s, "compaction/start")
        before = [seq for seq in s.surface()]
        assert (await agent.run_turn(f"q3 {LONG}")).kind == "completed"
        start = first_seq(s, "compaction/start")
        # Inside turn 4, after its claim, before its step/start: the bracket is owned by the turn.
        claim = max(seq for seq, t, _ in log_of(s) if t == "agent/inbox/spliced" and seq < start)
        assert first_seq(s, "turn/start", turn=4) < claim < start
        end = first_seq(s, "compaction/end")
        assert end < first_seq(s, "step/start", turn=4)
        data = {t: d for _, t, d in log_of(s) if t.startswith("compaction/")}
        assert data["compaction/start"]["turn"] == 4 and "sourceCommandId" not in data["compaction/start"]
        assert data["compaction/end"] == {"compactionId": data["compaction/start"]["compactionId"], "turn": 4}
        # Head-anchored, the newest unit retained: turns 1 and 2 are shadowed, turn 3 is not.
        assert data["compaction/summary"]["shadowedSeqs"] == before[:4]
        messages = await s.derive_messages()
        assert messages[0]["content"][0]["text"].startswith(PREAMBLE)  # type: ignore[index]
        # The prompt of turn 4 was claimed before the bracket and reached the surface after it.
        assert [m["content"][0]["text"][:2] for m in messages[1:]] == ["q2", "lo", "q3", "lo"]  # type: ignore[index]
        assert summarizer.requests[0].purpose == "compaction"


async def test_pressure_needs_a_routed_target_and_the_threshold() -> None:
    async with agent_on(replies(2)) as (agent, _, summarizer):
        await agent.run_turn(LONG)  # no request/header before the first step: no target
        await agent.run_turn(LONG)  # a target, 556 tokens < 1,600
        assert not of_type(agent.session, "compaction/start", "compaction/prune")
        assert summarizer.requests == []


async def test_no_context_window_is_warned_once_per_target(caplog: pytest.LogCaptureFixture) -> None:
    async with agent_on(replies(3), window=None) as (agent, _, _summaries):
        with caplog.at_level(logging.WARNING, logger="harness.compaction"):
            for _ in range(3):
                assert (await agent.run_turn("hi")).kind == "completed"
        warned = [r.getMessage() for r in caplog.records if r.name == "harness.compaction"]
        assert warned == [
            "compaction-basic: no context capacity for scripted/script-1; configure contextWindow on that adapter model"
        ]


async def test_a_live_lock_is_warned_at_every_step_even_below_threshold(caplog: pytest.LogCaptureFixture) -> None:
    # Without the invariant companion, an orphan standalone start can precede turns.
    async with agent_on(replies(3), validator=False) as (agent, _, _summaries):
        await agent.run_turn("hi")
        await agent.session.append("compaction/start", {"compactionId": "orphan", "turn": None})
        with caplog.at_level(logging.WARNING, logger="harness.compaction"):
            await agent.run_turn("hi")
            await agent.run_turn("hi")
        warned = [r.getMessage() for r in caplog.records if r.name == "harness.compaction"]
        assert warned == [
            "step compaction failed: automatic pressure compaction: compaction already in progress; "
            "the session compaction lock is already active; continuing the turn"
        ] * 2


async def test_pressure_that_cannot_get_below_threshold_raises_and_keeps_what_landed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The system prompt alone is over the threshold: no compaction can help.
    config = {"compactionRetries": 0}
    async with agent_on(replies(3), config=config, window=2500, system="x" * 8000) as (agent, _, _summaries):
        with caplog.at_level(logging.WARNING, logger="harness.compaction"):
            for _ in range(3):
                assert (await agent.run_turn(LONG)).kind == "completed"
        warned = [r.getMessage() for r in caplog.records if r.name == "harness.compaction"]
        assert any(
            m.startswith("step compaction failed: compaction still above threshold after 1 compaction attempts (")
            and m.endswith("estimated tokens >= threshold 2000); continuing the turn")
            for m in warned
        ), warned
        assert len(of_type(agent.session, "compaction/summary")) == 1  # the checkpoint that landed stays


@tool("big", "A huge output")
async def big(args: dict[str, Any]) -> Any:
    return "y" * 20_000


async def test_pressure_prunes_first_and_stops_when_pruning_was_enough() -> None:
    script = [[Call("big", {})], [Say("ok")], [Say("ok")]]
    async with agent_on(script, window=6000, tools=ToolSet([big])) as (agent, _, summarizer):
        await agent.run_turn("read it")
        await agent.run_turn("and now?")
        s = agent.session
        prunes = of_type(s, "compaction/prune")
        assert len(prunes) == 1 and not of_type(s, "compaction/start")
        replaced = [x for x in log_of(s) if x[1] == "tool/result" and x[0] == prunes[0][0] + 1]
        assert len(replaced) == 1 and prunes[0][0] < first_seq(s, "step/start", turn=2)
        assert summarizer.requests == []


# -- context-overflow recovery (§6.2, §6.3) -------------------------------------------------


def overflow() -> Fail:
    # A fresh error per use: a raised exception keeps its traceback (and the frames,
    # and the session they reference) alive for as long as the exception lives.
    return Fail(ContextWindowExceededError("prompt is too long"))


async def test_overflow_compacts_and_retries_in_the_same_step() -> None:
    script = [*replies(2), [overflow()], [Say("fits now")]]
    async with agent_on(script, window=100_000) as (agent, _, _summaries):
        await agent.run_turn(LONG)
        await agent.run_turn(LONG)
        result = await agent.run_turn("q3")
        assert result.kind == "completed"
        s = agent.session
        assert [d["step"] for _, _, d in of_type(s, "step/start") if d["turn"] == 3] == [1]
        start = first_seq(s, "compaction/start")
        assert first_seq(s, "step/start", turn=3) < start < first_seq(s, "assistant/message", turn=3)
        assert thaw(s.events[start].data)["turn"] == 3
        request = agent.provider.requests[-1]  # type: ignore[attr-defined]
        assert request.messages[0]["content"][0]["text"].startswith(PREAMBLE)
        assert request.messages[-1]["content"][0]["text"] == "q3"  # the newest node is kept


async def test_overflow_retries_are_capped_per_agent_and_reset_when_idle() -> None:
    script = [*replies(2), [overflow()], [overflow()], [overflow()], [Say("ok")]]
    async with agent_on(script, window=100_000) as (agent, compaction, _summaries):
        await agent.run_turn(LONG)
        await agent.run_turn(LONG)
        failed = await agent.run_turn("q3")
        assert failed.kind == "error" and failed.reason["error"]["code"] == "CONTEXT_WINDOW_EXCEEDED"
        assert len(of_type(agent.session, "compaction/end")) == 1  # one recovery, then the cap
        assert compaction.overflow_retries(agent) == 0  # reset: the agent went idle
        assert (await agent.run_turn("q4")).kind == "completed"
        assert len(of_type(agent.session, "compaction/end")) == 2


async def test_overflow_without_progress_is_not_retried() -> None:
    async with agent_on([[overflow()]], window=100_000) as (agent, _, _summaries):
        result = await agent.run_turn("only me")  # nothing compactable: the newest node is kept
        assert result.kind == "error"
        assert not of_type(agent.session, "compaction/start")


@pytest.mark.parametrize("config", [{"maxOverflowRetries": 0}, {"auto": False}])
async def test_overflow_recovery_can_be_disabled(config: dict[str, Any]) -> None:
    async with agent_on([*replies(2), [overflow()]], config=config, window=100_000) as (agent, _, _summaries):
        await agent.run_turn(LONG)
        await agent.run_turn(LONG)
        assert (await agent.run_turn("q3")).kind == "error"
        assert not of_type(agent.session, "compaction/start")


# -- manual compaction (§7.1) ----------------------------------------------------------------


async def test_compact_now_runs_standalone_and_keeps_the_newest_unit() -> None:
    async with agent_on(replies(2), window=100_000) as (agent, compaction, _summaries):
        s = agent.session
        assert await compaction.compact_now(agent) is None  # nothing yet: nothing written
        assert not of_type(s, "compaction/start")
        await agent.run_turn(LONG)
        await agent.run_turn(LONG)
        surface = list(s.surface())
        result = await compaction.compact_now(agent)
        assert result is not None and list(result.shadowed_seqs) == surface[:3]
        start = thaw(s.events[result.start_seq].data)
        assert start["turn"] is None and "sourceCommandId" not in start
        assert list(s.surface())[1:] == surface[3:]
        assert agent.phase == "idle"


async def test_compact_now_is_busy_while_a_turn_runs(autojump_clock: trio.testing.MockClock) -> None:
    async with agent_on([[Delay(5), Say("slow")]], window=100_000) as (agent, compaction, _summaries):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run_turn, "hi")
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(CompactionBusyError) as info:
                await compaction.compact_now(agent)
            assert str(info.value) == "manual compaction requires an idle agent with no waking queued work"
        assert not of_type(agent.session, "compaction/start")


async def test_agent_cancel_during_compact_now_is_the_cancelled_kind(autojump_clock: trio.testing.MockClock) -> None:
    async with agent_on(replies(2), window=100_000, summary_delay=10) as (agent, compaction, _summaries):
        await agent.run_turn(LONG)
        await agent.run_turn(LONG)
        async with trio.open_nursery() as nursery:

            async def cancel_soon() -> None:
                await trio.sleep(1)
                agent.cancel("parent")

            nursery.start_soon(cancel_soon)
            with pytest.raises(CompactionCancelledError) as info:
                await compaction.compact_now(agent)
        assert info.value.kind == "cancelled" and str(info.value) == "manual compaction was cancelled"
        cause = info.value.__cause__
        assert isinstance(cause, AgentCancelledError) and cause.cause == {"kind": "parent"}
        ends = of_type(agent.session, "compaction/end")
        assert len(ends) == 1 and "error" in ends[0][2]  # closed before the error surfaced


async def test_caller_cancel_during_compact_now_propagates_after_the_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with agent_on(replies(2), window=100_000, summary_delay=10) as (agent, compaction, _summaries):
        await agent.run_turn(LONG)
        await agent.run_turn(LONG)
        with trio.move_on_after(1) as scope:
            await compaction.compact_now(agent)
        assert scope.cancelled_caught
        ends = of_type(agent.session, "compaction/end")
        assert len(ends) == 1 and "error" in ends[0][2]
        assert agent.phase == "idle"


async def test_follow_ups_wait_for_manual_compaction_and_see_the_checkpoint(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with agent_on(replies(3), window=100_000, summary_delay=10) as (agent, compaction, _summaries):
        await agent.run_turn(LONG)
        await agent.run_turn(LONG)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(compaction.compact_now, agent)
            await trio.sleep(1)
            nursery.start_soon(agent.send, "after the compaction")  # waits for the maintenance to end
            await trio.sleep(1)
            await agent.send("inject me", delivery="inject")
            await trio.sleep(1)
            assert agent.phase == "maintenance" and not of_type(agent.session, "turn/start")[2:]
        await agent.wait_idle()
        s = agent.session
        end = first_seq(s, "compaction/end")
        assert first_seq(s, "turn/start", turn=3) > end
        # The injected message was only recorded during the bracket, not put on the surface.
        spliced = [seq for seq, t, _ in log_of(s) if t == "agent/inbox/spliced"]
        assert any(first_seq(s, "compaction/start") < seq < end for seq in spliced)
        inside = [x for x in of_type(s, "user/message") if first_seq(s, "compaction/start") < x[0] < end]
        assert [x[2]["source"]["kind"] for x in inside] == ["plugin"]  # only the checkpoint
        # The follow-up's record is written after the bracket, not inside it (§7.1).
        start = first_seq(s, "compaction/start")
        assert [d["target"] for seq, t, d in log_of(s) if t == "agent/inbox/spliced" and start < seq < end] == [
            "next-step"
        ]
        (follow_up,) = [
            seq
            for seq, t, d in log_of(s)
            if t == "agent/inbox/spliced" and [m["content"][0]["text"] for m in d["inserted"]] == ["after the compaction"]
        ]
        assert follow_up > end
        request = agent.provider.requests[-1]  # type: ignore[attr-defined]
        texts = [m["content"][0]["text"] for m in request.messages]
        assert texts[0].startswith(PREAMBLE) and texts[-2:] == ["after the compaction", "inject me"]


# -- /compact (§7.2) ----------------------------------------------------------------------------


async def test_compact_command_records_run_bracket_and_done_in_order() -> None:
    async with agent_on(replies(2), window=100_000) as (agent, compaction, _summaries):
        commands = Commands()
        install_compact_command(commands, compaction)
        assert [c.name for c in commands.list()] == ["compact"]
        assert commands.list()[0].description == "Compact older conversation history"
        await agent.run_turn(LONG)
        await agent.run_turn(LONG)
        mark = agent.session.events[-1].seq
        result = await commands.run(agent, "/compact", command_id="cmd-1")
        assert result.kind == "success" and result.text == "Compacted 3 history items (~834 tokens)."
        tail = [(t, d) for seq, t, d in log_of(agent.session) if seq > mark]
        assert [t for t, _ in tail] == [
            "command/run",
            "compaction/start",
            "compaction/summary",
            "user/message",
            "compaction/end",
            "command/done",
        ]
        assert tail[0][1] == {"commandId": "cmd-1", "name": "compact", "source": {"kind": "user"}}
        assert all(d["sourceCommandId"] == "cmd-1" for t, d in tail[1:5] if t.startswith("compaction/"))
        assert tail[3][1]["source"]["sourceCommandId"] == "cmd-1"
        summary_seq = mark + 3
        assert tail[5][1] == {
            "commandId": "cmd-1",
            "kind": "success",
            "text": "Compacted 3 history items (~834 tokens).",
            "sourceEventSeq": summary_seq,
        }


async def test_compact_command_texts(autojump_clock: trio.testing.MockClock) -> None:
    async with agent_on([[Delay(5), Say("slow")]], window=100_000) as (agent, compaction, _summaries):
        commands = Commands()
        install_compact_command(commands, compaction)
        usage = await commands.run(agent, "/compact now please")
        assert (usage.kind, usage.text) == ("error", "Usage: /compact (no arguments)")
        assert of_type(agent.session, "command/run")[0][2]["args"] == " now please"
        empty = await commands.run(agent, "/compact")
        assert (empty.kind, empty.text) == ("success", "No compactable history yet.")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run_turn, "hi")
            await trio.testing.wait_all_tasks_blocked()
            busy = await commands.run(agent, "/compact")
            assert (busy.kind, busy.text) == ("error", BUSY_TEXT)
        with pytest.raises(UnknownCommandError):
            await commands.run(agent, "/nope")
        assert len(of_type(agent.session, "command/run")) == len(of_type(agent.session, "command/done")) == 3


async def test_compact_command_cancelled_by_its_caller(autojump_clock: trio.testing.MockClock) -> None:
    async with agent_on(replies(2), window=100_000, summary_delay=10) as (agent, compaction, _summaries):
        commands = Commands()
        install_compact_command(commands, compaction)
        await agent.run_turn(LONG)
        await agent.run_turn(LONG)
        with trio.move_on_after(1):
            await commands.run(agent, "/compact")
        done = of_type(agent.session, "command/done")
        assert [d for _, _, d in done] == [
            {"commandId": of_type(agent.session, "command/run")[0][2]["commandId"], "kind": "error", "text": "Compaction cancelled."}
        ]
        assert first_seq(agent.session, "compaction/end") < done[0][0]


async def test_commands_close_waits_for_running_handlers(autojump_clock: trio.testing.MockClock) -> None:
    async with agent_on(replies(2), window=100_000, summary_delay=10) as (agent, compaction, _summaries):
        commands = Commands()
        install_compact_command(commands, compaction)
        await agent.run_turn(LONG)
        await agent.run_turn(LONG)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(commands.run, agent, "/compact")
            await trio.sleep(1)
            await commands.aclose()
            assert commands.list() == ()
            assert of_type(agent.session, "command/done")  # the running one finished first


# -- small parts ---------------------------------------------------------------------------------


def test_routed_target() -> None:
    assert routed_target(None) is None
    assert routed_target({"config": {"provider": "p", "model": "m"}}) == ("p", "m")
    assert routed_target({"config": {"provider": "", "model": "m"}}) is None
    assert routed_target({"system": "s"}) is None


async def test_model_catalog() -> None:
    provider = ScriptedProvider([], name="p", model="m", context_window=1000)
    catalog = ModelCatalog({("p", "big"): 5000}, providers=[provider])
    assert await catalog.resolve_model_info("p", "big") == ModelInfo("p", "big", 5000)
    assert await catalog.resolve_model_info("p", "unlisted") == ModelInfo("p", "unlisted", 1000)
    assert await catalog.resolve_model_info("q", "m") == ModelInfo("q", "m", None)
    with pytest.raises(ValueError, match="must be a positive integer"):
        ModelCatalog({("p", "m"): 0})


async def test_compact_command_cancelled_during_the_flush_is_still_answered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by `harness chaos compact-command`: with several flush listeners the flush
    # ran them in a nursery, and a cancellation came out as a group of Cancelled, which
    # skipped the command's `except trio.Cancelled` and left command/run unanswered.
    async with agent_on(replies(2), window=100_000) as (agent, compaction, _summaries):
        store = agent.session._store
        flushing = trio.Event()

        async def slow_flush(handle: SessionHandle) -> None:
            flushing.set()
            await trio.sleep(10)

        store.on_flush(slow_flush)
        store.on_flush(slow_flush)
        commands = Commands()
        install_compact_command(commands, compaction)
        await agent.run_turn(LONG)
        await agent.run_turn(LONG)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_in_flush() -> None:
                    await flushing.wait()
                    scope.cancel()

                nursery.start_soon(cancel_in_flush)
                await commands.run(agent, "/compact")
        assert scope.cancelled_caught
        done = of_type(agent.session, "command/done")
        assert [d["text"] for _, _, d in done] == ["Compaction cancelled."]
        assert [d.get("error") is None for _, _, d in of_type(agent.session, "compaction/end")] == [True]


# -- found by review against the reference (each failed before its fix) --------------------------


async def two_turns(agent: Agent) -> None:
    await agent.run_turn(LONG)
    await agent.run_turn(LONG)


@pytest.mark.parametrize("who", ["agent", "caller"])
async def test_a_cancel_during_the_manual_flush_waits_for_the_flush(
    who: str, autojump_clock: trio.testing.MockClock
) -> None:
    # §5.4: "closed and flushed first"; a caller's abort is thrown "after close and flush".
    async with agent_on(replies(2), window=100_000) as (agent, compaction, _summaries):
        await two_turns(agent)
        store = agent.session._store
        flushing, flushed = trio.Event(), trio.Event()

        async def slow_flush(handle: SessionHandle) -> None:
            flushing.set()
            await trio.sleep(5)
            flushed.set()

        store.on_flush(slow_flush)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_in_flush() -> None:
                    await flushing.wait()
                    agent.cancel("user") if who == "agent" else scope.cancel()

                nursery.start_soon(cancel_in_flush)
                if who == "agent":
                    with pytest.raises(CompactionCancelledError):
                        await compaction.compact_now(agent)
                else:
                    await compaction.compact_now(agent)
        assert flushed.is_set()
        assert scope.cancelled_caught == (who == "caller")


async def test_a_vetoed_commit_with_a_closed_bracket_is_still_flushed() -> None:
    # §1.2 step 9: flush "if the bracket closed"; §5.4 commit: "no flush if unclosed".
    async with agent_on(replies(2), window=100_000) as (agent, compaction, _summaries):
        await two_turns(agent)
        store = agent.session._store
        flushed: list[int] = []

        async def flush(handle: SessionHandle) -> None:
            flushed.append(handle.seq)

        def veto(handle: SessionHandle, events: Sequence[Any]) -> None:
            if any(e.type == "compaction/summary" for e in events):
                raise RuntimeError("veto the commit batch")

        store.on_flush(flush)
        store.add_pre_commit_hook(veto)
        with pytest.raises(ManualCompactionError) as info:
            await compaction.compact_now(agent)
        assert info.value.kind == "commit"
        ends = of_type(agent.session, "compaction/end")
        assert [d["error"] for _, _, d in ends] == ["veto the commit batch"]
        assert flushed == [agent.session.seq]


async def test_any_flush_failure_is_the_persistence_kind() -> None:
    async with agent_on(replies(2), window=100_000) as (agent, compaction, _summaries):
        await two_turns(agent)

        async def failing(handle: SessionHandle) -> None:
            raise OSError("disk full")

        agent.session._store.on_flush(failing)
        commands = Commands()
        install_compact_command(commands, compaction)
        result = await commands.run(agent, "/compact")
        assert (result.kind, result.text) == ("error", "Compaction finished, but the session could not be saved.")
        assert [d.get("error") for _, _, d in of_type(agent.session, "compaction/end")] == [None]


class CancelInside(AgentCompaction):
    """A summarizer override that cancels its agent just before it returns."""

    async def summarize(self, agent: Agent, input: Any, target: Any) -> Any:
        output = await super().summarize(agent, input, target)
        agent.cancel("user")
        return output


async def test_a_manual_run_cancelled_after_its_summary_does_not_commit() -> None:
    # §1.2 step 7.3: manual runs re-check the signal after the summary.
    async with agent_on(replies(2), window=100_000) as (agent, _, summarizer):
        compaction = CancelInside(load_basic_compaction_config({}), summary_provider=summarizer)
        await two_turns(agent)
        surface = list(agent.session.surface())
        with pytest.raises(CompactionCancelledError):
            await compaction.compact_now(agent)
        assert list(agent.session.surface()) == surface
        assert not of_type(agent.session, "compaction/summary")
        assert "error" in of_type(agent.session, "compaction/end")[0][2]


async def test_pending_work_rebuilt_from_the_log_waits_for_a_waking_send() -> None:
    async with agent_on(replies(3), window=100_000) as (agent, compaction, _summaries):
        await two_turns(agent)
        holder = Agent(agent.session, agent.provider)  # no nursery: the send only queues
        await holder.send("pending follow-up")
        resumed = Agent(agent.session, agent.provider, nursery=agent._nursery)
        compaction.install(resumed)
        assert await compaction.compact_now(resumed) is not None
        await resumed.wait_idle()
        assert len(of_type(agent.session, "turn/start")) == 2  # not started by maintenance's end
        assert [m["content"][0]["text"] for m in resumed.inbox["next-turn"]] == ["pending follow-up"]  # type: ignore[index]


class CountingCatalog(ModelCatalog):
    def __init__(self) -> None:
        super().__init__({("scripted", "scripted-1"): 2000})
        self.lookups: list[tuple[str, str]] = []

    async def resolve_model_info(self, provider: str, model: str) -> ModelInfo:
        # A remote catalog would send its request here, before any checkpoint.
        self.lookups.append((provider, model))
        return await super().resolve_model_info(provider, model)


async def test_a_step_already_cancelled_does_not_look_up_model_info() -> None:
    # Reference §6.3: "If the signal is already aborted, go straight to next()".
    async with agent_on(replies(3)) as (agent, _, summarizer):
        catalog = CountingCatalog()
        compaction = AgentCompaction(load_basic_compaction_config({}), models=catalog, summary_provider=summarizer)
        for remove in list(agent.hooks.pre_step):
            agent.hooks.pre_step.remove(remove)
        compaction.install(agent)
        await agent.run_turn("hi")
        await agent.run_turn("hi")  # routed now: the second step looks the model up
        assert catalog.lookups
        catalog.lookups.clear()

        async def cancel_first(context: Any) -> None:
            context.agent.cancel("user")

        agent.hooks.pre_step.insert(0, cancel_first)
        result = await agent.run_turn("hi")
        assert result.kind == "aborted"
        assert catalog.lookups == []


def test_a_send_waiting_for_maintenance_under_a_cancellation_at_every_step() -> None:
    # harness.faults: a follow-up sent during maintenance, its caller cancelled at every
    # scheduler step. Either it is recorded after the maintenance ended and queued, or
    # it was cancelled and nothing of it is anywhere (the log and the inbox agree).
    from harness.faults import Probe, explore

    async def scenario(probe: Probe) -> None:
        async with open_store() as store, trio.open_nursery() as nursery:
            s = await store.create()
            agent = Agent(s, ScriptedProvider([[Say("r")]]), nursery=None)
            release = trio.Event()
            ended: list[int] = []

            async def task() -> None:
                await release.wait()
                ended.append(s.seq)

            nursery.start_soon(agent.run_maintenance, task)
            await trio.testing.wait_all_tasks_blocked()
            sent: list[str] = []
            with trio.CancelScope() as caller:
                probe.canceller("caller", caller.cancel)
                probe.arm()

                async def send() -> None:
                    sent.append(await agent.send("later"))

                try:
                    async with trio.open_nursery() as inner:
                        inner.start_soon(send)
                        await trio.testing.wait_all_tasks_blocked()
                        release.set()
                finally:
                    release.set()
            probe.disarm()
            await agent.wait_idle()
            records = [e for e in s.events if e.type == "agent/inbox/spliced"]
            probe.check(all(e.seq >= ended[0] for e in records) if ended else not records, "a record inside maintenance")
            probe.check(len(records) == len(sent), "the log and the send's outcome disagree")
            probe.check(len(agent.inbox["next-turn"]) == len(sent), "the inbox and the send's outcome disagree")

    report = explore(scenario, name="deferred-send")
    assert report.ok, report.distinct()
    assert report.steps["caller"] >= 3
