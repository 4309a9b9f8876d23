"""`harness chaos`, the built-in scenarios, and the I/O / crash explorers: short runs,
and proof that the scenarios' checks do fail when the runtime breaks its promises."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from harness.cli import main as harness_main
from harness.faults import (
    ExploreReport,
    PowerLossFiles,
    Violation,
    builtin_scenarios,
    explore,
    explore_crash,
    explore_io,
    kill_campaign,
    replay,
)
from harness.faults._cli import (
    BUDGETS,
    MODES,
    Campaign,
    plan_campaign,
    run_campaign,
    summary_table,
    violations_text,
)
from harness.faults._files import FaultyFiles
from harness.faults._scenarios import select_scenarios
from harness.persistence import JsonlBackend, Persistence, SessionPreparation


def chaos(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        harness_main(["chaos", *args])
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def test_chaos_json_run_is_parsed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = chaos(capsys, "write-behind/jsonl", "--mode", "io", "--budget", "full", "--json")
    assert code == 0, out
    data = json.loads(out)
    (report,) = data["reports"]
    assert report["scenario"] == "write-behind/jsonl" and report["mode"] == "io" and report["backend"] == "jsonl"
    n = report["dry_steps"]["0"]
    assert n > 10 and report["steps"] == {"enospc": n, "eio": n}
    assert report["attempts"] == 1 + 2 * n == data["attempts"]
    assert data["violations"] == 0 and report["violations"] == [] and report["distinct"] == []
    # Not a terminal: one progress line per finished scenario and mode, no \r bar.
    assert "chaos: write-behind/jsonl io:" in err and "\r" not in err


def test_chaos_table_list_replay_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = chaos(capsys, "fork/jsonl", "--mode", "crash", "--budget", "ci")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["scenario", "backend", "mode", "canceller", "steps", "attempts", "violations", "groups", "wall"]
    assert lines[2].split()[:4] == ["fork", "jsonl", "crash", "crash"]
    assert lines[3].split()[:5] == ["sigkill", "jsonl", "kill", "sigkill", "8"]
    assert lines[-1].endswith("s") and " 0 violation(s) in 0 group(s)" in lines[-1]

    code, out, _ = chaos(capsys, "--list")
    assert code == 0 and len([ln for ln in out.splitlines() if not ln.startswith(" ")]) == len(builtin_scenarios()) == 37
    assert "agent-turn/sqlite" in out and "agent-cancel" in out
    assert "resume/jsonl-zstd" in out and "fork/jsonl-zstd" not in out  # the zstd kind's subset
    assert "write-behind/postgres" in out and "resume/postgres" not in out  # the postgres kind's
    # Names of any length stay aligned (agent-compaction/sqlite has 23 characters).
    starts = {ln.index("cancellers:") for ln in out.splitlines() if not ln.startswith(" ")}
    assert len(starts) == 1, starts
    modes_at = {ln.index("checkpoints") for ln in out.splitlines() if not ln.startswith(" ") and "checkpoints" in ln}
    assert len(modes_at) == 1, modes_at

    code, out, _ = chaos(capsys, "--replay", "write-behind/jsonl:seed=0:k=3:eio")
    assert code == 0 and out.startswith("write-behind/jsonl:seed=0:k=3:eio: ")
    code, out, _ = chaos(capsys, "--replay", "agent-turn/jsonl:seed=0:k=40:owner")
    assert code == 0 and "injected before a step of" in out

    assert chaos(capsys, "no-such-scenario")[0] == 2
    assert chaos(capsys, "--replay", "not a key")[0] == 2
    assert chaos(capsys, "--replay", "resume:seed=0:k=1:caller")[0] == 2  # names two scenarios
    assert chaos(capsys, "--seeds", "0")[0] == 2


def test_summary_and_violation_text() -> None:
    v = Violation("resume/jsonl", "owner", 41, 3, "turn 2 is still open", "actor:store", ("m:1 f", "m:2 g"))
    report = ExploreReport("resume/jsonl", "checkpoints", {"caller": 10, "owner": 10}, 21, (v, v), 1.25, {3: 10}, "jsonl")
    campaign = Campaign([report], wall_time=1.5)
    table = summary_table(campaign)
    rows = table.splitlines()
    assert rows[2].split() == ["resume", "jsonl", "checkpoints", "caller", "10", "21", "0", "1", "1.2s"]
    assert rows[3].split() == ["owner", "10", "2"]
    assert rows[-1] == "21 attempts, 2 violation(s) in 1 group(s), 1.5s"
    text = violations_text(campaign)
    assert text == str(report)
    assert text.splitlines()[:5] == [
        "resume/jsonl (checkpoints): 21 attempts (caller 10, owner 10; 1 schedule(s)), 2 violation(s) in 1 group(s), 1.2s",
        "group 1: check x2, smallest k=41",
        "  turn 2 is still open",
        "  replay: resume/jsonl:seed=3:k=41:owner",
        "  injected: owner before a step of actor:store (no task received Cancelled)",
    ]
    assert campaign.to_json()["violations"] == 2 and campaign.to_json()["groups"] == 1


def test_campaign_plans_and_parallel_runs_agree() -> None:
    scenarios = select_scenarios(["fork/jsonl", "write-behind/jsonl"])
    plan = plan_campaign(scenarios, modes=["checkpoints", "crash"], seeds=2, budget=BUDGETS["ci"])
    assert [(i.scenario, i.mode) for i in plan] == [
        ("fork/jsonl", "checkpoints"),
        ("write-behind/jsonl", "checkpoints"),
        ("fork/jsonl", "crash"),
        ("write-behind/jsonl", "crash"),
        ("sigkill/jsonl", "kill"),
    ]
    assert plan[-1].kills == 8
    # The CI budget explores every third step of the checkpoints and io modes (every
    # crash point): `--seeds 3` or the full budget covers the rest.
    assert [i.stride for i in plan] == [3, 3, 1, 1, 1]
    assert {i.stride for i in plan_campaign(scenarios, modes=["checkpoints"], seeds=1, budget=BUDGETS["full"])} == {1}
    assert plan_campaign(scenarios, modes=["crash"], seeds=50, budget=BUDGETS["ci"])[-1].kills == 200
    one = run_campaign(scenarios, modes=["io"], seeds=1, budget=BUDGETS["ci"], jobs=1)
    two = run_campaign(scenarios, modes=["io"], seeds=1, budget=BUDGETS["ci"], jobs=2)
    assert [(r.scenario, dict(r.steps), r.attempts) for r in one.reports] == [
        (r.scenario, dict(r.steps), r.attempts) for r in two.reports
    ]
    assert one.violations == two.violations == 0


def test_kill_campaign_short() -> None:
    report = kill_campaign("jsonl", kills=2, seed=7)
    assert report.mode == "kill" and report.steps == {"sigkill": 2} and report.ok, report.violations
    with pytest.raises(ValueError):
        replay(select_scenarios(["write-behind/jsonl"])[0], "sigkill/jsonl:seed=0:k=1:sigkill")


def test_the_zstd_kind_runs_its_subset_on_zstd_files(tmp_path: Path) -> None:
    from harness.faults._backends import plain_backend

    scenarios = select_scenarios(["write-behind/jsonl-zstd", "resume"])
    assert [(s.name, s.modes) for s in scenarios] == [
        ("write-behind/jsonl-zstd", ("io", "crash")),
        ("resume/jsonl", ("checkpoints", "io", "crash")),
        ("resume/sqlite", ("checkpoints", "io", "crash")),
        ("resume/jsonl-zstd", ("io", "crash")),
    ]
    items = plan_campaign(scenarios[:1], modes=MODES, seeds=1, budget=BUDGETS["ci"])
    assert [(i.scenario, i.mode) for i in items] == [
        ("write-behind/jsonl-zstd", "io"),
        ("write-behind/jsonl-zstd", "crash"),
        ("sigkill/jsonl-zstd", "kill"),
    ]
    report = explore_crash(scenarios[0], stride=6)
    assert report.backend == "jsonl-zstd" and report.attempts > 2 and report.ok, report.violations
    backend = plain_backend(tmp_path, "jsonl-zstd")
    assert isinstance(backend, JsonlBackend)
    assert backend.compression == "zstd" and backend.root == tmp_path / "jsonl-zstd"
    report = kill_campaign("jsonl-zstd", kills=2, seed=3)
    assert report.steps == {"sigkill": 2} and report.ok, report.violations


def test_io_attempts_inject_their_fault_and_replay() -> None:
    scenario = select_scenarios(["write-behind/sqlite"])[0]
    report = explore_io(scenario, stride=8)
    assert report.ok, report.distinct()
    assert set(report.steps) == {"full", "ioerr"} and report.notes == ()
    attempt = replay(scenario, "write-behind/sqlite:seed=0:k=5:full")
    assert attempt.outcome == "ok" and any("disk is full" in line for line in attempt.logs)


# -- the checks fail when the runtime breaks its promises -------------------------------------


def test_crash_mode_catches_a_disk_that_lies_about_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    # fsync happens but is not recorded as durable: the power cut drops what was
    # acknowledged, as on a disk with a lying write cache.
    monkeypatch.setattr(PowerLossFiles, "fsync", lambda self, fd: FaultyFiles.fsync(self, fd))
    report = explore_crash(select_scenarios(["write-behind/jsonl"])[0])
    lost = [v for v in report.violations if "acknowledged event" in v.message and "lost" in v.message]
    assert lost, report.distinct()


def test_checkpoint_mode_catches_a_leaked_writer_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    async def dispose_keeping_the_lock(self: SessionPreparation) -> None:
        self.disposed = True  # forgets to release the writer lock

    monkeypatch.setattr(SessionPreparation, "dispose", dispose_keeping_the_lock)
    scenario = select_scenarios(["resume/jsonl"])[0]
    report = explore(scenario, cancellers=["owner"], stride=6, seeds=1)
    messages = {v.message for v in report.violations}
    assert any("cannot be prepared again" in m or "still holds its writer lock" in m for m in messages), messages


def test_checkpoint_mode_catches_an_unshielded_turn_end(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.agent import _agent

    async def finish_unshielded(self: Any, turn: int, steps: Any, outcome: Any, **kwargs: Any) -> None:
        await self.session.append("turn/end", {"turn": turn, "reason": outcome})

    monkeypatch.setattr(_agent.Agent, "_finish", finish_unshielded)
    report = explore(select_scenarios(["agent-turn/jsonl"])[0], cancellers=["caller"], stride=4, seeds=1)
    assert any("still open" in v.message or "without a result" in v.message for v in report.violations), report.distinct()


def test_scenarios_accept_only_lifecycle_errors() -> None:
    from harness.errors import InvariantError, SessionNotLiveError
    from harness.faults import Probe
    from harness.faults._scenarios import note_errors

    probe = Probe(scenario="s", seed=0, k=0, canceller_name=None, tmp_path=__import__("pathlib").Path("."))
    note_errors(probe, SessionNotLiveError("gone"), "append")
    assert probe.messages == []
    note_errors(probe, ExceptionGroup("g", [InvariantError("bad")]), "append")
    assert probe.messages == ['append: unexpected InvariantError: invariant violated by "@deepseek-ai/dsh-session": bad']


def test_progress_bar_on_a_terminal() -> None:
    from harness.faults._cli import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    progress = Progress(stream)
    progress.update("fork/jsonl seed=0 caller", 5, 5)
    assert "fork/jsonl seed=0 caller" in stream.getvalue() and "5/5" in stream.getvalue()  # Rich's bar
    progress.finished(ExploreReport("fork/jsonl", "checkpoints", {"caller": 5}, 6, (), 0.5))
    progress.close()
    assert "chaos: fork/jsonl checkpoints: 6 attempts (caller 5), 0 violation(s) in 0 group(s), 0.5s" in stream.getvalue()
    plain = io.StringIO()
    lines = Progress(plain)
    lines.update("fork/jsonl seed=0 caller", 1, 5)  # no bar off a terminal
    lines.finished(ExploreReport("fork/jsonl", "checkpoints", {"caller": 5}, 6, (), 0.5))
    assert plain.getvalue() == "chaos: fork/jsonl checkpoints: 6 attempts (caller 5), 0 violation(s) in 0 group(s), 0.5s\n"


# -- the explorer finds issue #9's first two bugs by itself when their fix is reverted ------


def test_checkpoint_mode_finds_the_old_call_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    import actors._actor as kernel

    async def old_call(self: Any, message: Any) -> Any:
        # eddf553's ActorRef.call: a cancellation once the message was taken reached
        # the caller as Cancelled although the message was (or had just been) applied.
        env = kernel._Envelope(message, reply=True)
        env.done = trio.Event()  # its per-call event (the kernel sets it: no parked waiter)
        await self._enqueue(env)
        try:
            await env.done.wait()
        except BaseException:
            if env.state is kernel._State.QUEUED:
                env.state = kernel._State.WITHDRAWN
            raise
        return env.result.unwrap()  # type: ignore[union-attr]

    async def old_publish(self: Any, prep: Any) -> Any:
        # eddf553's Persistence.publish: trusts the replies, never asks the store.
        try:
            prepared = await self.store.adopt(prep.session)
            handle = await self.store.enter(prepared)
            try:
                await self.store.announce(handle)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self.store.detach(handle)
                raise
        except BaseException:
            with trio.CancelScope(shield=True):
                await prep.dispose()
            raise
        return handle

    # Revert the whole fix: the kernel's contract and the caller's reconciliation.
    monkeypatch.setattr(kernel.ActorRef, "call", old_call)
    monkeypatch.setattr(Persistence, "publish", old_publish)
    report = explore(select_scenarios(["lifecycle/jsonl"])[0], cancellers=["caller"], seeds=1)
    messages = {v.message for v in report.violations}
    assert any("writer lock is not held" in m for m in messages), report.distinct()


def test_checkpoint_mode_finds_the_old_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    import actors._lifetimes as lifetimes

    async def old_aclose(self: Any, reason: object = "owner closed") -> None:
        # eddf553's Owner.aclose: cancel the one nursery that ran both the owned tasks
        # and the body of the `async with`, and return without waiting for them.
        self.close(reason)
        self._cm._nursery.cancel_scope.cancel()

    monkeypatch.setattr(lifetimes.Owner, "aclose", old_aclose)
    report = explore(select_scenarios(["agent-turn/jsonl"])[0], cancellers=["owner"], stride=3, seeds=1)
    assert any("still open" in v.message for v in report.violations), report.distinct()


# -- the postgres kind ---------------------------------------------------------------------------


def test_the_postgres_kind_runs_its_subset() -> None:
    scenarios = select_scenarios(
        [
            "write-behind/postgres",
            "lifecycle/postgres",
            "group-commit/postgres",
            "group-write/postgres",
            "group-chain/postgres",
        ]
    )
    assert [(s.name, s.modes) for s in scenarios] == [
        ("write-behind/postgres", ("checkpoints", "io", "crash")),
        ("lifecycle/postgres", ("io", "crash")),
        ("group-commit/postgres", ("io", "crash")),
        ("group-write/postgres", ("io", "crash")),
        ("group-chain/postgres", ("crash",)),
    ]
    assert not [s for s in builtin_scenarios() if s.backend == "postgres" and s.name not in {x.name for x in scenarios}]
    items = plan_campaign(scenarios, modes=MODES, seeds=1, budget=BUDGETS["ci"])
    assert [(i.scenario, i.mode) for i in items] == [
        ("write-behind/postgres", "checkpoints"),
        ("write-behind/postgres", "io"),
        ("lifecycle/postgres", "io"),
        ("group-commit/postgres", "io"),
        ("group-write/postgres", "io"),
        ("write-behind/postgres", "crash"),
        ("lifecycle/postgres", "crash"),
        ("group-commit/postgres", "crash"),
        ("group-write/postgres", "crash"),
        ("group-chain/postgres", "crash"),
        ("sigkill/postgres", "kill"),
    ]


def test_the_postgres_kind_is_skipped_saying_why_without_a_server(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import harness.persistence._postgres_cluster as cluster
    from harness.faults._backends import PG_BENCH_URL_ENV, PG_URL_ENV

    monkeypatch.delenv(PG_URL_ENV, raising=False)
    monkeypatch.delenv(PG_BENCH_URL_ENV, raising=False)
    monkeypatch.setattr(cluster, "missing", lambda: "PostgreSQL server binaries not on PATH (initdb)")
    code, out, err = chaos(capsys, "write-behind/postgres", "--mode", "crash", "--budget", "ci")
    assert code == 0 and "skipping the postgres kind: PostgreSQL server binaries not on PATH" in err
    assert out.splitlines()[-1].startswith("0 attempts, 0 violation(s)")


@pytest.fixture
def chaos_pg(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test cluster (tests/pg_cluster.py) as the postgres kind's server, with a
    schema prefix of its own; returns the prefix."""
    import secrets

    from harness.faults._backends import PG_PREFIX_ENV, PG_URL_ENV

    prefix = f"chaos_t{secrets.token_hex(4)}_"
    monkeypatch.setenv(PG_URL_ENV, pg_url)
    monkeypatch.setenv(PG_PREFIX_ENV, prefix)
    return prefix


