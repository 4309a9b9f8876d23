"""Issue 16, events: every payload, surface op, provenance list and batch a caller can
hand ``append`` is refused with a typed error or stored losslessly; the session, its
neighbours and everything acknowledged before survive, and the runtime closes cleanly."""

from __future__ import annotations

import math
import reprlib
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import (
    EventError,
    HarnessError,
    NotJsonError,
    PersistedSessionNotFoundError,
    PersistenceArgumentError,
)
from harness.fuzz import budget, explored
from harness.persistence import JsonlBackend, SqliteBackend, open_persistence
from harness.runtime import open_store
from harness.session import EventDraft, thaw
from harness.session._json import MAX_STORABLE_DEPTH, raw_equal
from tests.helpers import user

pytestmark = pytest.mark.fuzz

BACKENDS = ("jsonl", "sqlite")


def _backend(name: str, root: Path) -> Any:
    return JsonlBackend(root / "tree") if name == "jsonl" else SqliteBackend(root / "db.sqlite")


def _deep(depth: int) -> Any:
    value: Any = "bottom"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


_cyclic: list[Any] = []
_cyclic.append(_cyclic)

# Values JSON (or this port's lossless JSON) has trouble with.
EDGE_SCALARS: list[object] = [
    0, -0.0, 0.0, 1e308, -1e308, 5e-324, float("nan"), float("inf"), float("-inf"),
    2**53, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 2**200,
    "", "\x00", "\ud800", "a\udfffb", "\U0001f600", "\u2028\u2029", "\\", '"', "x" * 1_000_000,
    True, False, None, b"bytes", (1, 2), {1, 2}, frozenset(), 1j, object(),
]
EDGE_CONTAINERS: list[object] = [
    {1: "int key"}, {None: 1}, {"\ud800": 1}, {"": {}}, [], {}, _deep(50), [[[[[]]]]], {"k" * 10_000: "long key"},
    _deep(60), _deep(199), _deep(200), _deep(201), _deep(260),
]
# Not given to Hypothesis, whose reports repr their examples (deep or cyclic values
# would make the report itself fail).
UNPRINTABLE: list[object] = [_deep(10_000), _cyclic, {"a": _cyclic}]

json_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.sampled_from(EDGE_SCALARS)
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(["\ud800", ""])), inner, max_size=4),
    ),
    max_leaves=12,
)
payloads = st.one_of(json_values, st.sampled_from(EDGE_CONTAINERS))
types = st.one_of(
    st.just("feedback/record"),
    st.sampled_from(["user/message", "turn/end", "session/end-seed", "", "no/such-type", "x" * 10_000, "\ud800"]),
    st.text(max_size=20),
    st.integers(),
    st.none(),
)
surface_ops = st.one_of(
    st.none(), st.just("append"),
    st.sampled_from(["replace", "", {"op": "replace", "start": 0, "end": 0}, {"op": "replace", "start": -1, "end": 2**70},
                     {"op": "append"}, ["append"], 5]),
    st.fixed_dictionaries({"op": st.just("replace"), "start": st.integers(), "end": st.integers()}),
)
source_seqs = st.one_of(
    st.none(), st.lists(st.integers(), max_size=5),
    st.sampled_from([[], [0], [0, 0], [2**53], [-1], [1.0], ["0"], [True], "01", 7, [2**64]]),
)
drafts = st.builds(EventDraft, types, payloads, surface_ops, source_seqs)


def _is_harness_error(exc: BaseException) -> bool:
    return isinstance(exc, HarnessError) and bool(exc.code)


