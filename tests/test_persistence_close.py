"""``Persistence.aclose`` (and so the exit of ``open_persistence`` / ``open_runtime``)
reports *every* session whose last events could not be made durable: one
:class:`PersistenceCloseError` naming them all (``failures``, ``errors``), and one
warning per failed session on the store's warnings channel, even when the close error
itself cannot be raised (the block's own exception wins) or the close is cancelled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import harness
from harness.errors import (
    FlushError,
    PersistenceCloseError,
    PersistenceError,
    StorageIOError,
)
from harness.faults import Probe
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import WarningReport, open_store
from harness.testing import ExploreCheckpoints


class FailingJsonl(JsonlBackend):
    """A JSONL backend whose writes fail for the session ids in ``fail``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.fail: set[str] = set()

    def append(self, session_id: str, records: list[dict[str, Any]], **kw: Any) -> None:
        if session_id in self.fail:
            raise StorageIOError(
                f'appending to session "{session_id}" failed: disk on fire', session_id=session_id
            )
        super().append(session_id, records, **kw)

    def materialize(self, header: dict[str, Any], records: list[dict[str, Any]], **kw: Any) -> None:
        if header["id"] in self.fail:
            raise StorageIOError(
                f'creating session "{header["id"]}" failed: disk on fire', session_id=header["id"]
            )
        super().materialize(header, records, **kw)


def on_disk(root: Path, sid: str) -> list[Any]:
    backend = JsonlBackend(root)
    if backend.revision(sid) is None:
        return []
    return [r["data"] for r in backend.load(sid).records]


def close_reports(reports: list[WarningReport]) -> list[str | None]:
    return [r.session_id for r in reports if r.kind == "write-failed" and r.source == "close"]


async def test_every_failed_session_is_reported(tmp_path: Path) -> None:
    backend = FailingJsonl(tmp_path)
    reports: list[WarningReport] = []
    async with open_store() as store:
        store.warnings.subscribe(reports.append)
        with pytest.raises(PersistenceCloseError) as info:
            async with open_persistence(store, backend, write_delay=60):
                sessions = {sid: await store.create(sid, cwd="/w") for sid in ("a", "b", "c")}
                for s in sessions.values():
                    await s.append("feedback/record", 0)
                    await s.flush()
                backend.fail = {"a", "b"}
                for s in sessions.values():
                    await s.append("feedback/record", 1)  # left to the close's final flush
    error = info.value
    assert isinstance(error, PersistenceError) and error.code == "PERSISTENCE_CLOSE_FAILED"
    assert list(error.failures) == ["a", "b"]
    assert str(error).startswith('jsonl: closing failed for 2 session(s): "a": ')
    assert '"b": jsonl: writing session "b" failed' in str(error)
    for sid, exc in error.failures.items():
        assert isinstance(exc, FlushError) and exc.session_id == sid
        assert isinstance(exc.__cause__, StorageIOError)
    assert error.errors == (error.failures["a"], error.failures["b"])
    assert error.__cause__ is error.errors[0]
    # One warning per failed session, naming it, with its error.
    assert close_reports(reports) == ["a", "b"]
    report = next(r for r in reports if r.source == "close")
    assert report.error is error.failures["a"]
    assert "could not be made durable and are lost" in report.message
    # The healthy session's last event is durable; the failed ones' are not.
    assert on_disk(tmp_path, "c") == [0, 1]
    assert on_disk(tmp_path, "a") == [0] and on_disk(tmp_path, "b") == [0]


async def test_a_failed_retirement_and_a_failed_live_writer_are_both_reported(
    tmp_path: Path,
) -> None:
    backend = FailingJsonl(tmp_path)
    reports: list[WarningReport] = []
    async with open_store() as store:
        store.warnings.subscribe(reports.append)
        with pytest.raises(PersistenceCloseError) as info:
            async with open_persistence(store, backend, write_delay=60) as p:
                gone = await store.create("gone", cwd="/w")
                live = await store.create("live", cwd="/w")
                backend.fail = {"gone", "live"}
                await gone.append("feedback/record", 0)
                await live.append("feedback/record", 0)
                await store.detach(gone)
                await p.wait_retired("gone")  # failed in the background: a leftover
                assert [r.source for r in reports] == ["retirement"]
    assert set(info.value.failures) == {"gone", "live"}
    assert sorted(x for x in close_reports(reports) if x is not None) == ["gone", "live"]
    assert on_disk(tmp_path, "gone") == [] and on_disk(tmp_path, "live") == []


