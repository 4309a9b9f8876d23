"""The pytest plugin ``harness.testing``: its fixtures used directly, and from an inline
test file run by ``pytester``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import harness
from harness.agent import Call, Say, ToolSet, tool
from harness.errors import FlushError
from harness.faults import FailingFiles, Probe
from harness.persistence import JsonlBackend
from harness.session import RelationalInvariants
from harness.testing import ExploreCheckpoints, ScriptedProviderFactory, assert_log_ok
from tests.helpers import rec

pytest_plugins = ["pytester"]


@tool("add", "Add two numbers", {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}})
async def add(args: dict[str, Any]) -> Any:
    return str(args["a"] + args["b"])


# -- direct uses ---------------------------------------------------------------------------


async def test_harness_runtime_runs_a_turn_on_each_backend(
    harness_runtime: harness.Runtime,
    harness_backend: str,
    scripted_provider: ScriptedProviderFactory,
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = harness_runtime
    assert rt.store.validator_factory is RelationalInvariants
    assert (rt.persistence is None) == (harness_backend == "memory")
    provider = scripted_provider([Call("add", {"a": 2, "b": 3})], "2 + 3 = 5")
    agent = await rt.create("a", provider=provider, tools=ToolSet([add]), cwd="/w")
    await trio.sleep(5)  # mock time: autojump makes this instant
    result = await agent.run_turn("what is 2 + 3?")
    assert (result.turn, result.kind) == (1, "completed")
    assert provider.remaining == 0 and scripted_provider.made == [provider]
    assert_log_ok(agent)
    assert_log_ok(agent.session)
    assert_log_ok(list(agent.session.events))


@pytest.mark.parametrize("harness_backend", ["jsonl"])
async def test_harness_runtime_can_be_narrowed_and_persists(
    harness_runtime: harness.Runtime, scripted_provider: ScriptedProviderFactory, tmp_path: Path
) -> None:
    agent = await harness_runtime.create("p", provider=scripted_provider("hi"))
    await agent.run_turn("hello")
    await agent.session.flush()
    stored = JsonlBackend(tmp_path / "sessions").load("p")
    assert_log_ok(stored.records)


def test_scripted_provider_factory_accepts_texts_parts_and_lists(scripted_provider: ScriptedProviderFactory) -> None:
    p = scripted_provider("one", Say("two"), [Say("three"), Call("add", {"a": 1, "b": 1})], model="m-1")
    assert p.remaining == 3 and p.model == "m-1"


def test_assert_log_ok_reports_an_unbalanced_log() -> None:
    records = [rec("turn/start", 0, {"turn": 1}), rec("step/start", 1, {"turn": 1, "step": 1})]
    assert_log_ok(records, live=True)
    with pytest.raises(AssertionError, match="session log violates"):
        assert_log_ok(records)
    with pytest.raises(TypeError):
        assert_log_ok(42)


async def test_failing_files_fails_a_flush(failing_files: FailingFiles, tmp_path: Path) -> None:
    assert isinstance(failing_files, FailingFiles) and failing_files.injected == 0
    async with harness.open_runtime(backend=JsonlBackend(tmp_path, files=failing_files)) as rt:
        s = await rt.store.create("f")
        await s.append("feedback/record", {"i": 0})
        await s.flush()
        failing_files.fail_writes = 1
        await s.append("feedback/record", {"i": 1})
        with pytest.raises(FlushError):
            await s.flush()
        assert failing_files.injected == 1
        await s.flush()  # retried: nothing fails any more
        assert_log_ok(s)
    assert [r["data"]["i"] for r in JsonlBackend(tmp_path).load("f").records] == [0, 1]


def test_explore_checkpoints_runs_the_body_at_every_step(explore_checkpoints: ExploreCheckpoints) -> None:
    seen: list[int] = []

    async def body(probe: Probe) -> None:
        seen.append(probe.k)
        for _ in range(3):
            await trio.lowlevel.checkpoint()

    report = explore_checkpoints(body, seeds=1)
    assert report.ok and report.steps == {"caller": report.dry_steps[0]} and report.dry_steps[0] >= 3
    assert seen == list(range(report.dry_steps[0] + 1))  # the dry run, then every k
    seen.clear()
    # By default: every schedule seed's dry run first, then every k under each.
    report = explore_checkpoints(body)
    n = report.dry_steps[0]
    assert len(report.dry_steps) == 8 and report.steps == {"caller": 8 * n}
    assert seen == [0] * 8 + list(range(1, n + 1)) * 8
    assert explore_checkpoints.reports[-1] == report


def test_explore_checkpoints_fails_on_a_violation(explore_checkpoints: ExploreCheckpoints) -> None:
    async def body(probe: Probe) -> None:
        state = {"applied": False, "receipt": False}
        try:
            await trio.lowlevel.checkpoint()
            state["applied"] = True
            await trio.lowlevel.checkpoint()
            state["receipt"] = True
        finally:
            probe.check(state["applied"] == state["receipt"], "applied without a receipt")

    with pytest.raises(AssertionError, match="applied without a receipt"):
        explore_checkpoints(body)
    report = explore_checkpoints(body, check=False)
    assert not report.ok


def test_explore_checkpoints_over_a_runtime(explore_checkpoints: ExploreCheckpoints) -> None:
    # A whole runtime under exploration: create an agent, run a turn, leave the block.
    async def body(probe: Probe) -> None:
        provider = ScriptedProviderFactory()("hello")
        handles: list[Any] = []
        try:
            async with harness.open_runtime(provider=provider) as rt:
                handles.append(await rt.create("x"))
                await handles[0].run_turn("hi")
        finally:
            # A cancelled block may leave the in-memory turn open (see docs/testing.md).
            for h in handles:
                assert_log_ok(h, live=probe.fired)

    report = explore_checkpoints(body, stride=7, max_steps=40)
    assert report.ok and report.attempts > 1


# -- through pytester ----------------------------------------------------------------------

INLINE = '''
import trio
from harness.agent import Say
from harness.faults import FailingFiles
from harness.testing import assert_log_ok


async def test_turn(harness_runtime, scripted_provider, autojump_clock):
    agent = await harness_runtime.create("a", provider=scripted_provider("hi"))
    await trio.sleep(1)
    result = await agent.run_turn("hello")
    assert result.kind == "completed"
    assert_log_ok(agent)


def test_failing(failing_files, faulty_files):
    assert isinstance(failing_files, FailingFiles)
    assert faulty_files(fail_at=3).fail_at == 3


def test_explore(explore_checkpoints):
    async def body(probe):
        await trio.lowlevel.checkpoint()
        await trio.sleep(1)
    report = explore_checkpoints(body)
    assert report.ok


def test_explore_violation(explore_checkpoints):
    async def body(probe):
        done = []
        try:
            await trio.lowlevel.checkpoint()
            done.append(1)
        finally:
            probe.check(done, "cancelled before it was done")
    explore_checkpoints(body)
'''


def test_plugin_in_a_pytester_run(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(test_inline=INLINE)
    # The plugin comes from the installed pytest11 entry point (no conftest here).
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_turn?jsonl? PASSED*",
            "*test_turn?sqlite? PASSED*",
            "*test_turn?memory? PASSED*",
            "*test_explore_violation FAILED*",
        ]
    )
    assert "cancelled before it was done" in result.stdout.str()


def test_plugin_by_pytest_plugins_without_the_entry_point(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makeconftest('pytest_plugins = ["harness.testing"]\n')
    pytester.makepyfile(
        test_one='''
async def test_memory(harness_runtime, scripted_provider):
    agent = await harness_runtime.create("a", provider=scripted_provider("hi"))
    assert (await agent.run_turn("x")).kind == "completed"
'''
    )
    result = pytester.runpytest_subprocess("-p", "no:harness", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_the_testing_doc_examples_run_as_written(pytester: pytest.Pytester) -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    code = "\n\n".join(b for b in blocks if "pytest_plugins" not in b)
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(test_doc=code)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=11)


MARKED = '''
import pytest
import trio


class Stats:
    active = 0


@pytest.mark.explore(seeds=2)
async def test_counter_restored(probe):
    stats = Stats()
    stats.active += 1
    try:
        await trio.sleep(0.01)
    finally:
        stats.active -= 1
    probe.check(stats.active == 0, "never reached when cancelled")


@pytest.mark.explore(cancellers=["caller"])
async def test_counter_leaks(probe, tmp_path):
    assert tmp_path.exists()  # synchronous fixtures are handed in
    stats = Stats()
    try:
        stats.active += 1
        await trio.sleep(0.01)
        stats.active -= 1
    finally:
        probe.check(stats.active == 0, f"active = {stats.active} after the call")


@pytest.mark.explore
async def test_without_probe():
    await trio.sleep(0)
'''


def test_the_explore_marker_fails_with_the_grouped_summary(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_counter_restored PASSED*",
            "*test_counter_leaks FAILED*",
            "*test_without_probe PASSED*",
            "*test_counter_leaks (checkpoints): * violation(s) in 1 group(s)*",
            "*group 1: check x*, smallest k=1*",
            "*active = 1 after the call*",
            "*replay: test_counter_leaks:seed=0:k=1:caller*",
            "*injected: caller -> Cancelled delivered to scenario at test_marked:* test_counter_leaks*",
        ]
    )
