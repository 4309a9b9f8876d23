"""Hypothesis properties of the session core."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import SessionError
from harness.session import (
    EventDraft,
    ReplaceOp,
    Session,
    derive_event_message,
    event_to_record,
    fold_surface,
)
from tests.helpers import user

Op = tuple[str, Any]


def random_ops() -> st.SearchStrategy[list[Op]]:
    step = st.one_of(
        st.tuples(st.just("append"), st.sampled_from(["user/message", "assistant/message", "tool/result", "turn/start", "x/y"])),
        st.tuples(st.just("replace"), st.tuples(st.integers(0, 30), st.integers(0, 30), st.booleans())),
        st.tuples(st.just("bad"), st.integers(0, 3)),
    )
    return st.lists(step, max_size=40)


def draft_for(s: Session, op: Op) -> EventDraft:
    kind, arg = op
    n = s.seq
    if kind == "append":
        if arg == "user/message":
            return EventDraft(arg, user(f"u{n}"), "append")
        if arg == "assistant/message":
            return EventDraft(arg, {"turn": 1, "step": 1, "message": {"id": f"a{n}", "role": "assistant", "content": [] if n % 3 == 0 else [{"type": "text", "text": "t"}], "source": {"kind": "model", "provider": "p", "model": "m"}}}, "append")
        if arg == "tool/result":
            return EventDraft(arg, {"turn": 1, "step": 1, "message": {"id": f"r{n}", "role": "user", "content": [{"type": "tool-result", "toolCallId": "c", "content": []}], "source": {"kind": "tool", "callId": "c"}}}, "append")
        return EventDraft(arg, {"n": n})
    if kind == "replace":
        i, j, cite_all = arg
        nodes = list(s.surface)
        if not nodes:
            return EventDraft("user/message", user(f"s{n}"), ReplaceOp(i, j), [])
        a, b = nodes[i % len(nodes)], nodes[j % len(nodes)]
        lo, hi = sorted((nodes.index(a), nodes.index(b)))
        cited = nodes[lo : hi + 1] if cite_all else nodes[lo : hi + 1][1:]
        return EventDraft("user/message", user(f"s{n}"), ReplaceOp(a, b), cited or None)
    return [
        EventDraft("turn/start", {}, "append"),
        EventDraft("user/message", user(), None),
        EventDraft("user/message", user(), ReplaceOp(10_000, 0)),
        EventDraft("user/message", {"x": {1}}, "append"),
    ][arg]


def state_of(s: Session) -> tuple[Any, ...]:
    return (s.seq, tuple(s.surface), s.generation, tuple(s.events), tuple(s.derive_messages()))


@settings(max_examples=150, deadline=None)
@given(random_ops(), st.integers(1, 4))
def test_live_state_matches_fold_and_rejections_change_nothing(ops: list[Op], batch: int) -> None:
    s = Session.create("p", clock=lambda: 1)
    pending: list[EventDraft] = []
    for op in ops:
        pending.append(draft_for(s, op))
        if len(pending) < batch:
            continue
        before = state_of(s)
        try:
            s.append_batch(pending)
        except SessionError:
            # (c) a rejected batch leaves the session exactly as it was
            assert state_of(s) == before
        pending = []
        # (a) the live surface equals a fold from scratch
        assert tuple(s.surface) == fold_surface(list(s.events)).nodes
        # (b) incremental derive equals derive from scratch
        scratch = [m for seq in fold_surface(list(s.events)).nodes if (m := derive_event_message(s.event(seq))) is not None]
        assert list(s.derive_messages()) == scratch
        rebuilt = Session.create("p", list(s.events))
        assert list(rebuilt.derive_messages()) == scratch


@settings(max_examples=120, deadline=None)
@given(random_ops(), st.data())
def test_restored_log_reads_like_the_original(ops: list[Op], data: st.DataObject) -> None:
    # The restored seed is stored by column (decision 0006): it must read back
    # exactly like the live log it was written from, and fork like it too.
    s = Session.create("p", clock=lambda: 1)
    for op in ops:
        with contextlib.suppress(SessionError):
            s.append_batch([draft_for(s, op)])
    records = [orjson.loads(orjson.dumps(event_to_record(e))) for e in s.events]
    r = Session.restore("p", records, {"version": 0, "id": "p", "createdAt": 1}, clock=lambda: 1)
    n = s.seq
    assert list(r.events)[:n] == list(s.events)
    assert [r.event(i) for i in range(-n - 1, 0)] == list(r.events)
    assert list(r.events[2:n:3]) == list(s.events[2:n:3])
    assert (tuple(r.surface), r.generation) == (tuple(s.surface), s.generation)
    assert list(r.derive_messages()) == list(s.derive_messages())
    assert r.first_live_seq == n and r.event(n).type == "session/end-seed"
    if n:
        boundary = data.draw(st.integers(0, n - 1))
        header = {"version": 0, "id": "c", "createdAt": 1}
        a = Session.fork_of(s, boundary, "c", header, clock=lambda: 1)
        b = Session.fork_of(r, boundary, "c", header, clock=lambda: 1)
        assert list(a.events) == list(b.events)
        assert (tuple(a.surface), a.generation) == (tuple(b.surface), b.generation)
        assert list(a.derive_messages()) == list(b.derive_messages())
        # the child's later appends never reach the parent it shares columns with
        b.append("user/message", user("late"), surface_op="append")
        assert r.seq == n + 1 and list(r.events)[:n] == list(s.events)
        # a fork of a fork past its shared part copies the fork's own columns
        last = b.seq - 1
        c = Session.fork_of(b, last, "d", {"version": 0, "id": "d", "createdAt": 1}, clock=lambda: 1)
        assert list(c.events)[: last + 1] == list(b.events)
        assert list(c.derive_messages()) == list(b.derive_messages())
        c.append("user/message", user("later"), surface_op="append")
        assert b.seq == last + 1 and c.seq == last + 3  # its end-seed, then the append


def test_restore_indexes_nodes_appended_after_a_one_node_replace() -> None:
    # Found by the property above: a one-node replace keeps the position index
    # up to date, but the restore's fast path appends nodes without indexing them,
    # so a later replace of such a node was refused on restore.
    s = Session.create("p", clock=lambda: 1)
    for i in range(8):
        s.append("user/message", user(f"u{i}"), surface_op="append")
    s.append("user/message", user("r0"), surface_op=ReplaceOp(0, 0), source_event_seqs=[0])
    s.append("user/message", user("u9"), surface_op="append")
    s.append("user/message", user("r8"), surface_op=ReplaceOp(9, 9), source_event_seqs=[9])
    records = [orjson.loads(orjson.dumps(event_to_record(e))) for e in s.events]
    r = Session.restore("p", records, {"version": 0, "id": "p", "createdAt": 1}, clock=lambda: 1)
    assert (tuple(r.surface), r.generation) == (tuple(s.surface), s.generation)
