"""Chained group-commit rounds (decision 0015): the writer thread starts the next round
itself, as soon as the previous one is written, with the batches submitted meanwhile;
the Trio thread only submits and completes. Driven by threading events and Trio's
``wait_all_tasks_blocked``, never by timing (a 10 s wait only bounds a broken run)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import outcome
import pytest
import trio
import trio.testing

from harness.persistence import JsonlBackend, open_persistence
from harness.persistence import _committer as committer_module
from harness.persistence._backend import GroupWrite
from harness.persistence._committer import CommitJob, GroupCommitter
from harness.runtime import SessionHandle, open_store
from tests.test_group_commit import on_disk, sessions

WAIT = 10.0  # bounds a broken run only


class SteppedJsonl(JsonlBackend):
    """Holds the ``n``-th ``write_group`` call (counted from ``hold()``) at its start
    until ``release[n]`` is set; ``entered[n]`` is set when it starts."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.groups: list[list[str]] = []
        self.holding = False
        self.entered = [threading.Event() for _ in range(8)]
        self.release = [threading.Event() for _ in range(8)]

    def hold(self) -> None:
        self.groups.clear()
        self.holding = True

    def write_group(self, writes: Sequence[GroupWrite]) -> list[BaseException | None]:
        if self.holding:
            n = len(self.groups)
            self.groups.append(sorted(w.session_id for w in writes))
            self.entered[n].set()
            self.release[n].wait(WAIT)
        return super().write_group(writes)


async def flushes_queued_behind_a_held_round(
    backend: SteppedJsonl,
    committer: GroupCommitter,
    first: SessionHandle,
    others: Sequence[SessionHandle],
    n: trio.Nursery,
) -> None:
    """``first``'s round held on the writer thread, the others' batches pending."""
    backend.hold()
    await first.append("feedback/record", 1)
    n.start_soon(first.flush)
    await trio.to_thread.run_sync(backend.entered[0].wait, WAIT)
    for h in others:
        await h.append("feedback/record", 1)
        n.start_soon(h.flush)
    await trio.testing.wait_all_tasks_blocked()
    assert len(committer._pending) == len(others)


async def test_the_next_round_starts_without_the_trio_thread(tmp_path: Path) -> None:
    backend = SteppedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=60) as p:
        a, b, c = await sessions(store, "a", "b", "c")
        async with trio.open_nursery() as n:
            await flushes_queued_behind_a_held_round(backend, p.committer, a, (b, c), n)
            rounds = p.committer.rounds
            backend.release[0].set()
            # The Trio thread is blocked here, so it runs no completion: the writer
            # thread must start the next round by itself.
            started = backend.entered[1].wait(WAIT)
            assert started and backend.groups == [["a"], ["b", "c"]]
            assert p.committer.rounds == rounds + 1  # counted as the round took them
            assert (
                a.id in p._writers and p._writers["a"].durable == 1
            )  # a's waiter not completed yet
            backend.release[1].set()
    for sid in "abc":
        assert on_disk(tmp_path, sid) == [0, 1]


def _chain_ended_after(monkeypatch: pytest.MonkeyPatch, backend: SteppedJsonl, *, rounds: int) -> threading.Event:
    """Set once the chain that wrote the ``rounds``-th round ended (any earlier chain is
    not it): the rounds are written and handed to the Trio thread."""
    chains_ended = threading.Event()
    ended = committer_module._chain_ended

    def chain_ended(result: outcome.Outcome[None]) -> None:
        ended(result)
        if len(backend.groups) == rounds:
            chains_ended.set()

    monkeypatch.setattr(committer_module, "_chain_ended", chain_ended)
    return chains_ended


async def test_rounds_written_before_the_trio_thread_ran_a_completion_share_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = SteppedJsonl(tmp_path)
    chains_ended = _chain_ended_after(monkeypatch, backend, rounds=2)
    async with open_store() as store, open_persistence(store, backend, write_delay=60) as p:
        a, b, c = await sessions(store, "a", "b", "c")
        committer = p.committer
        completions: list[int] = []
        complete = committer._complete_rounds

        def counted() -> None:
            completions.append(len(committer._done))
            complete()

        committer._complete_rounds = counted  # type: ignore[method-assign]
        async with trio.open_nursery() as n:
            await flushes_queued_behind_a_held_round(backend, committer, a, (b, c), n)
            backend.release[0].set()
            backend.release[1].set()
            # Trio thread blocked: both rounds are written and the chain ends.
            assert chains_ended.wait(WAIT)
            assert backend.groups == [["a"], ["b", "c"]]
        assert completions == [2]  # one run_sync_soon completed both rounds
    for sid in "abc":
        assert on_disk(tmp_path, sid) == [0, 1]


