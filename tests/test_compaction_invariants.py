"""The compaction companion's invariants (compaction reference §1.5) and its seed
replay (§1.4), inside :class:`RelationalInvariants`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compaction import SummarizationInput, SummaryOutput, frame_checkpoint
from harness.compaction._framing import checkpoint_source
from harness.errors import InvariantError
from harness.runtime import open_store
from harness.session import (
    END_SEED,
    EventDraft,
    RelationalInvariants,
    ReplaceOp,
    Session,
    event_to_record,
    freeze,
    interrupted_turn_closers,
    thaw,
)
from tests.helpers import assistant, header, user

MISSING: Any = object()
"""A field the built event leaves out."""


def fields(*pairs: tuple[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in pairs if v is not MISSING}


def start(cid: Any = "c1", turn: Any = None, **extra: Any) -> EventDraft:
    return EventDraft("compaction/start", fields(("compactionId", cid), *extra.items(), ("turn", turn)))


def summary(cid: Any = "c1", seqs: Any = (1, 3), **extra: Any) -> EventDraft:
    seqs = list(seqs)
    data = fields(("compactionId", cid), ("sourceCommandId", extra.pop("sourceCommandId", MISSING)))
    data["summary"] = [{"type": "text", "text": "- short"}]
    data["shadowedRange"] = {"start": seqs[0], "end": seqs[-1]} if seqs else {"start": 0, "end": 0}
    data["shadowedSeqs"] = seqs
    data["shadowedTokenCount"] = 40
    data["provider"], data["model"] = "p", "m"
    data.update(extra)
    return EventDraft("compaction/summary", data)


def end(cid: Any = "c1", turn: Any = None, **extra: Any) -> EventDraft:
    return EventDraft("compaction/end", fields(("compactionId", cid), ("sourceCommandId", extra.pop("sourceCommandId", MISSING)), ("turn", turn), *extra.items()))


def checkpoint(cid: Any = "c1", seqs: tuple[int, ...] = (1, 3), sources: tuple[int, ...] = (), **source: Any) -> EventDraft:
    """The checkpoint ``user/message``: a replace of ``seqs`` with a compact source."""
    message = frame_checkpoint([{"type": "text", "text": "- short"}], "placeholder")
    message["source"] = fields(("kind", "plugin"), ("plugin", "compact"), ("compactionId", cid), *source.items())
    return EventDraft("user/message", message, ReplaceOp(seqs[0], seqs[-1]), [*sources, *seqs])


def transaction(s: Session, cid: str, turn: int | None, seqs: tuple[int, ...], **extra: Any) -> list[EventDraft]:
    """start, summary, checkpoint, success end, as the real transaction writes them."""
    at = s.seq
    return [
        start(cid, turn, **extra),
        summary(cid, seqs, **extra),
        checkpoint(cid, seqs, (at, at + 1), **extra),
        end(cid, turn, **extra),
    ]


def closed_turn(turn: int, mid: str) -> list[EventDraft]:
    return [
        EventDraft("turn/start", {"turn": turn}),
        EventDraft("user/message", user(f"u{mid}", "question"), "append"),
        EventDraft("step/start", {"turn": turn, "step": 1}),
        EventDraft("assistant/message", assistant(turn, 1, f"a{mid}"), "append"),
        EventDraft("step/end", {"turn": turn, "step": 1}),
        EventDraft("turn/end", {"turn": turn, "reason": {"kind": "completed"}}),
    ]


def fresh(validator: Any = "default") -> Session:
    return Session.create("s", clock=lambda: 5, validator=RelationalInvariants() if validator == "default" else validator)


def idle() -> Session:
    """Turn 1 closed: the surface is [1, 3], no turn is open (next seq 6)."""
    s = fresh()
    s.append_batch(closed_turn(1, "1"))
    return s


def in_turn() -> Session:
    """Turn 1 closed, turn 2 open with its user message (7), no step open (next seq 8)."""
    s = idle()
    s.append_batch([EventDraft("turn/start", {"turn": 2}), EventDraft("user/message", user("u2"), "append")])
    return s


def rejects(s: Session, drafts: list[EventDraft], message: str) -> None:
    """Every draft but the last is accepted; the last is vetoed with ``message`` and
    the rejected batch changes nothing."""
    s.append_batch(drafts[:-1])
    before = (s.seq, s._vstate)
    with pytest.raises(InvariantError) as caught:
        s.append_batch(drafts[-1:])
    assert caught.value.detail == message
    assert str(caught.value).endswith(message)
    assert (s.seq, s._vstate) == before


Base = Callable[[], Session]
CASES: list[tuple[str, Base, Callable[[], list[EventDraft]], str]] = [
    # -- identifiers
    ("start id", idle, lambda: [start("")], "compaction/start compactionId must be a non-empty string"),
    ("start id missing", idle, lambda: [start(MISSING)], "compaction/start compactionId must be a non-empty string"),
    ("start source", idle, lambda: [start(sourceCommandId="")], "compaction/start sourceCommandId must be a non-empty string"),
    ("summary id", idle, lambda: [start(), summary(5)], "compaction/summary compactionId must be a non-empty string"),
    ("summary source", idle, lambda: [start(), summary(sourceCommandId=None)], "compaction/summary sourceCommandId must be a non-empty string"),
    ("end id", idle, lambda: [start(), end(MISSING, error="x")], "compaction/end compactionId must be a non-empty string"),
    ("end source", idle, lambda: [start(), end(sourceCommandId="", error="x")], "compaction/end sourceCommandId must be a non-empty string"),
    ("checkpoint id", idle, lambda: [start(), summary(), checkpoint("")], "compaction checkpoint compactionId must be a non-empty string"),
    ("checkpoint source", idle, lambda: [start(), summary(), checkpoint(sourceCommandId=7)], "compaction checkpoint sourceCommandId must be a non-empty string"),
    (
        "summary source differs",
        idle,
        lambda: [start(sourceCommandId="cmd-1"), summary(sourceCommandId="cmd-2")],
        "compaction/summary sourceCommandId cmd-2 does not match compaction/start sourceCommandId cmd-1",
    ),
    (
        "summary source only on summary",
        idle,
        lambda: [start(), summary(sourceCommandId="cmd-1")],
        "compaction/summary sourceCommandId cmd-1 does not match compaction/start sourceCommandId undefined",
    ),
    (
        "end source missing",
        idle,
        lambda: [start(sourceCommandId="cmd-1"), summary(sourceCommandId="cmd-1"), end()],
        "compaction/end sourceCommandId undefined does not match compaction/start sourceCommandId cmd-1",
    ),
    (
        "checkpoint source missing",
        idle,
        lambda: [start(sourceCommandId="cmd-1"), summary(sourceCommandId="cmd-1"), checkpoint()],
        "compaction checkpoint sourceCommandId undefined does not match compaction/start sourceCommandId cmd-1",
    ),
    # -- compaction/start
    ("standalone still compacting", idle, lambda: [start(), start("c2")], "compaction/start while standalone compaction is still compacting"),
    ("turn still compacting", in_turn, lambda: [start(turn=2), start("c2", 2)], "compaction/start while turn 2 is still compacting"),
    ("standalone in a turn", in_turn, lambda: [start(turn=None)], "compaction/start is standalone but turn 2 is open"),
    ("owner outside a turn", idle, lambda: [start(turn=1)], "compaction/start for turn 1 appended outside any open turn"),
    ("owner names another turn", in_turn, lambda: [start(turn=1)], "compaction/start names turn 1 but open turn is 2"),
    ("owner missing", in_turn, lambda: [start(turn=MISSING)], "compaction/start names turn undefined but open turn is 2"),
    # -- compaction/summary
    ("summary unmatched", idle, lambda: [summary()], "compaction/summary has no matching compaction/start"),
    ("summary id differs", idle, lambda: [start(), summary("c2")], "compaction/summary id c2 does not match compaction/start id c1"),
    ("summary repeated", idle, lambda: [start(), summary(), summary()], "compaction/summary repeated within one compaction"),
    ("summary no seqs", idle, lambda: [start(), summary(seqs=())], "compaction/summary shadowedSeqs must be non-empty"),
    (
        "summary range",
        idle,
        lambda: [start(), summary(shadowedRange={"start": 1, "end": 1})],
        "compaction/summary shadowedRange must match the first and last shadowedSeqs",
    ),
    (
        "summary range start",
        idle,
        lambda: [start(), summary(shadowedRange={"start": 0, "end": 3})],
        "compaction/summary shadowedRange must match the first and last shadowedSeqs",
    ),
    # -- compaction/end
    ("end unmatched", idle, lambda: [end(error="x")], "compaction/end has no matching compaction/start"),
    ("end id differs", idle, lambda: [start(), end("c2", error="x")], "compaction/end id c2 does not match compaction/start id c1"),
    ("end owner null", in_turn, lambda: [start(turn=2), end(turn=None, error="x")], "compaction/end owner null does not match compaction/start owner 2"),
    ("end owner number", idle, lambda: [start(), end(turn=2, error="x")], "compaction/end owner 2 does not match compaction/start owner null"),
    ("end owner missing", idle, lambda: [start(), end(turn=MISSING, error="x")], "compaction/end owner undefined does not match compaction/start owner null"),
    ("end owner string", in_turn, lambda: [start(turn=2), end(turn="2", error="x")], "compaction/end owner 2 does not match compaction/start owner 2"),
    ("end without summary", idle, lambda: [start(), end()], "successful compaction/end requires one compaction/summary"),
    # -- the checkpoint
    ("checkpoint unmatched", idle, lambda: [checkpoint()], "compaction checkpoint has no matching compaction/start"),
    ("checkpoint id differs", idle, lambda: [start(), summary(), checkpoint("c2")], "compaction checkpoint id c2 does not match compaction/start id c1"),
    # -- turn boundaries
    ("turn/start crosses standalone", idle, lambda: [start(), EventDraft("turn/start", {"turn": 2})], "turn/start cannot cross an open standalone compaction"),
    (
        "turn/end crosses turn's",
        in_turn,
        lambda: [start(turn=2), EventDraft("turn/end", {"turn": 2, "reason": {"kind": "completed"}})],
        "turn/end cannot cross an open compaction for turn 2",
    ),
    (
        "turn/end crosses after summary",
        in_turn,
        lambda: [start(turn=2), summary(), EventDraft("turn/end", {"turn": 2, "reason": {"kind": "completed"}})],
        "turn/end cannot cross an open compaction for turn 2",
    ),
]


@pytest.mark.parametrize(("base", "drafts", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_rule_vetoes_with_its_message(base: Base, drafts: Callable[[], list[EventDraft]], message: str) -> None:
    rejects(base(), drafts(), message)


@pytest.mark.parametrize("count", [-1, 2**53, 1.5, -0.5, True, "3", None, MISSING])
def test_shadowed_token_count_must_be_a_non_negative_safe_integer(count: Any) -> None:
    bad = summary()
    data = dict(bad.data)  # type: ignore[call-overload]
    if count is MISSING:
        del data["shadowedTokenCount"]
    else:
        data["shadowedTokenCount"] = count
    rejects(idle(), [start(), EventDraft("compaction/summary", data)], "compaction/summary shadowedTokenCount must be a non-negative safe integer")


@pytest.mark.parametrize("count", [0, 3.0, 2**53 - 1])
def test_integral_json_numbers_are_safe_token_counts(count: Any) -> None:
    s = idle()
    s.append_batch([start(), summary(shadowedTokenCount=count), end(error="later")])


def test_valid_brackets_of_every_owner_pass() -> None:
    s = idle()
    # Manual: standalone, with the command's id on every event.
    s.append_batch(transaction(s, "m1", None, (1, 3), sourceCommandId="cmd-1"))
    cp = s.seq - 2
    # Pre-step: inside turn 2, outside a step.
    s.append_batch([EventDraft("turn/start", {"turn": 2}), EventDraft("user/message", user("u2"), "append")])
    s.append_batch(transaction(s, "a1", 2, (cp, s.seq - 1)))
    cp = s.seq - 2
    # Overflow recovery: inside an open step of turn 2 (a float owner is the number 2).
    s.append_batch([EventDraft("step/start", {"turn": 2, "step": 1}), EventDraft("assistant/message", assistant(2, 1, "a2"), "append")])
    s.append_batch(transaction(s, "a2", 2.0, (cp, s.seq - 1)))  # type: ignore[arg-type]
    s.append_batch([EventDraft("step/end", {"turn": 2, "step": 1}), EventDraft("turn/end", {"turn": 2, "reason": {"kind": "completed"}})])
    assert s._vstate.compaction_id is None and s._vstate.open_turn is None


def test_failures_checkpoint_order_and_unbracketed_events_pass() -> None:
    s = idle()
    # A failure before the summary, and one after it (the commit failed).
    s.append_batch([start("f1", sourceCommandId="cmd"), end("f1", sourceCommandId="cmd", error="summary failed")])
    s.append_batch([start("f2"), summary("f2"), end("f2", error="commit failed")])
    # The checkpoint is not required to follow the summary.
    s.append_batch([start("c3"), checkpoint("c3", sources=(s.seq,)), summary("c3", (1, 3)), end("c3")])
    # A compact-sourced message that is not a replace is no checkpoint; a prune is no bracket.
    s.append("user/message", {**user("x"), "source": checkpoint_source("nobody")}, surface_op="append")
    s.append("compaction/prune", {"shadowedRange": {"start": 1, "end": 1}, "shadowedSeqs": [1], "shadowedTokenCount": 3})
    assert s._vstate.compaction_id is None


def test_the_trace_tracks_the_open_bracket() -> None:
    s = in_turn()
    s.append_batch([start("c9", 2, sourceCommandId="cmd-9")])
    t = s._vstate
    assert (t.compaction_id, t.compaction_source, t.compaction_owner, t.compaction_start, t.summarized) == ("c9", "cmd-9", 2, 8, False)
    s.append_batch([summary("c9", sourceCommandId="cmd-9")])
    assert s._vstate.summarized and s._vstate.compaction_id == "c9"
    s.append("compaction/end", {"compactionId": "c9", "sourceCommandId": "cmd-9", "turn": 2})
    assert s._vstate.compaction_id is None and not s._vstate.summarized


def test_an_end_seed_clears_the_open_bracket() -> None:
    s = idle()
    s.append_batch([start("old"), EventDraft(END_SEED, {})])
    s.append_batch([start("new"), end("new", error="x"), EventDraft("turn/start", {"turn": 2})])


# -- seed replay (§1.4) -------------------------------------------------------------------------


def crashed_log(*, in_step: bool) -> list[Any]:
    """A log a crash left with an open automatic bracket inside turn 2 (pre-step, or
    inside a step for overflow recovery), plus crash repair's closers."""
    raw = fresh(None)
    raw.append_batch(closed_turn(1, "1"))
    raw.append_batch([EventDraft("turn/start", {"turn": 2}), EventDraft("user/message", user("u2"), "append")])
    if in_step:
        raw.append_batch([EventDraft("step/start", {"turn": 2, "step": 1}), EventDraft("assistant/message", assistant(2, 1, "a2"), "append")])
    raw.append_batch([start("orphan", 2), summary("orphan", (1, 3))])
    events = list(raw.events)
    closers = interrupted_turn_closers(events)
    assert [e.type for e in closers] == (["step/end", "turn/end"] if in_step else ["turn/end"])
    return events + closers


