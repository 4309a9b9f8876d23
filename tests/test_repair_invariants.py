"""Crash repair (§9), relational invariants (§11) and request-header folding (§10)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.errors import InvariantError
from harness.session import (
    EventDraft,
    RelationalInvariants,
    Session,
    canonical_header,
    fold_request_header,
    freeze,
    header_equals,
    interrupted_turn_closers,
    thaw,
)
from harness.session._repair import NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT
from tests.helpers import assistant, tool_call_block, tool_result, user


def build(drafts: list[EventDraft], validator: Any = None) -> Session:
    s = Session.create("s", clock=lambda: 5, validator=validator)
    s.append_batch(drafts)
    return s


OPEN_TURN_WITH_CALLS = [
    EventDraft("turn/start", {"turn": 1}),
    EventDraft("user/message", user(), "append"),
    EventDraft("step/start", {"turn": 1, "step": 1}),
    EventDraft("assistant/message", assistant(blocks=[tool_call_block("c1"), tool_call_block("c2")]), "append"),
    EventDraft("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "read", "arguments": "{}"}),
]


def test_closers_for_dangling_calls_step_and_turn() -> None:
    s = build(OPEN_TURN_WITH_CALLS)
    closers = interrupted_turn_closers(list(s.events))
    assert [(e.type, e.seq, e.time) for e in closers] == [
        ("tool/result", 5, 5),
        ("tool/result", 6, 5),
        ("step/end", 7, 5),
        ("turn/end", 8, 5),
    ]
    unknown, not_started, step_end, turn_end = (thaw(e.data) for e in closers)
    assert unknown["error"] == {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}
    assert closers[0].source_event_seqs == (4,)
    assert unknown["message"]["id"] == "interrupted-tool-result-c1-5"
    assert unknown["message"]["content"][0]["content"][0]["text"] == OUTCOME_UNKNOWN_TEXT
    assert unknown["message"]["content"][0]["isError"] is True
    assert not_started["error"] == {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"}
    assert closers[1].source_event_seqs is None
    assert not_started["message"]["content"][0]["content"][0]["text"] == NOT_STARTED_TEXT
    assert step_end == {"turn": 1, "step": 1}
    assert turn_end == {"turn": 1, "reason": {"kind": "interrupted"}}
    # The closers make a valid continuation that satisfies the invariants.
    repaired = Session.create("s", list(s.events) + closers, validator=RelationalInvariants())
    assert repaired.events[-1].type == "session/end-seed"
    assert interrupted_turn_closers(list(repaired.events)) == []


def test_no_closers_for_balanced_or_empty_log() -> None:
    assert interrupted_turn_closers([]) == []
    s = build([EventDraft("turn/start", {"turn": 1}), EventDraft("turn/end", {"turn": 1, "reason": {"kind": "completed"}})])
    assert interrupted_turn_closers(list(s.events)) == []


def test_calls_from_closed_step_get_no_result() -> None:
    s = build(
        [
            EventDraft("turn/start", {"turn": 1}),
            EventDraft("step/start", {"turn": 1, "step": 1}),
            EventDraft("assistant/message", assistant(blocks=[tool_call_block("old")]), "append"),
            EventDraft("step/end", {"turn": 1, "step": 1}),
            EventDraft("tool/call", {"turn": 1, "step": 2, "callId": "orphan", "name": "x", "arguments": "{}"}),
        ]
    )
    closers = interrupted_turn_closers(list(s.events))
    assert [e.type for e in closers] == ["turn/end"]


def test_answered_calls_need_no_result() -> None:
    s = build(
        [
            *OPEN_TURN_WITH_CALLS,
            EventDraft("tool/result", tool_result("c1"), "append"),
            EventDraft("tool/result", tool_result("c2"), "append"),
        ]
    )
    assert [e.type for e in interrupted_turn_closers(list(s.events))] == ["step/end", "turn/end"]


# -- invariants ----------------------------------------------------------------------------


P = 'invariant violated by "@deepseek-ai/dsh-session": '


@pytest.mark.parametrize(
    ("drafts", "message"),
    [
        ([EventDraft("turn/start", {"turn": 2})], "turn/start expected turn 1, got 2"),
        ([EventDraft("turn/start", {"turn": 1}), EventDraft("turn/start", {"turn": 2})], "turn/start 2 while turn 1 is still open"),
        ([EventDraft("turn/end", {"turn": 1, "reason": {"kind": "completed"}})], "turn/end 1 does not match open turn null"),
        (
            [EventDraft("turn/start", {"turn": 1}), EventDraft("step/start", {"turn": 1, "step": 1}), EventDraft("turn/end", {"turn": 1, "reason": {}})],
            "turn/end 1 while step 1 is still open",
        ),
        ([EventDraft("turn/start", {"turn": 1}), EventDraft("step/start", {"turn": 2, "step": 1})], "step/start in turn 2 but open turn is 1"),
        ([EventDraft("turn/start", {"turn": 1}), EventDraft("step/start", {"turn": 1, "step": 3})], "step/start expected step 1 in turn 1, got 3"),
        (
            [EventDraft("turn/start", {"turn": 1}), EventDraft("step/start", {"turn": 1, "step": 1}), EventDraft("step/start", {"turn": 1, "step": 2})],
            "step/start 2 while step 1 is still open",
        ),
        ([EventDraft("assistant/message", assistant(), "append")], "assistant/message names turn 1/step 1 but open is turn null/step null"),
        (
            [EventDraft("turn/start", {"turn": 1}), EventDraft("step/start", {"turn": 1, "step": 1}), EventDraft("tool/result", tool_result("zz"), "append")],
            "tool/result for zz with no prior tool/call in this step",
        ),
        ([EventDraft("request/context", {"provider": "p", "model": "m"})], "request/context appended outside any open turn (core execution events must be turn-enclosed)"),
        # JavaScript's ===: a boolean is never the number it would equal in Python.
        ([EventDraft("turn/start", {"turn": True})], "turn/start expected turn 1, got true"),
        ([EventDraft("turn/start", {"turn": 1}), EventDraft("step/start", {"turn": 1, "step": True})], "step/start expected step 1 in turn 1, got true"),
        ([EventDraft("turn/start", {"turn": 1}), EventDraft("turn/end", {"turn": True, "reason": {}})], "turn/end true does not match open turn 1"),
        (
            [EventDraft("turn/start", {"turn": 1}), EventDraft("step/start", {"turn": 1, "step": 1}), EventDraft("step/end", {"turn": True, "step": 1})],
            "step/end names turn true/step 1 but open is turn 1/step 1",
        ),
        # An absent field is interpolated as "undefined" (a JSON null as "null").
        ([EventDraft("turn/start", {})], "turn/start expected turn 1, got undefined"),
        ([EventDraft("turn/start", {"turn": None})], "turn/start expected turn 1, got null"),
        ([EventDraft("turn/start", {"turn": 1}), EventDraft("turn/end", {"reason": {}})], "turn/end undefined does not match open turn 1"),
        ([EventDraft("turn/start", {"turn": 1}), EventDraft("step/start", {"turn": 1})], "step/start expected step 1 in turn 1, got undefined"),
        ([EventDraft("assistant/chunk", {"chunk": {}})], "assistant/chunk names turn undefined/step undefined but open is turn null/step null"),
    ],
)
def test_invariant_violations(drafts: list[EventDraft], message: str) -> None:
    s = Session.create("s", validator=RelationalInvariants())
    with pytest.raises(InvariantError) as info:
        s.append_batch(drafts)
    assert str(info.value) == P + message
    assert info.value.code == "INVARIANT_VIOLATED"
    assert s.seq == 0  # the veto happened before anything committed


def test_invariants_compare_numbers_by_value() -> None:
    # 1.0 === 1 in the reference: an integral float names the same turn and step.
    s = Session.create("s", validator=RelationalInvariants())
    s.append_batch(
        [
            EventDraft("turn/start", {"turn": 1.0}),
            EventDraft("step/start", {"turn": 1, "step": 1.0}),
            EventDraft("step/end", {"turn": 1.0, "step": 1}),
            EventDraft("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
        ]
    )
    assert s.seq == 4


def test_invariants_allow_synthetic_not_started_and_user_messages_anywhere() -> None:
    s = build(OPEN_TURN_WITH_CALLS, RelationalInvariants())
    s.append_batch(interrupted_drafts(s))
    s.append("user/message", user("late"), surface_op="append")
    assert s.events[-1].type == "user/message"


def interrupted_drafts(s: Session) -> list[EventDraft]:
    return [EventDraft(e.type, e.data, e.surface_op, e.source_event_seqs) for e in interrupted_turn_closers(list(s.events))]


def test_validator_state_rolls_back_with_a_rejected_batch() -> None:
    s = Session.create("s", validator=RelationalInvariants())
    with pytest.raises(InvariantError):
        s.append_batch([EventDraft("turn/start", {"turn": 1}), EventDraft("turn/start", {"turn": 7})])
    s.append("turn/start", {"turn": 1})  # turn 1 is still the expected one
    assert s.seq == 1


def test_bad_seed_fails_construction_with_validator() -> None:
    seed = [{"type": "turn/end", "seq": 0, "time": 0, "data": {"turn": 1, "reason": {}}}]
    with pytest.raises(InvariantError):
        Session.create("s", seed, validator=RelationalInvariants())


# -- request header folding -------------------------------------------------------------


def header_data(**config: Any) -> dict[str, Any]:
    return {"config": {"provider": "p", "model": "m", **config}}


def test_canonical_header_and_equality() -> None:
    h = {**header_data(maxTokens=5), "adapterDefaults": {"maxTokens": False}, "system": "", "tools": []}
    assert canonical_header(freeze(h)) == header_data(maxTokens=5)
    assert header_equals(freeze(h), freeze(header_data(maxTokens=5)))
    assert not header_equals(freeze(header_data(stop=[])), freeze(header_data()))
    assert not header_equals(freeze(header_data(model="x")), freeze(header_data()))
    tools = [{"name": "t", "description": "d", "parameters": {}}]
    assert not header_equals(freeze({**header_data(), "tools": tools}), freeze(header_data()))


def test_fold_request_header_and_session_tracking() -> None:
    s = Session.create("s")
    assert s.request_header() is None and fold_request_header(list(s.events)) is None
    s.append("request/header", {"header": header_data(), "reason": "initial"})
    s.append("request/header", {"header": {**header_data(model="m2"), "system": ""}, "reason": "change"})
    assert s.request_header() == header_data(model="m2")
    assert fold_request_header(list(s.events)) == header_data(model="m2")
