"""The chunk-row codec: exact round trips and malformed rows."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.errors import StorageRowError
from harness.session import decode_storage_record, pack_chunk_runs


def chunk(seq: int, time: int, text: str = "x", kind: str = "text-delta", index: int = 0, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"type": kind, "index": index}
    if kind == "tool-call-delta":
        c.update({"id": extra.get("id", "c1")})
        if "name" in extra:
            c["name"] = extra["name"]
        c["argumentsDelta"] = text
    else:
        c["text"] = text
    return {"type": "assistant/chunk", "seq": seq, "time": time, "data": {"turn": 1, "step": 1, "chunk": c}}


def expand(records: list[Any]) -> list[Any]:
    return [ev for r in records for ev in decode_storage_record(r)]


def test_runs_of_three_pack_and_shorter_runs_pass() -> None:
    evs = [chunk(0, 10, "a"), chunk(1, 12, "b"), chunk(2, 11, "c"), {"type": "x", "seq": 3, "time": 0, "data": None}, chunk(4, 0), chunk(5, 0)]
    packed = pack_chunk_runs(evs)
    assert packed[0] == {"type": "text-chunks", "seq0": 0, "time0": 10, "data": {"turn": 1, "step": 1, "index": 0, "dt": [2, -1], "texts": ["a", "b", "c"]}}
    assert packed[1:] == evs[3:]
    assert expand(packed) == evs


def test_tool_rows_keep_id_and_name_presence() -> None:
    named = [chunk(i, i, "a", "tool-call-delta", id="c", name="read") for i in range(3)]
    unnamed = [chunk(i, i, "a", "tool-call-delta", id="c") for i in range(3, 6)]
    packed = pack_chunk_runs(named + unnamed)
    assert [r["type"] for r in packed] == ["tool-call-chunks", "tool-call-chunks"]
    assert "name" in packed[0]["data"] and "name" not in packed[1]["data"]
    assert expand(packed) == named + unnamed


def test_breaks_on_kind_index_seq_and_extra_keys() -> None:
    evs = [chunk(0, 0), chunk(1, 0), chunk(2, 0, kind="reasoning-delta"), chunk(3, 0, index=1), chunk(5, 0)]
    odd = chunk(6, 0)
    odd["surfaceOp"] = "append"
    assert pack_chunk_runs([*evs, odd]) == [*evs, odd]


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ({"type": "text-chunks", "seq0": -1, "time0": 0, "data": {"turn": 1, "step": 1, "index": 0, "dt": [], "texts": ["a"]}}, "seq0"),
        ({"type": "text-chunks", "seq0": 0, "time0": 0, "data": {"turn": 1, "step": 1, "index": 0, "dt": [1], "texts": ["a"]}}, "dt"),
        ({"type": "text-chunks", "seq0": 0, "time0": 0, "data": {"turn": 1, "step": 1, "index": 0, "dt": [], "texts": []}}, "texts"),
        ({"type": "text-chunks", "seq0": 0, "time0": 0, "data": {"turn": 1, "step": 1, "index": 0, "dt": [], "texts": ["a"], "x": 1}}, "keys"),
        ({"type": "tool-call-chunks", "seq0": 0, "time0": 0, "data": {"turn": 1, "step": 1, "index": 0, "dt": [], "args": ["a"], "id": 5}}, "id"),
        ({"type": "text-chunks", "seq0": 0, "time0": 0, "data": {"turn": 1, "step": 1, "index": 0, "dt": [], "texts": ["a"]}, "extra": 1}, "envelope"),
    ],
)
def test_malformed_rows(row: dict[str, Any], why: str) -> None:
    with pytest.raises(StorageRowError) as info:
        decode_storage_record(row)
    assert str(info.value).startswith(f"malformed {row['type']} storage row: ")
    assert why in str(info.value)


@st.composite
def event_lists(draw: st.DrawFn) -> list[Any]:
    out: list[Any] = []
    time = draw(st.integers(0, 10**6))
    for seq in range(draw(st.integers(0, 25))):
        time += draw(st.integers(-5, 5))
        if draw(st.integers(0, 4)) == 0:
            out.append({"type": "other", "seq": seq, "time": time, "data": draw(st.none() | st.integers(-(2**53), 2**53))})
            continue
        kind = draw(st.sampled_from(["text-delta", "reasoning-delta", "tool-call-delta"]))
        extra = {"id": draw(st.sampled_from(["a", "b"]))}
        if draw(st.booleans()):
            extra["name"] = draw(st.sampled_from(["n", "m"]))
        out.append(chunk(seq, time, draw(st.text(max_size=3)), kind, draw(st.integers(0, 1)), **extra))
    return out


@given(event_lists())
def test_round_trip_is_exact(events: list[Any]) -> None:
    events = orjson.loads(orjson.dumps(events))
    packed = orjson.loads(orjson.dumps(pack_chunk_runs(events)))
    assert expand(packed) == events
    assert [orjson.dumps(e) for e in expand(packed)] == [orjson.dumps(e) for e in events]