@pytest.mark.parametrize("in_step", [False, True])
def test_a_stale_orphan_does_not_veto_its_repair_closers(in_step: bool) -> None:
    seed = crashed_log(in_step=in_step)
    # Live appends stay strict: the closer would cross the open bracket.
    live = fresh()
    live.append_batch([EventDraft(e.type, e.data, e.surface_op, e.source_event_seqs) for e in seed[:-1]])
    with pytest.raises(InvariantError, match="turn/end cannot cross an open compaction for turn 2"):
        live.append(seed[-1].type, seed[-1].data)
    # Replayed as a seed, the end-seed that follows proves the orphan stale.
    s = Session.create("s", seed, clock=lambda: 5, validator=RelationalInvariants())
    assert s.events[-1].type == END_SEED and s._vstate.compaction_id is None
    # A later compaction is not blocked.
    s.append_batch([EventDraft("turn/start", {"turn": 3}), EventDraft("user/message", user("u3"), "append")])
    s.append_batch(transaction(s, "next", 3, (1, 3)))
    # Restore (raw records, a second lifecycle) and fork replay the same way.
    records = [event_to_record(e) for e in s.events]
    Session.restore("s", records, header("s"), validator=RelationalInvariants())
    Session.fork_of(s, s.seq - 1, "child", header("child"), validator=RelationalInvariants())


