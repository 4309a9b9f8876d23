"""The pure compaction core: meter, measure, tool pairing, selection, config (issue #10)."""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.compaction import (
    BasicCompactionConfig,
    CompactableRange,
    CompactionPolicy,
    Measurement,
    NodeTokens,
    PressureSpec,
    estimate_blocks,
    estimate_message,
    estimate_system,
    estimate_tools,
    load_basic_compaction_config,
    measure,
    select_compactable_range,
    tool_pairing_balanced_after,
    tool_pairing_balanced_before,
    utf16_len,
)
from harness.compaction._cache import cache_for, cached_session_count
from harness.errors import (
    CompactionConfigError,
    CompactionError,
    HarnessError,
    MeterSurfaceMismatchError,
    TargetPressureConfigError,
    ToolPairingError,
)
from harness.session import ReplaceOp, Session, SessionHeader, thaw
from tests.helpers import assistant, tool_call_block, tool_result, user

# -- builders ---------------------------------------------------------------------------------


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def msg(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"id": "m", "role": "user", "content": list(blocks), "source": {"kind": "user"}}


def new_session(sid: str = "s") -> Session:
    return Session.create(sid)


def add_user(s: Session, t: str = "hi", mid: str = "u") -> int:
    return s.append("user/message", user(mid, t), surface_op="append").seq


def add_assistant(s: Session, *calls: str, usage: dict[str, int] | None = None, blocks: list[Any] | None = None) -> int:
    content = blocks if blocks is not None else [text("ok"), *(tool_call_block(c) for c in calls)]
    data = assistant(blocks=content)
    if usage is not None:
        data["usage"] = usage
    return s.append("assistant/message", data, surface_op="append").seq


def add_result(s: Session, call: str, t: str = "out") -> int:
    return s.append("tool/result", tool_result(call, text=t), surface_op="append").seq


HEADER: dict[str, Any] = {
    "config": {"provider": "p", "model": "m"},
    "system": "you are a helpful agent",
    "tools": [{"name": "read", "description": "read a file", "parameters": {"type": "object"}}],
}


def add_header(s: Session, header: dict[str, Any] = HEADER) -> int:
    return s.append("request/header", {"header": header, "reason": "initial"}).seq


def checkpoint(s: Session, start: int, end: int, shadowed_tokens: int | None, kind: str = "compaction/summary") -> int:
    """A priced replace, as the transaction writes it: the pricing event, then the checkpoint."""
    nodes = list(s.surface)
    shadowed = nodes[nodes.index(start) : nodes.index(end) + 1]
    sources = list(shadowed)
    if shadowed_tokens is not None:
        priced = s.append(kind, {"shadowedRange": {"start": start, "end": end}, "shadowedSeqs": shadowed, "shadowedTokenCount": shadowed_tokens})
        sources.append(priced.seq)
    return s.append("user/message", user("cp", "summary"), surface_op=ReplaceOp(start, end), source_event_seqs=sources).seq


def price_of(s: Session, seq: int) -> int:
    return next(n.tokens for n in measure(s).nodes if n.seq == seq)


# -- the meter (§0) ---------------------------------------------------------------------------


def test_text_and_reasoning_blocks() -> None:
    assert estimate_blocks([text("abcde")]) == 2 + 4
    assert estimate_blocks([{"type": "reasoning", "text": "abcd"}]) == 1 + 4
    assert estimate_blocks([text("")]) == 0 + 4
    assert estimate_message(msg(text("abcde"))) == 6 + 4


def test_lengths_are_utf16_code_units() -> None:
    assert utf16_len("😀😀😀") == 6  # astral characters count 2, as in JavaScript
    assert utf16_len("é") == 1
    assert estimate_blocks([text("😀😀😀")]) == 2 + 4  # Python's len (3) would give 1 + 4
    assert estimate_system("😀😀") == 1 + 4


def test_tool_call_and_tool_result_blocks() -> None:
    assert estimate_blocks([{"type": "tool-call", "id": "c", "name": "read", "arguments": '{"a":1}'}]) == 1 + 2 + 4
    nested = {"type": "tool-result", "toolCallId": "c", "content": [text("abcd"), text("abcdefghi")]}
    assert estimate_blocks([nested]) == (1 + 4) + (3 + 4) + 4