async def _append_and_check(backend_name: str, root: Path, batches: list[list[EventDraft]]) -> None:
    accepted: list[tuple[str, Any]] = []
    async with (
        open_store() as store,
        open_persistence(store, _backend(backend_name, root), write_delay=0) as persistence,
    ):
        other = await store.create("other", cwd="/w")
        await other.append("user/message", user("u0"), surface_op="append")
        assert await other.flush()
        target = await store.create("target", cwd="/w")
        for batch in batches:
            explored(f"SessionHandle.append_batch/{backend_name}", len(batch))
            try:
                events = await target.append_batch(batch)
            except HarnessError as exc:
                assert _is_harness_error(exc)
                assert exc.session_id in (None, "target"), exc
                continue
            except BaseException as exc:  # the point of the test: nothing else escapes
                raise AssertionError(f"append_batch({reprlib.repr(batch)}) raised {exc!r}") from exc
            accepted.extend((e.type, thaw(e.data)) for e in events)
            # Lossless in memory: what was logged is what was given.
            for draft, event in zip(batch, events, strict=True):
                assert event.type == draft.type
                assert raw_equal(thaw(event.data), draft.data), (draft, event)
            assert await target.flush()
        # The store still serves the neighbour after whatever the target got.
        await other.append("user/message", user("u1"), surface_op="append")
        assert await other.flush()
    async with open_store() as store, open_persistence(store, _backend(backend_name, root)) as persistence:
        if not accepted:
            # Nothing accepted: the session never materialised (lazy creation).
            with pytest.raises(PersistedSessionNotFoundError):
                await persistence.read_from("target", 0)
            stored: tuple[Any, ...] = ()
        else:
            stored = await persistence.read_from("target", 0)
        got = [(e["type"], thaw(e["data"])) for e in stored]
        assert len(got) == len(accepted)
        for (t1, d1), (t2, d2) in zip(got, accepted, strict=True):
            assert t1 == t2 and raw_equal(d1, d2), ((t1, d1), (t2, d2))
        neighbour = await persistence.read_from("other", 0)
        assert [e["data"]["id"] for e in neighbour] == ["u0", "u1"]


@pytest.mark.parametrize("backend_name", BACKENDS)
@settings(max_examples=budget(40))
@given(batches=st.lists(st.lists(drafts, min_size=0, max_size=4), min_size=1, max_size=4))
def test_fuzz_append(backend_name: str, batches: list[list[EventDraft]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(_append_and_check, backend_name, Path(tmp), batches)


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("value", EDGE_SCALARS + EDGE_CONTAINERS + UNPRINTABLE, ids=reprlib.repr)
def test_edge_values_as_payloads(backend_name: str, value: object) -> None:
    """The deterministic regression set: each edge value as a payload, alone and nested."""
    batches = [[EventDraft("feedback/record", value)], [EventDraft("feedback/record", {"v": [value]})]]
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(_append_and_check, backend_name, Path(tmp), batches)


def _envelope(seq: int, data: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "feedback/record", "seq": seq, "time": 1000 + seq, "data": data, **extra}


envelopes = st.one_of(
    st.builds(lambda d: {"type": "feedback/record", "seq": 0, "time": 0, "data": d}, payloads),
    st.dictionaries(st.sampled_from(["type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable", "x"]),
                    json_values, max_size=7),
    json_values,
)


@pytest.mark.parametrize("backend_name", BACKENDS)
@settings(max_examples=budget(40))
@given(batch=st.lists(envelopes, max_size=5), renumber=st.booleans())
def test_fuzz_persistence_append(backend_name: str, batch: list[Any], renumber: bool) -> None:
    """``Persistence.create``/``append`` (envelopes given by the caller, seqs included)."""
    if renumber:
        batch = [dict(e, seq=i) if type(e) is dict else e for i, e in enumerate(batch)]

    async def main(root: Path) -> None:
        async with (
            open_store() as store,
            open_persistence(store, _backend(backend_name, root), write_delay=0) as persistence,
        ):
            await persistence.create({"version": 0, "id": "env", "createdAt": 1, "cwd": "/w"})
            await persistence.append("env", [_envelope(0, {"first": True})])
            explored(f"Persistence.append envelopes/{backend_name}", max(1, len(batch)))
            try:
                await persistence.append("env", batch)
            except HarnessError as exc:
                assert exc.code
                ok = False
            else:
                ok = True
            stored = await persistence.read_from("env", 0)
            assert thaw(stored[0]["data"]) == {"first": True}
            if ok:
                assert len(stored) == 1 + len(batch)
                for rec, given_rec in zip(stored[1:], batch, strict=True):
                    assert raw_equal(thaw(rec["data"]), given_rec["data"])
            else:
                assert len(stored) == 1  # a refused batch lands whole or not at all

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("size", [0, 1, 100_000])
def test_batch_sizes(backend_name: str, size: int) -> None:
    """An empty batch, one event, and 100k events in one ``append_batch`` (one flush)."""

    async def main(root: Path) -> None:
        batch = [EventDraft("feedback/record", {"i": i}) for i in range(size)]
        async with (
            open_store() as store,
            open_persistence(store, _backend(backend_name, root), write_delay=0) as persistence,
        ):
            h = await store.create("big", cwd="/w")
            events = await h.append_batch(batch)
            assert len(events) == size
            assert await h.flush()
        explored(f"SessionHandle.append_batch size/{backend_name}")
        async with open_store() as store, open_persistence(store, _backend(backend_name, root)) as persistence:
            if size == 0:
                # Nothing was appended: nothing materialised (a lazy session).
                assert [h["id"] for h in await persistence.list()] == []
                return
            stored = await persistence.read_from("big", 0)
            assert len(stored) == size
            assert stored[-1]["data"]["i"] == size - 1

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))


