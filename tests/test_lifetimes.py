"""The front door's orderly teardown: a cancelled enclosing scope, an exception of the
body, or a normal exit all wind the runtime down in order (issue 13)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import harness
from actors import open_guard
from harness.agent import AgentHandle, Call, Say, ScriptedProvider, ToolSet, tool
from harness.errors import PersistenceError
from harness.faults import FailingFiles, Probe, check_log
from harness.persistence import JsonlBackend
from harness.session import thaw
from harness.testing import ExploreCheckpoints, assert_log_ok


def waiting_tool(started: trio.Event) -> Any:
    @tool("wait", "Wait until cancelled")
    async def wait_forever(args: dict[str, Any]) -> Any:
        started.set()
        await trio.sleep_forever()

    return wait_forever


def turn_ends(events: Any) -> list[dict[str, Any]]:
    return [thaw(e["data"] if isinstance(e, dict) else e.data) for e in events if _type(e) == "turn/end"]


def _type(e: Any) -> str:
    return str(e["type"] if isinstance(e, dict) else e.type)


def _records(root: Path, sid: str) -> list[dict[str, Any]]:
    return list(JsonlBackend(root).load(sid).records)


def _check_ends(ends: list[dict[str, Any]], probe: Probe | None = None) -> None:
    """Every turn/end is the script's completion or the teardown's or the owner's abort
    (``disposed``); only the body's own cancellation of ``run_turn`` (the ``body``
    canceller) makes it ``user``."""
    causes = ("disposed", "user") if probe is not None and probe.canceller_name == "body" else ("disposed",)
    allowed = [{"kind": "completed"}, *({"kind": "aborted", "reason": {"kind": k}} for k in causes)]
    for end in ends:
        reason = end["reason"]
        ok = reason in allowed
        if probe is not None:
            probe.check(ok, f"unexpected turn/end reason {reason!r}")
        else:
            assert ok, reason


# -- deterministic cases -------------------------------------------------------------------


async def test_enclosing_cancel_during_a_turn_logs_the_teardown_abort(tmp_path: Path) -> None:
    provider = ScriptedProvider([[Call("wait", {})]])
    root = tmp_path / "s"
    disposed: list[str] = []
    handles: list[AgentHandle] = []
    started = trio.Event()
    with trio.CancelScope() as outer:
        async with harness.open_runtime(root, provider=provider, tools=ToolSet([waiting_tool(started)])) as rt:
            rt.store.on_disposed(lambda h: disposed.append(h.id))
            handles.append(await rt.create("a"))

            async def cancel_when_waiting() -> None:
                await started.wait()
                outer.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_when_waiting)
                await handles[0].run_turn("go")
            pytest.fail("the body was not cancelled")  # pragma: no cover
    assert outer.cancelled_caught
    assert disposed == ["a"]
    assert handles[0].disposed
    assert_log_ok(handles[0])
    assert turn_ends(handles[0].session.events) == [
        {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "disposed"}}}
    ]
    records = _records(root, "a")
    assert_log_ok(records)
    assert turn_ends(records) == turn_ends(handles[0].session.events)


async def test_enclosing_cancel_before_the_body_starts_still_closes_in_order() -> None:
    entered: list[bool] = []
    with trio.CancelScope() as outer:
        outer.cancel()
        async with harness.open_runtime(provider=ScriptedProvider([])) as rt:
            entered.append(True)
            await rt.create("a")  # the body starts cancelled: its first checkpoint raises
            pytest.fail("the body was not cancelled")  # pragma: no cover
    assert outer.cancelled_caught
    assert entered == [True]


async def test_an_exception_of_the_body_propagates_unwrapped_after_an_orderly_teardown(tmp_path: Path) -> None:
    provider = ScriptedProvider([[Say("done")]])
    root = tmp_path / "s"
    with pytest.raises(KeyError, match="boom") as info:
        async with harness.open_runtime(root, provider=provider) as rt:
            h = await rt.create("a")
            await h.run_turn("hi")
            await h.session.append("feedback/record", {"text": "pending write"})
            raise KeyError("boom")
    assert type(info.value) is KeyError  # not an exception group of the layers' nurseries
    assert h.disposed
    records = _records(root, "a")
    assert_log_ok(records)
    assert [r["type"] for r in records][-1] == "feedback/record"  # the pending write was flushed


async def test_a_failed_final_flush_is_reported_even_when_cancelled(tmp_path: Path) -> None:
    files = FailingFiles()
    with trio.CancelScope() as outer:
        with pytest.raises(PersistenceError, match='session "f"'):
            async with harness.open_runtime(backend=JsonlBackend(tmp_path, files=files), write_delay=1000) as rt:
                s = await rt.store.create("f")
                await s.append("feedback/record", {"i": 0})
                await s.flush()
                files.fail_writes = 100
                await s.append("feedback/record", {"i": 1})  # pending: its final flush fails
                outer.cancel()
                await trio.sleep_forever()
    assert not outer.cancelled_caught  # the failure replaced the cancellation
    assert [r["data"]["i"] for r in JsonlBackend(tmp_path).load("f").records] == [0]


async def test_shutdown_grace_must_be_positive() -> None:
    with pytest.raises(harness.RuntimeConfigError, match="shutdown_grace"):
        async with harness.open_runtime(shutdown_grace=0):
            pass  # pragma: no cover


async def test_open_guard_bounds_the_cleanup_and_then_propagates_the_cancel(caplog: pytest.LogCaptureFixture) -> None:
    stopped: list[str] = []
    with trio.CancelScope() as outer:
        async with open_guard("svc", grace=0.05) as guard:
            try:
                with guard.body():
                    outer.cancel()
                    await trio.sleep_forever()
            finally:
                try:
                    await trio.sleep_forever()  # a wedged, unshielded cleanup step
                except trio.Cancelled:
                    stopped.append("cut short")
                    raise
    assert outer.cancelled_caught
    assert guard.cancelled and guard.overran
    assert stopped == ["cut short"]
    assert "cleanup did not finish within 0.05 s" in caplog.text


async def test_open_guard_runs_callbacks_before_cancelling_the_body() -> None:
    seen: list[str] = []
    with trio.CancelScope() as outer:
        async with open_guard("svc", grace=5) as guard:
            guard.on_cancel(lambda: seen.append("callback"))
            guard.on_cancel(_fail)  # logged, the next steps still run
            with guard.body():
                try:
                    outer.cancel()
                    await trio.sleep_forever()
                finally:
                    seen.append("body cancelled")
            seen.append("cleanup")
            await trio.lowlevel.checkpoint()  # not cancelled: the cleanup is shielded
            seen.append("cleanup done")
    assert outer.cancelled_caught
    assert seen == ["callback", "body cancelled", "cleanup", "cleanup done"]


# -- exploration: a cancellation at every checkpoint, by the enclosing scope (``caller``),
# the runtime owner closing (``owner``) and a scope inside the block (``body``) ----------


def _nothing() -> None:
    pass


def _fail() -> None:
    raise RuntimeError("callback failed")


def _dispatch(targets: dict[str, Callable[[], None]], name: str) -> Callable[[], None]:
    return lambda: targets.get(name, _nothing)()


def _turn_body(root: Path | None) -> Any:
    async def body(probe: Probe) -> None:
        handles: list[AgentHandle] = []
        provider = ScriptedProvider([[Call("ping", {})], [Say("pong received")]])
        # Bound from the start (the explorer wants every canceller at every step):
        # before its target exists a canceller does nothing.
        targets: dict[str, Callable[[], None]] = {}
        for name in ("owner", "body"):
            probe.canceller(name, _dispatch(targets, name))
        try:
            async with harness.open_runtime(root, provider=provider, tools=ToolSet([ping])) as rt:
                targets["owner"] = lambda: rt.owner.close("closed by the test")
                with trio.CancelScope() as inner:
                    targets["body"] = inner.cancel
                    handles.append(await rt.create("x"))
                    await handles[0].run_turn("hi")
        finally:
            for h in handles:
                problems = check_log(list(h.session.events), live=False)
                probe.check(not problems, f"in memory: {problems}")
                assert_log_ok(h)
                _check_ends(turn_ends(h.session.events), probe)
                probe.check(h.disposed, "the agent was not disposed")
            if root is not None and handles:
                records = _records(root, "x")
                problems = check_log(records, live=False)
                probe.check(not problems, f"stored: {problems}")
                assert_log_ok(records)
                probe.check(
                    turn_ends(records) == turn_ends(handles[0].session.events),
                    "the stored turn/ends differ from the live log's",
                )

    return body


@tool("ping", "Answer pong")
async def ping(args: dict[str, Any]) -> Any:
    await trio.lowlevel.checkpoint()
    return "pong"


def test_enclosing_cancel_at_every_checkpoint_in_memory(explore_checkpoints: ExploreCheckpoints) -> None:
    report = explore_checkpoints(_turn_body(None), name="lifetimes-memory")
    assert report.attempts > 50


def test_enclosing_cancel_at_every_checkpoint_on_jsonl(
    explore_checkpoints: ExploreCheckpoints, tmp_path: Path
) -> None:
    counter = iter(range(1_000_000))

    async def body(probe: Probe) -> None:
        await _turn_body(tmp_path / f"run-{next(counter)}")(probe)

    report = explore_checkpoints(body, name="lifetimes-jsonl", stride=3)
    assert report.attempts > 50


def test_the_log_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    # The orderly teardown logs nothing at WARNING or above on a normal exit.
    async def main() -> None:
        async with harness.open_runtime(provider=ScriptedProvider([[Say("x")]])) as rt:
            await (await rt.create("a")).run_turn("hi")

    with caplog.at_level(logging.WARNING):
        trio.run(main)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_raising_body_cancelled_at_every_checkpoint(explore_checkpoints: ExploreCheckpoints, tmp_path: Path) -> None:
    """The body's own exception and an enclosing cancellation, in every interleaving:
    the exception comes out unwrapped (or the Cancelled does), the log is balanced."""
    counter = iter(range(1_000_000))

    async def body(probe: Probe) -> None:
        root = tmp_path / f"run-{next(counter)}"
        handles: list[AgentHandle] = []
        try:
            async with harness.open_runtime(root, provider=ScriptedProvider([[Say("hi")]])) as rt:
                handles.append(await rt.create("x"))
                await handles[0].run_turn("hi")
                raise KeyError("boom")
        except KeyError:
            probe.check(bool(handles) and handles[0].disposed, "the agent outlived the runtime")
        finally:
            for h in handles:
                assert_log_ok(h)
                assert_log_ok(_records(root, "x"))
                _check_ends(turn_ends(h.session.events), probe)

    report = explore_checkpoints(body, name="lifetimes-raising", stride=3)
    assert report.attempts > 20
