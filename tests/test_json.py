"""Lossless JSON: acceptance, rejection, immutability, depth, round trips."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.errors import NotJsonError
from harness.session import FrozenDict, FrozenList, freeze, is_json, raw_of, thaw
from harness.session._json import raw_equal


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, 0.0, "", "héllo ✓", [], {}, [1, [2, {"a": None}]]],
)
def test_accepts(value: Any) -> None:
    assert is_json(value)
    assert thaw(freeze(value)) == value


class Thing:
    pass


class Sub(dict):  # type: ignore[type-arg]
    pass


REJECTED: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    2**64,
    -(2**63) - 1,
    (1, 2),
    {1, 2},
    {1: "a"},
    Thing(),
    Sub(),
    b"x",
    "\ud800",
    {"\udfff": 1},
    [1, [2, (3,)]],
    {"a": {"b": [math.nan]}},
]
"""Values the snapshot refuses (also the odd leaves of tests/test_encoded_appends.py)."""


@pytest.mark.parametrize("value", REJECTED)
def test_rejects(value: Any) -> None:
    assert not is_json(value)
    with pytest.raises(NotJsonError) as info:
        freeze(value)
    assert info.value.code == "NOT_JSON"


def test_rejects_cycles_but_accepts_shared_references() -> None:
    a: list[Any] = []
    a.append(a)
    assert not is_json(a)
    d: dict[str, Any] = {}
    d["self"] = {"inner": d}
    assert not is_json(d)
    shared = {"x": 1}
    value = {"a": shared, "b": shared, "c": [shared, shared]}
    frozen = freeze(value)
    assert frozen == value
    shared["x"] = 2  # the snapshot is independent of the caller's object
    assert frozen["a"] == {"x": 1}  # type: ignore[index]


def test_deep_cycle_found_by_iterative_walk() -> None:
    root: list[Any] = []
    node = root
    for _ in range(200):
        child: list[Any] = []
        node.append(child)
        node = child
    node.append(root)
    assert not is_json(root)


def test_very_deep_values() -> None:
    deep_list: list[Any] = []
    node = deep_list
    for _ in range(5000):
        child: list[Any] = []
        node.append(child)
        node = child
    deep_dict: dict[str, Any] = {}
    d = deep_dict
    for _ in range(20000):
        d["k"] = {}
        d = d["k"]
    fl = freeze(deep_list)
    fd = freeze(deep_dict)
    assert isinstance(fl, FrozenList) and isinstance(fd, FrozenDict)
    assert fd == deep_dict
    assert fl == deep_list
    assert raw_equal(thaw(fd), deep_dict)


def test_views_are_immutable() -> None:
    fd = freeze({"a": [1, {"b": 2}]})
    assert isinstance(fd, FrozenDict)
    with pytest.raises(TypeError):
        fd["a"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        fd.x = 1  # type: ignore[attr-defined]
    inner = fd["a"]
    assert isinstance(inner, FrozenList)
    with pytest.raises(TypeError):
        inner[0] = 5  # type: ignore[index]
    with pytest.raises(AttributeError):
        inner.append(3)  # type: ignore[attr-defined]
    nested = inner[1]
    assert isinstance(nested, FrozenDict)
    with pytest.raises(TypeError):
        del nested["b"]  # type: ignore[attr-defined]


def test_thaw_is_a_mutable_copy() -> None:
    fd = freeze({"a": [1, 2]})
    t = thaw(fd)
    t["a"].append(3)
    assert fd == {"a": [1, 2]}


def test_frozen_views_are_shared_not_copied() -> None:
    inner = freeze({"big": list(range(10))})
    outer = freeze({"x": inner})
    assert raw_of(outer)["x"] is raw_of(inner)  # type: ignore[index]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not (f == 0 and math.copysign(1, f) < 0))
    | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=5),
    max_leaves=30,
)


@given(json_values)
def test_round_trips_through_orjson(value: Any) -> None:
    frozen = freeze(value)
    encoded = orjson.dumps(raw_of(frozen))
    assert encoded == orjson.dumps(value)
    decoded = orjson.loads(encoded)
    assert raw_equal(raw_of(frozen), decoded)
    assert orjson.dumps(decoded) == encoded
