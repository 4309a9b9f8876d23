"""The compaction act of ``harness demo``: pressure in the middle of a turn, an overflow
recovered by compaction in the same step, and ``/compact``.

A scripted agent with a small context window (2,000 tokens: the embedded defaults put
the pressure threshold at 80 %, 1,600, and keep 16 %, 320, when compacting) has a long
conversation. A tool result pushes the surface over the threshold in the middle of a
turn, so the ``agent/pre-step`` hook compacts it before the turn's next step. Then a
request fails with ``ContextWindowExceededError``, the ``agent/request-error`` hook
compacts, and the request is retried in the same step. Last, ``/compact`` runs.
Everything is offline and deterministic; the log is persisted under the demo's root.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import trio

from actors import Owner
from harness.agent import (
    Agent,
    AgentCompaction,
    Call,
    ContextWindowExceededError,
    Fail,
    Reason,
    Say,
    ScriptedProvider,
    ToolSet,
    open_agent_loop,
    tool,
)
from harness.agent._scripted import Reply
from harness.compaction import PREAMBLE, load_basic_compaction_config
from harness.compaction._transaction import CompactionResult
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import SessionHandle, open_store
from harness.session import Event, FrozenDict, RelationalInvariants, thaw

WINDOW = 2000
SESSION = "long-chat"

NOTES = (
    "# Design notes\n"
    + "".join(
        f"{i}. The session log is append-only; the surface is a projection of its message events, "
        "and a replace shadows a span of it without deleting anything from the log.\n"
        for i in range(1, 25)
    )
)


@tool("read_file", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}})
async def read_notes(args: dict[str, Any]) -> Any:
    await trio.lowlevel.checkpoint()
    return NOTES


TOOLS = ToolSet([read_notes])


def _answer(topic: str) -> str:
    return (
        f"{topic} Each event has a sequence number and a type, and events are never changed once written. "
        "The model does not read the log itself: it reads the surface, the list of message events that are "
        "still visible, derived in order. Forks copy a prefix, resumes replay the log, and crash repair only "
        "appends closers, so every past state can be rebuilt from the file on disk. Compaction follows the same "
        "rule: a checkpoint message replaces a span of the surface, and the replaced messages stay in the log, "
        "where a reader, a fork or a replay can still find them. Nothing the user or the model said is ever "
        "rewritten in place; the next request is simply built from a shorter surface."
    )


QUESTIONS = [
    "How does the session log work, in detail?",
    "And what exactly does the model get to see?",
    "How do fork and resume relate to the log?",
]
SCRIPT: list[Reply] = [
    [Say(_answer("The log is the source of truth."))],
    [Say(_answer("The model sees the surface."))],
    [Say(_answer("Fork and resume are both log operations."))],
    # Turn 4: step 1 reads a long file (pressure crosses the threshold), step 2 answers.
    [Say("Reading the notes."), Call("read_file", {"path": "/repo/NOTES.md"})],
    [Say("The notes say the log is append-only and a replace only shadows a span of the surface.")],
    # Turn 5: the provider refuses the first request; the retried one completes.
    [Fail(ContextWindowExceededError("prompt is too long"))],
    [Say("Compared with the old design, nothing is deleted any more: history is shadowed, not lost.")],
]
SUMMARIES: list[Reply] = [
    [Say("- The user asked how the session log, the surface, fork and resume work; all were explained.")],
    [Say("- Log, surface, fork and resume explained; NOTES.md read: the log is append-only, replaces shadow.")],
    [Say("- Everything so far: the log design, and how it differs from the old one.")],
]


@attrs.frozen
class Observation:
    """One run of a compaction policy, as the demo saw it."""

    reason: Reason
    seq_before: int  # the log's length when the policy started
    tokens_before: int
    tokens_after: int
    messages_before: tuple[FrozenDict, ...]
    messages_after: tuple[FrozenDict, ...]
    result: CompactionResult | None


class ObservedCompaction(AgentCompaction):
    """The embedded compaction policies, unchanged; each run is measured before and
    after (``SessionHandle.measure``, a read) so the demo can print what happened."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[Observation] = []

    async def compact_if_needed(self, agent: Agent, reason: Reason) -> CompactionResult | None:
        s = agent.session
        seq, before = s.seq, await _tokens(s)
        messages = tuple(await s.derive_messages())
        result = await super().compact_if_needed(agent, reason)
        if result is not None or reason == "context-overflow":
            after = tuple(await s.derive_messages())
            self.seen.append(Observation(reason, seq, before, await _tokens(s), messages, after, result))
        return result


async def _tokens(s: SessionHandle) -> int:
    return int((await s.measure()).measurement.total_tokens)


def _short(cid: object) -> str:
    return str(cid)[:8]