def test_unknown_and_malformed_blocks_priced_by_json() -> None:
    image = {"type": "image", "attachment": "x"}
    assert len('{"type":"image","attachment":"x"}') == 33
    assert estimate_blocks([image]) == 4 + 9
    # A text block whose text is not a string is priced as an unknown block.
    assert estimate_blocks([{"type": "text", "text": 5}]) == 4 + math.ceil(len('{"type":"text","text":5}') / 4)


def test_json_prices_write_numbers_as_javascript_does() -> None:
    # JSON.stringify writes an integral float as an integer (1.0 -> "1", 1e16 in full,
    # -0.0 -> "0"); the meter prices the reference's text, not orjson's "1.0".
    assert len('{"type":"x","vv":1}') == 19  # 5 quarters; "1.0" would make it 21, 6
    assert estimate_blocks([{"type": "x", "vv": 1.0}]) == 4 + 5
    assert estimate_blocks([{"type": "x", "vv": 1}]) == 4 + 5
    spec = {"name": "n", "parameters": {"minimum": 0.0, "maximum": 1e16, "step": 0.5, "zero": -0.0}}
    js = '[{"name":"n","parameters":{"minimum":0,"maximum":10000000000000000,"step":0.5,"zero":0}}]'
    assert estimate_tools([spec]) == math.ceil(len(js) / 4) + 4
    # From 1e21 JavaScript writes an exponent too, as orjson does; strings are untouched.
    assert estimate_tools([{"name": "v1.0", "big": 1e21}]) == math.ceil(len('[{"name":"v1.0","big":1e+21}]') / 4) + 4


def test_message_system_and_tools() -> None:
    assert estimate_message(msg()) == 4
    assert estimate_message({"content": "not a list"}) == 4
    assert estimate_system("abcdefgh") == 2 + 4
    assert estimate_tools([]) == 0
    assert estimate_tools(None) == 0
    assert estimate_tools([{"name": "a"}]) == math.ceil(len('[{"name":"a"}]') / 4) + 4


def test_deeply_nested_tool_results_do_not_recurse() -> None:
    block: dict[str, Any] = text("abcd")
    for _ in range(5000):
        block = {"type": "tool-result", "toolCallId": "c", "content": [block]}
    assert estimate_blocks([block]) == 5000 * 4 + 5


# -- measure (§0) -----------------------------------------------------------------------------


def test_measure_heuristic_nodes_in_surface_order() -> None:
    s = new_session()
    u = add_user(s, "abcd")
    empty = add_assistant(s, blocks=[])
    a = add_assistant(s, "c1")
    r = add_result(s, "c1", "abcdefgh")
    m = measure(s)
    assert [n.seq for n in m.nodes] == [u, empty, a, r] == list(s.surface)
    assert m.nodes[0] == NodeTokens(u, (1 + 4) + 4)
    assert m.nodes[1] == NodeTokens(empty, 0)  # an empty assistant message costs 0
    assert m.nodes[2].tokens == estimate_message(assistant(blocks=[text("ok"), tool_call_block("c1")])["message"])
    assert m.nodes[3].tokens == ((2 + 4) + 4) + 4
    assert m.surface_tokens == sum(n.tokens for n in m.nodes)
    assert m.header_tokens == 0 and m.total_tokens == m.surface_tokens and m.anchor_seq is None
    assert m.generation == 0


def test_measure_prices_latest_header_or_the_given_one() -> None:
    s = new_session()
    add_user(s, "abcd")
    add_header(s)
    h = estimate_system(HEADER["system"]) + estimate_tools(HEADER["tools"])
    m = measure(s)
    assert m.header_tokens == h and m.total_tokens == h + m.surface_tokens
    assert measure(s, header=None).header_tokens == 0
    other = {"config": {"provider": "p", "model": "m"}, "system": "abcd"}
    assert measure(s, header=other).header_tokens == 1 + 4
    # An empty system prompt and empty tools are dropped by canonicalisation: 0.
    assert measure(s, header={"config": {"provider": "p", "model": "m"}, "system": "", "tools": []}).header_tokens == 0


def anchored_session(usage: int) -> tuple[Session, int]:
    s = new_session()
    add_header(s)
    add_user(s, "please read the file")
    a = add_assistant(s, "c1", usage={"inputTokens": usage - 10, "outputTokens": 10})
    return s, a


def test_measure_anchors_on_provider_usage() -> None:
    s, a = anchored_session(1000)
    m = measure(s)
    assert m.anchor_seq == a and m.total_tokens == 1000
    r = add_result(s, "c1", "x" * 40)
    m = measure(s)
    assert m.anchor_seq == a and m.total_tokens == 1000 + price_of(s, r)
    # Log-only growth (even a new header of the same value) changes nothing.
    add_header(s)
    s.append("step/end", {"turn": 1, "step": 1})
    assert measure(s).total_tokens == 1000 + price_of(s, r)