async def test_close_while_rounds_chain_writes_what_is_pending_then_ends_the_thread(
    tmp_path: Path,
) -> None:
    backend = SteppedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=60) as p:
        a, b, c = await sessions(store, "a", "b", "c")
        async with trio.open_nursery() as n:
            await flushes_queued_behind_a_held_round(backend, p.committer, a, (b, c), n)
            thread = p.committer.close()
            assert thread is not None and thread.is_alive()
            backend.release[0].set()
            backend.release[1].set()
            await trio.to_thread.run_sync(thread.join, WAIT)
            assert not thread.is_alive() and p.committer._thread._thread is None
            assert backend.groups == [
                ["a"],
                ["b", "c"],
            ]  # the round in flight, then what was pending
        # The flushes were acknowledged by the rounds that wrote them.
        assert all(p._writers[s].durable == 2 for s in "abc")
        backend.holding = False
        await a.append("feedback/record", 2)
        await a.flush()  # a round after close starts a new thread
    assert on_disk(tmp_path, "a") == [0, 1, 2]
    assert on_disk(tmp_path, "b") == on_disk(tmp_path, "c") == [0, 1]


# -- the committer alone ---------------------------------------------------------------------


class RecordingBackend:
    """A backend with only ``write_group``: records the sessions of each round."""

    name = "recording"

    def __init__(self) -> None:
        self.groups: list[list[str]] = []

    def write_group(self, writes: Sequence[GroupWrite]) -> list[BaseException | None]:
        self.groups.append([w.session_id for w in writes])
        return [None] * len(writes)


def job(
    sid: str,
    prepared: list[str],
    *,
    gate: threading.Event | None = None,
    entered: threading.Event | None = None,
) -> CommitJob:
    def prepare() -> GroupWrite:
        prepared.append(sid)
        if entered is not None:
            entered.set()
        if gate is not None:
            gate.wait(WAIT)
        return GroupWrite(sid, {"id": sid}, [{"seq": 0}], True, None)

    return CommitJob(prepare, lambda _err: None)


async def wait_all(committer: GroupCommitter, *jobs: CommitJob) -> list[outcome.Outcome[None]]:
    return [await committer.wait(j) for j in jobs]


async def test_withdraw_races_the_writer_thread_and_a_withdrawn_job_is_never_written() -> None:
    backend = RecordingBackend()
    committer = GroupCommitter(backend)  # type: ignore[arg-type]
    prepared: list[str] = []
    hold, in_round = threading.Event(), threading.Event()
    held = threading.Event()
    try:
        first = job("first", prepared, gate=hold, entered=held)
        committer.submit(first)
        await trio.to_thread.run_sync(held.wait, WAIT)  # round 1 is preparing "first"
        queued = job("queued", prepared)
        committer.submit(queued)
        assert committer.withdraw(queued)  # still pending: taken back
        blocker_gate = threading.Event()
        blocker = job("blocker", prepared, gate=blocker_gate, entered=in_round)
        taken = job("taken", prepared)
        for j in (blocker, taken):
            committer.submit(j)
        hold.set()
        await trio.to_thread.run_sync(in_round.wait, WAIT)  # round 2 took both, prepares "blocker"
        assert committer._pending == []
        assert committer.withdraw(taken)  # in a round that has not reached it: never runs
        assert not committer.withdraw(blocker)  # started: it runs
        blocker_gate.set()
        results = await wait_all(committer, first, blocker, taken)
    finally:
        hold.set()
        committer.close()
    assert backend.groups == [["first"], ["blocker"]]
    assert prepared == ["first", "blocker"]
    assert [r.error if isinstance(r, outcome.Error) else None for r in results][:2] == [None, None]
    assert isinstance(results[2], outcome.Error) and isinstance(
        results[2].error, committer_module.Withdrawn
    )


