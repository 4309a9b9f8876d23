"""The fault explorer explores the group committer's *chained* rounds (decision 0015):
the production ``GroupCommitter._chain``, its steps granted by the explorer's gate
between scheduler batches. Proof that it does: each broken variant below (the
production source with one edit) is caught by the ``group-chain`` scenario, and a
replay repeats the chain's interleaving step for step."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from harness.faults import ExploreReport, explore, explore_crash, explore_io, replay
from harness.faults._scenarios import select_scenarios
from harness.persistence import _committer
from harness.persistence._committer import GroupCommitter, run_round


def mutant(fn: Callable[..., Any], *edits: tuple[str, str]) -> Callable[..., Any]:
    """``fn`` (a method of ``GroupCommitter``) recompiled from its source with each
    ``(old, new)`` replaced once (``old`` must be there: the variant stays the
    production code but for that edit)."""
    source = inspect.getsource(fn)  # indented as in the class: so are the edits
    for old, new in edits:
        assert source.count(old) == 1, f"not in {fn.__qualname__}: {old!r}"
        source = source.replace(old, new)
    source = textwrap.dedent(source)
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<mutant of {fn.__qualname__}>", "exec"), vars(_committer), namespace)
    return namespace[fn.__name__]  # type: ignore[no-any-return]


def chain_scenario(kind: str = "jsonl") -> Any:
    return select_scenarios([f"group-chain/{kind}"])[0]


def messages(report: ExploreReport) -> list[str]:
    return [v.message for v in report.violations]


def test_the_campaign_explores_the_chain_and_finds_nothing_in_it() -> None:
    report = explore(chain_scenario(), seeds=1, confirm=False)
    assert report.violations == (), report.distinct()
    assert report.attempts >= 3 * 24
    dry = replay(chain_scenario(), "group-chain/jsonl:seed=0:k=0:dry")
    assert dry.chains >= 1 and dry.chain_steps >= 5  # the chain ran, step by step, under the gate


def test_a_replay_repeats_the_chain_s_interleaving() -> None:
    for key in ("group-chain/jsonl:seed=0:k=7:waiter", "group-chain/sqlite:seed=3:k=0:dry"):
        first, again = replay(chain_scenario(key.split("/")[1].split(":")[0]), key), replay(
            chain_scenario(key.split("/")[1].split(":")[0]), key
        )
        assert (first.steps, first.chains, first.chain_steps, first.violations) == (
            again.steps,
            again.chains,
            again.chain_steps,
            again.violations,
        )
        assert first.gate_timeouts == 0


def test_a_chain_that_decides_to_end_before_the_hand_over_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The carrier decides whether more is pending as it publishes a round, and ends at
    # its next step on that stale answer, without the recheck under the lock: a batch
    # submitted in between is left with no carrier, and its waiter hangs.
    broken = mutant(
        GroupCommitter._chain,
        ("        try:\n            while True:", "        more = True\n        try:\n            while True:"),
        (
            "                with mutex:\n                    jobs, self._pending = self._pending, []",
            "                with mutex:\n                    if not more:\n                        self._busy = False\n"
            "                        return\n                    jobs, self._pending = self._pending, []",
        ),
        (
            "wake = len(done) == 1  # else a completion is already on its way",
            "wake = len(done) == 1\n                    more = bool(self._pending)",
        ),
    )
    monkeypatch.setattr(GroupCommitter, "_chain", broken)
    report = explore(chain_scenario(), seeds=1, confirm=False)
    assert any("hang" in m or "did not end" in m for m in messages(report)), report.distinct()


def test_a_round_acknowledged_before_it_is_written_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The round's outcome ("durable") is published first and the round written at the
    # chain's next step: a crash or an I/O failure in between loses acknowledged batches.
    broken = mutant(
        GroupCommitter._chain,
        ("        try:\n            while True:", "        later: list[Any] = []\n        try:\n            while True:"),
        (
            '                    steps.step("take")\n',
            '                    steps.step("take")\n                if later:\n'
            "                    run_round(backend, later, cache)\n                    later = []\n",
        ),
        (
            "result = outcome.capture(run_round, backend, jobs, cache, steps)",
            "result = outcome.Value([None] * len(jobs))\n                    later = jobs",
        ),
    )
    monkeypatch.setattr(GroupCommitter, "_chain", broken)
    crash = explore_crash(chain_scenario())
    assert any("acknowledged" in m for m in messages(crash)), crash.distinct()
    io = explore_io(chain_scenario(), stride=2)
    assert any("acknowledged batch" in m for m in messages(io)), io.distinct()


def test_a_withdrawal_that_trusts_a_taken_job_gone_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # A job a round already took is reported withdrawn without its own lock's say:
    # the round writes it anyway.
    broken = mutant(
        GroupCommitter.withdraw,
        ("pass  # taken by a round already: the job's own lock decides", "return True"),
    )
    monkeypatch.setattr(GroupCommitter, "withdraw", broken)
    report = explore(chain_scenario(), cancellers=["waiter", "caller"], seeds=1, confirm=False)
    assert any("the withdrawn batch must not be there" in m for m in messages(report)), report.distinct()


def test_completions_that_drop_coalesced_rounds_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the first of the rounds written before the Trio thread ran a completion is
    # completed: reached only when the gate lets the chain write several rounds at once.
    broken = mutant(GroupCommitter._complete_rounds, ("for jobs, result in done:", "for jobs, result in done[:1]:"))
    monkeypatch.setattr(GroupCommitter, "_complete_rounds", broken)
    report = explore(chain_scenario(), seeds=1, confirm=False)
    assert any("hang" in m or "did not end" in m for m in messages(report)), report.distinct()


def test_a_round_that_claims_its_jobs_on_a_stale_reading_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The round reads which jobs were withdrawn once, as it starts, and claims each
    # later without the job's lock: a withdrawal that lands after the round claimed an
    # earlier job (reached only through the steps inside a round) is told "never
    # written", and the round writes the batch anyway.
    broken = mutant(
        run_round,
        (
            "    results: list[BaseException | None] = [None] * len(jobs)\n",
            "    results: list[BaseException | None] = [None] * len(jobs)\n"
            "    wanted = [not j._withdrawn for j in jobs]\n",
        ),
        ("        if not job.start():", "        job._started = wanted[i]\n        if not wanted[i]:"),
    )
    monkeypatch.setattr(_committer, "run_round", broken)
    report = explore(chain_scenario(), cancellers=["waiter", "caller"], seeds=1, confirm=False)
    assert any("the withdrawn batch must not be there" in m for m in messages(report)), report.distinct()