def _words(message: Any, n: int = 9) -> str:
    m = thaw(message)
    parts: list[str] = []
    for block in m["content"]:
        if block["type"] == "text":
            parts.append(str(block["text"]))
        elif block["type"] == "tool-call":
            parts.append(f"-> {block['name']}({block['arguments']})")
        elif block["type"] == "tool-result":
            parts.append("<result> " + " ".join(str(b.get("text", "")) for b in block["content"]))
    if m.get("source", {}).get("plugin") == "compact":
        # The frame: PREAMBLE + <compacted-summary>, the summary, </compacted-summary>.
        inner = " ".join(parts[1:-1]) if parts and parts[0].startswith(PREAMBLE) else " ".join(parts)
        return "[checkpoint] " + " ".join(inner.split()[:n]) + " ..."
    words = " ".join(parts).split()
    return " ".join(words[:n]) + (" ..." if len(words) > n else "")


def _span(seqs: list[int]) -> str:
    """The shadowed messages, in surface order. A range ``{start, end}`` names the first
    and last *surface position*, not the lowest and highest seq: after an earlier
    compaction its checkpoint (a later seq) stands where the old head was, so a span
    like ``340 .. 337`` is right (session-core reference, replace rule 4)."""
    order = "" if list(seqs) == sorted(seqs) else " (surface order: an earlier checkpoint first)"
    if len(seqs) <= 4:
        return "seqs " + ", ".join(map(str, seqs)) + order
    return f"seqs {seqs[0]}, {seqs[1]} ... {seqs[-1]}{order}"


def _show_messages(title: str, messages: tuple[FrozenDict, ...]) -> None:
    print(f"    {title}, {len(messages)} messages):")
    for m in messages:
        print(f"      {m['role']:>9}: {_words(m)}")


def _describe(e: Event) -> str:
    d: Any = thaw(e.data)
    t = e.type
    if t == "turn/start":
        return f"turn {d['turn']}"
    if t == "turn/end":
        return f"turn {d['turn']}: {d['reason']['kind']}"
    if t == "step/start":
        return f"---- step {d['step']} of turn {d['turn']} begins ----"
    if t == "step/end":
        return f"---- step {d['step']} of turn {d['turn']} ends ----"
    if t == "agent/inbox/spliced":
        return "claim the prompt" if d.get("removedCount") else "queue the prompt"
    if t == "compaction/start":
        return f"[ bracket {_short(d['compactionId'])} opens ({_owner(d)})"
    if t == "compaction/summary":
        seqs = d["shadowedSeqs"]
        return f"| summary of {len(seqs)} surface messages ({d['shadowedTokenCount']} tokens): {_span(seqs)}"
    if t == "compaction/end":
        return f"] bracket {_short(d['compactionId'])} closes ({_owner(d)})" + (" ERROR" if "error" in d else "")
    if t == "user/message":
        op = e.surface_op
        if op is not None and not isinstance(op, str):
            return f"| {_words(d, 4)}  (the checkpoint: it takes their place on the surface)"
        return "user: " + _words(d)
    if t == "assistant/message":
        return "assistant: " + _words(d["message"])
    if t == "tool/call":
        return f"dispatch {d['name']}"
    if t == "tool/result":
        return f"result of {d['message']['content'][0]['toolCallId']}: {len(NOTES)} characters of notes"
    if t == "request/header":
        return f"header ({d['reason']})"
    if t == "command/run":
        return f"/{d['name']}"
    if t == "command/done":
        return f"{d['kind']}: {d.get('text', '')}"
    return ""


def _owner(d: Any) -> str:
    return "standalone, turn null" if d["turn"] is None else f"turn {d['turn']}"


def _timeline(s: SessionHandle, lo: int, hi: int, notes: dict[int, list[str]]) -> None:
    """Events lo..hi (chunks folded); ``notes[seq]`` is printed before event ``seq``."""
    chunks = 0
    for e in s.events[lo : hi + 1]:
        if e.type != "assistant/chunk" or e.seq in notes:
            if chunks:
                print(f"           ... {chunks} assistant/chunk")
                chunks = 0
            for note in notes.get(e.seq, ()):
                print(f"           * {note}")
        if e.type == "assistant/chunk":
            chunks += 1
            continue
        if e.type == "request/context":
            continue
        print(f"      {e.seq:4d} {e.type:<20} {_describe(e)}")


def _turn_range(s: SessionHandle, turn: int) -> tuple[int, int]:
    lo = hi = -1
    for e in s.events:
        d: Any = e.data
        if e.type == "turn/start" and d["turn"] == turn:
            lo = e.seq
        elif e.type == "turn/end" and d["turn"] == turn:
            hi = e.seq
    return lo, hi