def test_measure_usage_below_heuristic_falls_back() -> None:
    s, _ = anchored_session(1000)
    heuristic = measure(s, header=None).surface_tokens + measure(s).header_tokens
    s2, _ = anchored_session(heuristic - 1)
    assert measure(s2).anchor_seq is None and measure(s2).total_tokens == heuristic
    s3, a3 = anchored_session(heuristic)
    assert measure(s3).anchor_seq == a3 and measure(s3).total_tokens == heuristic


def test_measure_needs_that_calls_header_to_equal_the_current_one() -> None:
    s, _ = anchored_session(1000)
    changed = {**HEADER, "system": "another system prompt"}
    m = measure(s, header=changed)
    assert m.anchor_seq is None and m.total_tokens == m.header_tokens + m.surface_tokens
    # A header logged after the call is the current one, not that call's.
    add_header(s, changed)
    assert measure(s).anchor_seq is None
    assert measure(s, header=HEADER).anchor_seq is not None


def test_measure_without_a_header_before_the_call_is_heuristic() -> None:
    s = new_session()
    add_user(s)
    add_assistant(s, usage={"inputTokens": 900, "outputTokens": 100})
    add_header(s)  # logged after the call: not that call's header
    m = measure(s)
    assert m.anchor_seq is None and m.total_tokens == m.header_tokens + m.surface_tokens


def test_measure_uses_only_the_latest_assistant_message() -> None:
    s, _ = anchored_session(1000)
    add_result(s, "c1")
    add_assistant(s)  # no usage
    m = measure(s)
    assert m.anchor_seq is None and m.total_tokens < 1000
    s2, _ = anchored_session(1000)
    add_result(s2, "c1")
    add_assistant(s2, usage={"inputTokens": -1, "outputTokens": 5})
    assert measure(s2).anchor_seq is None


def test_measure_priced_replace_gives_a_signed_delta() -> None:
    s, a = anchored_session(5000)
    r = add_result(s, "c1", "y" * 400)
    before = measure(s)
    result_price = price_of(s, r)
    assert before.total_tokens == 5000 + result_price
    nodes = list(s.surface)
    shadowed = sum(n.tokens for n in before.nodes)
    cp = checkpoint(s, nodes[0], nodes[-1], shadowed)
    m = measure(s)
    assert m.anchor_seq == a and m.nodes == (NodeTokens(cp, price_of(s, cp)),)
    assert m.total_tokens == 5000 + result_price + price_of(s, cp) - shadowed
    assert m.total_tokens < before.total_tokens


def test_measure_prune_event_prices_a_replace_too() -> None:
    s, a = anchored_session(5000)
    r = add_result(s, "c1", "z" * 800)
    pruned = tool_result("c1", text="z")
    priced = s.append("compaction/prune", {"shadowedRange": {"start": r, "end": r}, "shadowedSeqs": [r], "shadowedTokenCount": price_of(s, r)})
    new = s.append("tool/result", pruned, surface_op=ReplaceOp(r, r), source_event_seqs=[r, priced.seq]).seq
    m = measure(s)
    assert m.anchor_seq == a and m.total_tokens == 5000 + price_of(s, new)


def test_measure_unpriced_or_mispriced_replace_falls_back() -> None:
    s, _ = anchored_session(5000)
    add_result(s, "c1")
    nodes = list(s.surface)
    checkpoint(s, nodes[0], nodes[1], None)
    m = measure(s)
    assert m.anchor_seq is None and m.total_tokens == m.header_tokens + m.surface_tokens
    s2, _ = anchored_session(5000)
    add_result(s2, "c1")
    nodes = list(s2.surface)
    priced = s2.append("compaction/summary", {"shadowedRange": {"start": nodes[0], "end": nodes[0]}, "shadowedTokenCount": 1})
    s2.append("user/message", user("cp"), surface_op=ReplaceOp(nodes[0], nodes[1]), source_event_seqs=[*nodes[:2], priced.seq])
    assert measure(s2).anchor_seq is None


def test_measure_replacing_assistant_message_does_not_anchor() -> None:
    s = new_session()
    add_header(s)
    u = add_user(s)
    data = assistant()
    data["usage"] = {"inputTokens": 5000, "outputTokens": 1}
    s.append("assistant/message", data, surface_op=ReplaceOp(u, u), source_event_seqs=[u])
    assert measure(s).anchor_seq is None


