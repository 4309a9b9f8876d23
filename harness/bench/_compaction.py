"""W8: compacting a 100,000-event agent session, and the derive rebuild after it.

The session is an agent log as the agent loop writes it (``harness.agent``): turns of
two steps, streamed ``assistant/chunk`` deltas, an assistant message with two tool
calls and their ``tool/call`` / ``tool/result`` events, a closing text step, one
``request/header`` and ``request/context``; every 8th tool result is larger than the
pruning threshold (8,192 characters). It is valid under :class:`RelationalInvariants`
(the validator is on for the whole run) and ends with an open turn, which owns the
automatic compaction.

Timed, per run, on a fresh session (restored and made live outside the timed region),
through its session actor as the compaction policies use it:

* **prune**: ``SessionHandle.prune`` (``prune_session`` in the actor) with the default
  ``ToolResultPruneConfig``: one priced pair per over-threshold result;
* **select**: ``SessionHandle.measure(retain)``: ``measure``, the lock state and
  ``select_compactable_range`` in one actor read, with the default policy's retention
  for a 128k window;
* **summary+commit**: ``compact_region`` (begin, prepare, the default summarizer
  ``summarize`` on a ``ScriptedProvider`` with a short reply, frame and shrink check,
  stability check, the committed batch);
* **derive**: the first ``derive_messages`` after it, which rebuilds from the
  compacted surface.

Not timed: the restore, entering the store, and the pressure check that triggers an
automatic compaction (a cold ``measure``: a fresh session has no meter cache; reported
as ``trigger_measure_ms``), so the select step's measure is warm except for what the
prune wrote. ``gc_ms`` is the time the cyclic collector took inside the timed steps.

W6, one bare ``Session.append`` of a replace over 89k of 100k nodes (no actor, no
derive), is measured in the same invocation; W8/W6 is reported as the ratio (target:
at most 3x). Peak memory is the ``tracemalloc`` peak of the timed steps in one extra,
untimed run (tracing slows Python down severalfold); the restored session is not in it.
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
import uuid
from functools import partial
from typing import Any

import attrs
import orjson
import trio

from harness.agent import ScriptedProvider
from harness.agent._scripted import Say
from harness.bench._core import w6
from harness.bench._events import bench_text
from harness.bench._runner import Result
from harness.compaction import (
    load_basic_compaction_config,
    load_tool_result_prune_config,
    resolve_summary_target,
    summarize,
)
from harness.runtime import Store, open_store
from harness.session import RelationalInvariants, Session

PROVIDER, MODEL, CONTEXT_WINDOW = "bench", "bench-model", 128_000
LARGE_EVERY = 8
"""Every 8th tool result is larger than the pruning threshold."""
LARGE_CHARS, SMALL_CHARS = 12_000, 600
SUMMARY = "- the user asked for changes across many files; the model read, edited and tested them."
_TIME0 = 1_700_000_000_000
_TOOLS = [
    {"name": "read", "description": "Read a file.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
    {"name": "grep", "description": "Search files.", "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}}},
]


def _clock() -> int:
    return _TIME0


def _mid(i: int) -> str:
    return str(uuid.UUID(int=(i * 0x9E3779B97F4A7C15) & ((1 << 128) - 1), version=4))


def _text(i: int, chars: int) -> str:
    parts, total = [], 0
    k = i
    while total < chars:
        parts.append(bench_text(k))
        total += 201
        k += 1
    return " ".join(parts)[:chars]


class _Log:
    """Builds the records of the agent log (restore-mode records)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.results = 0

    def add(self, type_: str, data: dict[str, Any], *, surface: bool = False) -> None:
        seq = len(self.records)
        rec: dict[str, Any] = {"type": type_, "seq": seq, "time": _TIME0 + seq, "data": data}
        if surface:
            rec["surfaceOp"] = "append"
        self.records.append(rec)

    def chunks(self, turn: int, step: int, text: str, calls: list[dict[str, Any]], usage: dict[str, int]) -> None:
        half = len(text) // 2
        raws: list[dict[str, Any]] = [
            {"type": "text-delta", "index": 0, "text": text[:half]},
            {"type": "text-delta", "index": 0, "text": text[half:]},
        ]
        for i, c in enumerate(calls, 1):
            mid = len(c["arguments"]) // 2
            raws.append({"type": "tool-call-delta", "index": i, "id": c["id"], "name": c["name"], "argumentsDelta": c["arguments"][:mid]})
            raws.append({"type": "tool-call-delta", "index": i, "id": c["id"], "argumentsDelta": c["arguments"][mid:]})
        raws.append({"type": "usage", "usage": usage})
        raws.append({"type": "finish", "reason": "tool-calls" if calls else "stop"})
        for raw in raws:
            self.add("assistant/chunk", {"turn": turn, "step": step, "chunk": raw})

    def assistant(self, turn: int, step: int, i: int, text: str, calls: list[dict[str, Any]]) -> None:
        usage = {"inputTokens": 1_000 + i % 500, "outputTokens": 50 + i % 40}
        self.chunks(turn, step, text, calls, usage)
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        content += [{"type": "tool-call", **c} for c in calls]
        message = {"id": _mid(i), "role": "assistant", "content": content, "source": {"kind": "model", "provider": PROVIDER, "model": MODEL}}
        self.add("assistant/message", {"turn": turn, "step": step, "message": message, "usage": usage}, surface=True)

    def turn(self, turn: int) -> None:
        i = len(self.records)
        self.add("turn/start", {"turn": turn})
        self.add("user/message", {"id": _mid(i), "role": "user", "content": [{"type": "text", "text": bench_text(i)}], "source": {"kind": "user"}}, surface=True)
        self.add("step/start", {"turn": turn, "step": 1})
        if turn == 1:
            header = {"config": {"provider": PROVIDER, "model": MODEL}, "system": "You are a coding agent.", "tools": _TOOLS}
            self.add("request/header", {"header": header, "reason": "initial"})
            self.add("request/context", {"provider": PROVIDER, "model": MODEL, "contextWindow": CONTEXT_WINDOW})
        calls = [
            {"id": f"call-{turn}-1", "name": "read", "arguments": orjson.dumps({"path": f"src/m{turn % 97}.py"}).decode()},
            {"id": f"call-{turn}-2", "name": "grep", "arguments": orjson.dumps({"pattern": f"def f{turn % 13}"}).decode()},
        ]
        self.assistant(turn, 1, i + 1, bench_text(i + 1), calls)
        for c in calls:
            self.add("tool/call", {"turn": turn, "step": 1, "callId": c["id"], "name": c["name"], "arguments": c["arguments"]})
        for c in calls:
            self.results += 1
            size = LARGE_CHARS if self.results % LARGE_EVERY == 0 else SMALL_CHARS
            block = {"type": "tool-result", "toolCallId": c["id"], "content": [{"type": "text", "text": _text(i + self.results, size)}]}
            message = {"id": _mid(i + 2 + self.results), "role": "user", "content": [block], "source": {"kind": "tool", "callId": c["id"]}}
            self.add("tool/result", {"turn": turn, "step": 1, "message": message}, surface=True)
        self.add("step/end", {"turn": turn, "step": 1})
        self.add("step/start", {"turn": turn, "step": 2})
        self.assistant(turn, 2, i + 3, bench_text(i + 3), [])
        self.add("step/end", {"turn": turn, "step": 2})
        self.add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})

    def open_turn(self, turn: int) -> None:
        i = len(self.records)
        self.add("turn/start", {"turn": turn})
        self.add("user/message", {"id": _mid(i), "role": "user", "content": [{"type": "text", "text": bench_text(i)}], "source": {"kind": "user"}}, surface=True)
        self.add("step/start", {"turn": turn, "step": 1})