def test_edge_scalars_are_what_they_claim() -> None:
    # Guards the list above against an edit that makes it vacuous.
    assert any(type(v) is float and math.isnan(v) for v in EDGE_SCALARS)
    assert 2**64 in EDGE_SCALARS and -0.0 in EDGE_SCALARS


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("type_", ["", "no/such-type", "text-chunks", "session", "x" * 10_000])
def test_unreadable_event_types_are_refused_at_append(backend_name: str, type_: str) -> None:
    """Found by test_fuzz_append: a type a load refuses ("unknown to this harness and not
    marked ignorable"; a chunk-row tag) was logged and acknowledged by the flush, and
    then the whole session no longer loaded (JSONL), or every flush failed (SQLite, for
    the empty type). A persisted session now refuses it at append, typed."""

    async def main(root: Path) -> None:
        async with (
            open_store() as store,
            open_persistence(store, _backend(backend_name, root), write_delay=0) as persistence,
        ):
            h = await store.create("typed", cwd="/w")
            await h.append("user/message", user("u0"), surface_op="append")
            with pytest.raises(EventError) as info:
                await h.append(type_, {})
            assert info.value.session_id == "typed" and repr(type_[:60]) in str(info.value)
            with pytest.raises(EventError):
                await store.create("seeded", cwd="/w", seed=[{"type": type_, "seq": 0, "time": 0, "data": {}}])
            assert await h.flush()
            explored(f"SessionHandle.append unreadable type/{backend_name}")
        async with open_store() as store, open_persistence(store, _backend(backend_name, root)) as persistence:
            assert [e.type for e in (await persistence.load("typed")).events][:1] == ["user/message"]
            assert "seeded" not in [h["id"] for h in await persistence.list()]

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_seed_has_the_depth_limit_of_an_append(backend_name: str) -> None:
    """Found by test_fuzz_seeded_create on a fresh clone: a seed record's data was
    copied without the depth check of appends, so ``create(seed=...)`` accepted data
    orjson cannot write and every flush of the session then failed ("Recursion limit
    reached"). The seed now has the append's limit, to the level."""

    def nested(depth: int) -> Any:
        value: Any = 0
        for _ in range(depth):
            value = [value]
        return value

    def seed(depth: int) -> list[dict[str, Any]]:
        return [{"type": "feedback/record", "seq": 0, "time": 0, "data": {"v": nested(depth)}}]

    async def main(root: Path) -> None:
        async with (
            open_store() as store,
            open_persistence(store, _backend(backend_name, root), write_delay=0) as persistence,
        ):
            with pytest.raises(NotJsonError, match=r"seed event at index 0 carries data nested more than 200") as info:
                await store.create("too-deep", cwd="/w", seed=seed(MAX_STORABLE_DEPTH))
            assert info.value.session_id == "too-deep"
            with pytest.raises(NotJsonError):
                await store.create("far-too-deep", cwd="/w", seed=seed(300))
            h = await store.create("deep", cwd="/w", seed=seed(MAX_STORABLE_DEPTH - 1))
            assert await h.flush()
            assert [x["id"] for x in await persistence.list()] == ["deep"]
        async with open_store() as store, open_persistence(store, _backend(backend_name, root)) as persistence:
            event, end_seed = await persistence.read_from("deep", 0)
            assert end_seed["type"] == "session/end-seed"
            assert thaw(event["data"]) == {"v": nested(MAX_STORABLE_DEPTH - 1)}

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_depth_limit_is_exact(backend_name: str) -> None:
    """Found by test_edge_values_as_payloads: data nested deeper than orjson writes was
    accepted, and every flush of the session then failed ("Recursion limit reached").
    MAX_STORABLE_DEPTH levels are stored and read back; one more is refused at append."""

    def nested(depth: int) -> Any:
        value: Any = 0
        for _ in range(depth):
            value = [value]
        return value

    async def main(root: Path) -> None:
        async with (
            open_store() as store,
            open_persistence(store, _backend(backend_name, root), write_delay=0) as persistence,
        ):
            h = await store.create("deep", cwd="/w")
            await h.append("feedback/record", {"v": nested(MAX_STORABLE_DEPTH - 1)})
            with pytest.raises(NotJsonError, match="nested more than 200 levels"):
                await h.append("feedback/record", {"v": nested(MAX_STORABLE_DEPTH)})
            assert await h.flush()
        async with open_store() as store, open_persistence(store, _backend(backend_name, root)) as persistence:
            [event] = await persistence.read_from("deep", 0)
            assert thaw(event["data"]) == {"v": nested(MAX_STORABLE_DEPTH - 1)}

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_persistence_append_depth(backend_name: str) -> None:
    """Found while fuzzing ``Persistence.create``/``append``: a batch whose data nested
    more than 48 levels was refused as "not JSON" (the deep copy returns a list where
    the fast one returns a tuple), and metadata nested past what orjson writes was
    accepted and then raised a raw ``TypeError`` from the first append (JSONL)."""

    def nested(depth: int) -> Any:
        value: Any = 0
        for _ in range(depth - 1):
            value = [value]
        return [value]

    async def main(root: Path) -> None:
        async with (
            open_store() as store,
            open_persistence(store, _backend(backend_name, root), write_delay=0) as persistence,
        ):
            with pytest.raises(PersistenceArgumentError, match="nests more than 200 levels"):
                await persistence.create({"version": 0, "id": "meta", "createdAt": 1, "x": nested(300)})
            await persistence.create({"version": 0, "id": "env", "createdAt": 1, "cwd": "/w"})
            await persistence.append("env", [_envelope(0, nested(60)), _envelope(1, nested(MAX_STORABLE_DEPTH))])
            with pytest.raises(PersistenceArgumentError, match="nested more than 200 levels"):
                await persistence.append("env", [_envelope(2, nested(MAX_STORABLE_DEPTH + 1))])
            explored(f"Persistence.append envelopes/{backend_name}", 3)
        async with open_store() as store, open_persistence(store, _backend(backend_name, root)) as persistence:
            stored = await persistence.read_from("env", 0)
            assert [thaw(e["data"]) for e in stored] == [nested(60), nested(MAX_STORABLE_DEPTH)]

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))


