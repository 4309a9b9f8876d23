"""The agent compaction family: ``agent-compaction`` (pressure, overflow, recovery in
the same step) and ``compact-command`` (``/compact`` with a follow-up during the summary)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, Final

import trio

from harness.agent import (
    AgentCompaction,
    ContextWindowExceededError,
    Delay,
    Fail,
    Say,
    ScriptedProvider,
    TurnResult,
)
from harness.compaction import load_basic_compaction_config
from harness.faults._backends import track_session
from harness.faults._explore import Probe
from harness.faults._invariants import open_compaction
from harness.faults._scenarios._frame import (
    TOOLS,
    AgentRun,
    agent_run,
    flush_and_acknowledge,
    guarded,
    leaves,
    message,
)
from harness.persistence._files import SimulatedCrash
from harness.runtime import SessionHandle
from harness.session import EventDraft, Session, thaw

#: Pressure at half the window, keep a tenth of it: with the window below, two turns of
#: :data:`HISTORY_TEXT` reach the threshold (one does not), and one summary of the
#: oldest turn brings the surface back under it.
AGENT_COMPACTION_CONFIG: Final = {"thresholdRatio": 0.5, "retainRatio": 0.1}


AGENT_COMPACTION_WINDOW: Final = 700


HISTORY_TEXT: Final = "history that the next request cannot carry whole, so it is summarized first; " * 8


FOLLOW_UP_TEXT: Final = "and now the follow-up"


#: When the follow-up is sent (attempt clock), and how long each ``/compact`` summary
#: takes: the send lands while the summary runs.
FOLLOW_UP_AT: Final = 0.5


SUMMARY_DELAY: Final = 1.0


COMPACTED_TEXT: Final = re.compile(r"Compacted \d+ history items \(~\d+ tokens\)\.")


def agent_compaction_policy(*, summaries: int, delay: float = 0.0) -> AgentCompaction:
    """The policy of the agent compaction scenarios: the config above and a summary
    provider of its own (``summaries`` replies, each after ``delay`` seconds on the
    attempt's clock), so that the agent's script does not depend on how many summaries
    ran."""
    reply: list[Any] = [Delay(delay)] if delay else []
    reply.append(Say("- the earlier turns, summarized"))
    summary = ScriptedProvider([reply] * summaries, name="summary", model="summary-1")
    return AgentCompaction(load_basic_compaction_config(AGENT_COMPACTION_CONFIG), summary_provider=summary)


def history_drafts(turns: int) -> list[EventDraft]:
    """``turns`` completed turns of :data:`HISTORY_TEXT`, each answered ``noted``, as the
    rig's agent logs them (request header and context before the first reply, the
    scripted provider's usage on every reply): history without running the turns,
    which would cost every attempt two agent turns with their checkpoints."""
    provider, model = "scripted", "script-1"
    header = {
        "config": {"provider": provider, "model": model},
        "tools": [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in TOOLS.specs],
    }
    drafts: list[EventDraft] = []
    for t in range(1, turns + 1):
        drafts += [
            EventDraft("turn/start", {"turn": t}),
            EventDraft("step/start", {"turn": t, "step": 1}),
            EventDraft("user/message", message("user", f"history-u{t}", HISTORY_TEXT), "append"),
        ]
        if t == 1:
            drafts += [
                EventDraft("request/header", {"header": header, "reason": "initial"}),
                EventDraft("request/context", {"provider": provider, "model": model, "contextWindow": AGENT_COMPACTION_WINDOW}),
            ]
        reply = message("assistant", f"history-a{t}", "noted", provider=provider, model=model)
        # The scripted provider reports 10 input tokens per request message, plus 20.
        usage = {"inputTokens": 10 * (2 * t - 1) + 20, "outputTokens": 1}
        drafts += [
            EventDraft("assistant/message", {"turn": t, "step": 1, "message": reply, "usage": usage}, "append"),
            EventDraft("step/end", {"turn": t, "step": 1}),
            EventDraft("turn/end", {"turn": t, "reason": {"kind": "completed"}}),
        ]
    return drafts


def seed_history(probe: Probe, turns: int) -> Callable[[AgentRun], Awaitable[None]]:
    """An :func:`agent_run` setup (unarmed): agent ``"ac"`` is created with
    :func:`history_drafts` appended by ``create``'s ``setup`` (before it is published,
    so the agent numbers its next turn after them), then flushed."""

    async def fill(session: Session) -> None:
        session.append_batch(history_drafts(turns))

    async def setup(run: AgentRun) -> None:
        h = await run.rig.loop.create("ac", owner=run.owner, cwd="/chaos", setup=fill)
        run.handles.append(h)
        track_session(probe, h.session)
        await flush_and_acknowledge(probe, h.session, "seed flush")

    return setup


def _data(event: Any) -> dict[str, Any]:
    data = thaw(event.data)
    return data if type(data) is dict else {}


@contextmanager
def then_check(check: Callable[[], None]) -> Iterator[None]:
    """Run ``check`` once the block has exited, normally, with an error or cancelled,
    but not when the world stopped in it (a simulated crash: nothing runs after one)."""
    try:
        yield
    except BaseException as exc:
        if not any(isinstance(leaf, SimulatedCrash) for leaf in leaves(exc)):
            check()
        raise
    check()


def check_brackets(probe: Probe, handle: SessionHandle, after: str) -> None:
    """In a live session: no compaction bracket left open, and no bracket ended twice."""
    if not handle.alive:
        return
    events = list(handle.events)
    left = open_compaction(events)
    probe.check(left is None, f'live "{handle.id}": compaction {left} is left open after {after}')
    ends: dict[str, int] = {}
    for e in events:
        if e.type == "compaction/end":
            cid = str(_data(e).get("compactionId"))
            ends[cid] = ends.get(cid, 0) + 1
    for cid, n in ends.items():
        probe.check(n <= 1, f'live "{handle.id}": compaction {cid} has {n} compaction/end records')


def _text(message: object) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")


async def agent_compaction(probe: Probe, kind: str) -> None:
    """An agent with compaction configured and two turns of history runs a turn: its
    pre-step compacts under pressure, its first request overflows the context window
    and the recovery compacts again and retries in the same step."""
    overflow = Fail(ContextWindowExceededError("the request does not fit the context window"))
    script = [[overflow], [Say("recovered")]]
    async with agent_run(
        probe,
        kind,
        agent_cancel=True,
        script=script,
        context_window=AGENT_COMPACTION_WINDOW,
        compaction=agent_compaction_policy(summaries=4),
        setup=seed_history(probe, 2),
    ) as run:
        h = run.handles[0]
        result: TurnResult | None = None
        with run.caller.scope():
            with then_check(partial(check_brackets, probe, h.session, "the turn returned")):
                result = await guarded(probe, "run_turn", partial(h.run_turn, "go on"))
            await flush_and_acknowledge(probe, h.session, "flush")
        if probe.faults is None and not probe.fired:
            _check_recovered(probe, h.session, result)


def _check_recovered(probe: Probe, s: SessionHandle, result: TurnResult | None) -> None:
    """A clean run: the turn completed in one step, with a successful pressure
    compaction before its step and a successful overflow compaction inside it (the
    retry ran in the same step)."""
    if result is None or result.kind != "completed":
        probe.fail(f"clean run: the compacting turn did not complete: {result}")
        return
    mine = [e for e in list(s.events) if _data(e).get("turn") == result.turn]
    steps = [e.seq for e in mine if e.type == "step/start"]
    probe.check(
        len(steps) == 1,
        f"clean run: turn {result.turn} has {len(steps)} step/start records (the overflow retry runs in the same step)",
    )
    done = [e.seq for e in mine if e.type == "compaction/end" and "error" not in _data(e)]
    probe.check(bool(done), f"clean run: turn {result.turn} has no successful compaction bracket")
    if steps and done:
        probe.check(
            done[0] < steps[0] < done[-1],
            f"clean run: turn {result.turn}: successful brackets end at {done}, its step starts at {steps[0]} "
            "(expected one from pressure before the step and one from overflow recovery in it)",
        )


async def compact_command(probe: Probe, kind: str) -> None:
    """An idle agent with history runs ``/compact`` while a follow-up is sent during
    the summary: the follow-up is recorded, and its turn runs, once the compaction has
    ended (reference: only ``compaction/start`` sits inside a manual bracket)."""
    script = [[Say("followed up")]]
    async with agent_run(
        probe,
        kind,
        agent_cancel=True,
        script=script,
        context_window=AGENT_COMPACTION_WINDOW,
        compaction=agent_compaction_policy(summaries=4, delay=SUMMARY_DELAY),
        setup=seed_history(probe, 2),
    ) as run:
        h = run.handles[0]
        commands = run.rig.loop.commands

        async def follow_up() -> None:
            await trio.sleep(FOLLOW_UP_AT)
            await guarded(probe, "send", partial(h.agent.send, FOLLOW_UP_TEXT, delivery="follow-up"))

        with run.caller.scope():
            with (
                then_check(partial(check_commands, probe, h.session)),
                then_check(partial(check_brackets, probe, h.session, "/compact returned")),
            ):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(guarded, probe, "/compact", partial(commands.run, h.agent, "/compact"))
                    nursery.start_soon(follow_up)
            await guarded(probe, "wait_idle", h.agent.wait_idle)
            await flush_and_acknowledge(probe, h.session, "flush")
        _check_follow_up(probe, h.session, clean=probe.faults is None and not probe.fired)


def check_commands(probe: Probe, s: SessionHandle) -> None:
    """In a live session: every ``command/run`` has exactly one ``command/done`` with
    its ``commandId``."""
    if not s.alive:
        return
    runs: dict[str, int] = {}
    dones: dict[str, int] = {}
    for e in list(s.events):
        if e.type in ("command/run", "command/done"):
            counts = runs if e.type == "command/run" else dones
            cid = str(_data(e).get("commandId"))
            counts[cid] = counts.get(cid, 0) + 1
    for cid in runs.keys() | dones.keys():
        n_run, n_done = runs.get(cid, 0), dones.get(cid, 0)
        probe.check(
            n_run == 1 and n_done == 1,
            f'live "{s.id}": command {cid}: {n_run} command/run and {n_done} command/done records',
        )


def _check_follow_up(probe: Probe, s: SessionHandle, *, clean: bool) -> None:
    """Nothing of the follow-up is written inside the ``/compact`` bracket: neither its
    inbox record nor its turn (reference: a send during a manual compaction waits for
    the bracket to close). A clean run also compacted successfully (the answer names
    what), recorded the follow-up after the bracket, and its turn completed."""
    events = list(s.events)
    commands = {str(_data(e).get("commandId")) for e in events if e.type == "command/run"}
    start: int | None = None
    end: int | None = None
    sent: int | None = None
    current: tuple[int, int] | None = None  # the latest turn/start: (turn, seq)
    turn: tuple[int, int] | None = None  # the turn that claimed the follow-up
    for e in events:
        d = _data(e)
        if e.type == "compaction/start" and d.get("sourceCommandId") in commands:
            start = e.seq
        elif e.type == "compaction/end" and d.get("sourceCommandId") in commands:
            end = e.seq
        elif e.type == "agent/inbox/spliced" and any(_text(m) == FOLLOW_UP_TEXT for m in d.get("inserted", [])):
            sent = e.seq
        elif e.type == "turn/start":
            current = (int(d.get("turn", 0)), e.seq)
        elif e.type == "user/message" and _text(d) == FOLLOW_UP_TEXT:
            turn = current
    if sent is not None and start is not None and sent > start:
        probe.check(
            end is not None and sent > end,
            f'live "{s.id}": the follow-up was recorded at seq {sent}, inside the /compact bracket (seqs {start}..{end})',
        )
    if turn is not None and start is not None and turn[1] > start:
        probe.check(
            end is not None and turn[1] > end,
            f'live "{s.id}": the follow-up\'s turn {turn[0]} starts at seq {turn[1]}, inside the /compact bracket (seqs {start}..{end})',
        )
    if not clean:
        return
    done = [_data(e) for e in events if e.type == "command/done"]
    probe.check(
        len(done) == 1 and done[0].get("kind") == "success" and COMPACTED_TEXT.fullmatch(str(done[0].get("text"))) is not None,
        f"clean run: /compact answered {done}",
    )
    probe.check(
        sent is not None and end is not None and sent > end,
        f"clean run: the follow-up (seq {sent}) was not recorded after the /compact bracket (seqs {start}..{end})",
    )
    reasons = [
        _data(e).get("reason") for e in events if e.type == "turn/end" and turn is not None and _data(e).get("turn") == turn[0]
    ]
    probe.check(
        turn is not None and reasons == [{"kind": "completed"}],
        f"clean run: the follow-up's turn {turn} did not complete: {reasons}",
    )
