"""Appended events keep their data as its JSON (decision 0023).

The append hot path no longer copies a value into a tree: it checks it and keeps
orjson's encoding. These tests pin what must not change with that (the values
accepted and refused, the bytes written, what a read returns) and what the change is
for (nothing per appended event for the cyclic collector to visit).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import gc
import math
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from harness.errors import InvariantError
from harness.persistence import JsonlBackend, SqliteBackend, open_persistence
from harness.persistence._postgres import _same
from harness.runtime import open_store
from harness.session import Event, EventDraft, Session, event_to_record, freeze, thaw
from harness.session._events import event_to_write_record
from harness.session._json import (
    SnapshotRefused,
    encode_storable_fast,
    snapshot_storable_fast,
)
from tests.test_json import REJECTED


class Str(str):
    pass


class Int(int):
    pass


class Color(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    LOW = 1


class Tag(enum.StrEnum):
    A = "a"


@dataclasses.dataclass
class Point:
    x: int = 1


def _odd_leaves() -> st.SearchStrategy[Any]:
    """Values orjson would write but the harness refuses, and values orjson refuses."""
    return st.sampled_from(
        [
            *REJECTED,
            (),
            Color.RED,
            Level.LOW,
            Tag.A,
            uuid.UUID(int=7),
            Point(),
            datetime.datetime(2026, 1, 1),
            orjson.Fragment(b"1"),
            Str("s"),
            Int(3),
            {Str("k"): 1},
            {True: 1},
            object(),
        ]
    )


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not (f == 0 and math.copysign(1, f) < 0))
    | st.text(max_size=8)
)


def _tree(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda children: st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=4), children, max_size=4)
        | children.map(lambda v: freeze(v) if _is_json(v) else v),  # our own views, nested
        max_leaves=20,
    )


def _is_json(value: Any) -> bool:
    try:
        snapshot_storable_fast(value)
    except SnapshotRefused:
        return False
    return True


values = _tree(_scalars | _odd_leaves())


def _verdicts(value: Any) -> tuple[bytes | None, bytes | None]:
    try:
        encoded: bytes | None = encode_storable_fast(value)
    except SnapshotRefused:
        encoded = None
    try:
        copied: bytes | None = orjson.dumps(snapshot_storable_fast(value))
    except SnapshotRefused:
        copied = None
    return encoded, copied


@given(values)
def test_the_encoding_accepts_exactly_what_the_copy_accepts_and_writes_the_same_bytes(value: Any) -> None:
    encoded, copied = _verdicts(value)
    assert encoded == copied


@pytest.mark.parametrize(
    "value",
    [
        [1, [2, (3,)]],
        {"a": {"b": [math.nan]}},
        {"a": [Level.LOW]},
        {"a": {"b": Tag.A}},
        {"k": [Str("x")]},
        {"n": -0.0},
        {"big": [2**64]},
        {"u": uuid.UUID(int=1)},
        {Str("k"): 1},
        {"s": "\ud800"},
        [orjson.Fragment(b"{}")],
    ],
)
def test_a_nested_odd_value_is_refused_as_before(value: Any) -> None:
    assert _verdicts(value) == (None, None)


def test_deep_values_fall_back_to_the_copy_with_its_verdict() -> None:
    deep: list[Any] = []
    node = deep
    for _ in range(100):  # past the fast walk (48), within the storable depth (200)
        child: list[Any] = []
        node.append(child)
        node = child
    s = Session.create("deep", clock=lambda: 1)
    event = s.append("tool/call", {"v": deep})
    assert thaw(event.data) == {"v": deep}
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(Exception) as info:
        s.append("tool/call", {"v": cyclic})
    assert getattr(info.value, "code", None) == "NOT_JSON"
    assert s.seq == 1  # nothing half-appended


def _payload(i: int) -> dict[str, Any]:
    return {"id": f"m{i}", "role": "user", "content": [{"type": "text", "text": f"hi {i}"}], "source": {"kind": "user"}}


def test_appended_events_leave_nothing_for_the_collector() -> None:
    s = Session.create("gc", clock=lambda: 1)
    drafts = [EventDraft("user/message", _payload(i), "append") for i in range(2000)]
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for i in range(0, 2000, 50):
            s.append_batch(drafts[i : i + 50])
        grown = len(gc.get_objects()) - before
    finally:
        gc.enable()
    # A copied tree left ~2 tracked containers per event (the dicts that hold a
    # container are untracked only by a full collection): 4,000 here.
    assert grown < 100, grown
    assert s.seq == 2000


def test_an_appended_value_is_a_snapshot_and_reads_are_fresh_equal_trees() -> None:
    s = Session.create("snap", clock=lambda: 1)
    inner = freeze({"k": [1, 2]})
    value: dict[str, Any] = {"id": "m", "role": "user", "content": [{"type": "text", "text": "a"}], "view": inner}
    event = s.append("user/message", value, surface_op="append")
    value["content"].append({"type": "text", "text": "later"})
    value["id"] = "changed"
    read = s.events[0]
    assert read == event
    assert thaw(read.data) == {"id": "m", "role": "user", "content": [{"type": "text", "text": "a"}], "view": {"k": [1, 2]}}
    assert read.data == event.data and read.data is not event.data
    assert s.derive_messages()[0]["id"] == "m"
    assert s.raw_data_at(0)["view"] == {"k": [1, 2]}


def test_the_records_written_are_the_records_of_the_copied_tree() -> None:
    s = Session.create("rec", clock=lambda: 7)
    plain = s.append("user/message", _payload(0), surface_op="append")
    logged = s.append("tool/call", {"turn": 1, "args": [1, 2.5, None, True]})
    (hidden,) = s.append_batch([EventDraft("custom/thing", {"x": [1]}, ignorable=True)])
    for event in (plain, logged, hidden):
        record = event_to_record(event)
        assert orjson.dumps(event_to_write_record(event)) == orjson.dumps(record)
        assert orjson.loads(orjson.dumps(record)) == thaw(record)
    assert event_to_record(hidden)["ignorable"] is True
    assert s.events[2] == hidden


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_encoded_appends_round_trip_through_each_backend_and_a_fork(kind: str, tmp_path: Path) -> None:
    def backend() -> Any:
        return JsonlBackend(tmp_path / "j") if kind == "jsonl" else SqliteBackend(tmp_path / "s.db")

    async def main() -> list[Any]:
        async with open_store(clock=lambda: 5) as store, open_persistence(store, backend()):
            h = await store.create("a", cwd="/w")
            await h.append_batch([EventDraft("user/message", _payload(i), "append") for i in range(3)])
            await h.append("tool/call", {"k": {"z": 1, "a": [1, {"b": None}]}})
            child = await store.fork(h, h.seq - 1, "b")
            await h.flush()
            await child.flush()
            return [list(h.events), list(child.events)]

    parent, child = trio.run(main)
    b = backend()
    assert [thaw(event_to_record(e)) for e in parent] == list(b.load("a").records)
    assert [thaw(event_to_record(e)) for e in child] == list(b.load("b").records)
    if kind == "jsonl":
        (lines,) = [
            f.read_bytes().splitlines()[1:]
            for f in (tmp_path / "j").rglob("session.jsonl")
            if orjson.loads(f.read_bytes().splitlines()[0])["id"] == "a"
        ]
        assert lines == [orjson.dumps(thaw(event_to_record(e))) for e in parent]


def test_the_postgres_retry_check_compares_encoded_data_by_content() -> None:
    stored = [{"type": "tool/call", "seq": 1, "time": 2, "data": {"a": 1, "b": [2]}}]
    given_ = [{"type": "tool/call", "seq": 1, "time": 2, "data": orjson.Fragment(b'{"b":[2],"a":1}')}]
    assert _same(stored, given_)
    other = [{"type": "tool/call", "seq": 1, "time": 2, "data": orjson.Fragment(b'{"b":[3],"a":1}')}]
    assert not _same(stored, other)


def _encoded(s: Session) -> list[bool]:
    # Which events' data the log keeps as JSON (decision 0023's rule, pinned here).
    return [type(d) is bytes for d in s._events.own.datas]


def test_surface_events_are_kept_as_trees_once_the_surface_is_derived() -> None:
    s = Session.create("rule", clock=lambda: 1)
    s.append("user/message", _payload(0), surface_op="append")
    s.append("tool/call", {"id": "c"})
    assert s.derive_messages()[0]["id"] == "m0"  # the encoded event decodes for the derive
    s.append("user/message", _payload(1), surface_op="append")
    s.append("tool/call", {"id": "d"})
    assert _encoded(s) == [True, True, False, True]
    assert [m["id"] for m in s.derive_messages()] == ["m0", "m1"]


def test_a_validated_session_keeps_trees_for_the_types_its_validator_reads() -> None:
    from harness.session import RelationalInvariants

    s = Session.create("checked", clock=lambda: 1, validator=RelationalInvariants())
    s.append("user/message", _payload(0), surface_op="append")  # no rule reads its data
    s.append("turn/start", {"turn": 1})  # the turn rules read it
    s.append("custom/kind", {"a": 1})
    s.append("step/start", {"turn": 1, "step": 1})
    assert _encoded(s) == [True, False, True, False]
    # The rules still hold over the encoded events (a turn/start is checked from its tree).
    with pytest.raises(InvariantError, match="turn/start 2 while turn 1 is still open"):
        s.append("turn/start", {"turn": 2})


class _Counting:
    """A validator that reads the data of every event it checks (no ``reads_data``)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def initial(self) -> int:
        return 0

    def check(self, state: int, event: Event) -> int:
        self.seen.append(event.data)
        return state + 1