@pytest.mark.parametrize("backend_name", BACKENDS)
@settings(max_examples=budget(30))
@given(seed=st.lists(envelopes, max_size=5), renumber=st.booleans())
def test_fuzz_seeded_create(backend_name: str, seed: list[Any], renumber: bool) -> None:
    """``Store.create(seed=...)``: a seed is validated at the door (typed refusal) or
    stored as given, followed by its ``session/end-seed``."""
    if renumber:
        seed = [dict(e, seq=i) if type(e) is dict else e for i, e in enumerate(seed)]

    async def main(root: Path) -> None:
        async with (
            open_store() as store,
            open_persistence(store, _backend(backend_name, root), write_delay=0) as persistence,
        ):
            explored(f"Store.create seed/{backend_name}", max(1, len(seed)))
            try:
                h = await store.create("seeded", cwd="/w", seed=seed)
            except HarnessError as exc:
                assert exc.code
                return
            assert await h.flush()
            given_events = [(e.type, thaw(e.data)) for e in h.events]
        async with open_store() as store, open_persistence(store, _backend(backend_name, root)) as persistence:
            stored = await persistence.read_from("seeded", 0)
            assert len(stored) == len(given_events)
            for rec, (t, d) in zip(stored, given_events, strict=True):
                assert rec["type"] == t and raw_equal(thaw(rec["data"]), d)

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp))
