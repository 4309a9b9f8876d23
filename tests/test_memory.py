"""Memory behaviour: what the collector sees, and what is freed when.

Decisions 0003 and 0006: a log is stored by column, a large restored or seeded log is
moved to the oldest generation without a scan, and nothing the runtime keeps after a
session is retired holds that session in a reference cycle (a cycle would leave the
whole log for a late full collection).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from actors import Actor, ActorRuntime
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import open_store
from harness.session import Session, decode_records, gc_paused, promote_young
from tests.helpers import user


@pytest.fixture
def collector() -> Iterator[None]:
    """Each test starts with an empty young generation and leaves gc as it found it."""
    thresholds = gc.get_threshold()
    enabled = gc.isenabled()
    gc.collect()
    yield
    gc.set_threshold(*thresholds)
    if enabled:
        gc.enable()
    if gc.get_freeze_count():
        gc.unfreeze()


def _in_generation(obj: object, generation: int) -> bool:
    return any(o is obj for o in gc.get_objects(generation))


def _many_young() -> list[list[int]]:
    threshold0, threshold1, _ = gc.get_threshold()
    return [[i] for i in range(threshold0 * threshold1 + 100)]


def test_promote_young_moves_a_large_young_generation_to_the_oldest(collector: None) -> None:
    with gc_paused():
        built = _many_young()
        assert _in_generation(built, 0)
        assert promote_young() is True
    assert gc.get_count()[0] < 10
    assert _in_generation(built, 2) and not _in_generation(built, 0)
    assert gc.get_freeze_count() == 0


def test_promote_young_leaves_small_generations_alone(collector: None) -> None:
    with gc_paused():
        few = [[i] for i in range(50)]
        assert promote_young() is False
        assert _in_generation(few, 0)


def test_promote_young_never_touches_application_frozen_objects(collector: None) -> None:
    mine = [object()]
    gc.freeze()
    frozen = gc.get_freeze_count()
    with gc_paused():
        built = _many_young()
        assert promote_young() is False  # unfreeze would release the application's objects
        assert gc.get_freeze_count() == frozen
        assert _in_generation(built, 0)
    del mine


def test_promote_young_respects_a_disabled_threshold(collector: None) -> None:
    gc.set_threshold(0)
    with gc_paused():
        built = [[i] for i in range(8000)]
        assert gc.get_count()[0] > 7000
        assert promote_young() is False
    assert built


def test_gc_paused_restores_the_state_and_does_not_promote_after_an_error(collector: None) -> None:
    gc.disable()
    with gc_paused(promote=True):
        pass
    assert not gc.isenabled()
    gc.enable()
    with pytest.raises(RuntimeError), gc_paused(promote=True):
        built = _many_young()
        raise RuntimeError("boom")
    assert gc.isenabled()
    assert not _in_generation(built, 2)  # young (or one collection older), not promoted


def _records(n: int) -> list[dict[str, Any]]:
    return [
        {"type": "user/message", "seq": i, "time": 1, "data": user(f"u{i}"), "surfaceOp": "append"}
        for i in range(n)
    ]


def test_restore_moves_a_large_log_to_the_oldest_generation(collector: None) -> None:
    header = {"version": 0, "id": "big", "createdAt": 1}
    lines = [orjson.dumps(r) for r in _records(8000)]
    with gc_paused():  # decoded and adopted in one pause, as the persistence readers do
        s = Session.restore("big", decode_records(lines), header)
    data = s.events[4000].data
    content = data["content"]  # type: ignore[index]
    assert _in_generation(content._raw, 2)  # type: ignore[union-attr]
    assert gc.get_count()[0] < 1000


def test_restored_lines_keep_their_bytes_not_trees(collector: None) -> None:
    """Decision 0010: a plain event restored from a line keeps the line; its data is
    decoded again, equal and fresh, on every read, and the collector sees no trees."""
    header = {"version": 0, "id": "lines", "createdAt": 1}
    records = _records(3000)
    lines = [orjson.dumps(r) for r in records]
    gc.collect()
    tracked = len(gc.get_objects())
    s = Session.restore_lines("lines", lines, header)
    del lines
    gc.collect()
    # 3000 events, 4 containers each as trees: none of them is left for the collector.
    assert len(gc.get_objects()) - tracked < 100
    first, again = s.events[1234], s.events[1234]
    assert first == again and first.data == records[1234]["data"]
    assert first.data._raw is not again.data._raw  # type: ignore[union-attr]
    assert s.raw_data_at(7) == records[7]["data"]
    assert [e.seq for e in s.events[:3]] == [0, 1, 2] and s.seq == 3001  # + end-seed


def test_a_restored_log_holds_no_event_objects(collector: None) -> None:
    header = {"version": 0, "id": "cols", "createdAt": 1}
    with gc_paused():
        before = sum(1 for o in gc.get_objects() if type(o).__name__ == "Event")
        s = Session.restore("cols", _records(2000), header)
        after = sum(1 for o in gc.get_objects() if type(o).__name__ == "Event")
    assert after - before <= 2  # the end-seed append's transient event at most
    assert s.seq == 2001


class _Keeper(Actor[Any]):
    name = "keeper"

    async def handle(self, message: Any) -> Any:
        return None


class _Message:
    pass


async def test_an_idle_actor_does_not_keep_its_last_message() -> None:
    async with ActorRuntime() as runtime:
        ref = runtime.spawn(_Keeper())
        message = _Message()
        dead = weakref.ref(message)
        await ref.call(message)
        del message
        await trio.testing.wait_all_tasks_blocked()
        assert dead() is None  # freed by reference counting, with no collection


async def test_a_retired_session_is_freed_by_reference_counting(tmp_path: Path) -> None:
    gc.collect()
    gc.disable()
    try:
        async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
            s = await store.create("freed")
            await s.append("user/message", user(), surface_op="append")
            await store.detach(s)
            await p.wait_retired("freed")
            del s
            await trio.testing.wait_all_tasks_blocked()
            assert not [o for o in gc.get_objects() if type(o) is Session]
            assert [e.type for e in (await p.load("freed")).events][:1] == ["user/message"]
    finally:
        gc.enable()


def test_overlapping_pauses_resume_the_collector_once_the_last_ends(collector: None) -> None:
    first = gc_paused()
    second = gc_paused()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # as when another thread's pause ends first
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()