class _ReadsCustom(_Counting):
    reads_data = frozenset({"custom/kind"})


def test_a_validator_that_declares_no_reads_keeps_every_event_as_a_tree() -> None:
    v = _Counting()
    s = Session.create("all", clock=lambda: 1, validator=v)
    s.append("user/message", _payload(0), surface_op="append")
    s.append("custom/kind", {"a": 1})
    assert _encoded(s) == [False, False]
    assert v.seen == [_payload(0), {"a": 1}]


def test_a_validator_declaring_its_reads_sees_the_same_data_either_way() -> None:
    # reads_data decides only how the data is kept: a validator reading a type it did
    # not name still gets that event's data (decoded), equal to what it appended.
    v = _ReadsCustom()
    s = Session.create("some", clock=lambda: 1, validator=v)
    s.append("user/message", _payload(0), surface_op="append")
    s.append("custom/kind", {"a": [1, 2]})
    assert _encoded(s) == [True, False]
    assert [thaw(d) for d in v.seen] == [_payload(0), {"a": [1, 2]}]


@pytest.mark.parametrize("reads", ["custom/kind", 5, [1, "a"]])
def test_a_reads_declaration_that_is_not_a_set_of_types_means_every_type(reads: object) -> None:
    v = _Counting()
    v.reads_data = reads  # type: ignore[attr-defined]
    s = Session.create("odd", clock=lambda: 1, validator=v)
    s.append("custom/kind", {"a": 1})
    assert _encoded(s) == [False]