async def test_nothing_failed_nothing_reported(tmp_path: Path) -> None:
    reports: list[WarningReport] = []
    async with open_store() as store:
        store.warnings.subscribe(reports.append)
        async with open_persistence(store, FailingJsonl(tmp_path)) as p:
            s = await store.create("a", cwd="/w")
            await s.append("feedback/record", 0)
        await p.aclose()  # idempotent: nothing left to retire
    assert reports == []
    assert on_disk(tmp_path, "a") == [0]


async def test_the_block_exception_wins_and_carries_the_close_failure(tmp_path: Path) -> None:
    backend = FailingJsonl(tmp_path)
    reports: list[WarningReport] = []
    caught: list[BaseException] = []
    async with open_store() as store:
        store.warnings.subscribe(reports.append)
        try:
            async with open_persistence(store, backend, write_delay=60):
                for sid in ("a", "b"):
                    s = await store.create(sid, cwd="/w")
                    await s.append("feedback/record", 0)
                backend.fail = {"a", "b"}
                raise KeyError("the body failed")
        except BaseException as exc:  # the body's KeyError (maybe in a group)
            caught.append(exc)
    body_error = caught[0]
    while isinstance(body_error, BaseExceptionGroup) and len(body_error.exceptions) == 1:
        body_error = body_error.exceptions[0]
    assert isinstance(body_error, KeyError)
    notes = getattr(body_error, "__notes__", [])
    assert len(notes) == 1 and notes[0].startswith(
        "while closing the persistence: jsonl: closing failed for 2 session(s)"
    )
    assert close_reports(reports) == ["a", "b"]


async def test_open_runtime_raises_the_close_error_naming_every_session(tmp_path: Path) -> None:
    backend = FailingJsonl(tmp_path)
    reports: list[WarningReport] = []
    with pytest.raises(PersistenceCloseError) as info:
        async with harness.open_runtime(backend=backend, write_delay=60) as rt:
            rt.warnings.subscribe(reports.append)
            for sid in ("a", "b"):
                s = await rt.store.create(sid, cwd="/w")
                await s.append("feedback/record", 0)
            backend.fail = {"a", "b"}
    assert list(info.value.failures) == ["a", "b"]
    assert close_reports(reports) == ["a", "b"]


def test_close_cancelled_at_every_checkpoint(
    explore_checkpoints: ExploreCheckpoints, tmp_path: Path
) -> None:
    """An unshielded ``aclose`` cancelled at any step, then the shielded close of
    ``open_persistence``: the healthy session's events all land, and a failed
    session whose events did not land is always reported (raised or warned)."""
    counter = iter(range(1_000_000))

    async def body(probe: Probe) -> None:
        root = tmp_path / f"run-{next(counter)}"
        backend = FailingJsonl(root)
        reports: list[WarningReport] = []
        sessions: dict[str, Any] = {}
        raised: set[str] = set()
        async with open_store() as store:
            store.warnings.subscribe(reports.append)
            try:
                async with open_persistence(store, backend, write_delay=60) as p:
                    for sid in ("a", "b", "c"):
                        sessions[sid] = await store.create(sid, cwd="/w")
                    backend.fail = {"a", "b"}
                    for s in sessions.values():
                        await s.append("feedback/record", 0)
                    try:
                        await p.aclose()  # cancellable: the exploration cancels it anywhere
                    except PersistenceCloseError as exc:
                        raised |= set(exc.failures)
            except PersistenceCloseError as exc:
                raised |= set(exc.failures)
        warned = set(close_reports(reports))
        for sid, s in sessions.items():
            durable = len(on_disk(root, sid)) == len(s.events)
            if sid == "c":
                probe.check(durable, "the healthy session lost events")
            else:
                probe.check(durable or sid in warned, f'"{sid}" lost silently (no warning)')
                probe.check(
                    durable or sid in raised or not raised, f'"{sid}" missing from the close error'
                )
                probe.check(not durable, f'"{sid}" was written through a failing backend')

    report = explore_checkpoints(body, name="close-cancelled")
    assert report.attempts > 10


