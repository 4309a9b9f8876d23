"""The compaction transaction owned by the session actor (reference §1, §3)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from harness.compaction import PREAMBLE, SummarizationInput, SummaryOutput
from harness.errors import (
    CompactionBusyError,
    CompactionChangedError,
    CompactionError,
    CompactionSummaryFailedError,
    SessionNotLiveError,
    SummaryContentError,
    SummaryNotSmallerError,
    SurfaceChangedError,
    UnsupportedSummaryContentError,
)
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import SessionHandle, open_store
from harness.session import EventDraft, freeze, thaw
from tests.helpers import assistant, user

LONG = "lorem ipsum dolor sit amet " * 40  # ~1,000 characters: worth compacting


class Summaries:
    """A summarizer the test controls: a gate to hold it, a failure to raise."""

    def __init__(self, text: str = "- the user asked; the model answered", fail: Exception | None = None) -> None:
        self.text = text
        self.fail = fail
        self.gate: trio.Event | None = None
        self.started = trio.Event()
        self.inputs: list[SummarizationInput] = []

    async def __call__(self, inp: SummarizationInput) -> SummaryOutput:
        self.inputs.append(inp)
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        await trio.lowlevel.checkpoint()
        if self.fail is not None:
            raise self.fail
        block = freeze({"type": "text", "text": self.text})
        return SummaryOutput(summary=(block,), raw_output=(block,), provider="p", model="m", max_tokens=256)  # type: ignore[arg-type]


async def conversation(s: SessionHandle, turns: int, *, open_turn: bool) -> list[int]:
    """``turns`` closed turns (a user and an assistant message each), then an open one
    when asked; returns the surface seqs of the messages."""
    seqs: list[int] = []
    for t in range(1, turns + 1):
        events = await s.append_batch(
            [
                EventDraft("turn/start", {"turn": t}),
                EventDraft("user/message", user(f"u{t}", LONG), "append"),
                EventDraft("step/start", {"turn": t, "step": 1}),
                EventDraft("assistant/message", assistant(t, 1, f"a{t}", [{"type": "text", "text": LONG}]), "append"),
                EventDraft("step/end", {"turn": t, "step": 1}),
                EventDraft("turn/end", {"turn": t, "reason": {"kind": "completed"}}),
            ]
        )
        seqs += [events[1].seq, events[3].seq]
    if open_turn:
        t = turns + 1
        events = await s.append_batch(
            [EventDraft("turn/start", {"turn": t}), EventDraft("user/message", user(f"u{t}", "next"), "append")]
        )
        seqs.append(events[1].seq)
    return seqs


def bracket(s: SessionHandle) -> list[tuple[str, Any]]:
    return [(e.type, thaw(e.data)) for e in s.events if e.type.startswith("compaction/")]


async def compact_while(
    s: SessionHandle,
    start: int,
    end: int,
    during: Callable[[], Awaitable[object]],
    *,
    catch: tuple[type[BaseException], ...] = (),
    **options: Any,
) -> Any:
    """Run ``compact_region`` with a summarizer held at its gate, run ``during`` while
    it is held, release it; return the result, or the exception of a type in ``catch``."""
    slow = Summaries()
    slow.gate = trio.Event()
    results: list[Any] = []
    async with trio.open_nursery() as n:

        async def compact() -> None:
            try:
                results.append(await s.compact_region(start, end, summarizer=slow, **options))
            except catch as exc:
                results.append(exc)

        n.start_soon(compact)
        await slow.started.wait()
        await during()
        slow.gate.set()
    return results[0]


async def test_an_automatic_compaction_commits_summary_checkpoint_and_end() -> None:
    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=True)
        summarizer = Summaries()
        result = await s.compact_region(seqs[0], seqs[3], summarizer=summarizer)
        types = [e.type for e in s.events][-4:]
        assert types == ["compaction/start", "compaction/summary", "user/message", "compaction/end"]
        start, summary, checkpoint, end = list(s.events)[-4:]
        cid = thaw(start.data)["compactionId"]
        assert thaw(start.data) == {"compactionId": cid, "turn": 3}
        data = thaw(summary.data)
        assert list(data) == [
            "compactionId", "summary", "rawOutput", "shadowedRange",
            "shadowedSeqs", "shadowedTokenCount", "provider", "model", "maxTokens",
        ]
        assert data["shadowedRange"] == {"start": seqs[0], "end": seqs[3]} and data["shadowedSeqs"] == seqs[:4]
        assert checkpoint.surface_op is not None and checkpoint.source_event_seqs == (start.seq, summary.seq, *seqs[:4])
        message = thaw(checkpoint.data)
        assert message["content"][0]["text"].startswith(PREAMBLE) and message["source"]["plugin"] == "compact"
        assert thaw(end.data) == {"compactionId": cid, "turn": 3}
        # The model now sees the checkpoint, then what followed the span.
        assert s.surface() == (checkpoint.seq, seqs[4])
        assert result.summary_seq == summary.seq and result.end_seq == end.seq
        assert result.shadowed_token_count == data["shadowedTokenCount"] > 0
        # The summarizer saw the shadowed messages, in surface order.
        assert [m["id"] for m in summarizer.inputs[0].messages] == ["u1", "a1", "u2", "a2"]


async def test_range_owner_and_lock_checks_write_nothing() -> None:
    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=False)
        before = len(s.events)
        with pytest.raises(CompactionError, match=r"compactRegion: start seq 999 not found in surface"):
            await s.compact_region(999, seqs[1], summarizer=Summaries())
        with pytest.raises(CompactionError, match=r"is after end seq"):
            await s.compact_region(seqs[2], seqs[1], summarizer=Summaries())
        with pytest.raises(CompactionError, match=r"no open turn — automatic compaction"):
            await s.compact_region(seqs[0], seqs[1], summarizer=Summaries())
        assert len(s.events) == before
        await conversation_turn_open(s)
        with pytest.raises(CompactionBusyError, match="manual compaction: the session already has an open turn"):
            await s.compact_region(seqs[0], seqs[1], summarizer=Summaries(), manual=True)
        assert len(s.events) == before + 2


async def conversation_turn_open(s: SessionHandle) -> None:
    await s.append_batch([EventDraft("turn/start", {"turn": 9}), EventDraft("user/message", user("u9", "hi"), "append")])


async def test_the_actor_keeps_serving_and_a_second_compaction_is_busy() -> None:
    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=True)

        async def meanwhile() -> None:
            # The actor serves appends and reads while the summary is being written.
            await s.append("request/header", {"header": {"config": {"provider": "p", "model": "m"}}, "reason": "initial"})
            assert len(await s.derive_messages()) == 5
            with pytest.raises(CompactionBusyError, match="compaction already in progress"):
                await s.compact_region(seqs[0], seqs[1], summarizer=Summaries())

        await compact_while(s, seqs[0], seqs[1], meanwhile)
        # A log-only append does not change the surface: the commit went through.
        assert [t for t, _ in bracket(s)] == ["compaction/start", "compaction/summary", "compaction/end"]


async def test_a_surface_append_during_the_summary_fails_stability_and_closes_the_bracket() -> None:
    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=True)
        error = await compact_while(
            s, seqs[0], seqs[1], partial(s.append, "user/message", user("late", "more"), surface_op="append"), catch=(SurfaceChangedError,)
        )
        assert str(error) == "compaction: session surface changed during summarization"
        (_, start), (_, end) = bracket(s)
        assert end == {**start, "error": "compaction: session surface changed during summarization"}
        assert s.surface()[:2] == tuple(seqs[:2])  # nothing was replaced


async def test_a_manual_run_keeps_appends_outside_its_span() -> None:
    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=False)
        late: list[Any] = []

        async def append_late() -> None:
            late.append(await s.append("user/message", user("late", "more"), surface_op="append"))

        result = await compact_while(s, seqs[0], seqs[1], append_late, manual=True)
        start = next(e for e in s.events if e.type == "compaction/start")
        assert thaw(start.data)["turn"] is None
        checkpoint = s.events[result.end_seq - 1]
        assert s.surface() == (checkpoint.seq, seqs[2], seqs[3], late[0].seq)


async def test_summary_failures_are_raw_when_automatic_and_classified_when_manual() -> None:
    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=False)
        boom = Summaries(fail=ValueError("model exploded"))
        with pytest.raises(CompactionSummaryFailedError) as info:
            await s.compact_region(seqs[0], seqs[3], summarizer=boom, manual=True)
        assert info.value.kind == "summary" and isinstance(info.value.__cause__, ValueError)
        assert bracket(s)[-1][1]["error"] == "model exploded"
        await conversation_turn_open(s)
        with pytest.raises(ValueError):
            await s.compact_region(seqs[0], seqs[3], summarizer=boom)
        with pytest.raises(SummaryNotSmallerError):
            await s.compact_region(seqs[0], seqs[0], summarizer=Summaries("x" * 20_000))
        # Every start got its end; the surface never changed.
        types = [t for t, _ in bracket(s)]
        assert types.count("compaction/start") == types.count("compaction/end") == 3
        assert s.surface()[:4] == tuple(seqs[:4])


async def test_a_cancelled_caller_gets_cancelled_after_the_bracket_closed(autojump_clock: trio.testing.MockClock) -> None:
    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=True)
        slow = Summaries()
        slow.gate = trio.Event()  # never set
        with trio.move_on_after(0.05) as scope:
            await s.compact_region(seqs[0], seqs[1], summarizer=slow)
        assert scope.cancelled_caught
        (_, start), (_, end) = bracket(s)
        assert end["compactionId"] == start["compactionId"] and "cancelled" in end["error"]
        # The lock is free again.
        await s.compact_region(seqs[0], seqs[1], summarizer=Summaries())


async def test_the_actor_stopping_mid_summary_closes_the_bracket(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=True)
        error = await compact_while(s, seqs[0], seqs[1], partial(store.detach, s), catch=(SessionNotLiveError,))
        assert "stopped during compaction" in str(error)
        await p.wait_retired("s")
    # The error end reached the disk: no live lock is left behind.
    records = JsonlBackend(tmp_path).load("s").records
    ends = [r for r in records if r["type"] == "compaction/end"]
    assert len(ends) == 1 and "stopped during compaction" in ends[0]["data"]["error"]


async def test_a_start_left_by_an_earlier_lifecycle_is_stale(tmp_path: Path) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=False)
        # A crash between start and end: the start is on disk, the end never came.
        await s.append("compaction/start", {"compactionId": "c-old", "turn": None})
        await s.flush()
        await store.detach(s)
        await p.wait_retired("s")
        prep = await p.prepare("s")
        h = await p.publish(prep)  # the restored log ends with session/end-seed
        result = await h.compact_region(seqs[0], seqs[3], summarizer=Summaries(), manual=True, flush=True)
        assert result.end_seq == h.seq - 1


async def test_a_manual_span_rewritten_during_the_summary_is_changed() -> None:
    from harness.session import ReplaceOp

    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=False)
        rewrite = partial(s.append, "user/message", user("x", "replaced"), surface_op=ReplaceOp(seqs[0], seqs[1]), source_event_seqs=seqs[:2])
        error = await compact_while(s, seqs[0], seqs[1], rewrite, catch=(CompactionChangedError,), manual=True)
        assert error.kind == "changed"
        assert str(error.__cause__) == "compaction: the selected span is no longer a valid replacement target"


async def test_a_crashed_session_actor_never_leaves_a_compaction_caller_waiting() -> None:
    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=True)

        async def crash() -> None:
            assert s._entry.ref is not None
            with pytest.raises(TypeError):
                await s._entry.ref.call(object())  # a bug crashes the session actor

        error = await compact_while(s, seqs[0], seqs[1], crash, catch=(SessionNotLiveError,))
        assert "ended during compaction" in str(error)


# -- issue 24 §4: the summarizer's output as the reference records it --------------------


class Output:
    """A summarizer returning exactly the output it is given."""

    def __init__(self, output: SummaryOutput) -> None:
        self.output = output

    async def __call__(self, inp: SummarizationInput) -> SummaryOutput:
        await trio.lowlevel.checkpoint()
        return self.output


async def test_absent_summarizer_fields_stay_absent_in_the_summary_event() -> None:
    # Reference §1.1: provenance, provider, model, maxTokens and usage each "only when defined".
    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=True)
        block = freeze({"type": "text", "text": "- short"})
        await s.compact_region(seqs[0], seqs[3], summarizer=Output(SummaryOutput(summary=(block,))))  # type: ignore[arg-type]
        (summary,) = [e for e in s.events if e.type == "compaction/summary"]
        assert list(thaw(summary.data)) == [
            "compactionId", "summary", "shadowedRange", "shadowedSeqs", "shadowedTokenCount",
        ]


async def test_raw_output_without_the_marker_records_no_llm_stream_call() -> None:
    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=True)
        block = freeze({"type": "text", "text": "- short"})
        output = SummaryOutput(summary=(block,), raw_output=(block,), model="m")  # type: ignore[arg-type]
        await s.compact_region(seqs[0], seqs[3], summarizer=Output(output))
        (summary,) = [e for e in s.events if e.type == "compaction/summary"]
        data = thaw(summary.data)
        assert "llmStreamCall" not in data and data["rawOutput"] == [{"type": "text", "text": "- short"}]
        assert data["model"] == "m" and "provider" not in data and "maxTokens" not in data


def test_an_output_marked_llm_stream_call_needs_raw_output() -> None:
    block = freeze({"type": "text", "text": "- short"})
    with pytest.raises(SummaryContentError):
        SummaryOutput(summary=(block,), llm_stream_call=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "summary, raw",
    [
        ([{"type": "text", "text": "- s"}, {"type": "image", "attachment": "a"}], None),
        ([{"type": "text", "text": "- s"}], [{"type": "tool-result", "toolCallId": "c", "content": [{"type": "image", "attachment": "a"}]}]),
        ([{"type": "text", "text": "- s"}, {"type": "tool-result", "toolCallId": "c", "content": []}], None),
    ],
    ids=["image", "nested-image", "tool-result"],
)
async def test_image_and_tool_result_content_is_unsupported(summary: list[Any], raw: list[Any] | None) -> None:
    # Reference §5.2: an image anywhere, also nested in a tool result, is UNSUPPORTED_CONTENT.
    async with open_store() as store:
        s = await store.create("s")
        seqs = await conversation(s, 2, open_turn=True)
        surface = s.surface()
        output = SummaryOutput(
            summary=tuple(freeze(b) for b in summary),  # type: ignore[misc]
            raw_output=None if raw is None else tuple(freeze(b) for b in raw),  # type: ignore[misc]
        )
        with pytest.raises(UnsupportedSummaryContentError) as info:
            await s.compact_region(seqs[0], seqs[3], summarizer=Output(output))
        assert info.value.code == "UNSUPPORTED_CONTENT"
        assert s.surface() == surface
        assert [e.type for e in s.events][-2:] == ["compaction/start", "compaction/end"]
        assert thaw(list(s.events)[-1].data)["error"].startswith("compaction summary cannot contain")