def test_chunk_deltas_and_request_headers_are_kept_as_trees() -> None:
    s = Session.create("kept", clock=lambda: 1)
    s.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "a"}})
    s.append("custom/kind", {"a": 1})
    assert _encoded(s) == [False, True]


def test_an_encoded_event_holds_about_its_bytes_in_memory() -> None:
    import tracemalloc

    s = Session.create("mem", clock=lambda: 1)
    drafts = [EventDraft("user/message", _payload(i), "append") for i in range(2000)]
    size = sum(len(orjson.dumps(d.data)) for d in drafts) / len(drafts)
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(0, 2000, 50):
            s.append_batch(drafts[i : i + 50])
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] / 2000
    finally:
        tracemalloc.stop()
    # orjson's own result keeps its 4 KiB output buffer: kept as it is, each event
    # would hold ~4 KiB for ~90 bytes of JSON.
    assert retained < size + 200, (retained, size)


def test_the_hot_paths_event_factory_makes_the_constructors_event() -> None:
    import attrs

    from harness.session import Event
    from harness.session._events import plain_event

    for data, op in ((b'{"a":1}', "append"), ({"a": 1}, None)):
        made = plain_event("user/message", 3, 9, data, op)  # type: ignore[arg-type]
        built = Event("user/message", 3, 9, data, op, None)  # type: ignore[arg-type]
        assert attrs.astuple(made) == attrs.astuple(built) and made == built
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            made.seq = 4  # type: ignore[misc]