async def test_a_cancelled_close_still_reports_what_failed_and_a_later_close_finishes(
    tmp_path: Path,
) -> None:
    backend = FailingJsonl(tmp_path)
    reports: list[WarningReport] = []
    scope = trio.CancelScope()
    token = trio.lowlevel.current_trio_token()
    failing_append = backend.append

    def append(session_id: str, records: list[dict[str, Any]], **kw: Any) -> None:
        if session_id == "a":
            trio.from_thread.run_sync(scope.cancel, trio_token=token)  # cancel the close meanwhile
        failing_append(session_id, records, **kw)

    backend.append = append  # type: ignore[method-assign]
    async with open_store() as store:
        store.warnings.subscribe(reports.append)
        with pytest.raises(PersistenceCloseError) as info:
            async with open_persistence(store, backend, write_delay=60) as p:
                a = await store.create("a", cwd="/w")
                b = await store.create("b", cwd="/w")
                for s in (a, b):
                    await s.append("feedback/record", 0)
                    await s.flush()
                backend.fail = {"a"}
                for s in (a, b):
                    await s.append("feedback/record", 1)
                with scope:
                    await p.aclose()  # a's write fails (shielded), then the close is cancelled
                assert scope.cancelled_caught
                # Reported although the close was cancelled; b not retired yet.
                assert close_reports(reports) == ["a"]
                assert "(close cancelled)" in reports[-1].message
                assert on_disk(tmp_path, "b") == [0]
        # The shielded close of open_persistence finishes the job.
    assert list(info.value.failures) == ["a"]
    assert on_disk(tmp_path, "b") == [0, 1] and on_disk(tmp_path, "a") == [0]


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), "0.2", True, None])
async def test_open_persistence_refuses_a_bad_write_delay(tmp_path: Path, bad: object) -> None:
    from harness.errors import PersistenceArgumentError

    async with open_store() as store:
        with pytest.raises(PersistenceArgumentError, match="write_delay") as info:
            async with open_persistence(store, JsonlBackend(tmp_path / "s"), write_delay=bad):  # type: ignore[arg-type]
                pass  # pragma: no cover
    assert repr(bad) in str(info.value)
    assert not (tmp_path / "s").exists()


async def test_one_failed_final_write_is_tried_again_and_nothing_is_lost(tmp_path: Path) -> None:
    """A live session's unflushed tail meets one transient failure at close: the close
    writes it on its second try and reports nothing (the chaos scenario close-writes
    explores this at every I/O step)."""
    backend = FailingJsonl(tmp_path)
    failing_append = backend.append
    calls: list[str] = []

    def append(session_id: str, records: list[dict[str, Any]], **kw: Any) -> None:
        calls.append(session_id)
        if len(calls) == 1:  # the close's first try fails, once (the flush materialized)
            raise StorageIOError(f'appending to session "{session_id}" failed: a hiccup', session_id=session_id)
        failing_append(session_id, records, **kw)

    backend.append = append  # type: ignore[method-assign]
    reports: list[WarningReport] = []
    async with open_store() as store:
        store.warnings.subscribe(reports.append)
        async with open_persistence(store, backend, write_delay=60) as p:
            a = await store.create("a", cwd="/w")
            await a.append("feedback/record", 0)
            await a.flush()
            await a.append("feedback/record", 1)
            await a.append("feedback/record", 2)
            await p.aclose()
    assert close_reports(reports) == [] and on_disk(tmp_path, "a") == [0, 1, 2]
    assert calls == ["a", "a"]  # the failed try, the second try


async def test_close_waits_for_a_detached_public_append(tmp_path: Path) -> None:
    # Reference §2.10: dispose waits until every per-id chain is empty, detached public
    # appends included, before the backend is closed (issue 24 §4).
    import threading

    import trio.testing

    go = threading.Event()
    order: list[str] = []

    class Held(JsonlBackend):
        def materialize(self, header: Any, records: Any, *, lease: Any = None) -> None:
            go.wait()
            super().materialize(header, records, lease=lease)
            order.append("append committed")

    backend = Held(tmp_path)
    header = {"version": 0, "id": "s", "createdAt": 1}
    record = {"type": "session/end-seed", "seq": 0, "time": 1, "data": {}}
    async with trio.open_nursery() as outer, open_store() as store:
        async with open_persistence(store, backend) as p:
            await p.create(header)
            outer.start_soon(p.append, "s", [record])  # detached: another task's call
            await trio.testing.wait_all_tasks_blocked()

            async def release() -> None:
                await trio.testing.wait_all_tasks_blocked()  # the close is waiting
                order.append("released")
                go.set()

            outer.start_soon(release)
        order.append("persistence closed")
    assert order == ["released", "append committed", "persistence closed"]
