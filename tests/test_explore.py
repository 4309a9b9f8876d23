"""The checkpoint explorer on small toy Trio code (not the harness), and the built-in
invariants on hand-built logs."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import trio

from harness.errors import HarnessError
from harness.faults import (
    Probe,
    ReplayKey,
    Scenario,
    ScenarioError,
    Settings,
    TaskInfo,
    check_durable,
    check_log,
    check_no_tasks_left,
    check_preparations,
    explore,
    replay,
    step_plan,
)
from tests.helpers import assistant, rec, tool_call_block, tool_result, user

FAST = Settings(autojump_threshold=0.0, timeout=60.0, grace=10.0, real_timeout=20.0)


# -- a planted bug: applied, but reported cancelled ------------------------------------------


class Account:
    def __init__(self) -> None:
        self.balance = 0
        self.receipts: list[int] = []


async def deposit(account: Account, amount: int) -> None:
    """Buggy on purpose: the balance changes, then a checkpoint, then the receipt.
    A cancellation at exactly that second checkpoint leaves a deposit without receipt."""
    await trio.lowlevel.checkpoint()
    account.balance += amount
    await trio.lowlevel.checkpoint()
    account.receipts.append(amount)


async def deposit_fixed(account: Account, amount: int) -> None:
    await trio.lowlevel.checkpoint()
    account.balance += amount
    account.receipts.append(amount)
    await trio.lowlevel.checkpoint()


def bank(fn: Any) -> Any:
    async def scenario(probe: Probe) -> None:
        account = Account()
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as caller:
                probe.canceller("caller", caller.cancel)
                probe.arm()
                nursery.start_soon(trio.sleep, 0.01)  # a bystander task: its steps count too
                await fn(account, 10)
        probe.disarm()
        probe.check(
            account.balance == sum(account.receipts),
            f"applied but reported cancelled: balance {account.balance}, receipts {account.receipts}",
        )

    return scenario


def test_explorer_finds_the_planted_bug_at_one_step_only() -> None:
    report = explore(bank(deposit), name="bank", seeds=3, settings=FAST)
    assert report.violations, "the planted bug was not found"
    assert all(v.message == "applied but reported cancelled: balance 10, receipts []" for v in report.violations)
    assert report.steps == {"caller": sum(report.dry_steps.values())}
    assert report.attempts == 3 + sum(report.dry_steps.values())
    # The cancellation must land exactly at the checkpoint between balance and receipt:
    # for each seed, the violating step is the one where the main task resumes there
    # (or a bystander step in the same batch, right before it).
    for v in report.violations:
        assert v.canceller == "caller" and v.k >= 1
        assert v.task is not None
    main_hits = [v for v in report.violations if any("deposit" in frame for frame in v.stack)]
    assert main_hits and all(v.stack[-1].startswith("trio.") for v in main_hits)
    assert any("test_explore:" in frame and "deposit" in frame for frame in main_hits[0].stack)
    fixed = explore(bank(deposit_fixed), name="bank-fixed", seeds=3, settings=FAST)
    assert fixed.ok and fixed.steps == {"caller": sum(fixed.dry_steps.values())}


def test_same_seed_same_result_and_replay_is_exact() -> None:
    first = explore(bank(deposit), name="bank", seeds=[5, 6], settings=FAST)
    second = explore(bank(deposit), name="bank", seeds=[5, 6], settings=FAST)
    assert [(v.key, v.message, v.task, v.stack) for v in first.violations] == [
        (v.key, v.message, v.task, v.stack) for v in second.violations
    ]
    assert first.dry_steps == second.dry_steps
    v = first.violations[0]
    again = replay(bank(deposit), str(v.key), settings=FAST)
    assert again.key == v.key and again.fired
    assert [x.message for x in again.violations] == [v.message]
    assert (again.task, again.stack) == (v.task, v.stack)
    # A step that does not violate replays clean.
    clean = next(k for k in range(1, first.dry_steps[5] + 1) if ReplayKey("bank", 5, k, "caller") not in {x.key for x in first.violations})
    assert replay(bank(deposit), ReplayKey("bank", 5, clean, "caller"), settings=FAST).violations == ()


def test_seeds_change_the_schedule() -> None:
    # Two tasks append to a shared list at each checkpoint: the batch order decides the
    # interleaving, and Trio's seeded scheduler makes it a function of the seed.
    orders: dict[int, list[str]] = {}

    async def interleave(probe: Probe) -> None:
        out: list[str] = []

        async def worker(name: str) -> None:
            for _ in range(6):
                out.append(name)
                await trio.lowlevel.checkpoint()

        probe.arm()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker, "a")
            nursery.start_soon(worker, "b")
        orders.setdefault(probe.seed, []).append("".join(out))

    explore(interleave, seeds=8, cancellers=[], settings=FAST)
    explore(interleave, seeds=8, cancellers=[], settings=FAST)
    assert all(len(set(runs)) == 1 for runs in orders.values())  # same seed, same order
    assert len({runs[0] for runs in orders.values()}) > 1  # different seeds differ


def test_worker_threads_are_gated_so_replay_stays_exact() -> None:
    # Worker threads of random real duration run next to a task taking checkpoints:
    # without the gate, how far the ticker got when each result arrived would vary.
    async def threaded(probe: Probe) -> None:
        ticks: list[int] = []
        seen: list[int] = []

        def work() -> int:
            time.sleep(random.uniform(0.0, 0.004))
            return 1

        async def ticker() -> None:
            for i in range(40):
                seen.append(i)
                time.sleep(0.0002)  # real work: the thread may finish at any tick
                await trio.lowlevel.checkpoint()

        with trio.CancelScope() as caller:
            probe.canceller("caller", caller.cancel)
            probe.arm()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker)
                for _ in range(3):
                    await trio.to_thread.run_sync(work)
                    ticks.append(len(seen))
        probe.fail(f"ticks={ticks}")  # reported as a "violation" so the test can compare

    runs = [replay(threaded, "threaded:seed=1:k=0:dry", settings=FAST) for _ in range(6)]
    assert len({(a.steps, a.violations[0].message) for a in runs}) == 1, [a.violations[0].message for a in runs]
    cut = [replay(threaded, "threaded:seed=1:k=9:caller", settings=FAST) for _ in range(4)]
    assert len({(a.steps, a.task, a.stack, a.violations[0].message) for a in cut}) == 1
    assert all(a.gate_timeouts == 0 for a in runs + cut)


def test_a_hang_is_a_violation() -> None:
    async def stuck(probe: Probe) -> None:
        done = trio.Event()
        with trio.CancelScope() as caller:
            probe.canceller("caller", caller.cancel)
            probe.arm()
            async with trio.open_nursery() as nursery:

                async def producer() -> None:
                    await trio.sleep(1)
                    done.set()

                nursery.start_soon(producer)
        await done.wait()  # a cancelled producer never sets it: waits forever

    settings = Settings(autojump_threshold=0.0, timeout=30.0, grace=5.0, real_timeout=20.0)
    report = explore(stuck, seeds=1, settings=settings)
    hangs = [v for v in report.violations if v.message.startswith("deadlock/hang at step")]
    assert hangs and len(hangs) == len(report.violations)
    assert all("stuck" in (v.traceback or "") and "wait" in (v.traceback or "") for v in hangs)  # the task dump


def test_a_hard_hang_in_shielded_code_is_abandoned_and_reported() -> None:
    async def shielded(probe: Probe) -> None:
        never = trio.Event()
        with trio.CancelScope() as caller:
            probe.canceller("caller", caller.cancel)
            probe.arm()
            await trio.lowlevel.checkpoint()
        if caller.cancelled_caught:
            with trio.CancelScope(shield=True):
                await never.wait()  # the watchdog's cancellation cannot reach this

    settings = Settings(autojump_threshold=0.0, timeout=10.0, grace=5.0, real_timeout=20.0)
    started = time.monotonic()
    report = explore(shielded, name="shielded", seeds=1, settings=settings)
    assert time.monotonic() - started < 15
    hard = [v for v in report.violations if "abandoned after a hard hang" in v.message]
    assert len(hard) == 1 and "never.wait" not in hard[0].message
    assert "shielded" in (hard[0].traceback or "")


def test_a_raw_exception_is_a_violation_and_a_library_error_is_not() -> None:
    async def leaky(probe: Probe) -> None:
        with trio.CancelScope() as caller:
            probe.canceller("caller", caller.cancel)
            probe.arm()
            await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint()
        if caller.cancelled_caught:
            if probe.k == 1:
                raise HarnessError("typed, allowed")
            raise ValueError("cleanup forgot a case")

    report = explore(leaky, settings=FAST)
    raw = [v for v in report.violations if "raw non-library exception escaped: ValueError" in v.message]
    assert raw and all("cleanup forgot a case" in (v.traceback or "") for v in raw)
    assert 1 not in {v.k for v in report.violations}  # the HarnessError at k=1 is allowed


def test_cancellers_and_tasks_left_running() -> None:
    async def leaks(probe: Probe) -> None:
        async with trio.open_nursery() as outer:
            probe.canceller("noop", lambda: None)
            probe.arm()
            async with trio.open_nursery() as inner:
                inner.start_soon(trio.sleep, 0.1)
            outer.start_soon(trio.sleep_forever, name="leaked")
            await trio.lowlevel.checkpoint()
            probe.record(check_no_tasks_left(probe.live_tasks()))
            outer.cancel_scope.cancel()

    report = explore(leaks, settings=FAST)
    assert report.violations and all("task left running" in v.message and "leaked" in v.message for v in report.violations)
    with pytest.raises(ScenarioError):
        explore(leaks, cancellers=["missing"], settings=FAST)

    async def bad_name(probe: Probe) -> None:
        probe.canceller("a:b", lambda: None)

    assert any("ScenarioError" in v.message for v in explore(bad_name, settings=FAST).violations)


def test_a_canceller_that_raises_is_reported() -> None:
    async def scenario(probe: Probe) -> None:
        def boom() -> None:
            raise RuntimeError("canceller broke")

        probe.canceller("boom", boom)
        probe.arm()
        await trio.lowlevel.checkpoint()

    report = explore(Scenario("boomer", scenario, cancellers=("boom",)), seeds=1, settings=FAST)
    assert [v.message.splitlines()[0] for v in report.violations] == ["canceller 'boom' raised RuntimeError: canceller broke"]


def test_replay_keys_and_step_plans() -> None:
    key = ReplayKey("resume/jsonl", 3, 41, "owner")
    assert str(key) == "resume/jsonl:seed=3:k=41:owner"
    assert ReplayKey.parse(str(key)) == key
    assert ReplayKey.parse("a:b:seed=0:k=0:dry") == ReplayKey("a:b", 0, 0, "dry")
    for bad in ["resume", "resume:seed=x:k=1:owner", "resume:k=1:seed=1:owner", ":seed=1:k=1:owner"]:
        with pytest.raises(ValueError):
            ReplayKey.parse(bad)
    assert list(step_plan(5, seed=0)) == [1, 2, 3, 4, 5]
    assert list(step_plan(10, seed=1, stride=3)) == [2, 5, 8]
    assert list(step_plan(10, seed=0, stride=2, max_steps=6)) == [1, 3, 5]
    assert sorted(k for s in range(3) for k in step_plan(10, seed=s, stride=3)) == list(range(1, 11))
    assert str(TaskInfo("t", ("m:1 f", "m:2 g"))) == "t (at m:2 g)"


def test_trio_scheduler_state_is_restored() -> None:
    from trio._core import _run

    before = (getattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING"), _run._r.getstate())  # noqa: B009
    explore(bank(deposit_fixed), settings=FAST)
    assert (getattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING"), _run._r.getstate()) == before  # noqa: B009


# -- the built-in invariants on hand-built logs ----------------------------------------------


def turn_log() -> list[dict[str, Any]]:
    return [
        rec("turn/start", 0, {"turn": 1}),
        rec("user/message", 1, user(), surfaceOp="append"),
        rec("step/start", 2, {"turn": 1, "step": 1}),
        rec("assistant/message", 3, assistant(blocks=[tool_call_block("c1")]), surfaceOp="append"),
        rec("tool/call", 4, {"turn": 1, "step": 1, "callId": "c1", "name": "read", "arguments": "{}"}),
        rec("tool/result", 5, tool_result("c1"), surfaceOp="append"),
        rec("step/end", 6, {"turn": 1, "step": 1}),
        rec("turn/end", 7, {"turn": 1, "reason": {"kind": "completed"}}),
    ]


def renumber(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "seq": i} for i, r in enumerate(records)]


def test_check_log_accepts_a_good_log_and_open_turns_only_when_live() -> None:
    log = turn_log()
    assert check_log(log, live=False) == []
    assert check_log(log[:6], live=True) == []
    assert check_log(log[:6], live=False) == ["turn 1 is still open at the end of a log at rest"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda log: [*log[:3], *log[4:]], "seqs are not contiguous"),
        (lambda log: renumber([*log[:5], log[5], log[5], *log[6:]]), "second tool/result for call c1"),
        (lambda log: renumber([*log[:4], *log[5:]]), "tool/result for call c1 at seq 4 has no tool/call before it"),
        (lambda log: renumber([*log[:5], *log[6:]]), "leaves tool call(s) c1 without a result"),
        (lambda log: renumber([*log[:6], log[7]]), "turn/end 1 at seq 6 while step 1 is open"),
        (lambda log: renumber([*log, log[0]]), "turn/start 1 at seq 8 after turn 1"),
        (lambda log: renumber([log[0], *log]), "turn/start 1 at seq 1 while turn 1 is open"),
        (lambda log: renumber([*log[:2], log[6], *log[7:]]), "step/end 1 at seq 2 does not match the open step None"),
        (lambda log: renumber([*log, rec("turn/start", 0, {"turn": 3})]), "turn/start 3 at seq 8 after turn 1"),
        (lambda log: renumber([*log, log[2]]), "step/start at seq 8 outside any turn"),
    ],
)
def test_check_log_finds_bad_logs(mutate: Any, expected: str) -> None:
    found = check_log(mutate(turn_log()), live=True)
    assert any(expected in m for m in found), found


def test_repair_results_and_call_ids_scoped_per_turn() -> None:
    log = turn_log()
    second = [{**r, "data": {**r["data"], "turn": 2}} if "turn" in r["data"] else r for r in log]
    assert check_log(renumber(log + second), live=False) == []  # "c1" again in turn 2
    not_started = tool_result("c9")
    not_started["error"] = {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"}
    repaired = renumber([*log[:6], rec("tool/result", 0, not_started, surfaceOp="append"), *log[6:]])
    assert check_log(repaired, live=False) == []


def test_other_invariants() -> None:
    assert check_preparations({"prepared": 3, "published": 2, "disposed": 1}) == []
    assert check_preparations({"prepared": 3, "published": 1, "disposed": 1}) == [
        "preparations: prepared 3 != published 1 + disposed 1"
    ]
    assert check_no_tasks_left([]) == []
    assert check_no_tasks_left([TaskInfo("writer", ("m:3 f",))]) == [
        "task left running after the runtime exited: writer (at m:3 f)"
    ]
    log = turn_log()
    assert check_durable(log, 7, log) == []
    assert check_durable(log, -1) == []
    assert check_durable(log[:3], 4) == ["acknowledged event 4 lost: only 3 event(s) stored"]
    changed = [*log[:2], {**log[2], "data": {"turn": 1, "step": 9}}, *log[3:]]
    assert check_durable(changed, 7, log) == ["acknowledged event 2 changed on disk: step/start != step/start"]


def test_a_run_too_slow_in_wall_time_is_cancelled_and_reported() -> None:
    async def slow(probe: Probe) -> None:
        probe.arm()
        for _ in range(2000):
            time.sleep(0.005)  # real work: the mock clock does not move
            await trio.lowlevel.checkpoint()

    settings = Settings(autojump_threshold=0.0, real_timeout=0.3)
    started = time.monotonic()
    attempt = replay(slow, "slow:seed=0:k=0:dry", settings=settings)
    assert time.monotonic() - started < 5
    assert attempt.outcome == "hang"
    assert [v.message for v in attempt.violations] == ["hang at step 0: still running after 0.3s of wall time (cancelled)"]


def test_a_worker_thread_abandoned_by_the_run_is_reported() -> None:
    import threading

    release = threading.Event()

    async def abandons(probe: Probe) -> None:
        probe.arm()
        with trio.move_on_after(1):
            # The run gives up on the thread (abandon_on_cancel) and ends without it.
            await trio.to_thread.run_sync(release.wait, 5, abandon_on_cancel=True)

    settings = Settings(autojump_threshold=0.0, thread_wait=0.2)
    try:
        # The thread is let go only after the run (a timer raced the machine's load).
        attempt = replay(abandons, "abandons:seed=0:k=0:dry", settings=settings)
    finally:
        release.set()
    assert [v.message for v in attempt.violations] == ["worker thread outlived the run (still running): wait from scenario abandons"]
    assert attempt.gate_timeouts == 1


def test_check_log_sees_nested_and_mismatched_compaction_brackets() -> None:
    from harness.faults import open_compaction

    def rec(seq: int, t: str, data: dict[str, Any]) -> dict[str, Any]:
        return {"type": t, "seq": seq, "time": 1, "data": data}

    good = [rec(0, "compaction/start", {"compactionId": "a", "turn": None}), rec(1, "compaction/end", {"compactionId": "a", "turn": None})]
    assert check_log(good, live=False) == [] and open_compaction(good) is None
    nested = [rec(0, "compaction/start", {"compactionId": "a", "turn": None}), rec(1, "compaction/start", {"compactionId": "b", "turn": None})]
    assert check_log(nested, live=True) == ["compaction/start at seq 1 while compaction a is open"]
    assert open_compaction(nested) == "b"
    wrong = [rec(0, "compaction/start", {"compactionId": "a", "turn": None}), rec(1, "compaction/end", {"compactionId": "z", "turn": None})]
    assert check_log(wrong, live=True) == ["compaction/end at seq 1 names compaction z but the open one is a"]
    stale = [rec(0, "compaction/start", {"compactionId": "a", "turn": None}), rec(1, "session/end-seed", {}), rec(2, "compaction/start", {"compactionId": "b", "turn": None})]
    assert check_log(stale, live=True) == [] and open_compaction(stale) == "b"