def test_an_ignorable_appended_event_is_kept_whole_with_its_json_and_reads_back_by_seq() -> None:
    # Kept whole (an ignorable event), its data entry is the data's JSON, not a
    # restored record line: the by-seq readers (derive, compaction's raw_data_at)
    # decode it as the data itself.
    s = Session.create("whole", clock=lambda: 1)
    s.append_batch(
        [
            EventDraft("user/message", _payload(0), "append", ignorable=True),
            EventDraft("tool/call", {"k": [1, {"b": None}]}, ignorable=True),
        ]
    )
    assert _encoded(s) == [True, True]
    assert s.raw_data_at(0) == _payload(0)
    assert s.raw_data_at(1) == {"k": [1, {"b": None}]}
    assert [thaw(m) for m in s.derive_messages()] == [_payload(0)]
    child = Session.fork_of(s, 1, "whole-child", {"version": 0, "id": "whole-child", "createdAt": 1}, clock=lambda: 1)
    assert child.raw_data_at(1) == {"k": [1, {"b": None}]} and child.events[0].ignorable


def test_a_session_under_a_store_installed_validator_keeps_trees_and_one_without_encodes() -> None:
    from harness.session import RelationalInvariants

    async def main() -> tuple[list[bool], list[bool], list[bool], list[bool]]:
        async with open_store(clock=lambda: 1) as store:
            plain = await store.create("plain")
            await plain.append("turn/start", {"turn": 1})
            remove = store.install_validator(RelationalInvariants)
            checked = await store.create("checked")
            await checked.append("turn/start", {"turn": 1})
            await checked.append("custom/kind", {"a": 1})  # no rule reads it: encoded
            await plain.append("turn/end", {"turn": 1})
            remove_all = store.install_validator(_Counting)  # reads every type
            both = await store.create("both")
            await both.append("custom/kind", {"a": 1})
            remove_all()
            remove()
            await checked.append("turn/end", {"turn": 1})
            return (
                _encoded(plain._entry.session),
                _encoded(checked._entry.session),
                _encoded(both._entry.session),
                [e.type == t for e, t in zip(checked.events, ("turn/start", "custom/kind", "turn/end"), strict=True)],
            )

    plain, checked, both, types = trio.run(main)
    assert plain == [True, False]  # encoded, then a tree while the validator was installed
    assert checked == [False, True, True]  # a tree of a type it reads, encoded once it was removed
    assert both == [False]  # the union: one of the two validators reads every type
    assert all(types)


def test_the_log_only_draft_factory_makes_the_constructors_draft() -> None:
    import attrs

    from harness.session._append_types import log_only_draft

    made = log_only_draft("x/y", {"a": 1}, True)
    assert made == EventDraft("x/y", {"a": 1}, ignorable=True) and type(made) is EventDraft
    assert log_only_draft("x/y", None) == EventDraft("x/y", None)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        made.type = "z"  # type: ignore[misc]
