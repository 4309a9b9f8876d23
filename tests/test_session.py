"""Session core rules: header, seeds, append, surface, construction, derive."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from harness.errors import EventError, HeaderError, NotJsonError, SessionError, SurfaceError
from harness.session import (
    EventDraft,
    FrozenDict,
    ReplaceOp,
    Session,
    derive_event_message,
    event_to_record,
    fold_surface,
    thaw,
)
from tests.helpers import assistant, header, rec, tool_call_block, tool_result, user


def clock() -> int:
    return 42


def fresh(sid: str = "s") -> Session:
    return Session.create(sid, clock=clock)


# -- header (§3) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"version": 1}, "session header version must be 0, got 1"),
        ({"id": "other"}, 'session header id "other" does not match session id "s"'),
        # Interpolated as the reference's String(value): JSON null is "null" (an absent
        # key is "undefined", below), booleans lower-case, arrays joined, objects opaque.
        ({"version": None}, "session header version must be 0, got null"),
        ({"version": True}, "session header version must be 0, got true"),
        ({"version": [1, 2]}, "session header version must be 0, got 1,2"),
        ({"version": {"v": 0}}, "session header version must be 0, got [object Object]"),
        ({"id": None}, 'session header id "null" does not match session id "s"'),
        # Only this port refuses an integral float (docs/differences.md): its fraction shows.
        ({"version": 0.0}, "session header version must be 0, got 0.0"),
        ({"id": False}, 'session header id "false" does not match session id "s"'),
        ({"id": ["s", None]}, 'session header id "s," does not match session id "s"'),
        ({"createdAt": "123"}, "session header createdAt must be a non-negative safe integer"),
        ({"createdAt": 1.5}, "session header createdAt must be a non-negative safe integer"),
        ({"createdAt": -1}, "session header createdAt must be a non-negative safe integer"),
        ({"createdAt": 2**53}, "session header createdAt must be a non-negative safe integer"),
        ({"cwd": 3}, "session header cwd must be a string"),
        ({"cwd": "rel/path"}, 'session header cwd must be an absolute path, got "rel/path"'),
        ({"parentSession": 1}, "session header parentSession must be a string"),
        ({"seedLength": -2}, "session header seedLength must be a non-negative safe integer"),
        ({"origin": "user"}, 'session header origin must be "subagent"'),
        ({"delegationDepth": 1.5}, "session header delegationDepth must be a non-negative safe integer"),
        ({"agentPreset": 5}, "session header agentPreset must be a string"),
    ],
)
def test_header_validation_messages(patch: dict[str, Any], message: str) -> None:
    for build in (
        lambda h: Session.create("s", header=h),
        lambda h: Session.restore("s", [], h),
    ):
        with pytest.raises(HeaderError) as info:
            build({**header("s"), **patch})
        assert str(info.value) == message
        assert info.value.code == "INVALID_HEADER"


def test_header_absent_version_and_id_read_undefined() -> None:
    for build in (
        lambda h: Session.create("s", header=h),
        lambda h: Session.restore("s", [], h),
    ):
        with pytest.raises(HeaderError) as info:
            build({"id": "s", "createdAt": 1})
        assert str(info.value) == "session header version must be 0, got undefined"
        with pytest.raises(HeaderError) as info:
            build({"version": 0, "createdAt": 1})
        assert str(info.value) == 'session header id "undefined" does not match session id "s"'


def test_header_order_version_before_id() -> None:
    with pytest.raises(HeaderError, match="version must be 0"):
        Session.create("s", header={"version": 2, "id": "x", "createdAt": "bad"})


def test_header_not_a_record_and_not_json() -> None:
    with pytest.raises(HeaderError, match="not a plain JSON record"):
        Session.create("s", header=[1])  # type: ignore[arg-type]
    with pytest.raises(HeaderError, match="not losslessly JSON-serializable"):
        Session.create("s", header={**header("s"), "x": {1, 2}})


def test_header_extra_keys_kept_and_fields_carried() -> None:
    s = Session.create(
        "s",
        header=header("s", cwd="/work", parentSession="p", seedLength=3, origin="subagent", delegationDepth=2, agentPreset="x", custom={"k": 1}),
    )
    h = s.header
    assert (h.cwd, h.parent_session, h.seed_length, h.origin, h.delegation_depth, h.agent_preset) == ("/work", "p", 3, "subagent", 2, "x")
    assert h.to_record()["custom"] == {"k": 1}


def test_synthesized_header() -> None:
    s = Session.create("abc", clock=lambda: 777)
    assert s.header.to_record() == {"version": 0, "id": "abc", "createdAt": 777}


# -- append (§6.2) -----------------------------------------------------------------------


def test_append_assigns_seq_and_time_and_freezes() -> None:
    s = fresh()
    data = user()
    ev = s.append("user/message", data, surface_op="append")
    assert (ev.seq, ev.time, ev.surface_op) == (0, 42, "append")
    data["id"] = "mutated"
    assert ev.data["id"] == "u1"  # type: ignore[index]
    assert s.events[0] == ev and s.events[0]._data is ev._data  # stored by column, data shared
    with pytest.raises(AttributeError):
        ev.seq = 5  # type: ignore[misc]


def test_append_does_not_validate_message_shape() -> None:
    s = fresh()
    ev = s.append("user/message", {"content": [], "source": {"kind": "user"}, "extra": 1}, surface_op="append")
    assert ev.seq == 0


def test_append_rejections_in_order() -> None:
    s = fresh()
    with pytest.raises(NotJsonError, match='session event "x/y" carries non-JSON-serializable data'):
        s.append("x/y", {"a": {1, 2}})
    with pytest.raises(EventError, match='session event "request/header-delta" uses unsupported legacy request/header-delta format'):
        s.append("request/header-delta", {})
    with pytest.raises(EventError, match='uses unsupported legacy request/header reason "fallback"'):
        s.append("request/header", {"reason": "fallback", "header": {}})
    with pytest.raises(NotJsonError, match="carries non-JSON-serializable surface metadata"):
        s.append("user/message", user(), surface_op={"op": "replace", "start": float("nan"), "end": 0})
    with pytest.raises(SurfaceError, match='session event "turn/start" is not surface-eligible and cannot carry surfaceOp'):
        s.append("turn/start", {"turn": 1}, surface_op="append")
    with pytest.raises(SurfaceError, match='session event "turn/start" is not surface-eligible and cannot carry sourceEventSeqs'):
        s.append("turn/start", {"turn": 1}, source_event_seqs=[0])
    with pytest.raises(SurfaceError, match='session event "user/message" is surface-eligible and requires a surfaceOp marker'):
        s.append("user/message", user())
    with pytest.raises(SurfaceError, match='session event "user/message" carries an invalid surfaceOp'):
        s.append("user/message", user(), surface_op="prepend")  # type: ignore[arg-type]
    with pytest.raises(SurfaceError, match="carries an invalid replace surfaceOp"):
        s.append("user/message", user(), surface_op={"op": "replace", "start": 0})
    with pytest.raises(SurfaceError, match="carries an invalid replace surfaceOp"):
        s.append("user/message", user(), surface_op={"op": "splice", "start": 0, "end": 0})
    assert s.seq == 0


def test_any_type_string_accepted_and_non_string_refused() -> None:
    s = fresh()
    s.append("my-plugin/thing", None)
    with pytest.raises(EventError):
        s.append(5, {})  # type: ignore[arg-type]
    assert s.seq == 1


def test_provenance_rules() -> None:
    s = fresh()
    s.append("user/message", user(), surface_op="append")
    s.append("turn/start", {"turn": 1})
    with pytest.raises(SurfaceError, match="sourceEventSeqs must not be empty except on assistant/message"):
        s.append("user/message", user("u2"), surface_op="append", source_event_seqs=[])
    s.append("assistant/message", assistant(), surface_op="append", source_event_seqs=[])
    with pytest.raises(SurfaceError, match="sourceEventSeqs must densely contain non-negative safe integers"):
        s.append("user/message", user("u2"), surface_op="append", source_event_seqs=[-1])
    with pytest.raises(SurfaceError, match="sourceEventSeqs must not contain duplicates"):
        s.append("user/message", user("u2"), surface_op="append", source_event_seqs=[0, 0])
    with pytest.raises(SurfaceError, match=r"sourceEventSeqs must reference earlier events: 3 >= current seq 3"):
        s.append("user/message", user("u2"), surface_op="append", source_event_seqs=[0, 3])
    ev = s.append("user/message", user("u2"), surface_op="append", source_event_seqs=[1, 0])
    assert ev.source_event_seqs == (1, 0)


# -- replace (§4.1 step 4-6) ----------------------------------------------------------------


def surface_session() -> Session:
    s = fresh()
    for i in range(5):
        s.append("user/message", user(f"u{i}"), surface_op="append")
    return s


def test_replace_by_surface_position() -> None:
    s = surface_session()
    ev = s.append("user/message", user("sum"), surface_op=ReplaceOp(1, 3), source_event_seqs=[1, 2, 3])
    assert list(s.surface) == [0, 5, 4]
    assert s.generation == 1
    # start numerically larger than end is fine when surface order says so
    s.append("user/message", user("sum2"), surface_op=ReplaceOp(5, 4), source_event_seqs=[5, 4])
    assert list(s.surface) == [0, 6]
    assert ev.surface_op == ReplaceOp(1, 3)


def test_replace_errors() -> None:
    s = surface_session()
    with pytest.raises(SurfaceError, match="surface replace: start seq 9 not found in surface"):
        s.append("user/message", user(), surface_op=ReplaceOp(9, 1))
    with pytest.raises(SurfaceError, match="surface replace: end seq 9 not found in surface"):
        s.append("user/message", user(), surface_op=ReplaceOp(1, 9))
    with pytest.raises(SurfaceError, match=r"surface replace: start seq 3 \(index 3\) is after end seq 1 \(index 1\)"):
        s.append("user/message", user(), surface_op=ReplaceOp(3, 1))
    with pytest.raises(SurfaceError, match="must include every shadowed surface node; missing 1, 2, 3"):
        s.append("user/message", user(), surface_op=ReplaceOp(1, 3))
    with pytest.raises(SurfaceError, match=r"missing 2$"):
        s.append("user/message", user(), surface_op=ReplaceOp(1, 3), source_event_seqs=[1, 3, 0])
    assert s.seq == 5 and list(s.surface) == [0, 1, 2, 3, 4] and s.generation == 0


def tool_session() -> Session:
    s = fresh()
    s.append("assistant/message", assistant(blocks=[tool_call_block("c1")]), surface_op="append")
    s.append("tool/result", tool_result("c1"), surface_op="append")
    s.append("user/message", user(), surface_op="append")
    return s


def test_tool_result_replacement_may_change_only_content() -> None:
    s = tool_session()
    pruned = tool_result("c1", text="[pruned]")
    ev = s.append("tool/result", pruned, surface_op=ReplaceOp(1, 1), source_event_seqs=[1])
    assert list(s.surface) == [0, 3, 2]
    assert derive_event_message(ev) == pruned["message"]


def test_tool_result_replacement_rules() -> None:
    s = tool_session()
    with pytest.raises(SurfaceError, match="must rewrite exactly one current node"):
        s.append("tool/result", tool_result("c1"), surface_op=ReplaceOp(1, 2), source_event_seqs=[1, 2])
    with pytest.raises(SurfaceError, match="must target a current tool/result"):
        s.append("tool/result", tool_result("c1"), surface_op=ReplaceOp(2, 2), source_event_seqs=[2])
    changed = tool_result("c1", text="x", mid="other-id")
    with pytest.raises(SurfaceError, match="may change only content"):
        s.append("tool/result", changed, surface_op=ReplaceOp(1, 1), source_event_seqs=[1])
    err = tool_result("c1")
    err["error"] = {"name": "E", "code": "C"}
    with pytest.raises(SurfaceError, match="may change only content"):
        s.append("tool/result", err, surface_op=ReplaceOp(1, 1), source_event_seqs=[1])
    assert s.seq == 3


def test_tool_result_replacement_blanks_the_first_block_as_the_reference_spreads_it() -> None:
    # The reference compares ``{...data, message: {...message, content: [{...content[0],
    # content: null}]}}``: a missing first block (empty content) and a scalar one
    # spread to nothing, so each blanks to ``[{content: null}]``.
    def pair(before: list[Any], after: list[Any]) -> Session:
        s = Session.create("s")
        first = tool_result("c1")
        first["message"]["content"] = before
        s.append("tool/result", first, surface_op="append")
        second = tool_result("c1")
        second["message"]["content"] = after
        s.append("tool/result", second, surface_op=ReplaceOp(0, 0), source_event_seqs=[0])
        return s

    restored = [{"content": [{"type": "text", "text": "restored"}]}]
    assert list(pair([], restored).surface) == [1]
    assert list(pair([None], [7]).surface) == [1]
    assert list(pair(["ab"], [{"0": "a", "1": "b", "content": []}]).surface) == [1]
    with pytest.raises(SurfaceError, match="may change only content"):
        pair([], [{"type": "tool-result", "content": []}])  # a key the blank block lacks


def test_user_replacement_may_shadow_tool_results() -> None:
    s = tool_session()
    s.append("user/message", user("sum"), surface_op=ReplaceOp(0, 1), source_event_seqs=[0, 1])
    assert list(s.surface) == [3, 2]


# -- batches: plan-then-commit --------------------------------------------------------------


def test_batch_is_atomic() -> None:
    s = surface_session()
    gen, nodes, seq = s.generation, list(s.surface), s.seq
    with pytest.raises(SurfaceError):
        s.append_batch(
            [
                EventDraft("user/message", user("a"), "append"),
                EventDraft("user/message", user("b"), ReplaceOp(0, 5), [0, 1, 2, 3, 4, 5]),
                EventDraft("user/message", user("c"), "prepend"),
            ]
        )
    assert (s.generation, list(s.surface), s.seq) == (gen, nodes, seq)


def test_batch_replace_sees_earlier_drafts() -> None:
    s = surface_session()
    out = s.append_batch(
        [
            EventDraft("user/message", user("a"), "append"),
            EventDraft("user/message", user("b"), ReplaceOp(4, 5), [4, 5]),
            EventDraft("user/message", user("c"), ReplaceOp(6, 6), [6]),
        ]
    )
    assert [e.seq for e in out] == [5, 6, 7]
    assert list(s.surface) == [0, 1, 2, 3, 7]
    assert s.generation == 2


def test_stale_plan_is_refused() -> None:
    s = fresh()
    plan = s.plan([EventDraft("a/b", {})])
    s.append("c/d", {})
    with pytest.raises(SessionError, match="stale append plan"):
        s.commit(plan)
    other = fresh("o")
    with pytest.raises(SessionError):
        other.commit(s.plan([EventDraft("a/b", {})]))
    assert s.seq == 1 and other.seq == 0


# -- construction (§6) ---------------------------------------------------------------------


def test_seed_gets_end_seed_and_first_live_seq() -> None:
    seed = [rec("user/message", 0, user(), surfaceOp="append"), rec("turn/start", 1, {"turn": 1})]
    s = Session.create("s", seed, clock=clock)
    assert [e.type for e in s.events] == ["user/message", "turn/start", "session/end-seed"]
    assert s.first_live_seq == 2 and s.seq == 3
    again = Session.create("s", [thaw(event_to_record(e)) for e in s.events], clock=clock)
    assert again.seq == 3 and again.first_live_seq == 3
    empty = Session.create("s", [], clock=clock)
    assert [e.type for e in empty.events] == ["session/end-seed"] and empty.first_live_seq == 0
    assert Session.create("s").seq == 0


def test_seed_errors() -> None:
    cases: list[tuple[list[Any], str]] = [
        ([{"type": "a", "seq": 0, "time": 0}], "seed event at index 0 has an invalid event envelope"),
        ([{"type": "a", "seq": 0, "time": 0, "data": 1, "extra": 1}], "has an invalid event envelope"),
        ([{"type": "a", "seq": 0, "time": 0, "data": 1, "ignorable": False}], "has an invalid event envelope"),
        ([{"type": "a", "seq": 0, "time": 1.5, "data": 1}], "has an invalid event envelope"),
        ([rec("a", 0, {1, 2})], "seed event at index 0 is not losslessly JSON-serializable"),
        ([rec("request/header-delta", 0, {})], "seed event at index 0 uses unsupported legacy request/header-delta format"),
        ([rec("request/header", 0, {"header": {"config": {"provider": "p"}}})], "seed request/header at index 0 lacks provider/model"),
        ([rec("request/header", 0, {"header": {"config": {"provider": "p", "model": "m", "reasoningEffort": ""}}})], "has an invalid reasoningEffort"),
        ([rec("request/header", 0, {"header": {"config": {"provider": "p", "model": "m"}, "adapterDefaults": {"maxTokens": True}}})], "has invalid adapterDefaults"),
        ([rec("request/header", 0, {"reason": "fallback", "header": {"config": {"provider": "p", "model": "m"}}})], 'uses unsupported legacy request/header reason "fallback"'),
        ([rec("a", 1, {})], "seed event at index 0 has seq 1 (expected 0); seed must be contiguous from 0"),
        ([rec("user/message", 0, user())], "invalid seed event at index 0: session event \"user/message\" is surface-eligible and requires a surfaceOp marker"),
        ([rec("user/message", 0, {**user(), "id": ""}, surfaceOp="append")], "seed user/message at index 0 lacks an identified message"),
        ([rec("user/message", 0, {**user(), "role": "assistant"}, surfaceOp="append")], 'seed user/message at index 0 message must have role "user"'),
        ([rec("user/message", 0, {**user(), "source": {}}, surfaceOp="append")], "message has invalid source"),
        ([rec("user/message", 0, {**user(), "content": "x"}, surfaceOp="append")], "message has invalid content"),
        ([rec("assistant/message", 0, {"message": {**assistant()["message"], "source": {"kind": "user"}}}, surfaceOp="append")], "message must have model source"),
        ([rec("tool/result", 0, {"message": {**tool_result("c")["message"], "source": {"kind": "tool"}}}, surfaceOp="append")], "message must have tool source"),
        ([rec("tool/result", 0, {"message": {**tool_result("c")["message"], "content": []}}, surfaceOp="append")], "message must contain one tool-result block"),
        ([rec("tool/result", 0, {"message": {**tool_result("c")["message"], "source": {"kind": "tool", "callId": "d"}}}, surfaceOp="append")], "message has mismatched tool call ids"),
    ]
    for seed, message in cases:
        builders = [lambda sd: Session.create("s", sd)]
        if "losslessly" not in message:  # restore mode trusts the decoder: no JSON walk
            builders.append(lambda sd: Session.restore("s", sd, header("s")))
        for build in builders:
            with pytest.raises(EventError) as info:
                build([dict(r) for r in seed])
            assert message in str(info.value), (seed, str(info.value))


def test_restore_adopts_without_copy() -> None:
    records = [rec("user/message", 0, user(), surfaceOp="append"), rec("x/y", 1, {"k": [1]})]
    data0 = records[0]["data"]
    s = Session.restore("s", records, header("s"))
    from harness.session import raw_of

    assert raw_of(s.events[0].data) is data0
    assert s.seq == 3 and s.events[2].type == "session/end-seed"


def test_restore_and_snapshot_agree() -> None:
    seed = [
        rec("turn/start", 0, {"turn": 1}),
        rec("user/message", 1, user(), surfaceOp="append"),
        rec("request/context", 2, {"provider": "p", "model": "m"}),
        rec("assistant/message", 3, assistant(blocks=[tool_call_block("c1")]), surfaceOp="append"),
        rec("tool/result", 4, tool_result("c1"), surfaceOp="append"),
        rec("user/message", 5, user("s"), surfaceOp={"op": "replace", "start": 1, "end": 4}, sourceEventSeqs=[1, 3, 4]),
        rec("plugin/x", 6, None, ignorable=True),
    ]
    a = Session.create("s", orjson.loads(orjson.dumps(seed)), header("s"), clock=clock)
    b = Session.restore("s", orjson.loads(orjson.dumps(seed)), header("s"), clock=clock)
    assert list(a.events) == list(b.events)
    assert list(a.surface) == list(b.surface) == [5]
    assert a.events[6].ignorable and a.request_context() == {"provider": "p", "model": "m"}
    assert [orjson.loads(orjson.dumps(event_to_record(e))) for e in a.events][:7] == seed


def test_event_seed_shares_data_not_copies() -> None:
    parent = tool_session()
    child = Session.create("c", list(parent.events), clock=clock)
    pairs = list(zip(child.events, parent.events, strict=False))
    assert all(c == p and c._data is p._data for c, p in pairs)
    assert child.seq == parent.seq + 1 and parent.seq == 3


# -- derive (§5) -----------------------------------------------------------------------------


def test_derive_projection_and_identity() -> None:
    s = fresh()
    s.append("user/message", user(), surface_op="append")
    s.append("assistant/message", assistant(blocks=[]), surface_op="append")
    s.append("turn/start", {"turn": 1})
    s.append("assistant/message", assistant(mid="a2"), surface_op="append")
    first = s.derive_messages()
    assert [m["id"] for m in first] == ["u1", "a2"]
    assert len(s.surface) == 3  # the empty assistant message is a node without a message
    s.append("user/message", user("u3"), surface_op="append")
    second = s.derive_messages()
    assert len(first) == 2 and len(second) == 3
    assert second[0] is first[0]
    assert isinstance(second[0], FrozenDict)
    s.append("user/message", user("sum"), surface_op=ReplaceOp(0, 3), source_event_seqs=[0, 1, 3])
    third = s.derive_messages()
    assert [m["id"] for m in third] == ["sum", "u3"]
    assert [m["id"] for m in second] == ["u1", "a2", "u3"]  # held results never change


def test_fold_surface_matches_live_and_reports_replacements() -> None:
    s = surface_session()
    s.append("user/message", user("sum"), surface_op=ReplaceOp(1, 3), source_event_seqs=[1, 2, 3])
    fold = fold_surface(list(s.events))
    assert fold.nodes == tuple(s.surface)
    assert [(r.seq, r.start, r.end, r.shadowed_seqs) for r in fold.replacements] == [(5, 1, 3, (1, 2, 3))]


@pytest.mark.parametrize("bad", [2**70, -(2**64), 1.5, "now"])
def test_a_clock_out_of_range_is_refused_before_anything_changes(bad: Any) -> None:
    from harness.errors import EventError

    s = Session.create("s1", clock=lambda: 1)
    s.append("feedback/record", {"a": 1})
    s._clock = lambda: bad  # type: ignore[method-assign]
    with pytest.raises(EventError, match=r'session "s1" clock returned'):
        s.append("feedback/record", {"a": 2})
    assert len(s.events) == 1 and s.events[-1].seq == 0
    s._clock = lambda: 2  # type: ignore[method-assign]
    assert s.append("feedback/record", {"a": 3}).seq == 1


async def test_an_out_of_range_clock_never_reaches_the_write_behind(tmp_path: Any) -> None:
    from harness.errors import EventError
    from harness.persistence import JsonlBackend, open_persistence
    from harness.runtime import open_store

    now = [1]
    async with open_store(clock=lambda: now[0]) as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        h = await store.create("c1")
        await h.append("feedback/record", {"a": 1})
        now[0] = 2**70
        with pytest.raises(EventError):
            await h.append("feedback/record", {"a": 2})
        now[0] = 2
        await h.append("feedback/record", {"a": 3})
        await h.flush()
        assert p is not None and [e.seq for e in h.events] == [0, 1]


def _nested(depth: int) -> Any:
    value: Any = {}
    for k in range(depth - 1):
        value = [value] if k % 2 else {"k": value}
    return value


class _StrKey(str):
    pass


class _Int(int):
    pass


def _cyclic() -> Any:
    a: list[Any] = []
    a.append({"a": a})
    return a


@pytest.mark.parametrize(
    "bad",
    [
        (1, 2),
        float("nan"),
        float("inf"),
        -0.0,
        {1: "a"},
        {_StrKey("k"): 1},
        {"k": _Int(1)},
        "\ud800",
        {"\udfff": 1},
        2**64,
        -(2**63) - 1,
        b"bytes",
        {"k": [1, {2, 3}]},
        _cyclic(),
    ],
    ids=repr,
)
def test_append_hot_path_refuses_what_the_walk_refuses(bad: Any) -> None:
    """Issue 26: the append's direct fast walk keeps every rule (and message) of the
    validating copy, in append and in each draft of a batch; nothing lands."""
    s = fresh()
    msg = 'session event "x/y" carries non-JSON-serializable data'
    with pytest.raises(NotJsonError, match=msg):
        s.append("x/y", {"v": bad})
    with pytest.raises(NotJsonError, match=msg):
        s.append_batch([EventDraft("x/y", {}), EventDraft("x/y", {"v": [bad]})])
    assert s.seq == 0


def test_append_depth_limit_through_the_fast_walk_and_past_it() -> None:
    s = fresh()
    for depth in (1, 48, 49, 50, 199, 200):
        ev = s.append("x/y", _nested(depth))
        assert thaw(ev.data) == _nested(depth)
    with pytest.raises(NotJsonError, match='session event "x/y" carries data nested more than 200 levels deep'):
        s.append("x/y", _nested(201))
    with pytest.raises(NotJsonError, match="nested more than 200 levels deep"):
        s.append_batch([EventDraft("x/y", {}), EventDraft("x/y", _nested(201))])
    assert s.seq == 6


def test_event_to_record_of_each_metadata_shape() -> None:
    s = fresh()
    s.append("user/message", user("a"), surface_op="append")
    s.append("user/message", user("b"), surface_op="append")
    s.append("x/y", {"n": 1})
    s.append("user/message", user("c"), surface_op=ReplaceOp(0, 1), source_event_seqs=[0, 1])
    s.append_batch([EventDraft("x/z", {"i": [1]}, ignorable=True)])
    records = [orjson.loads(orjson.dumps(event_to_record(e))) for e in s.events]
    assert records[0] == {"type": "user/message", "seq": 0, "time": 42, "data": thaw(user("a")), "surfaceOp": "append"}
    assert list(records[0]) == ["type", "seq", "time", "data", "surfaceOp"]
    assert records[2] == {"type": "x/y", "seq": 2, "time": 42, "data": {"n": 1}}
    assert list(records[3]) == ["type", "seq", "time", "data", "sourceEventSeqs", "surfaceOp"]
    assert records[3]["surfaceOp"] == {"op": "replace", "start": 0, "end": 1}
    assert records[3]["sourceEventSeqs"] == [0, 1]
    assert records[4] == {"type": "x/z", "seq": 4, "time": 42, "data": {"i": [1]}, "ignorable": True}