def agent_log(n: int) -> list[dict[str, Any]]:
    """About ``n`` records (whole turns) ending with an open turn."""
    log = _Log()
    per_turn = 26
    turn = 1
    while len(log.records) + per_turn + 3 <= n or turn == 1:
        log.turn(turn)
        turn += 1
    log.open_turn(turn)
    return log.records


class _GcClock:
    """Wall time spent in the cyclic collector while ``on`` (a ``gc.callbacks`` hook)."""

    def __init__(self) -> None:
        self.on = False
        self.seconds = 0.0
        self.full = 0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.full += info["generation"] == 2


@attrs.frozen
class _Sample:
    prune: float
    select: float
    compact: float
    derive: float
    trigger: float
    gc: float
    gc_full: int
    tokens: int
    pruned: int
    shadowed: int
    surface_before: int
    surface_after: int

    @property
    def total(self) -> float:
        return self.prune + self.select + self.compact + self.derive


async def _one(store: Store, lines: list[bytes], sid: str, *, trace: bool = False) -> _Sample:
    header = {"version": 0, "id": sid, "createdAt": 1}
    session = Session.restore_lines(sid, lines, header, clock=_clock, validator=RelationalInvariants())
    handle = await store.enter(await store.adopt(session))
    del session
    config = load_basic_compaction_config({})
    spec = config.policy_for(PROVIDER, MODEL).scale(CONTEXT_WINDOW, provider=PROVIDER, model=MODEL)
    target = resolve_summary_target(config, handle.request_header())
    provider = ScriptedProvider([[Say(SUMMARY)]], name=PROVIDER, model=MODEL)
    summarizer = partial(
        summarize, provider, session_id=sid, max_tokens=target.max_tokens, provider_name=target.provider, model=target.model
    )
    prune_config = load_tool_result_prune_config()
    # The pressure check that triggers an automatic compaction measures the session
    # first: cold here (a fresh session has no meter cache). Reported, not in W8.
    t = time.perf_counter()
    check = await handle.measure()
    trigger = time.perf_counter() - t
    # The policy's retention for a 128k window; a small --n session keeps a fifth.
    retain = min(spec.retain_tokens, check.measurement.surface_tokens // 5)
    tokens = check.measurement.total_tokens
    del check
    gc.collect()
    if trace:
        tracemalloc.start()
    clock = _GcClock()
    gc.callbacks.append(clock)
    clock.on = True

    t0 = time.perf_counter()
    pruned = await handle.prune(prune_config)
    t1 = time.perf_counter()
    reply = await handle.measure(retain)
    t2 = time.perf_counter()
    span = reply.selection
    assert span is not None and not reply.lock.locked, "W8: nothing to compact"
    surface_before = len(reply.measurement.nodes)
    del reply
    t3 = time.perf_counter()
    result = await handle.compact_region(span.start, span.end, summarizer=summarizer)
    t4 = time.perf_counter()
    messages = await handle.derive_messages()
    t5 = time.perf_counter()
    clock.on = False
    gc.callbacks.remove(clock)

    surface_after = len(handle.surface())
    assert len(messages) == surface_after and surface_after < surface_before
    await store.detach(handle)
    return _Sample(
        t1 - t0,
        t2 - t1,
        t4 - t3,
        t5 - t4,
        trigger,
        clock.seconds,
        clock.full,
        tokens,
        len(pruned.pruned),
        len(result.shadowed_seqs),
        surface_before,
        surface_after,
    )


def _runs(lines: list[bytes], runs: int) -> list[_Sample]:
    """``runs`` fresh runs in one store."""

    async def main() -> list[_Sample]:
        samples: list[_Sample] = []
        async with open_store(clock=_clock) as store:
            for i in range(runs):
                samples.append(await _one(store, lines, f"bench-w8-{i}"))
                gc.collect()  # the previous session is freed here, not in the next run
        return samples

    return trio.run(main)


def _peak_mib(lines: list[bytes]) -> float:
    """The tracemalloc peak (MiB) of one run's steps: tracing starts after the restore
    and ends after the derive (the restored session itself is not counted)."""

    async def main() -> float:
        try:
            async with open_store(clock=_clock) as store:
                await _one(store, lines, "bench-w8-traced", trace=True)
                _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return peak / (1 << 20)

    return trio.run(main)


def w8(n: int, runs: int) -> list[Result]:
    """Compaction of an n-event agent session (prune + summary + commit) and the derive
    rebuild after it, against W6 (one bare replace) measured in the same invocation."""
    records = agent_log(n)
    lines = [orjson.dumps(r) for r in records]
    events = len(records)
    del records
    samples = _runs(lines, runs)
    peak_mib = _peak_mib(lines)
    w6_ms = w6(n, runs)[0].median_ms

    def med(values: list[float]) -> float:
        return statistics.median(values) * 1000.0

    s = samples[0]
    return [
        Result(
            "W8",
            med([x.total for x in samples]),
            w6_ms,
            {
                "n": events,
                "prune_ms": round(med([x.prune for x in samples]), 3),
                "select_ms": round(med([x.select for x in samples]), 3),
                "summary_commit_ms": round(med([x.compact for x in samples]), 3),
                "derive_ms": round(med([x.derive for x in samples]), 3),
                "gc_ms": round(med([x.gc for x in samples]), 3),
                "gc_full_runs": f"{sum(x.gc_full > 0 for x in samples)}/{len(samples)}",
                "trigger_measure_ms": round(med([x.trigger for x in samples]), 3),
                "peak_mib": round(peak_mib, 1),
                "tokens": s.tokens,
                "pruned": s.pruned,
                "shadowed": s.shadowed,
                "surface": f"{s.surface_before}->{s.surface_after}",
                "target": "<=3x W6",
            },
            "compaction + derive rebuild; floor = W6 (bare replace), same run",
        )
    ]