def _schemas(url: str, prefix: str) -> list[str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,)).fetchall()
    return [r[0] for r in rows]


def _write_commits(scenario: Any) -> tuple[int, int]:
    """From a dry run of ``scenario``: the statement numbers of the COMMIT of its first
    materialize and of its first append (the k that lose their acknowledgement)."""
    from harness.faults import SqliteFaults

    made: list[SqliteFaults] = []
    init = SqliteFaults.__init__

    def capture(self: SqliteFaults, **kw: Any) -> None:
        init(self, **kw)
        made.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SqliteFaults, "__init__", capture)
        assert replay(scenario, f"{scenario.name}:seed=0:k=0:full").violations == ()
    stmts = made[-1].statements
    found: dict[str, int] = {}
    kind = ""
    for k, stmt in enumerate(stmts, 1):
        if stmt.startswith("BEGIN"):
            kind = ""
        elif ".sessions (id, header" in stmt:
            kind = "materialize"
        elif "revision = revision + 1" in stmt:
            kind = "append"
        elif stmt == "COMMIT" and kind:
            found.setdefault(kind, k)
    return found["materialize"], found["append"]


def test_the_postgres_kind_finds_nothing_and_catches_a_writer_that_refuses_its_own_commit(
    chaos_pg: str, pg_url: str
) -> None:
    from harness.persistence._postgres import PostgresBackend

    scenario = select_scenarios(["write-behind/postgres"])[0]
    report = explore_io(scenario, stride=9)
    assert report.backend == "postgres" and set(report.steps) == {"full", "ioerr"} and report.notes == ()
    assert report.attempts > 10 and report.ok, report.distinct()
    report = explore_crash(scenario, stride=9)
    assert report.attempts > 5 and report.ok, report.distinct()
    report = explore(scenario, stride=25, seeds=1)
    assert report.attempts > 5 and report.ok, report.distinct()
    # A COMMIT that lands but whose answer is lost: the writer's retry recognises its
    # own first write and its own append, and loses or doubles nothing.
    k_materialize, k_append = _write_commits(scenario)
    for k in (k_materialize, k_append):
        attempt = replay(scenario, f"write-behind/postgres:seed=0:k={k}:ioerr")
        assert attempt.outcome == "ok" and attempt.violations == (), attempt.logs
        assert any("after COMMIT" in line for line in attempt.logs)
        assert not any("are lost" in line for line in attempt.logs), attempt.logs
    # The defect of docs/postgres.md's old limits, reinstated: the retry of an in-doubt
    # first write is refused (SESSION_LOG_EXISTS) and the session's events never land.
    # Under an injected I/O fault a typed failure is an answer, not a violation, so the
    # attempt's outcome and its close report show it.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PostgresBackend, "_own_first_write", lambda self, *a: None)
        attempt = replay(scenario, f"write-behind/postgres:seed=0:k={k_materialize}:ioerr")
    assert attempt.outcome == "typed error", attempt.logs
    assert any("refusing to materialize" in line for line in attempt.logs)
    assert any("could not be made durable and are lost" in line for line in attempt.logs)
    # An append retried after its in-doubt commit that writes its whole batch again:
    # the primary key refuses the duplicate seqs, and that writer never recovers either.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PostgresBackend, "_stored_prefix", lambda self, conn, sid, records, first, n: 0)
        attempt = replay(scenario, f"write-behind/postgres:seed=0:k={k_append}:ioerr")
    assert attempt.outcome == "typed error", attempt.logs
    assert any("could not be made durable and are lost" in line for line in attempt.logs)
    assert _schemas(pg_url, chaos_pg)  # every attempt had a schema of its own


def test_harness_chaos_postgres_on_a_given_server_drops_its_schemas(
    capsys: pytest.CaptureFixture[str], chaos_pg: str, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.faults._backends import PG_URL_ENV

    monkeypatch.delenv(PG_URL_ENV)
    monkeypatch.setenv("HARNESS_BENCH_POSTGRES_URL", pg_url)
    code, out, err = chaos(capsys, "--replay", "write-behind/postgres:seed=0:k=7:full")
    assert code == 0 and out.startswith("write-behind/postgres:seed=0:k=7:full: ok"), out + err
    code, out, err = chaos(capsys, "--replay", "write-behind/postgres:seed=0:k=40:caller")
    assert code == 0 and "injected before a step of" in out, out + err
    assert not [s for s in _schemas(pg_url, "chaos_") if not s.startswith("chaos_t")]  # the CLI's dropped