def test_an_orphan_the_seed_closes_later_is_not_stale() -> None:
    seed = crashed_log(in_step=False)
    with pytest.raises(InvariantError, match="turn/end cannot cross an open compaction for turn 2"):
        Session.create("s", [*seed, *_records_after(seed, [end("orphan", 2, error="late")])], validator=RelationalInvariants())


def test_a_closed_standalone_bracket_containing_a_turn_is_rejected_at_install() -> None:
    raw = fresh(None)
    raw.append_batch([start("c1"), *closed_turn(1, "1"), end("c1", error="x")])
    with pytest.raises(InvariantError) as caught:
        Session.create("s", list(raw.events), validator=RelationalInvariants())
    assert caught.value.detail == "turn/start cannot cross an open standalone compaction"
    with pytest.raises(InvariantError, match="turn/start cannot cross an open standalone compaction"):
        Session.restore("s", [event_to_record(e) for e in raw.events], header("s"), validator=RelationalInvariants())


def test_a_stale_orphan_still_has_its_own_events_checked() -> None:
    # The boundary check is skipped for a stale orphan; its owner check is not.
    raw = fresh(None)
    raw.append_batch([start("c1"), EventDraft("turn/start", {"turn": 1}), summary("c1", (0, 0))])
    with pytest.raises(InvariantError) as caught:
        Session.create("s", list(raw.events), validator=RelationalInvariants())
    assert caught.value.detail == "compaction/summary is standalone but turn 1 is open"