async def compaction_act(root: Path) -> None:
    provider = ScriptedProvider(SCRIPT, context_window=WINDOW)
    compaction = ObservedCompaction(load_basic_compaction_config({}), summary_provider=ScriptedProvider(SUMMARIES))
    spec = compaction.config.policy_for(provider.name, provider.model).scale(WINDOW, provider=provider.name, model=provider.model)
    threshold = spec.threshold_tokens
    backend = JsonlBackend(root)
    async with (
        open_store(validator_factory=RelationalInvariants) as store,
        open_persistence(store, backend) as persistence,
        open_agent_loop(store, provider=provider, tools=TOOLS, persistence=persistence, compaction=compaction) as loop,
        Owner("demo") as owner,
    ):
        handle = await loop.create(SESSION, owner=owner, cwd="/repo")
        agent, s = handle.agent, handle.session
        print(
            f"\n  a long conversation in a {WINDOW}-token context window: at every agent/pre-step, once the surface"
            f"\n  reaches floor({WINDOW} * 0.8) = {threshold} tokens, its head is summarized into a checkpoint, keeping"
            f"\n  the newest ~{spec.retain_tokens} tokens (the embedded defaults; tokens are the meter's estimate)"
        )
        for question in QUESTIONS:
            r = await agent.run_turn(question)
            print(f"    turn {r.turn}: {r.kind}, surface at {await _tokens(s)} tokens (< {threshold}: no compaction)")
        r4 = await agent.run_turn("Read /repo/NOTES.md and tell me what it says.")
        print(f"    turn {r4.turn}: {r4.kind}; its tool result pushed the surface over the threshold in the middle of the turn")

        pressure = next(o for o in compaction.seen if o.reason == "pressure")
        assert pressure.result is not None
        lo, hi = _turn_range(s, r4.turn)
        print(f"\n  timeline of turn {r4.turn}: the bracket sits between the end of step 1 and the start of step 2")
        _timeline(
            s,
            lo,
            hi,
            {
                pressure.result.start_seq: [
                    f"agent/pre-step of step 2 measures {pressure.tokens_before} tokens >= threshold {threshold}: compact"
                ],
                pressure.result.end_seq + 1: [f"measured again: {pressure.tokens_after} tokens < {threshold}"],
            },
        )
        print("\n  what the model sees, before and after the checkpoint:")
        _show_messages(f"before (at seq {pressure.seq_before}", pressure.messages_before)
        _show_messages(f"after (at seq {pressure.result.end_seq + 1}", pressure.messages_after)
        print(
            "    (the newest unit, the call and its result, is kept whole: a cut never separates a call from its result)"
        )
        seqs = pressure.result.shadowed_seqs
        kept = all(s.events[q].type in ("user/message", "assistant/message", "tool/result") for q in seqs)
        print(
            f"    the log still holds {'all ' if kept else 'NOT all '}{len(seqs)} shadowed messages (seqs {', '.join(map(str, seqs))}) "
            f"among its {s.seq} events;\n    the model sees the checkpoint instead"
        )

        requests_before = len(provider.requests)
        r5 = await agent.run_turn("Now compare this with the old design, in detail.")
        overflow = next(o for o in compaction.seen if o.reason == "context-overflow")
        assert overflow.result is not None
        lo, hi = _turn_range(s, r5.turn)
        steps = sum(1 for e in s.events[lo : hi + 1] if e.type == "step/start")
        pruned = sum(1 for e in s.events[lo : hi + 1] if e.type == "compaction/prune")
        print(
            f"\n  turn {r5.turn}: the meter estimates {overflow.tokens_before} tokens (< {threshold}: no pressure), "
            "but the provider counts differently and refuses the request"
        )
        _timeline(
            s,
            lo,
            hi,
            {
                overflow.result.start_seq: [
                    "request 1 fails: ContextWindowExceededError (CONTEXT_WINDOW_EXCEEDED); the step stays open",
                    f"agent/request-error: prune ({pruned or 'no'} oversized tool results), then compact all but the newest message",
                ],
                overflow.result.end_seq + 1: [f"request 2, rebuilt from the new surface ({overflow.tokens_after} tokens)"],
            },
        )
        print(
            f"    turn {r5.turn}: {r5.kind}; {len(provider.requests) - requests_before} requests, step/start count {steps}: "
            "retried in the same step"
        )

        mark = s.seq
        result = await loop.commands.run(agent, "/compact")
        print(f"\n  /compact (manual compaction between turns: the bracket belongs to no turn): {result.kind}: {result.text}")
        _timeline(s, mark, s.seq - 1, {})
        surface = s.surface()
        print(f"    the surface is now {len(surface)} messages; the log keeps all {s.seq} events")
        await s.flush()
    # Reloaded under the invariant companion too: the brackets replay cleanly from disk.
    async with (
        open_store(validator_factory=RelationalInvariants) as store,
        open_persistence(store, backend) as persistence,
    ):
        reloaded = await persistence.load(SESSION)
        print(
            f"\n  reloaded {SESSION} from {root}: {reloaded.seq} events, "
            f"same surface as when it was live: {'yes' if tuple(reloaded.surface) == surface else 'NO'}"
        )


def run_compaction_act(root: Path) -> int:
    print(f"\n== more: compaction in an agent: pressure mid-turn, overflow recovery, /compact (log under {root}) ==")
    trio.run(compaction_act, root)
    from harness.demo._show import stored_sessions

    stored_sessions(root)
    return 0