def test_measure_incremental_state_is_per_session() -> None:
    s, a = anchored_session(1000)
    child = Session.create("child", seed=list(s.events))
    add_result(s, "c1", "x" * 100)
    assert measure(child).total_tokens == 1000 and measure(child).anchor_seq == a
    assert measure(s).total_tokens > 1000


# -- tool pairing (§2.2) ----------------------------------------------------------------------


def test_pairing_cuts() -> None:
    s = new_session()
    u = add_user(s)
    a = add_assistant(s, "c1", "c2")
    r1 = add_result(s, "c1")
    n = add_user(s, "steer")
    r2 = add_result(s, "c2")
    u2 = add_user(s)
    before = {q: tool_pairing_balanced_before(s, q) for q in (u, a, r1, n, r2, u2)}
    after = {q: tool_pairing_balanced_after(s, q) for q in (u, a, r1, n, r2, u2)}
    assert before == {u: True, a: True, r1: False, n: False, r2: False, u2: True}
    # A multi-call message is balanced only after its last result; a neutral node
    # inside an open pair is unbalanced on both sides.
    assert after == {u: True, a: False, r1: False, n: False, r2: True, u2: True}


def test_head_checkpoint_is_balanced_on_both_sides() -> None:
    s = new_session()
    add_user(s)
    add_assistant(s, "c1")
    r = add_result(s, "c1")
    add_user(s)
    cp = checkpoint(s, s.surface[0], r, 10)
    assert tool_pairing_balanced_before(s, cp) and tool_pairing_balanced_after(s, cp)


def test_pairing_seq_not_found_including_stale_seqs() -> None:
    s = new_session()
    u = add_user(s)
    u2 = add_user(s)
    with pytest.raises(ToolPairingError, match=r"^tool-pairing balance: surface seq 99 not found$"):
        tool_pairing_balanced_before(s, 99)
    assert tool_pairing_balanced_after(s, u)
    checkpoint(s, u, u2, 5)
    with pytest.raises(ToolPairingError, match=r"^tool-pairing balance: surface seq 0 not found$"):
        tool_pairing_balanced_after(s, u)


def test_pairing_orphan_result_is_corrupt() -> None:
    s = new_session()
    add_user(s)
    r = add_result(s, "nobody")  # Session.append does not check pairing; the fold does
    with pytest.raises(ToolPairingError, match=rf"^tool-pairing balance: tool/result at surface seq {r} has no matching tool-call \(corrupt surface\)$") as info:
        tool_pairing_balanced_before(s, 0)
    assert info.value.code == "TOOL_PAIRING" and isinstance(info.value, CompactionError)