def _records_after(seed: list[Any], drafts: list[EventDraft]) -> list[dict[str, Any]]:
    """``drafts`` as records continuing ``seed`` (no validation)."""
    return [
        {"type": d.type, "seq": len(seed) + i, "time": 5, "data": d.data, **({"surfaceOp": d.surface_op} if d.surface_op else {})}
        for i, d in enumerate(drafts)
    ]


# -- the real transaction ----------------------------------------------------------------------


async def summarize_briefly(inp: SummarizationInput) -> SummaryOutput:
    await trio.lowlevel.checkpoint()
    block = freeze({"type": "text", "text": "- asked and answered"})
    return SummaryOutput(summary=(block,), raw_output=(block,), provider="p", model="m", max_tokens=64)  # type: ignore[arg-type]


async def failing_summarizer(inp: SummarizationInput) -> SummaryOutput:
    await trio.lowlevel.checkpoint()
    raise RuntimeError("model down")


async def test_compact_region_writes_brackets_the_invariants_accept() -> None:
    long = "lorem ipsum dolor sit amet " * 40
    async with open_store(validator_factory=RelationalInvariants) as store:
        s = await store.create("s")
        for t in (1, 2):
            await s.append_batch(
                [
                    EventDraft("turn/start", {"turn": t}),
                    EventDraft("user/message", user(f"u{t}", long), "append"),
                    EventDraft("step/start", {"turn": t, "step": 1}),
                    EventDraft("assistant/message", assistant(t, 1, f"a{t}", [{"type": "text", "text": long}]), "append"),
                    EventDraft("step/end", {"turn": t, "step": 1}),
                    EventDraft("turn/end", {"turn": t, "reason": {"kind": "completed"}}),
                ]
            )
        await s.append_batch([EventDraft("turn/start", {"turn": 3}), EventDraft("user/message", user("u3", long), "append")])
        nodes = s.surface()
        # Automatic (owned by turn 3), then a failed one, then a manual one between turns.
        auto = await s.compact_region(nodes[0], nodes[2], summarizer=summarize_briefly)
        with pytest.raises(RuntimeError, match="model down"):
            await s.compact_region(s.surface()[0], s.surface()[1], summarizer=failing_summarizer)
        await s.append("turn/end", {"turn": 3, "reason": {"kind": "completed"}})
        nodes = s.surface()
        manual = await s.compact_region(nodes[0], nodes[1], summarizer=summarize_briefly, manual=True, source_command_id="cmd-1")
        brackets = [(e.type, thaw(e.data).get("turn")) for e in s.events if e.type in ("compaction/start", "compaction/end")]
        assert brackets == [("compaction/start", 3), ("compaction/end", 3)] * 2 + [("compaction/start", None), ("compaction/end", None)]
        assert thaw(list(s.events)[manual.end_seq].data)["sourceCommandId"] == "cmd-1" and auto.end_seq < manual.start_seq
        # The store's validator still guards the session.
        with pytest.raises(InvariantError, match="compaction/end has no matching compaction/start"):
            await s.append("compaction/end", {"compactionId": "stray", "turn": None})


