"""``RelationalInvariants.check_batch`` is ``check`` over the events in turn: the same
state after them, the same first veto (its message included). The installed
validators and the replays call it, so any difference would be a different verdict on
the same log. Hypothesis draws runs of the types the rules concern, with turn and step
numbers that are sometimes right and sometimes not, seqs that sometimes go backwards,
and types no rule reads."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import HarnessError, InvariantError
from harness.runtime import open_store
from harness.session import Event, EventDraft, RelationalInvariants, ReplaceOp, Trace

_TYPES = (
    "turn/start",
    "turn/end",
    "step/start",
    "step/end",
    "tool/call",
    "tool/result",
    "assistant/message",
    "assistant/chunk",
    "user/message",
    "todo/write",
    "request/context",
    "session/end-seed",
    "compaction/start",
    "compaction/summary",
    "compaction/end",
    "openai-agents/item",
    "custom/kind",
)

_small = st.integers(min_value=0, max_value=3)
_data = st.fixed_dictionaries(
    {},
    optional={
        "turn": _small,
        "step": _small,
        "callId": st.sampled_from(["a", "b"]),
        "compactionId": st.sampled_from(["c1", "c2"]),
        "shadowedSeqs": st.just([0, 1]),
        "shadowedRange": st.just({"start": 0, "end": 1}),
        "shadowedTokenCount": st.just(5),
        "message": st.just({"source": {"callId": "a"}, "content": [{"text": "x"}]}),
        # A compaction checkpoint's source (read on a user/message replacement).
        "source": st.fixed_dictionaries(
            {"kind": st.just("plugin"), "plugin": st.just("compact")},
            optional={"compactionId": st.sampled_from(["c1", "c2"])},
        ),
    },
)


@st.composite
def _runs(draw: st.DrawFn) -> list[Event]:
    # Mostly a well-formed session (so that runs get past their first events), with
    # a wrong turn, step, seq, id or type now and then.
    events: list[Event] = []
    seq = draw(st.integers(min_value=0, max_value=2))
    turn, step, next_turn, next_step, compaction = None, None, 1, 1, None
    for _ in range(draw(st.integers(min_value=0, max_value=30))):
        seq += draw(st.sampled_from([1] * 12 + [2, 0, -1]))
        op: Any = None
        if draw(st.integers(min_value=0, max_value=9)) == 0:  # anything at all
            t = draw(st.sampled_from(_TYPES))
            data: dict[str, Any] = draw(_data)
            op = draw(st.sampled_from([None, "append", ReplaceOp(0, 0)]))
        else:
            t = draw(st.sampled_from(["item", "item", "user", "turn", "step", "call", "compaction"]))
            if t == "item":
                t, data = draw(st.sampled_from(["openai-agents/item", "custom/kind"])), {"item": {}}
            elif t == "user":
                t, data, op = "user/message", {"role": "user"}, "append"
            elif t == "turn":
                if turn is None:
                    t, data, turn, step, next_step = "turn/start", {"turn": next_turn}, next_turn, None, 1
                elif step is None:
                    t, data, turn, next_turn = "turn/end", {"turn": turn}, None, next_turn + 1
                else:
                    t, data, step, next_step = "step/end", {"turn": turn, "step": step}, None, next_step + 1
            elif t == "step":
                if turn is not None and step is None:
                    t, data, step = "step/start", {"turn": turn, "step": next_step}, next_step
                else:
                    t, data = "assistant/message", {"turn": turn, "step": step}
            elif t == "call":
                t, data = "tool/call", {"turn": turn, "step": step, "callId": "a"}
            elif compaction is None:
                t, data, compaction = "compaction/start", {"compactionId": "c1", "turn": turn}, "c1"
            else:
                t, data, op = "user/message", {"source": {"kind": "plugin", "plugin": "compact", "compactionId": compaction}}, ReplaceOp(0, 0)
        events.append(Event(t, seq, 1, data, op, None))
    return events


def _one_by_one(v: RelationalInvariants, state: Trace, events: list[Event]) -> tuple[Any, ...]:
    try:
        for e in events:
            state = v.check(state, e)
    except HarnessError as exc:
        return ("veto", type(exc), str(exc))
    return ("state", attrs.asdict(state))


def _batched(v: RelationalInvariants, state: Trace, events: list[Event]) -> tuple[Any, ...]:
    try:
        state = v.check_batch(state, events)
    except HarnessError as exc:
        return ("veto", type(exc), str(exc))
    return ("state", attrs.asdict(state))


@settings(max_examples=400, deadline=None)
@given(_runs(), st.booleans())
def test_check_batch_is_check_in_turn(events: list[Event], split: bool) -> None:
    v = RelationalInvariants()
    start = v.initial()
    if split and events:
        # From a state some rules have moved already (an open turn, a compaction).
        head, events = events[: len(events) // 2], events[len(events) // 2 :]
        try:
            start = v.check_batch(start, head)
        except HarnessError:
            return
    assert _batched(v, start, events) == _one_by_one(v, start, events)


def test_a_run_of_unruled_events_makes_one_state_not_one_per_event() -> None:
    v = RelationalInvariants()
    s = v.check(v.initial(), Event("turn/start", 0, 1, {"turn": 1}, None, None))
    items = [Event("openai-agents/item", seq, 1, {"item": {}}, None, None) for seq in range(1, 51)]
    after = v.check_batch(s, items)
    assert after.last_seq == 50 and after.open_turn == 1
    assert attrs.evolve(after, last_seq=0) == s  # nothing else moved
    assert v.check_batch(after, []) is after


def test_a_seq_veto_comes_before_the_type_test_as_in_check() -> None:
    # check tests the seq before it looks at the type: an Event built directly with a
    # type that cannot be hashed (or looked up) is vetoed for its seq, not a TypeError.
    v = RelationalInvariants()
    events = [Event("custom/kind", 5, 1, {}, None, None), Event(["x"], 2, 1, {}, None, None)]  # type: ignore[arg-type]
    assert _batched(v, v.initial(), events) == _one_by_one(v, v.initial(), events)
    assert _batched(v, v.initial(), events)[0] == "veto"


def test_check_batch_keeps_the_last_seq_object_check_keeps() -> None:
    # Events built directly may carry any seq. After a NaN (never <= anything) a seq
    # may equal an earlier one without being it (True after 1): check in turn keeps the
    # later one, and names it in the next veto.
    v = RelationalInvariants()
    nan = float("nan")
    start = v.check(v.initial(), Event("turn/start", 1, 1, {"turn": 1}, None, None))
    odd = [Event("custom/kind", nan, 1, {}, None, None), Event("custom/kind", True, 1, {}, None, None)]
    assert v.check_batch(start, odd).last_seq is True
    events = [*odd, Event("turn/end", 0, 1, {"turn": 1}, None, None)]
    assert _batched(v, start, events) == _one_by_one(v, start, events)


class _NoCustomOutsideATurn(RelationalInvariants):
    """A subclass with a rule of its own, on a type the base class never looks at."""

    def check(self, state: Trace, event: Event) -> Trace:
        if event.type == "custom/kind" and state.open_turn is None:
            raise InvariantError("custom/kind outside a turn")
        return super().check(state, event)


def test_a_subclass_that_overrides_check_is_checked_by_check_batch() -> None:
    v = _NoCustomOutsideATurn()
    events = [Event("custom/kind", 0, 1, {}, None, None)]
    assert _batched(v, v.initial(), events) == _one_by_one(v, v.initial(), events)


def test_an_installed_subclass_vetoes_what_its_own_check_vetoes() -> None:
    # The store's installed validators call check_batch: the subclass's rule holds there.
    async def main() -> None:
        async with open_store(validator_factory=_NoCustomOutsideATurn) as store:
            h = await store.create("s")
            with pytest.raises(InvariantError, match="custom/kind outside a turn"):
                await h.append("custom/kind", {})
            with pytest.raises(InvariantError, match="custom/kind outside a turn"):
                await h.append_batch([EventDraft("user/message", {"role": "user", "content": "x"}, "append"), EventDraft("custom/kind", {})])
            assert len(h.events) == 0

    trio.run(main)


@attrs.frozen(slots=True)
class _Counted(Trace):
    """A subclass's state: the base fields and one of its own."""

    customs: int = 0


class _Counting(RelationalInvariants):
    def initial(self) -> _Counted:
        return _Counted()

    def check(self, state: Trace, event: Event) -> Trace:
        s = super().check(state, event)
        return attrs.evolve(s, customs=s.customs + 1) if event.type == "custom/kind" else s  # type: ignore[attr-defined]


def test_a_trace_subclass_keeps_its_class_and_fields_through_check() -> None:
    # check advanced last_seq as attrs.evolve does (the state's own class), not by
    # building a plain Trace: a subclass's fields survive every event.
    v = _Counting()
    events = [Event("custom/kind", 0, 1, {}, None, None), Event("user/message", 1, 1, {}, "append", None)]
    s = v.check_batch(v.initial(), events)
    assert type(s) is _Counted and s.customs == 1 and s.last_seq == 1
    plain = RelationalInvariants()
    assert type(plain.check_batch(_Counted(customs=3), events)) is _Counted
    assert plain.check_batch(_Counted(customs=3), events).customs == 3