class Reads:
    """Counts ``Session.type_at`` calls: the fold reads each node's type once per seq
    (a seq's delta is memoised; only an assistant message's content is read too, from
    the session's memoised derived message). ``missing`` reads as a non-surface type."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, missing: int | None = None) -> None:
        self.count = 0
        original = Session.type_at

        def counted(session: Session, seq: int) -> str:
            self.count += 1
            if seq == missing:
                return "session/not-a-surface-event"
            return original(session, seq)

        monkeypatch.setattr(Session, "type_at", counted)


def test_pairing_node_without_event_is_corrupt(monkeypatch: pytest.MonkeyPatch) -> None:
    s = new_session()
    add_user(s)
    u = add_user(s)
    Reads(monkeypatch, missing=u)
    with pytest.raises(ToolPairingError, match=rf"^tool-pairing balance: surface seq {u} has no matching session event \(corrupt surface\)$"):
        tool_pairing_balanced_after(s, 0)


def test_pairing_cache_folds_incrementally(monkeypatch: pytest.MonkeyPatch) -> None:
    s = new_session()
    add_user(s)
    a = add_assistant(s, "c1")
    reads = Reads(monkeypatch)
    assert not tool_pairing_balanced_after(s, a)
    assert reads.count == 2
    for step in range(5):  # log-only growth reads no events
        s.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": str(step)}})
    assert not tool_pairing_balanced_after(s, a)
    assert reads.count == 2
    r = add_result(s, "c1")
    assert tool_pairing_balanced_after(s, r) and tool_pairing_balanced_before(s, r) is False
    assert reads.count == 3  # only the new node
    u = s.surface[0]
    checkpoint(s, u, r, 10)  # new generation: full rebuild of the 1 remaining node
    assert tool_pairing_balanced_after(s, s.surface[0])
    assert reads.count == 4


def test_pairing_corrupt_tail_commits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    s = new_session()
    add_user(s)
    tool_pairing_balanced_before(s, 0)
    add_user(s)
    add_assistant(s, "c1")
    add_result(s, "c1")
    bad = add_result(s, "c1")
    reads = Reads(monkeypatch)
    message = rf"tool/result at surface seq {bad} has no matching tool-call"
    folded = list(cache_for(s).pairing.after)
    with pytest.raises(ToolPairingError, match=message):
        tool_pairing_balanced_before(s, 0)
    assert reads.count == 4
    assert cache_for(s).pairing.after == folded  # nothing of the failed tail committed
    with pytest.raises(ToolPairingError, match=message):
        tool_pairing_balanced_before(s, 0)
    assert reads.count == 4  # the retry folds from the same point, on memoised deltas


def test_cache_is_dropped_with_its_session() -> None:
    gc.collect()
    base = cached_session_count()
    s = new_session("gone")
    add_user(s)
    tool_pairing_balanced_before(s, 0)
    assert cached_session_count() == base + 1
    del s
    gc.collect()
    assert cached_session_count() == base


def test_sessions_sharing_a_header_value_keep_separate_caches() -> None:
    header = SessionHeader(id="same", created_at=1)
    one = Session.create("same", header=header)
    two = Session.create("same", header=header)
    add_user(one)
    add_assistant(one, "c1")
    add_user(two)
    add_user(two)
    assert not tool_pairing_balanced_after(one, 1)
    assert tool_pairing_balanced_after(two, 1)


# -- a model of the surface, for properties ---------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.integers(0, 30)),
        st.tuples(st.just("assistant"), st.integers(0, 3)),
        st.tuples(st.just("result"), st.integers(0, 30)),
        st.tuples(st.just("log"), st.just(0)),
        st.tuples(st.just("replace"), st.integers(0, 10_000)),
        st.tuples(st.just("query"), st.integers(0, 10_000)),
    ),
    max_size=40,
)


def expected_cuts(s: Session) -> list[bool] | str:
    """Cut balance from scratch (no cache), or the corruption message."""
    count, cuts = 0, [True]
    for seq in s.surface:
        ev = s.event(seq)
        if ev.type == "assistant/message":
            count += sum(1 for b in thaw(ev.data)["message"]["content"] if b["type"] == "tool-call")
        elif ev.type == "tool/result":
            count -= 1
            if count < 0:
                return f"tool-pairing balance: tool/result at surface seq {seq} has no matching tool-call (corrupt surface)"
        cuts.append(count == 0)
    return cuts


def play(s: Session, ops: list[tuple[str, int]]) -> Iterator[None]:
    """Apply ``ops``; yield after each so a property can check the session."""
    open_calls: list[str] = []
    next_call = 0
    for kind, n in ops:
        if kind == "user":
            add_user(s, "u" * n)
        elif kind == "assistant":
            calls = [f"c{next_call + i}" for i in range(n)]
            next_call += n
            open_calls.extend(calls)
            add_assistant(s, *calls)
        elif kind == "result":
            add_result(s, open_calls.pop(0) if open_calls else "orphan", "r" * n)
        elif kind == "log":
            s.append("todo/write", {"todos": []})
        elif kind == "replace" and len(s.surface) >= 1:
            nodes = list(s.surface)
            i = n % len(nodes)
            j = i + (n // len(nodes)) % (len(nodes) - i)
            checkpoint(s, nodes[i], nodes[j], None if n % 2 else 7)
        yield


def check_pairing(s: Session) -> None:
    expected = expected_cuts(s)
    nodes = list(s.surface)
    for p, seq in enumerate(nodes):
        if isinstance(expected, str):
            with pytest.raises(ToolPairingError) as info:
                tool_pairing_balanced_before(s, seq)
            assert str(info.value) == expected
            return
        assert tool_pairing_balanced_before(s, seq) == expected[p]
        assert tool_pairing_balanced_after(s, seq) == expected[p + 1]


@settings(max_examples=150)
@given(OPS)
def test_property_incremental_pairing_matches_full_rebuild(ops: list[tuple[str, int]]) -> None:
    s = new_session()
    for _ in play(s, ops):
        check_pairing(s)  # interleaved: exercises every incremental path
        fresh = Session.create("fresh", seed=list(s.events))
        check_pairing(fresh)  # a fresh session has an empty cache: a full fold


@settings(max_examples=150)
@given(OPS, st.integers(0, 200))
def test_property_selection_never_splits_a_tool_unit(ops: list[tuple[str, int]], retain: int) -> None:
    s = new_session()
    for _ in play(s, ops):
        pass
    if isinstance(expected_cuts(s), str):
        return
    m = measure(s)
    got = select_compactable_range(s, m, retain)
    nodes = list(s.surface)
    if got is None:
        return
    assert got.start == nodes[0]
    end = nodes.index(got.end)
    assert end < len(nodes) - 1  # the newest node is always kept
    assert tool_pairing_balanced_after(s, got.end) and tool_pairing_balanced_before(s, nodes[end + 1])
    # The cut is the newest balanced one at or before where the retention walk stopped.
    walk = len(nodes) - 1
    total = m.nodes[walk].tokens
    while walk > 0 and total < retain:
        walk -= 1
        total += m.nodes[walk].tokens
    assert end + 1 <= walk
    cuts = expected_cuts(s)
    assert isinstance(cuts, list)
    assert not any(cuts[k] for k in range(end + 2, walk + 1))


@settings(max_examples=100)
@given(OPS, st.integers(100, 5000))
def test_property_incremental_measure_matches_a_fresh_one(ops: list[tuple[str, int]], usage: int) -> None:
    s = new_session()
    add_header(s)
    ops = [("assistant", 0), *ops]
    for i, _ in enumerate(play(s, ops)):
        if i == 0:
            # Give the first assistant message a usage anchor via a second one.
            add_assistant(s, usage={"inputTokens": usage, "outputTokens": 0})
        fresh = Session.create("fresh", seed=list(s.events))
        assert measure(s) == measure(fresh)


# -- selection (§2.1) -------------------------------------------------------------------------


def users(n: int) -> tuple[Session, list[int]]:
    s = new_session()
    return s, [add_user(s) for _ in range(n)]


def test_select_empty_and_single_node() -> None:
    s = new_session()
    assert select_compactable_range(s, measure(s), 0) is None
    add_user(s)
    assert select_compactable_range(s, measure(s), 0) is None  # the newest node is kept


def test_select_retain_zero_keeps_only_the_newest() -> None:
    s, seqs = users(3)
    assert select_compactable_range(s, measure(s), 0) == CompactableRange(seqs[0], seqs[1])


def test_select_walks_from_the_tail_until_retained() -> None:
    s, seqs = users(4)
    m = measure(s)
    assert {n.tokens for n in m.nodes} == {9}
    assert select_compactable_range(s, m, 9) == CompactableRange(seqs[0], seqs[2])
    assert select_compactable_range(s, m, 10) == CompactableRange(seqs[0], seqs[1])
    assert select_compactable_range(s, m, 27) == CompactableRange(seqs[0], seqs[0])
    assert select_compactable_range(s, m, 28) is None  # the walk reaches index 0


def test_select_moves_an_unbalanced_cut_toward_the_head() -> None:
    s = new_session()
    u = add_user(s)
    add_assistant(s, "c1")
    add_result(s, "c1")
    add_user(s)
    m = measure(s)
    retain = m.nodes[3].tokens + 1  # stops at the result: cut before it is unbalanced
    assert select_compactable_range(s, m, retain) == CompactableRange(u, u)


def test_select_open_tail_unit_covering_the_surface_is_none() -> None:
    s = new_session()
    add_assistant(s, "c1")
    add_user(s, "steer")
    assert select_compactable_range(s, measure(s), 0) is None


def test_select_merges_a_prior_checkpoint() -> None:
    s, seqs = users(3)
    cp = checkpoint(s, seqs[0], seqs[1], 18)
    later = add_user(s)
    assert select_compactable_range(s, measure(s), 0) == CompactableRange(cp, seqs[2])
    assert list(s.surface) == [cp, seqs[2], later]


def test_select_rejects_a_measurement_of_another_surface() -> None:
    s, _ = users(2)
    m = measure(s)
    add_user(s)
    with pytest.raises(MeterSurfaceMismatchError, match=r"^compaction: token-meter surface does not match the current session surface$") as info:
        select_compactable_range(s, m, 0)
    assert info.value.code == "METER_SURFACE_MISMATCH"
    forged = Measurement(0, 0, 0, (NodeTokens(1, 9), NodeTokens(0, 9), NodeTokens(2, 9)), 0, None)
    with pytest.raises(MeterSurfaceMismatchError):
        select_compactable_range(s, forged, 0)


# -- config (§2.3) ----------------------------------------------------------------------------


def test_config_defaults() -> None:
    cfg = load_basic_compaction_config()
    assert cfg == load_basic_compaction_config({}) == BasicCompactionConfig()
    assert cfg.defaults == CompactionPolicy(
        threshold_ratio=0.8,
        retain_ratio=0.16,
        retain_tokens=None,
        summarization_provider="",
        summarization_model="",
        max_tokens=8192,
        compaction_retries=1,
        max_overflow_retries=1,
    )
    assert cfg.model_policies == () and cfg.auto is True
    with pytest.raises(AttributeError):
        cfg.auto = False  # type: ignore[misc]


def test_config_values_are_resolved() -> None:
    cfg = load_basic_compaction_config(
        {
            "thresholdRatio": 1,
            "retainTokens": 0,
            "summarizationProvider": "p",
            "summarizationModel": "m",
            "maxTokens": 100.0,
            "compactionRetries": 0,
            "maxOverflowRetries": 3,
            "auto": False,
        }
    )
    assert cfg.defaults == CompactionPolicy(1.0, None, 0, "p", "m", 100, 0, 3)
    assert type(cfg.defaults.max_tokens) is int and cfg.auto is False


BAD_CONFIGS = [
    ({"nope": 1}, 'unknown key "nope"'),
    ({"thresholdRatio": 0}, "thresholdRatio must be a number in (0, 1]"),
    ({"thresholdRatio": 1.01}, "thresholdRatio must be a number in (0, 1]"),
    ({"thresholdRatio": "0.5"}, "thresholdRatio must be a number in (0, 1]"),
    ({"thresholdRatio": True}, "thresholdRatio must be a number in (0, 1]"),
    ({"thresholdRatio": float("nan")}, "thresholdRatio must be a number in (0, 1]"),
    ({"retainRatio": -0.1}, "retainRatio must be a number in (0, 1]"),
    ({"retainRatio": 0.1, "retainTokens": 5}, "retainRatio and retainTokens are mutually exclusive"),
    ({"retainRatio": 0.5, "thresholdRatio": 0.5}, "retainRatio (0.5) must be less than the resolved thresholdRatio (0.5)"),
    ({"thresholdRatio": 0.1}, "retainRatio (0.16) must be less than the resolved thresholdRatio (0.1)"),
    ({"retainRatio": 1}, "retainRatio (1) must be less than the resolved thresholdRatio (0.8)"),
    ({"retainTokens": -1}, "retainTokens must be a non-negative integer"),
    ({"retainTokens": 1.5}, "retainTokens must be a non-negative integer"),
    ({"summarizationProvider": "p"}, "summarizationProvider and summarizationModel must be set together as an empty or non-empty pair"),
    ({"summarizationProvider": "", "summarizationModel": "m"}, "summarizationProvider and summarizationModel must be set together as an empty or non-empty pair"),
    ({"summarizationModel": 3}, "summarizationModel must be a string"),
    ({"maxTokens": 0}, "maxTokens must be a positive integer"),
    ({"compactionRetries": -1}, "compactionRetries must be a non-negative integer"),
    ({"maxOverflowRetries": "1"}, "maxOverflowRetries must be a non-negative integer"),
    ({"modelPolicies": {}}, "modelPolicies must be an array"),
    ({"modelPolicies": ["x"]}, "modelPolicies[0] must be an object"),
    ({"modelPolicies": [{"provider": "p", "model": "m"}, 3]}, "modelPolicies[1] must be an object"),
    ({"modelPolicies": [{"provider": "p", "model": "m"}, {"provider": "p", "model": "m"}]}, "duplicate model policy for p/m"),
    ({"modelPolicies": [{"provider": "", "model": "m"}]}, "modelPolicies[0]: provider must be a non-empty string"),
    ({"modelPolicies": [{"provider": "p"}]}, "modelPolicies[0]: model must be a non-empty string"),
    ({"modelPolicies": [{"provider": "p", "model": "m", "auto": True}]}, 'modelPolicies[0]: unknown key "auto"'),
    ({"modelPolicies": [{"provider": "p", "model": "m", "thresholdRatio": 2}]}, "modelPolicies[0]: thresholdRatio must be a number in (0, 1]"),
    ({"modelPolicies": [{"provider": "p", "model": "m", "thresholdRatio": 0.15}]}, "modelPolicies[0]: retainRatio (0.16) must be less than the resolved thresholdRatio (0.15)"),
    ({"modelPolicies": [{"provider": "p", "model": "m", "retainRatio": 0.1, "retainTokens": 1}]}, "modelPolicies[0]: retainRatio and retainTokens are mutually exclusive"),
    ({"modelPolicies": [{"provider": "p", "model": "m", "summarizationModel": "x"}]}, "modelPolicies[0]: summarizationProvider and summarizationModel must be set together as an empty or non-empty pair"),
    ({"auto": "yes"}, "auto must be a boolean"),
    ({"auto": 1}, "auto must be a boolean"),
]


@pytest.mark.parametrize(("record", "message"), BAD_CONFIGS)
def test_config_load_errors(record: dict[str, Any], message: str) -> None:
    with pytest.raises(CompactionConfigError) as info:
        load_basic_compaction_config(record)
    assert str(info.value) == "BasicCompactionConfig: " + message
    assert info.value.code == "COMPACTION_CONFIG_INVALID" and isinstance(info.value, HarnessError)


def test_config_not_an_object() -> None:
    with pytest.raises(CompactionConfigError, match=r"^BasicCompactionConfig: config must be an object$"):
        load_basic_compaction_config([])


def test_policy_merge_on_exact_target() -> None:
    cfg = load_basic_compaction_config(
        {
            "retainTokens": 1000,
            "maxTokens": 4096,
            "modelPolicies": [
                {"provider": "p", "model": "big", "thresholdRatio": 0.9, "retainRatio": 0.2},
                {"provider": "p", "model": "small", "maxOverflowRetries": 0},
            ],
        }
    )
    big = cfg.policy_for("p", "big")
    assert big == CompactionPolicy(0.9, 0.2, None, "", "", 4096, 1, 1)  # retention form replaced
    small = cfg.policy_for("p", "small")
    assert small == CompactionPolicy(0.8, None, 1000, "", "", 4096, 1, 0)  # retention inherited
    assert cfg.policy_for("p", "other") == cfg.defaults == CompactionPolicy(0.8, None, 1000, "", "", 4096, 1, 1)
    assert cfg.policy_for("q", "big") == cfg.defaults
    # The top level's ratio is checked against a policy's own threshold.
    top_tokens = load_basic_compaction_config({"retainTokens": 5, "modelPolicies": [{"provider": "p", "model": "m", "thresholdRatio": 0.01}]})
    assert top_tokens.policy_for("p", "m").threshold_ratio == 0.01


def test_scaling_to_a_context_window() -> None:
    policy = load_basic_compaction_config().defaults
    assert policy.scale(1000, provider="p", model="m") == PressureSpec(800, 160)
    assert policy.scale(128_000.0, provider="p", model="m") == PressureSpec(102_400, 20_480)
    odd = CompactionPolicy(threshold_ratio=0.7, retain_ratio=0.1)
    assert odd.scale(999, provider="p", model="m") == PressureSpec(math.floor(999 * 0.7), math.floor(999 * 0.1)) == PressureSpec(699, 99)
    fixed = CompactionPolicy(retain_ratio=None, retain_tokens=799)
    assert fixed.scale(1000, provider="p", model="m") == PressureSpec(800, 799)


@pytest.mark.parametrize(("window", "shown"), [(0, "0"), (-5, "-5"), (1.5, "1.5"), ("1000", "1000"), (None, "undefined"), (True, "true")])
def test_scaling_rejects_a_bad_window(window: object, shown: str) -> None:
    with pytest.raises(TargetPressureConfigError) as info:
        CompactionPolicy().scale(window, provider="p", model="m")
    assert str(info.value) == f"BasicCompactionConfig: contextWindow ({shown}) must be a positive integer"
    assert info.value.target_key == "p/m" and info.value.code == "TARGET_PRESSURE_CONFIG"


def test_scaling_rejects_retention_at_or_above_threshold() -> None:
    fixed = CompactionPolicy(retain_ratio=None, retain_tokens=800)
    with pytest.raises(TargetPressureConfigError) as info:
        fixed.scale(1000, provider="deepseek", model="chat")
    assert str(info.value) == "BasicCompactionConfig: deepseek/chat retainTokens (800) must be less than threshold tokens 800"
    assert info.value.target_key == "deepseek/chat"
    # A ratio can collide with the threshold after flooring on a tiny window.
    with pytest.raises(TargetPressureConfigError, match=r"retainTokens \(0\) must be less than threshold tokens 0$"):
        CompactionPolicy().scale(1, provider="p", model="m")