# -- random valid transactions ------------------------------------------------------------------

OPS = st.lists(
    st.sampled_from(["turn", "manual", "manual-failed", "pre-step", "overflow", "failed-after-summary", "crash", "end-seed"]),
    max_size=8,
)


def _replay(events: list[Any]) -> Session:
    return Session.create("s", events, clock=lambda: 5, validator=RelationalInvariants())


@settings(max_examples=60)
@given(OPS)
def test_random_valid_transactions_pass_live_and_replayed(ops: list[str]) -> None:
    s = _replay(crashed_log(in_step=False))  # start from a repaired, stale orphan
    turn = 3
    for k, op in enumerate(ops):
        cid = f"c{k}"
        head = s.surface_snapshot()
        if op in ("manual", "manual-failed", "end-seed"):
            if op == "manual":
                s.append_batch(transaction(s, cid, None, head, sourceCommandId=f"cmd{k}"))
            elif op == "manual-failed":
                s.append_batch([start(cid, None), end(cid, None, error="summary: no text")])
            else:
                s.append(END_SEED, {})
            continue
        s.append_batch([EventDraft("turn/start", {"turn": turn}), EventDraft("user/message", user(f"u{turn}"), "append")])
        if op == "pre-step":
            s.append_batch(transaction(s, cid, turn, head))
        elif op == "failed-after-summary":
            s.append_batch([start(cid, turn), summary(cid, head), end(cid, turn, error="changed")])
        s.append_batch([EventDraft("step/start", {"turn": turn, "step": 1}), EventDraft("assistant/message", assistant(turn, 1, f"a{turn}"), "append")])
        if op == "overflow":
            nodes = s.surface_snapshot()
            s.append_batch(transaction(s, cid, turn, nodes[:-1]))
        if op == "crash":
            # The bracket never closes; the next lifecycle repairs the turn and replays.
            s.append(start(cid, turn).type, start(cid, turn).data)
            s = _replay(list(s.events) + interrupted_turn_closers(list(s.events)))
        else:
            s.append_batch([EventDraft("step/end", {"turn": turn, "step": 1}), EventDraft("turn/end", {"turn": turn, "reason": {"kind": "completed"}})])
        turn += 1
    replayed = _replay(list(s.events))
    assert replayed._vstate.compaction_id is None
    Session.restore("s", [event_to_record(e) for e in s.events], header("s"), validator=RelationalInvariants())
