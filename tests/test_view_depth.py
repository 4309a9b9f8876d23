"""The 200-level storable depth rule counts the levels of a frozen view nested in the
data (stop 34's reviewer): a deep value made with ``freeze`` and shared into an append was
stored without a depth walk, past the rule, and past orjson's 254 levels every flush
of the session failed. Each path of an append is covered: the JSON-keeping fast path,
the tree path (a derived surface), a batch, a cast, the persistence service, and the
non-storable snapshot (``freeze`` itself has no depth limit)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

import harness.session._json as json_module
from harness.errors import NotJsonError, PersistenceArgumentError
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import open_store
from harness.session import Event, EventDraft, Session, freeze, thaw
from harness.session._json import _ORJSON_LEVELS, _raw_depth, _view_depth, _view_fits

DEEP = 'session event "x/y" carries data nested more than 200 levels deep'
DEEP_FEEDBACK = DEEP.replace("x/y", "feedback/record")


def nested(depth: int) -> Any:
    """A plain value ``depth`` containers deep (``{}`` is 1)."""
    value: Any = {}
    for k in range(depth - 1):
        value = [value] if k % 2 else {"k": value}
    return value


@pytest.fixture(params=["orjson", "walk"])
def measure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a view's depth is judged: orjson's encode of the wrapped tree, and the
    walk (what runs where orjson's limit is not the probed 254)."""
    if request.param == "walk":
        monkeypatch.setattr(json_module, "_ORJSON_LEVELS", None)
    return str(request.param)


def test_orjson_writes_254_levels_as_the_probe_says() -> None:
    assert _ORJSON_LEVELS == 254
    orjson.dumps(nested(254))
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(nested(255))


@pytest.mark.parametrize("depth", [1, 150, 199, 200, 201, 254, 255, 400])
@pytest.mark.parametrize("budget", [1, 150, 200, 202])
def test_view_fits_is_exact_either_way(depth: int, budget: int, measure: str) -> None:
    view = freeze(nested(depth))
    assert _view_fits(view, budget) is (depth <= budget)
    # Asked again (a kept bound or depth), the same answer.
    assert _view_fits(view, budget) is (depth <= budget)
    assert _view_fits(view, budget - 1) is (depth <= budget - 1)


def fresh() -> Session:
    return Session.create("s", clock=lambda: 1)


@pytest.mark.parametrize("depth", [0, 1, 2, 7, 300])
def test_raw_depth_counts_containers(depth: int) -> None:
    value = nested(depth) if depth else "scalar"
    assert _raw_depth(value) == depth
    if depth:
        assert _view_depth(freeze(value)) == depth


@pytest.mark.parametrize("outer", [0, 1, 10, 49, 60])
@pytest.mark.parametrize("derived", [False, True], ids=["json-kept", "tree"])
def test_a_nested_view_counts_its_own_levels(outer: int, derived: bool, measure: str) -> None:
    s = fresh()
    if derived:
        s.derive_messages()  # surface events keep trees now; x/y is log-only either way
    inner = 200 - outer

    def wrap(view: object) -> Any:
        # ``outer`` plain levels above the view: {"k": {"k": ... view}}
        value: Any = view
        for _ in range(outer):
            value = {"k": value}
        return value

    # Exactly 200 levels in all: stored, and it reads back whole.
    event = s.append("x/y", wrap(freeze(nested(inner))))
    assert _raw_depth(thaw(event.data)) == 200
    # One level more, inside the view: refused with the plain value's message.
    with pytest.raises(NotJsonError, match=DEEP):
        s.append("x/y", wrap(freeze(nested(inner + 1))))
    with pytest.raises(NotJsonError, match=DEEP):
        s.append_batch([EventDraft("x/y", {}), EventDraft("x/y", wrap(freeze(nested(inner + 1))))])
    # A list around the view counts as a level too.
    with pytest.raises(NotJsonError, match=DEEP):
        s.append("x/y", wrap([freeze(nested(inner))]) if outer else [freeze(nested(inner))])
    assert [e.seq for e in s.events] == [0]


def test_a_view_as_the_whole_data(measure: str) -> None:
    s = fresh()
    assert _raw_depth(thaw(s.append("x/y", freeze(nested(200))).data)) == 200
    with pytest.raises(NotJsonError, match=DEEP):
        s.append("x/y", freeze(nested(201)))
    with pytest.raises(NotJsonError, match=DEEP):
        s.append("x/y", freeze(nested(300)))  # past orjson's own limit too
    assert len(s.events) == 1


def test_freeze_itself_keeps_no_depth_limit() -> None:
    deep = freeze({"a": freeze(nested(300))})
    assert _raw_depth(thaw(deep)) == 301


async def test_through_the_actor_and_to_disk(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        h = await store.create("s", cwd="/x")
        with pytest.raises(NotJsonError, match=DEEP_FEEDBACK):
            await h.append("feedback/record", {"m": freeze(nested(255))})
        with pytest.raises(NotJsonError, match=DEEP_FEEDBACK):
            h.append_nowait("feedback/record", {"m": freeze(nested(200))})
        await h.append("feedback/record", {"m": freeze(nested(199))})
        # The flush succeeds: nothing past the rule was buffered for the writer.
        await h.flush()
        lines = [orjson.loads(line) for line in (await p.read_raw("s")).splitlines()]
        records = [r for r in lines if "seq" in r]
        assert [r["seq"] for r in records] == [0]
        assert _raw_depth(records[0]["data"]) == 200
        with pytest.raises(PersistenceArgumentError, match="nested more than 200 levels deep"):
            await p.append("s", [{"type": "feedback/record", "seq": 1, "time": 1, "data": {"m": freeze(nested(200))}}])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("data", ["view", "raw"])
async def test_a_seed_of_events_built_by_the_caller_keeps_the_rule(tmp_path: Path, data: str, measure: str) -> None:
    """The first reviewer: a seed of :class:`Event` objects was adopted without a depth
    check (seed records had one), so a 300-level value was seeded and every flush of
    the session failed."""
    def make(depth: int) -> object:
        return freeze(nested(depth)) if data == "view" else nested(depth)

    ok = Event("feedback/record", 0, 1, make(200))  # type: ignore[arg-type]
    async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
        for depth in (201, 300):
            bad = Event("feedback/record", 1, 1, make(depth))  # type: ignore[arg-type]
            with pytest.raises(NotJsonError, match="seed event at index 1 carries data nested more than 200 levels"):
                await store.create("s", cwd="/x", seed=[ok, bad])
        h = await store.create("s", cwd="/x", seed=[ok])
        await h.flush()
        loaded = await p.load("s")
        assert loaded.events[0].type == "feedback/record"
        assert _raw_depth(thaw(loaded.events[0].data)) == 200
