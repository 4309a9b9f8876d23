"""The session compaction family: ``compaction`` (an automatic compaction inside an
open turn, the ``actor-stop`` canceller detaching the session)."""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Final

import trio

from harness.compaction import SummarizationInput, SummaryOutput
from harness.errors import HarnessError
from harness.faults._backends import (
    check_at_rest,
    close_backend,
    make_backend,
    plain_backend,
    track_session,
)
from harness.faults._explore import Probe
from harness.faults._invariants import open_compaction
from harness.faults._scenarios._frame import (
    Caller,
    bind_teardown,
    check_live,
    check_runtime_exited,
    check_runtime_live,
    flush_and_acknowledge,
    guarded,
    message,
    rig,
)
from harness.runtime import SessionHandle, Store
from harness.session import EventDraft, FrozenDict, freeze


class Detacher:
    """The ``actor-stop`` canceller: detaches a session (its actor stops: drain, children
    cancelled, ``on_stop``) from a helper task, as an application closing it would."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.handle: SessionHandle | None = None
        self._go = trio.Event()

    def __call__(self) -> None:
        self._go.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The helper task. Cancellation: cancel its nursery when done."""
        task_status.started()
        await self._go.wait()
        if self.handle is not None:
            await guarded_detach(self.store, self.handle)


async def guarded_detach(store: Store, handle: SessionHandle) -> None:
    with contextlib.suppress(HarnessError):
        await store.detach(handle)


LONG_TEXT: Final = "the compaction scenario needs enough text to be worth summarizing " * 12


async def chaos_summarizer(inp: SummarizationInput) -> SummaryOutput:
    """A summarizer with a few checkpoints and no provider (deterministic)."""
    for _ in range(3):
        await trio.lowlevel.checkpoint()
    block = freeze({"type": "text", "text": f"- {len(inp.messages)} messages condensed"})
    assert isinstance(block, FrozenDict)
    return SummaryOutput(summary=(block,), raw_output=(block,), provider="chaos", model="chaos-1", max_tokens=64)


async def compaction(probe: Probe, kind: str) -> None:
    """A session with two closed turns and an open one is compacted (automatic, owned by
    the open turn) while a log-only event is appended; then the turn is closed, flushed."""
    backend = make_backend(probe, kind)
    try:
        async with rig(probe, backend, write_delay=0.05) as r, trio.open_nursery() as helpers:
            detacher = Detacher(r.store)
            await helpers.start(detacher.run)
            with trio.CancelScope() as body:
                caller = Caller()
                probe.canceller("caller", caller.cancel)
                probe.canceller("actor-stop", detacher)
                bind_teardown(probe, None, r.store, body)
                s = await r.store.create("c", cwd="/chaos")
                track_session(probe, s)
                detacher.handle = s
                seqs = await _compaction_seed(s)
                await flush_and_acknowledge(probe, s, "seed flush")
                probe.arm()
                with caller.scope():
                    await guarded(probe, "compact", partial(s.compact_region, seqs[0], seqs[3], summarizer=chaos_summarizer))
                    await guarded(probe, "request/header", partial(s.append, "request/header", {"header": {"config": {"provider": "chaos", "model": "chaos-1"}}, "reason": "initial"}))
                # Whatever happened, no live session is left with an open bracket.
                if s.alive:
                    probe.check(open_compaction(list(s.events)) is None, 'live "c": a compaction bracket is left open after compact_region returned')
                with caller.scope():
                    await guarded(probe, "turn/end", partial(s.append, "turn/end", {"turn": 3, "reason": {"kind": "completed"}}))
                    await flush_and_acknowledge(probe, s, "flush")
                for h in await guarded(probe, "store.list", r.store.list) or []:
                    check_live(probe, h, idle=False)
                await check_runtime_live(probe, r)
            helpers.cancel_scope.cancel()
        check_runtime_exited(probe, None)
    finally:
        close_backend(backend)
    probe.disarm()
    check_at_rest(probe, kind)
    if probe.faults is None:
        # No I/O fault, no crash: the runtime closed cleanly, so every bracket it opened
        # was closed on disk too (by the caller's path or by the actor's on_stop).
        stored = plain_backend(probe, kind)
        try:
            left = open_compaction(stored.load("c").records)
        finally:
            close_backend(stored)
        probe.check(left is None, f'stored "c": compaction {left} is left open after a clean close')


async def _compaction_seed(s: SessionHandle) -> list[int]:
    """Two closed turns and an open third (unarmed); the surface seqs of the messages."""
    seqs: list[int] = []
    for t in (1, 2):
        events = await s.append_batch(
            [
                EventDraft("turn/start", {"turn": t}),
                EventDraft("user/message", message("user", f"u{t}", LONG_TEXT), "append"),
                EventDraft("step/start", {"turn": t, "step": 1}),
                EventDraft("assistant/message", {"turn": t, "step": 1, "message": message("assistant", f"a{t}", LONG_TEXT)}, "append"),
                EventDraft("step/end", {"turn": t, "step": 1}),
                EventDraft("turn/end", {"turn": t, "reason": {"kind": "completed"}}),
            ]
        )
        seqs += [events[1].seq, events[3].seq]
    await s.append_batch([EventDraft("turn/start", {"turn": 3}), EventDraft("user/message", message("user", "u3", "go on"), "append")])
    return seqs
