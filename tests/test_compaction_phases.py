"""Compaction phases: tool-result pruning (§4), summary input and framing (§5.1, §1.1,
§5.3), target resolution and the default summarizer (§5.2) (issue #10)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from harness.agent import (
    Call,
    Delay,
    Fail,
    ModelRequest,
    ProviderStreamError,
    RateLimitedError,
    Say,
    ScriptedProvider,
    StreamChunk,
    TextDelta,
    Think,
    Truncated,
)
from harness.compaction import (
    COMPACTION_INSTRUCTION,
    MARKER,
    PREAMBLE,
    PrunedResult,
    PruneResult,
    SummarizationInput,
    SummaryTarget,
    ToolResultPruneConfig,
    check_shrink,
    estimate_message,
    frame_checkpoint,
    is_compact_checkpoint_source,
    load_basic_compaction_config,
    load_tool_result_prune_config,
    measure,
    prune_content,
    prune_session,
    resolve_summary_target,
    summarization_input,
    summarize,
)
from harness.compaction._prune import text_chars
from harness.errors import (
    CompactionBusyError,
    CompactionCancelledError,
    CompactionChangedError,
    CompactionCommitError,
    CompactionConfigError,
    CompactionError,
    CompactionPersistenceError,
    CompactionSummaryFailedError,
    EmptySummaryError,
    InvariantError,
    ManualCompactionError,
    SessionError,
    SummaryError,
    SummaryNotSmallerError,
    SummaryTargetError,
    SummaryTruncatedError,
    ToolResultPruneConfigError,
)
from harness.session import (
    Event,
    EventDraft,
    RelationalInvariants,
    ReplaceOp,
    Session,
    freeze,
    thaw,
)
from tests.helpers import assistant, tool_call_block, tool_result, user

# -- builders ---------------------------------------------------------------------------------


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


IMAGE: dict[str, Any] = {"type": "image", "attachment": {"id": "img"}}
SMALL = ToolResultPruneConfig(threshold_chars=50, head_chars=5, tail_chars=3)


def joined(content: Sequence[Any]) -> str:
    return "".join(b["text"] for b in content if b.get("type") == "text")


def turn_session(validator: Any = None) -> Session:
    """A session inside turn 1 / step 1, as the agent leaves it when it calls tools."""
    s = Session.create("s", validator=validator if validator is not None else RelationalInvariants())
    s.append("turn/start", {"turn": 1})
    s.append("user/message", user("u1", "do it"), surface_op="append")
    s.append("step/start", {"turn": 1, "step": 1})
    return s


def add_calls(s: Session, *outputs: str, meta: bool = False) -> list[int]:
    """One assistant message calling a tool per output, then each result; returns their seqs."""
    ids = [f"c{i}" for i in range(len(outputs))]
    s.append("assistant/message", assistant(blocks=[tool_call_block(c) for c in ids]), surface_op="append")
    s.append_batch([EventDraft("tool/call", {"turn": 1, "step": 1, "callId": c, "name": "read", "arguments": "{}"}) for c in ids])
    seqs = []
    for c, out in zip(ids, outputs, strict=True):
        data = tool_result(c, text=out)
        if meta:
            data["meta"] = {"bytes": len(out)}
            data["error"] = {"name": "X", "code": "Y"}
            data["extra"] = [1, {"k": None}]
        seqs.append(s.append("tool/result", data, surface_op="append").seq)
    return seqs


# -- ToolResultPruneConfig (§4) ------------------------------------------------------------------


def test_prune_config_defaults_and_marker() -> None:
    c = load_tool_result_prune_config()
    assert (c.threshold_chars, c.head_chars, c.tail_chars) == (8192, 4096, 1024)
    assert c == ToolResultPruneConfig() == load_tool_result_prune_config({})
    assert MARKER == "\n\n[... tool result middle pruned ...]\n\n"
    assert len(MARKER) == 39


def test_prune_config_values_and_integral_floats() -> None:
    c = load_tool_result_prune_config({"thresholdChars": 100.0, "headChars": 0, "tailChars": 61})
    assert (c.threshold_chars, c.head_chars, c.tail_chars) == (100, 0, 61)
    assert type(c.threshold_chars) is int


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"maxChars": 1}, 'unknown key "maxChars" (allowed: thresholdChars, headChars, tailChars)'),
        ({"thresholdChars": 0}, "thresholdChars (0) must be a positive integer"),
        ({"thresholdChars": "9000"}, "thresholdChars (9000) must be a positive integer"),
        ({"thresholdChars": 1.5}, "thresholdChars (1.5) must be a positive integer"),
        ({"thresholdChars": None}, "thresholdChars (null) must be a positive integer"),
        ({"headChars": -1}, "headChars (-1) must be a non-negative integer"),
        ({"headChars": True}, "headChars (true) must be a non-negative integer"),
        ({"tailChars": [1, 2]}, "tailChars (1,2) must be a non-negative integer"),
        ({"tailChars": {}}, "tailChars ([object Object]) must be a non-negative integer"),
        ({"headChars": 8000, "tailChars": 200}, "headChars + marker + tailChars (8239) must be at most thresholdChars (8192)"),
        ({"thresholdChars": 100, "headChars": 31, "tailChars": 31}, "headChars + marker + tailChars (101) must be at most thresholdChars (100)"),
        ({"thresholdChars": 100}, "headChars + marker + tailChars (5159) must be at most thresholdChars (100)"),
        ("nope", "config must be an object"),
    ],
)
def test_prune_config_errors(record: Any, message: str) -> None:
    with pytest.raises(ToolResultPruneConfigError) as info:
        load_tool_result_prune_config(record)
    assert str(info.value) == "ToolResultPruneConfig: " + message
    assert info.value.code == "TOOL_RESULT_PRUNE_CONFIG_INVALID"
    assert isinstance(info.value, CompactionConfigError)


def test_prune_config_exact_fit_and_direct_construction() -> None:
    assert load_tool_result_prune_config({"thresholdChars": 100, "headChars": 30, "tailChars": 31}).tail_chars == 31
    with pytest.raises(ToolResultPruneConfigError, match="must be at most thresholdChars"):
        ToolResultPruneConfig(threshold_chars=10, head_chars=0, tail_chars=0)
    with pytest.raises(ToolResultPruneConfigError, match=r"headChars \(-2\) must be a non-negative integer"):
        ToolResultPruneConfig(head_chars=-2)


# -- prune_content ------------------------------------------------------------------------------


def test_prune_content_within_budget_is_none() -> None:
    assert prune_content([text("x" * 50)], SMALL) is None  # exactly the threshold
    assert prune_content([text("x" * 30), IMAGE, text("y" * 20)], SMALL) is None
    assert prune_content([], SMALL) is None
    assert prune_content([IMAGE] * 100, SMALL) is None  # non-text counts 0


def test_prune_content_one_block() -> None:
    src = "".join(chr(ord("a") + i % 26) for i in range(60))
    out = prune_content([{"type": "text", "text": src, "cache": True}], SMALL)
    assert out == [{"type": "text", "text": src[:5] + MARKER + src[-3:], "cache": True}]


def test_prune_content_marker_in_first_touching_block_and_empties_dropped() -> None:
    # 4 + 10 + 40 + 6 = 60 code points; drop [5, 57).
    content = [text("AAAA"), IMAGE, text("BBBBBBBBBB"), text(""), text("C" * 40), IMAGE, text("DDDDDD")]
    out = prune_content(content, SMALL)
    assert out == [
        text("AAAA"),  # entirely in the head: unchanged
        IMAGE,
        text("B" + MARKER),  # first block touching the dropped interval: its head, then MARKER
        # the empty block and the all-dropped C block are gone
        IMAGE,
        text("DDD"),
    ]
    assert content[2] == text("BBBBBBBBBB")  # the input is untouched


def test_prune_content_marker_when_head_ends_on_a_block_boundary() -> None:
    # head 5 ends exactly after the first block: that block does not touch [5, 57)
    out = prune_content([text("AAAAA"), text("B" * 52), text("CCC")], SMALL)
    assert out == [text("AAAAA"), text(MARKER), text("CCC")]
    # head 0: the marker opens the first block
    cfg = ToolResultPruneConfig(threshold_chars=50, head_chars=0, tail_chars=3)
    assert prune_content([text("x" * 60)], cfg) == [text(MARKER + "xxx")]


def test_prune_content_counts_code_points_not_utf16_units() -> None:
    smile = "\U0001f600"
    src = smile * 60  # 60 code points, 120 UTF-16 units
    out = prune_content([text(src)], SMALL)
    assert out == [text(smile * 5 + MARKER + smile * 3)]
    assert prune_content([text(smile * 50)], SMALL) is None  # 100 UTF-16 units, 50 code points


# Any code point but lone surrogates (the session refuses them), astral ones included.
chars_st = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
blocks_st = st.lists(
    st.one_of(
        st.builds(text, chars_st),
        st.just(IMAGE),
        st.just({"type": "tool-result", "toolCallId": "n", "content": [text("nested " * 20)]}),
        st.builds(lambda t: {"type": "text", "text": t, "ephemeral": 1}, chars_st),
    ),
    max_size=12,
)
configs_st = st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 40)).map(
    lambda t: ToolResultPruneConfig(threshold_chars=t[0] + t[1] + 39 + t[2], head_chars=t[0], tail_chars=t[1])
)


@given(blocks_st, configs_st)
def test_property_prune_content(content: list[dict[str, Any]], cfg: ToolResultPruneConfig) -> None:
    total = text_chars(content)
    out = prune_content(content, cfg)
    if total <= cfg.threshold_chars:
        assert out is None
        return
    assert out is not None
    full = joined(content)
    # exactly head + MARKER + tail, sliced by code point (never inside a character)
    assert joined(out) == full[: cfg.head_chars] + MARKER + full[total - cfg.tail_chars :]
    assert text_chars(out) == cfg.head_chars + len(MARKER) + cfg.tail_chars <= cfg.threshold_chars
    assert text_chars(out) < total
    # idempotent: a second pass does nothing
    assert prune_content(out, cfg) is None
    # non-text blocks kept, in order; no empty text block survives
    assert [b for b in out if b["type"] != "text"] == [b for b in content if b["type"] != "text"]
    assert all(b["text"] for b in out if b["type"] == "text")
    # the marker is in exactly one block: the first text block touching [head, T - tail)
    marked = [i for i, b in enumerate(out) if b["type"] == "text" and MARKER in b["text"]]
    assert len(marked) == 1
    pos, touching = 0, None
    for b in content:
        if b["type"] == "text":
            n = len(b["text"])
            if touching is None and pos < total - cfg.tail_chars and pos + n > cfg.head_chars:
                touching = b
            pos += n
    marked_block = out[marked[0]]
    assert touching is not None
    assert {k: v for k, v in marked_block.items() if k != "text"} == {k: v for k, v in touching.items() if k != "text"}
    head_part = marked_block["text"].split(MARKER)[0]
    assert touching["text"].startswith(head_part)


# -- prune_session ------------------------------------------------------------------------------


def test_prune_session_writes_a_priced_pair_per_result() -> None:
    s = turn_session()
    big1, small, big2 = "a" * 30 + "b" * 40, "tiny", "x" * 51
    r1, r2, r3 = add_calls(s, big1, small, big2, meta=True)
    originals = {seq: s.event(seq) for seq in (r1, r2, r3)}
    before_len = s.seq
    result = prune_session(s, SMALL)

    assert result == PruneResult(
        (
            PrunedResult(r1, before_len + 1, "c0", 70, 47),
            PrunedResult(r3, before_len + 3, "c2", 51, 47),
        ),
        (70 - 47) + (51 - 47),
    )
    events = list(s.events)[before_len:]
    assert [e.type for e in events] == ["compaction/prune", "tool/result"] * 2
    for (price, repl), seq in zip([events[0:2], events[2:4]], (r1, r3), strict=True):
        original = originals[seq]
        assert thaw(price.data) == {
            "shadowedRange": {"start": seq, "end": seq},
            "shadowedSeqs": [seq],
            "shadowedTokenCount": estimate_message(thaw(original.data)["message"]),
        }
        assert price.surface_op is None and price.source_event_seqs is None
        assert repl.surface_op == ReplaceOp(seq, seq)
        assert repl.source_event_seqs == (seq,)
        # the data is the original's (turn, step, error, meta, unknown fields...) but the content
        want = thaw(original.data)
        block = want["message"]["content"][0]
        block["content"] = prune_content(block["content"], SMALL)
        assert thaw(repl.data) == want
    assert thaw(s.event(before_len + 1).data)["message"]["content"][0]["content"] == [text("a" * 5 + MARKER + "bbb")]
    # surface order kept; the small result untouched
    surface = list(s.surface)
    assert surface[-3:] == [before_len + 1, r2, before_len + 3]
    # a second pass prunes nothing, writes nothing
    assert prune_session(s, SMALL) == PruneResult((), 0)
    assert s.seq == before_len + 4


def test_prune_session_is_priced_for_the_meter() -> None:
    s = turn_session()
    s.append("request/header", {"header": {"config": {"provider": "p", "model": "m"}}, "reason": "initial"})
    data = assistant(blocks=[tool_call_block("c0")])
    data["usage"] = {"inputTokens": 5000, "outputTokens": 10}
    s.append("assistant/message", data, surface_op="append")
    s.append("tool/call", {"turn": 1, "step": 1, "callId": "c0", "name": "read", "arguments": "{}"})
    s.append("tool/result", tool_result("c0", text="z" * 4000), surface_op="append")
    before = measure(s)
    assert before.anchor_seq is not None
    prune_session(s, SMALL)
    after = measure(s)
    # the replace is priced by the compaction/prune just before it: still anchored
    assert after.anchor_seq == before.anchor_seq
    assert after.total_tokens < before.total_tokens


def test_prune_session_needs_an_open_turn() -> None:
    s = turn_session()
    (r,) = add_calls(s, "q" * 80)
    s.append("step/end", {"turn": 1, "step": 1})
    s.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    n = s.seq
    with pytest.raises(InvariantError, match="tool/result surface replacement appended outside any open turn"):
        prune_session(s, SMALL)
    assert s.seq == n  # one batch per pair: no dangling compaction/prune
    assert r in s.surface


class VetoSecondReplacement:
    """A validator that lets one tool/result replacement through, then vetoes."""

    def initial(self) -> int:
        return 0

    def check(self, state: int, event: Event) -> int:
        if event.type == "tool/result" and isinstance(event.surface_op, ReplaceOp):
            if state >= 1:
                raise SessionError("vetoed")
            return state + 1
        return state


def test_prune_session_rejection_keeps_earlier_replacements() -> None:
    s = turn_session(VetoSecondReplacement())
    r1, r2 = add_calls(s, "q" * 80, "w" * 80)
    n = s.seq
    with pytest.raises(SessionError, match="vetoed"):
        prune_session(s, SMALL)
    assert [e.type for e in list(s.events)[n:]] == ["compaction/prune", "tool/result"]
    assert list(s.surface)[-2:] == [n + 1, r2]


def test_prune_session_skips_non_text_and_odd_results() -> None:
    s = Session.create("s")  # no validator: appended tool results are not shape-checked
    r = s.append("tool/result", tool_result("c0", text="ok"), surface_op="append").seq
    # over the threshold only through a nested block and an image: text counts 0
    data = tool_result("c9")
    data["message"]["content"][0]["content"] = [IMAGE, {"type": "tool-result", "toolCallId": "n", "content": [text("n" * 99)]}]
    s.append("tool/result", data, surface_op="append")
    # not a tool-result first block: the session would refuse any content change
    s.append("tool/result", {"turn": 1, "step": 1, "message": {"content": [text("t" * 99)]}}, surface_op="append")
    n = s.seq
    assert prune_session(s, SMALL) == PruneResult((), 0)
    assert s.seq == n and r in s.surface


def test_prune_session_only_touches_the_current_surface() -> None:
    s = turn_session()
    (r,) = add_calls(s, "q" * 80)
    # a user checkpoint shadows the result: it is no longer a candidate
    s.append("user/message", user("cp", "summary"), surface_op=ReplaceOp(s.surface[0], r), source_event_seqs=list(s.surface))
    assert prune_session(s, SMALL) == PruneResult((), 0)


# -- summarization input and framing (§5.1, §1.1, §5.3) ----------------------------------------


HEADER = {
    "config": {"provider": "hp", "model": "hm"},
    "system": "be brief",
    "tools": [{"name": "read", "description": "read a file", "parameters": {"type": "object"}}],
}


def test_summarization_input_from_latest_header() -> None:
    s = Session.create("s")
    s.append("request/header", {"header": {"config": {"provider": "x", "model": "y"}, "system": "old"}, "reason": "initial"})
    u = s.append("user/message", user("u1", "hi"), surface_op="append").seq
    empty = s.append("assistant/message", assistant(blocks=[]), surface_op="append").seq
    a = s.append("assistant/message", assistant(mid="a2"), surface_op="append").seq
    s.append("request/header", {"header": HEADER, "reason": "change"})
    got = summarization_input(s, [u, empty, a])
    assert got.system == "be brief"
    assert [thaw(t) for t in got.tools] == HEADER["tools"]
    assert [m["id"] for m in got.messages] == ["u1", "a2"]  # the empty assistant message dropped
    assert got.messages[0] is not None and thaw(got.messages[0]) == user("u1", "hi")


def test_summarization_input_without_header_or_with_empty_parts() -> None:
    s = Session.create("s")
    u = s.append("user/message", user(), surface_op="append").seq
    assert summarization_input(s, [u]) == SummarizationInput(None, (), (s.derive_messages()[0],))
    s.append("request/header", {"header": {"config": {"provider": "x", "model": "y"}, "system": "", "tools": []}, "reason": "initial"})
    got = summarization_input(s, [u])
    assert got.system is None and got.tools == ()


def test_preamble_and_frame() -> None:
    assert PREAMBLE == (
        "This is an automatically generated checkpoint condensing an earlier span of the conversation "
        "to free up context. Treat the captured context as established background and build on it "
        "without restating it. Continue the task directly from the messages that follow, without "
        "acknowledging this checkpoint."
    )
    summary = [text("## Primary Request and Intent\n- x")]
    framed = frame_checkpoint(summary, "cid", message_id="m1")
    assert framed == {
        "id": "m1",
        "role": "user",
        "content": [text(PREAMBLE + "\n\n<compacted-summary>"), *summary, text("</compacted-summary>")],
        "source": {"kind": "plugin", "plugin": "compact", "compactionId": "cid"},
    }
    manual = frame_checkpoint(freeze(summary), "cid", "cmd-7")  # type: ignore[arg-type]
    assert manual["source"] == {"kind": "plugin", "plugin": "compact", "compactionId": "cid", "sourceCommandId": "cmd-7"}
    assert type(manual["id"]) is str and manual["id"] != frame_checkpoint(summary, "cid")["id"]
    assert is_compact_checkpoint_source(manual["source"])


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        ({"kind": "plugin", "plugin": "compact"}, True),
        (freeze({"kind": "plugin", "plugin": "compact", "compactionId": "c"}), True),
        ({"kind": "plugin", "plugin": "dsh-compaction-basic"}, False),
        ({"kind": "user", "plugin": "compact"}, False),
        ({"kind": "plugin"}, False),
        (None, False),
        ("compact", False),
    ],
)
def test_is_compact_checkpoint_source(src: Any, expected: bool) -> None:
    assert is_compact_checkpoint_source(src) is expected


def test_check_shrink() -> None:
    framed = frame_checkpoint([text("short")], "c", message_id="m")
    x = estimate_message(framed)
    assert check_shrink(framed, x + 1) == x
    for y in (x, x - 1):
        with pytest.raises(SummaryNotSmallerError) as info:
            check_shrink(framed, y)
        assert str(info.value) == f"summary is not smaller than the shadowed content ({x} estimated framed tokens >= {y})"
        assert isinstance(info.value, SummaryError)


def test_framed_checkpoint_is_a_valid_replace() -> None:
    s = Session.create("s")
    seqs = [s.append("user/message", user(f"u{i}", "words " * 50), surface_op="append").seq for i in range(3)]
    inp = summarization_input(s, seqs[:2])
    shadowed = sum(estimate_message(m) for m in inp.messages)
    framed = frame_checkpoint([text("- done")], "cid")
    check_shrink(framed, shadowed)
    price = s.append("compaction/summary", {"compactionId": "cid", "summary": [text("- done")], "shadowedRange": {"start": 0, "end": 1}, "shadowedSeqs": seqs[:2], "shadowedTokenCount": shadowed})
    cp = s.append("user/message", framed, surface_op=ReplaceOp(seqs[0], seqs[1]), source_event_seqs=[price.seq, *seqs[:2]])
    assert list(s.surface) == [cp.seq, seqs[2]]


def test_compaction_instruction() -> None:
    for needle in (
        "acting as a compaction engine",
        "Write concise English engineering prose.",
        "numeric values, function signatures, and syntax fragments.",
        "## Primary Request and Intent",
    ):
        assert needle in COMPACTION_INSTRUCTION
    lines = COMPACTION_INSTRUCTION.split("\n")
    assert lines[0].startswith(
        "You are now acting as a compaction engine for this AI coding assistant. Condense the "
        "conversation ABOVE into a structured checkpoint"
    )
    assert (
        'Output EXACTLY the Markdown structure below: keep every section, in order. Use terse bullets, '
        'not prose paragraphs. Write "(none)" for an empty section — never drop a section.'
    ) in lines
    sections = [i for i, line in enumerate(lines) if line.startswith("## ")]
    assert [lines[i] for i in sections] == [
        "## Primary Request and Intent",
        "## Key Technical Concepts",
        "## Files and Code",
        "## Errors and Fixes",
        "## Pending Jobs",
        "## Current Work",
        "## Next Step",
        "## Critical Context",
    ]
    assert all(lines[i + 1].startswith("- ") and not lines[i + 2] for i in sections)  # one bullet each
    rules = lines[lines.index("Rules:") + 1 :]
    assert len(rules) == 5 and all(r.startswith("- ") for r in rules)
    assert "<compacted-summary>" in rules[-1] and "PRIOR" in rules[-1]
    assert sections[0] > lines.index(next(x for x in lines if x.startswith("Output EXACTLY")))


# -- target resolution (§5.2) -------------------------------------------------------------------

NO_TARGET = (
    "no provider/model available for summarization: set both BasicCompactionConfig summarization "
    "fields, route one request, or set both AgentOptions fields"
)


def test_target_resolution_order_and_policy() -> None:
    cfg = load_basic_compaction_config(
        {
            "maxTokens": 1000,
            "modelPolicies": [
                {"provider": "hp", "model": "hm", "maxTokens": 2000},
                {"provider": "ap", "model": "am", "maxTokens": 3000, "summarizationProvider": "sp", "summarizationModel": "sm"},
            ],
        }
    )
    header = freeze(HEADER)
    # header: its pair, under its exact policy
    t = resolve_summary_target(cfg, header, agent_provider="ap", agent_model="am")
    assert (t.provider, t.model, t.max_tokens) == ("hp", "hm", 2000)
    assert t == SummaryTarget("hp", "hm", cfg.policy_for("hp", "hm"))
    # no header: the agent pair is the conversation target; its policy names a summarizer
    t = resolve_summary_target(cfg, None, agent_provider="ap", agent_model="am")
    assert (t.provider, t.model, t.max_tokens) == ("sp", "sm", 3000)
    # the top level applies with no exact policy
    t = resolve_summary_target(cfg, None, agent_provider="zp", agent_model="zm")
    assert (t.provider, t.model, t.max_tokens) == ("zp", "zm", 1000)
    # a configured top-level pair wins over the header
    top = load_basic_compaction_config({"summarizationProvider": "tp", "summarizationModel": "tm"})
    t = resolve_summary_target(top, header)
    assert (t.provider, t.model) == ("tp", "tm")


@pytest.mark.parametrize(
    ("header", "agent"),
    [
        (None, (None, None)),
        (None, ("ap", "")),
        (None, ("", "am")),
        ({"config": {"provider": "", "model": "m"}}, (None, None)),
        ({"config": "x"}, ("ap", None)),
    ],
)
def test_target_resolution_fails_without_a_pair(header: Any, agent: tuple[Any, Any]) -> None:
    with pytest.raises(SummaryTargetError) as info:
        resolve_summary_target(load_basic_compaction_config(), header, agent_provider=agent[0], agent_model=agent[1])
    assert str(info.value) == NO_TARGET
    assert info.value.code == "COMPACTION_NO_SUMMARY_TARGET"
    assert isinstance(info.value, SummaryError) and isinstance(info.value, CompactionError)


# -- the default summarizer (§5.2) --------------------------------------------------------------


def input_of(*texts: str) -> SummarizationInput:
    messages = tuple(freeze(user(f"u{i}", t)) for i, t in enumerate(texts))
    return SummarizationInput("be brief", tuple(freeze(HEADER)["tools"]), messages)  # type: ignore[arg-type, index]


async def test_summarize_request_and_result() -> None:
    provider = ScriptedProvider([[Say("## Primary Request and Intent\n- fix the bug")]])
    inp = input_of("please fix", "done")
    out = await summarize(provider, inp, session_id="s1", max_tokens=777, provider_name="sp", model="sm")
    (req,) = provider.requests
    assert (req.session_id, req.provider, req.model, req.max_tokens, req.purpose) == ("s1", "sp", "sm", 777, "compaction")
    assert req.system == "be brief"
    assert [(t.name, t.description, t.parameters) for t in req.tools] == [("read", "read a file", {"type": "object"})]
    assert list(req.messages[:2]) == list(inp.messages)
    instruction = thaw(req.messages[2])
    assert instruction["role"] == "user" and type(instruction["id"]) is str
    assert instruction["content"] == [text(COMPACTION_INSTRUCTION)]
    assert instruction["source"] == {"kind": "plugin", "plugin": "dsh-compaction-basic"}
    assert [thaw(b) for b in out.summary] == [text("## Primary Request and Intent\n- fix the bug")]
    assert out.raw_output == out.summary
    assert (out.provider, out.model, out.max_tokens, out.llm_stream_call) == ("sp", "sm", 777, True)
    assert out.usage is not None and thaw(out.usage) == {"inputTokens": 10 * 3 + 20, "outputTokens": len("## Primary Request and Intent\n- fix the bug") // 4}


async def test_summarize_keeps_only_text_blocks() -> None:
    provider = ScriptedProvider([[Think("hmm"), Say("- one"), Call("read", {"p": 1}, id="k"), Say("- two")]])
    out = await summarize(provider, input_of("x"), session_id="s", max_tokens=10)
    assert [thaw(b) for b in out.summary] == [text("- one"), text("- two")]
    assert [thaw(b) for b in out.raw_output] == [
        {"type": "reasoning", "text": "hmm"},
        text("- one"),
        {"type": "tool-call", "id": "k", "name": "read", "arguments": '{"p":1}'},
        text("- two"),
    ]
    assert (out.provider, out.model) == ("scripted", "script-1")  # default labels: the provider's
    assert provider.requests[0].system == "be brief"


async def test_summarize_without_system_or_tools() -> None:
    provider = ScriptedProvider([[Say("- ok")]])
    await summarize(provider, SummarizationInput(None, (), ()), session_id="s", max_tokens=5)
    req = provider.requests[0]
    assert req.system is None and req.tools == () and len(req.messages) == 1


async def test_summarize_truncated_is_max_tokens() -> None:
    provider = ScriptedProvider([[Say("- partial"), Truncated()]])
    with pytest.raises(SummaryTruncatedError) as info:
        await summarize(provider, input_of("x"), session_id="s", max_tokens=10)
    assert str(info.value) == "summarization truncated at the token cap (incomplete checkpoint)"
    assert info.value.code == "MAX_TOKENS"


@pytest.mark.parametrize("reply", [[Think("only thinking")], [Call("read")], [Say(" \n\t\u00a0\ufeff\u3000")], []])
async def test_summarize_no_text_is_an_error(reply: list[Any]) -> None:
    with pytest.raises(EmptySummaryError) as info:
        await summarize(ScriptedProvider([reply]), input_of("x"), session_id="s", max_tokens=10)
    assert str(info.value) == "summarization produced no text summary content"
    assert info.value.code == "COMPACTION_EMPTY_SUMMARY"


async def test_summarize_non_js_whitespace_is_text() -> None:
    # U+001C is whitespace to Python's str.strip() but not to JavaScript's trim()
    out = await summarize(ScriptedProvider([[Say("\x1c")]]), input_of("x"), session_id="s", max_tokens=10)
    assert [thaw(b) for b in out.summary] == [text("\x1c")]


async def test_summarize_provider_error_propagates_typed() -> None:
    error = RateLimitedError("slow down", status=429, retry_after_ms=5)
    with pytest.raises(RateLimitedError) as info:
        await summarize(ScriptedProvider([[Say("- a"), Fail(error)]]), input_of("x"), session_id="s", max_tokens=10)
    assert info.value is error


class Recording:
    """A provider whose stream records whether it was closed, around a scripted one."""

    def __init__(self, script: list[list[Any]], fail_with: Exception | None = None) -> None:
        self.inner = ScriptedProvider(script)
        self.name, self.model, self.context_window = "rec", "rec-1", None
        self.closed = False
        self.chunks = 0
        self.fail_with = fail_with

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        inner = self.inner.stream(request)
        try:
            async for chunk in inner:
                self.chunks += 1
                yield chunk
                if self.fail_with is not None:
                    raise self.fail_with
        finally:
            self.closed = True
            await inner.aclose()  # type: ignore[attr-defined]


async def test_summarize_wraps_a_raw_stream_failure() -> None:
    p = Recording([[Say("- a")]], fail_with=ValueError("socket"))
    with pytest.raises(ProviderStreamError) as info:
        await summarize(p, input_of("x"), session_id="s", max_tokens=10)
    assert isinstance(info.value.__cause__, ValueError)
    assert p.closed


async def test_summarize_cancelled_mid_stream_closes_the_stream(autojump_clock: trio.testing.MockClock) -> None:
    p = Recording([[Say("- first part"), Delay(60), Say("- never seen")]])
    with trio.move_on_after(30) as scope:
        await summarize(p, input_of("x"), session_id="s", max_tokens=10)
    assert scope.cancelled_caught
    assert p.closed
    assert 0 < p.chunks < 4  # it was cut mid-reply, after some text arrived
    assert p.inner.remaining == 0 and p.inner.requests[0].purpose == "compaction"


class IteratorStream:
    """A stream that is an iterator object, not a generator: nothing closes it unless
    the consumer calls ``aclose``."""

    def __init__(self, chunks: list[StreamChunk], stall: float) -> None:
        self.chunks, self.stall = chunks, stall
        self.aclosed = 0

    def __aiter__(self) -> IteratorStream:
        return self

    async def __anext__(self) -> StreamChunk:
        if not self.chunks:
            await trio.sleep(self.stall)
            raise StopAsyncIteration
        return self.chunks.pop(0)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()  # runs shielded: a cancelled caller still closes
        self.aclosed += 1


class IteratorProvider:
    name, model, context_window = "it", "it-1", None

    def __init__(self, stream: IteratorStream) -> None:
        self.it = stream

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self.it


async def test_summarize_closes_an_iterator_stream(autojump_clock: trio.testing.MockClock) -> None:
    cut = IteratorStream([TextDelta(0, "- a")], stall=60)
    with trio.move_on_after(1) as scope:
        await summarize(IteratorProvider(cut), input_of("x"), session_id="s", max_tokens=10)
    assert scope.cancelled_caught and cut.aclosed == 1
    done = IteratorStream([TextDelta(0, "- a")], stall=0)
    out = await summarize(IteratorProvider(done), input_of("x"), session_id="s", max_tokens=10)
    assert [thaw(b) for b in out.summary] == [text("- a")] and done.aclosed == 1


async def test_summarize_closes_the_stream_after_success() -> None:
    p = Recording([[Say("- done")]])
    await summarize(p, input_of("x"), session_id="s", max_tokens=10)
    assert p.closed


async def test_summarize_delta_chunks_are_joined() -> None:
    class Deltas:
        name, model, context_window = "d", "d-1", None

        async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
            for piece in ("- a", "bc", "\n- d"):
                yield TextDelta(0, piece)

    out = await summarize(Deltas(), input_of("x"), session_id="s", max_tokens=10)  # no Finish: counts as stop
    assert [thaw(b) for b in out.summary] == [text("- abc\n- d")]
    assert out.usage is None


# -- manual compaction errors (§5.4) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "cls", "code"),
    [
        ("busy", CompactionBusyError, "COMPACTION_BUSY"),
        ("changed", CompactionChangedError, "COMPACTION_CHANGED"),
        ("summary", CompactionSummaryFailedError, "COMPACTION_SUMMARY_FAILED"),
        ("commit", CompactionCommitError, "COMPACTION_COMMIT"),
        ("persistence", CompactionPersistenceError, "COMPACTION_PERSISTENCE"),
        ("cancelled", CompactionCancelledError, "COMPACTION_CANCELLED"),
    ],
)
def test_manual_compaction_error_kinds(kind: str, cls: type[ManualCompactionError], code: str) -> None:
    cause = SummaryTruncatedError("t")
    err = ManualCompactionError.of(kind, "msg", cause=cause, session_id="s")
    assert type(err) is cls and isinstance(err, ManualCompactionError) and isinstance(err, CompactionError)
    assert (err.kind, err.code, str(err), err.session_id) == (kind, code, "msg", "s")
    assert err.__cause__ is cause
    assert kind in ManualCompactionError.KINDS


def test_manual_compaction_error_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown manual compaction kind 'nope'"):
        ManualCompactionError.of("nope", "m")


def test_summarize_under_a_cancellation_at_every_step() -> None:
    # harness.faults on the summarizer: at every scheduler step the caller is
    # cancelled; it either returns a summary or raises Cancelled (nothing raw), and
    # the provider's stream is always closed.
    from harness.faults import Probe, explore

    async def scenario(probe: Probe) -> None:
        provider = Recording([[Say("- first part"), Say(" - second part")]])
        with trio.CancelScope() as caller:
            probe.canceller("caller", caller.cancel)
            probe.arm()
            out = await summarize(provider, input_of("x"), session_id="s", max_tokens=10)
            probe.check(out.summary, "a returned summary holds text")
        probe.disarm()
        probe.check(provider.closed, "the provider's stream was not closed")

    report = explore(scenario, name="summarize")
    assert report.ok, report.distinct()
    assert report.steps["caller"] >= 5