async def test_withdraw_racing_a_chain_never_loses_or_half_writes_a_job() -> None:
    # Submitting and withdrawing while the writer thread chains rounds: whatever the
    # interleaving, a job is written exactly when its withdrawal said it would be.
    backend = RecordingBackend()
    committer = GroupCommitter(backend)  # type: ignore[arg-type]
    prepared: list[str] = []
    verdicts: dict[str, bool] = {}
    jobs: list[CommitJob] = []
    try:
        for i in range(300):
            for k in range(3):
                j = job(f"{i}.{k}", prepared)
                jobs.append(j)
                committer.submit(j)
            verdicts[f"{i}.1"] = withdrawn = committer.withdraw(jobs[-2])
            if withdrawn:
                del jobs[
                    -2
                ]  # nobody waits for it (a job taken back from the queue gets no outcome)
            if i % 3 == 0:
                await trio.lowlevel.checkpoint()
        await wait_all(committer, *jobs)
    finally:
        committer.close()
    written = {s for g in backend.groups for s in g}
    assert set(prepared) == written
    for sid, withdrawn in verdicts.items():
        assert (sid not in written) == withdrawn, sid
    assert all(f"{i}.{k}" in written for i in range(300) for k in (0, 2))
    assert (
        len(written) <= committer.batches <= len(jobs)
    )  # a job taken by a round counts, withdrawn or not


def test_a_run_that_ends_under_a_chain_leaves_what_is_pending_unwritten() -> None:
    backend = RecordingBackend()
    committer = GroupCommitter(backend)  # type: ignore[arg-type]
    prepared: list[str] = []
    hold, held = threading.Event(), threading.Event()

    async def main() -> None:
        committer.submit(job("in-flight", prepared, gate=hold, entered=held))
        await trio.to_thread.run_sync(held.wait, WAIT)
        committer.submit(job("pending", prepared))
        # The run ends here, nobody waiting: the round's completion finds it over.

    try:
        trio.run(main)
        hold.set()
        thread = committer.close()
        assert thread is not None
        thread.join(WAIT)
        assert not thread.is_alive()
    finally:
        hold.set()
    assert backend.groups == [["in-flight"]] and prepared == ["in-flight"]
    assert not committer._busy and committer._pending == [] and committer._done == []


async def test_a_wrapped_start_thread_soon_does_not_change_how_rounds_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before the explorer gated the chain itself (decision 0015, amended), any wrapper
    # of ``start_thread_soon`` switched the committer to rounds dispatched from the
    # Trio side; now only ``_committer.chain_gate`` gates it, and the chain is the same.
    import trio._threads as trio_threads

    original: Callable[..., None] = trio_threads.start_thread_soon
    handed: list[str] = []

    def wrapped(
        fn: Callable[[], Any], deliver: Callable[[Any], None], name: str | None = None
    ) -> None:
        handed.append(str(name))
        original(fn, deliver, name)

    backend = SteppedJsonl(tmp_path)
    async with open_store() as store, open_persistence(store, backend, write_delay=60) as p:
        a, b, c = await sessions(store, "a", "b", "c")
        monkeypatch.setattr(trio_threads, "start_thread_soon", wrapped)
        rounds = p.committer.rounds
        async with trio.open_nursery() as n:
            await flushes_queued_behind_a_held_round(backend, p.committer, a, (b, c), n)
            assert p.committer._thread._thread is not None  # the committer's own thread
            backend.release[0].set()
            backend.release[1].set()
        monkeypatch.undo()
        assert backend.groups == [["a"], ["b", "c"]]
        assert p.committer.rounds == rounds + 2
        assert "harness group commit round" not in handed
    for sid in "abc":
        assert on_disk(tmp_path, sid) == [0, 1]


class _TaskSteps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.tasks: list[str] = []

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.tasks.append(task.name)


async def test_a_completion_wakes_the_waiters_of_its_rounds_and_no_other_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 26 (decision 0018): delivering rounds costs one scheduler step for all of
    # them (the entry queue running the ``run_sync_soon`` callback, which reschedules
    # every waiter itself), then one step per waiter: no task per round or per batch.
    backend = SteppedJsonl(tmp_path)
    chains_ended = _chain_ended_after(monkeypatch, backend, rounds=2)
    async with open_store() as store, open_persistence(store, backend, write_delay=60) as p:
        a, b, c = await sessions(store, "a", "b", "c")
        steps = _TaskSteps()
        async with trio.open_nursery() as n:
            await flushes_queued_behind_a_held_round(backend, p.committer, a, (b, c), n)
            trio.lowlevel.add_instrument(steps)  # from here the Trio thread is blocked
            backend.release[0].set()
            backend.release[1].set()
            assert chains_ended.wait(WAIT)  # both rounds written, neither completed
        trio.lowlevel.remove_instrument(steps)
        flushers = [t for t in steps.tasks if "flush" in t]
        others = [t for t in steps.tasks if "flush" not in t]
        assert len(flushers) == 3  # each waiter resumes once and returns
        # The entry queue once (both rounds), and this task leaving the nursery.
        assert len(others) == 2 and sum("run_sync_soon" in t for t in others) == 1, steps.tasks
    for sid in "abc":
        assert on_disk(tmp_path, sid) == [0, 1]
