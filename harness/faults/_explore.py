"""Checkpoint exploration: inject a cancellation at every scheduler step of a scenario,
under several schedules (seed 0: Trio's seeded order; seeds >= 1: PCT priority schedules).

A *scenario* is ``async def scenario(probe: Probe) -> None``. It builds what it
tests, declares its *cancellers* (``probe.canceller(name, action)``), arms the probe
at its trigger (``probe.arm()``) and checks invariants at the end (``probe.check``).
:func:`explore` runs it once to count the scheduler steps after the trigger (a
:class:`trio.abc.Instrument` counts every step of every task, so no hand-placed
fault points are needed), then once per step ``k`` and canceller, calling that
canceller's action right before step ``k`` runs.

Every attempt is its own ``trio.run`` with Trio's scheduler seeded, and worker
threads gated (see :class:`_ThreadGate`): a failing ``(seed, k, canceller)`` —
a :class:`ReplayKey` — replays bit for bit with :func:`replay`. Each violation carries
its cause (the task that received ``Cancelled`` and where, who detected it), and
:attr:`ExploreReport.groups` groups violations by that cause.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Final, TypeAlias

import attrs
import outcome
import trio
import trio.testing
from trio._core import _run as _trio_run

from actors import ActorError
from harness.errors import HarnessError
from harness.faults._report import (
    _INTERNAL,
    Attempt,
    ExploreReport,
    ReplayKey,
    TaskSite,
    Violation,
    group_violations,
)
from harness.persistence import _committer

ScenarioFn: TypeAlias = Callable[["Probe"], Awaitable[None]]


ProgressFn: TypeAlias = Callable[[str, int, int], None]


"""``progress(label, done, total)``: called after every attempt."""


#: Exceptions a scenario may legitimately see escape: the library's typed errors.
LIBRARY_ERRORS: Final[tuple[type[BaseException], ...]] = (HarnessError, ActorError)


_FLAG: Final = "_ALLOW_DETERMINISTIC_SCHEDULING"


_START: Final = "start_thread_soon"


# explore() and replay() change process-global Trio state (the scheduler's RNG and
# its determinism flag): one exploration at a time per process.
_GLOBAL = threading.RLock()


_thread_local = threading.local()


class ScenarioError(Exception):
    """The scenario itself is malformed (e.g. an unknown canceller was asked for)."""


@attrs.frozen
class TaskInfo:
    """A task seen by the probe: its name and await stack (innermost last)."""

    name: str
    stack: tuple[str, ...]

    def __str__(self) -> str:
        where = self.stack[-1] if self.stack else "?"
        return f"{self.name} (at {where})"


class Probe:
    """What a scenario sees of its attempt.

    * ``canceller(name, action)`` binds a canceller: a synchronous callable that cancels
      something (``scope.cancel``, ``lambda: owner.close("owner closed")``, ...). It is
      called from inside the step-counting instrument, right before step ``k`` runs.
    * ``arm()`` starts counting steps (the trigger), ``disarm()`` stops.
    * ``check(condition, message)``/``fail(message)``/``record(messages)`` record
      violations; ``acknowledge(session_id, seq)`` records an event known durable.
    * ``seed``, ``rng`` (seeded), ``k`` (0 in the dry run), ``canceller_name``,
      ``fired``, ``tmp_path`` (fresh per attempt, created when first read) and ``faults`` (the fault layer of an
      I/O or crash attempt, else ``None``) describe the attempt.
    """

    def __init__(
        self,
        *,
        scenario: str,
        seed: int,
        k: int,
        canceller_name: str | None,
        tmp_path: Path | Callable[[], Path],
        faults: object | None = None,
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        self.rng = random.Random(f"{scenario}:{seed}")
        self.k = k
        self.canceller_name = canceller_name
        self._tmp_path = tmp_path
        self.faults = faults
        self.fired = False
        self.fired_task: TaskInfo | None = None
        self.messages: list[str] = []
        self.acknowledged: dict[str, int] = {}
        self.acknowledged_records: dict[str, list[Any]] = {}
        self.cancellers: dict[str, Callable[[], object]] = {}
        self.data: dict[str, Any] = {}  # free-form state a scenario hands to post-run checks
        self._armed = False
        self._steps = 0
        self._live: dict[trio.lowlevel.Task, None] = {}
        self._excluded: set[trio.lowlevel.Task] = set()
        self._root: trio.lowlevel.Task | None = None
        self._main: trio.lowlevel.Task | None = None
        self._paths: dict[trio.lowlevel.Task, str] = {}
        self._spawned: dict[tuple[str, str], int] = {}
        self._detected: dict[int, TaskSite] = {}  # message index -> who recorded it
        self.cancelled: dict[trio.lowlevel.Task, TaskSite] = {}  # first Cancelled seen, per task
        self.injection: TaskSite | None = None

    @property
    def tmp_path(self) -> Path:
        """A fresh directory of this attempt (made on first use: most scenarios of
        in-memory code never need one, and it costs a mkdir and an rmtree)."""
        if not isinstance(self._tmp_path, Path):
            self._tmp_path = self._tmp_path()
        return self._tmp_path

    # -- declaring ---------------------------------------------------------------------

    def canceller(self, name: str, action: Callable[[], object]) -> None:
        """Bind (or rebind) the action of canceller ``name``. Names may not contain ``:``."""
        if ":" in name or not name:
            raise ScenarioError(f"canceller names may not be empty or contain ':': {name!r}")
        self.cancellers[name] = action

    def arm(self) -> None:
        """Start counting scheduler steps (the trigger); idempotent."""
        self._armed = True

    def disarm(self) -> None:
        """Stop counting steps (and stop tracking newly spawned tasks)."""
        self._armed = False

    @property
    def armed(self) -> bool:
        return self._armed

    @property
    def steps(self) -> int:
        """Steps counted so far while armed."""
        return self._steps

    # -- recording ---------------------------------------------------------------------

    def check(self, condition: object, message: str) -> bool:
        """Record ``message`` as a violation unless ``condition`` holds; return it."""
        if not condition:
            self._note(message, sys._getframe(1))
            return False
        return True

    def fail(self, message: str) -> None:
        self._note(message, sys._getframe(1))

    def record(self, messages: Iterable[str], prefix: str = "") -> None:
        """Record each of ``messages`` (e.g. an invariant checker's result)."""
        caller = sys._getframe(1)
        for m in messages:
            self._note(f"{prefix}{m}", caller)

    def _note(self, message: str, frame: FrameType) -> None:
        # Who detected it: the calling task's path and the caller's stack.
        self._detected[len(self.messages)] = _site_of_frame(self._current_path(), frame)
        self.messages.append(message)

    def _current_path(self) -> str:
        try:
            task = trio.lowlevel.current_task()
        except RuntimeError:
            return "(after the run)"
        return self.path_of(task)

    def path_of(self, task: trio.lowlevel.Task) -> str:
        """The stable path of ``task``: parent path / function (``#n``: the n-th task of
        that function spawned by the same parent, from 0, when n > 0)."""
        path = self._paths.get(task)
        if path is None:
            path = "scenario" if task is self._main else _function_of(task)
        return path

    def acknowledge(self, session_id: str, seq: int, records: Sequence[Any] | None = None) -> None:
        """Event ``seq`` of ``session_id`` and all before it are durable (a flush
        returned). ``records`` (optional) are their stored form, to check them unchanged."""
        if seq > self.acknowledged.get(session_id, -1):
            self.acknowledged[session_id] = seq
            if records is not None:
                self.acknowledged_records[session_id] = list(records[: seq + 1])

    def live_tasks(self) -> list[TaskInfo]:
        """Tasks spawned while armed that have not exited (see ``check_no_tasks_left``)."""
        return [_task_info(t) for t in self._live if t not in self._excluded]

    # -- instrument side -----------------------------------------------------------------

    def _counts(self, task: trio.lowlevel.Task) -> bool:
        # Trio's own system tasks (the run_sync_soon entry queue, which delivers worker
        # thread results) are not scenario steps: only the main task and its descendants.
        if task is self._main:
            return True
        if task in self._excluded:
            return False
        nursery = task.parent_nursery
        return not (nursery is not None and nursery.parent_task is self._root)

    def _spawned_task(self, task: trio.lowlevel.Task) -> None:
        nursery = task.parent_nursery
        parent = nursery.parent_task if nursery is not None else None
        base = self.path_of(parent) if parent is not None and parent is not self._root else ""
        fn = _function_of(task)
        n = self._spawned.get((base, fn), 0)
        self._spawned[(base, fn)] = n + 1
        name = fn if n == 0 else f"{fn}#{n}"
        self._paths[task] = f"{base}/{name}" if base else name

    def _saw_cancelled(self, task: trio.lowlevel.Task) -> None:
        site = _task_site(self, task)
        self.cancelled[task] = site
        if self.injection is None:
            self.injection = site

    def _fire(self, task: trio.lowlevel.Task) -> None:
        self.fired = True
        self.fired_task = _task_info(task)
        name = self.canceller_name
        assert name is not None
        action = self.cancellers.get(name)
        if action is None:
            self.messages.append(f"canceller {name!r} was not bound when step {self.k} ran")
            return
        try:
            action()
        except Exception as exc:
            self.messages.append(
                f"canceller {name!r} raised {type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc))
            )


def _check_cancelled(p: Probe, task: trio.lowlevel.Task) -> None:
    """Record ``task`` if it is about to be resumed with a ``Cancelled`` that is not
    only a timeout of its own (``trio.sleep`` wakes through a deadline too): where it
    first sees the cancellation."""
    sent = task._next_send
    if type(sent) is not outcome.Error or not isinstance(sent.error, trio.Cancelled) or not p._counts(task):
        return
    status: Any = task._cancel_status
    while status is not None:
        reason = status._scope._cancel_reason
        if reason is not None and reason.source != "deadline":
            p._saw_cancelled(task)
            return
        status = status._parent


class _StepCounter(trio.abc.Instrument):
    """Counts steps while the probe is armed, injects at step ``k``, tracks tasks and
    gates worker threads (every io wait first waits for in-flight worker threads)."""

    def __init__(self, probe: Probe, gate: _ThreadGate) -> None:
        self.probe = probe
        self.gate = gate

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        p = self.probe
        if p.fired and task not in p.cancelled:
            _check_cancelled(p, task)
        if not p._armed or not p._counts(task):
            return
        p._steps += 1
        if p._steps == p.k and p.canceller_name is not None and not p.fired:
            # Calling CancelScope.cancel() / Lifetime.close() here is safe: it only marks
            # scopes cancelled and reschedules blocked tasks through their abort functions
            # (onto the next batch), exactly as when another task cancels; the task about
            # to run sees the cancellation at its next checkpoint.
            p._fire(task)
            _check_cancelled(p, task)

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.probe._spawned_task(task)
        if self.probe._armed:
            self.probe._live[task] = None

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.probe._live.pop(task, None)

    def before_io_wait(self, timeout: float) -> None:
        self.gate.wait_idle()


class _ChainSteps:
    """One chain of group-commit rounds under the gate (the production
    ``GroupCommitter._chain``, decision 0015): it waits in :meth:`step` until the gate
    grants the step it names; the gate grants steps only between two batches of Trio's
    scheduler and waits for each to end (the chain parked at its next step, or ended),
    so the chain's steps interleave with the Trio side deterministically."""

    __slots__ = ("ended_", "gate", "granted", "name", "point")

    def __init__(self, gate: _ThreadGate, name: str) -> None:
        self.gate = gate
        self.name = name
        self.point: str | None = None  # where it waits (None: running, or not started)
        self.granted = False
        self.ended_ = False

    def step(self, point: str) -> None:
        """Writer thread: wait for the gate's permission to take step ``point``."""
        cond = self.gate._cond
        with cond:
            self.point = point
            cond.notify_all()
            while not self.granted and not self.gate.chains_free:
                cond.wait()
            self.granted = False
            self.point = None

    def ended(self) -> None:
        """Writer thread: the chain gave up the carrier role and returns."""
        with self.gate._cond:
            self.ended_ = True
            self.point = None
            self.gate._cond.notify_all()

    def settled(self) -> bool:
        return self.ended_ or (self.point is not None and not self.granted)


class _ChainPolicy:
    """How many steps a parked chain is granted between two scheduler batches, a
    function of the attempt (its replay key, so a replay repeats it): ``None`` (the
    dry run of seed 0) one step per batch, the chain keeping pace with the Trio side;
    any other attempt a mix drawn from its key of holds (0 steps: the Trio side runs
    ahead, its submits, withdrawals and cancellations land while the chain waits at
    that step) and bursts (up to 8 steps: several rounds written before the Trio
    thread completes the first, their completions coalesced). Drawn per attempt, not
    per seed: the campaign explores seed 0 only (``--seeds 1``), and each step ``k``
    then meets another interleaving of the chain."""

    def __init__(self, key: str | None) -> None:
        self._rng = random.Random(f"chain:{key}")
        self._eager = key is None
        self._hold = self._rng.choice((0.0, 0.25, 0.5, 0.75))
        self._burst = self._rng.choice((0.0, 0.15, 0.3, 0.5))

    def grant(self) -> int:
        if self._eager:
            return 1
        rng = self._rng
        if rng.random() < self._hold:
            return 0
        return rng.randint(2, 8) if rng.random() < self._burst else 1


class _ThreadGate:
    """Makes worker-thread completion deterministic at batch granularity.

    ``trio.to_thread.run_sync`` hands its result back through the run loop's entry
    queue, at whatever moment the thread finishes. The gate counts the threads a run
    started (by wrapping Trio's ``start_thread_soon``) and, before every io wait,
    blocks until each has handed its result back: a thread started in one batch is
    seen done before the next, whatever its real duration. A thread that takes longer
    than ``max_wait`` seconds is no longer waited for (``timeouts`` counts those; the
    schedule then depends on timing). The gate also prevents spurious autojumps of a
    mock clock while a thread works.

    Chains of group-commit rounds (``GroupCommitter._chain`` on the committer's own
    thread, not a ``to_thread`` hand-off) are gated step by step instead
    (:class:`_ChainSteps`): after the worker threads, before every io wait, each chain
    is granted the steps :class:`_ChainPolicy` draws, one at a time, each waited for;
    and while the Trio side has nothing to run and nothing queued for it, a chain is
    granted steps until it hands something back or ends (a mock clock must not jump
    ahead, firing deadlines, while a round is still to be written).
    """

    def __init__(self, max_wait: float, chain_key: str | None = None) -> None:
        self.max_wait = max_wait
        self.timeouts = 0
        self.finished = False  # set once the run is over: a delivery after it is late
        self.late: list[str] = []  # threads that finished after the run (abandoned)
        self._cond = threading.Condition()
        self._inflight: set[int] = set()
        self._running: dict[int, str] = {}
        self._next = 0
        self.chains: list[_ChainSteps] = []  # live chains, in the order they started
        self.chains_started = 0
        self.chain_steps = 0  # steps granted, all chains
        self.chains_free = False  # the run is over: chains run on ungated
        self._policy = _ChainPolicy(chain_key)

    def started(self, name: str) -> int:
        with self._cond:
            self._next += 1
            self._inflight.add(self._next)
            self._running[self._next] = name
            return self._next

    def delivering(self, token: int) -> None:
        with self._cond:
            if self.finished:
                self.late.append(self._running.get(token, "?"))

    def delivered(self, token: int) -> None:
        with self._cond:
            self._inflight.discard(token)
            self._running.pop(token, None)
            self._cond.notify_all()

    def still_running(self, timeout: float) -> list[str]:
        """After the run: wait up to ``timeout`` for threads it left behind; the names
        of those still running."""
        with self._cond:
            self._cond.wait_for(lambda: not self._running, timeout=timeout)
            return sorted(self._running.values())

    def new_chain(self) -> _ChainSteps:
        """Trio thread (``GroupCommitter._dispatch``): a chain starts."""
        with self._cond:
            self.chains_started += 1
            chain = _ChainSteps(self, f"group-commit chain {self.chains_started}")
            self.chains.append(chain)
            return chain

    def free_chains(self, timeout: float) -> list[str]:
        """After the run: let every chain run on ungated (a chain the run left behind
        writes its round, finds the run over and drops what is pending, as in
        production) and wait up to ``timeout`` for them to end; the names of those
        still running."""
        with self._cond:
            self.chains_free = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: all(c.ended_ for c in self.chains), timeout=timeout)
            return [c.name for c in self.chains if not c.ended_]

    def wait_idle(self) -> None:
        with self._cond:
            if self._inflight and not self._cond.wait_for(lambda: not self._inflight, timeout=self.max_wait):
                self.timeouts += len(self._inflight)
                self._inflight.clear()  # stop waiting for these; later ones are gated again
            if self.chains:
                self._step_chains()

    def _step_chains(self) -> None:
        """Under ``_cond``, on the Trio thread between two batches: grant the chains
        their steps (see the class docstring)."""
        runner = _trio_run.GLOBAL_RUN_CONTEXT.runner
        for chain in list(self.chains):
            if not self._settle(chain):
                continue
            n = self._policy.grant()
            while not chain.ended_:
                if n <= 0:
                    entry = runner.entry_queue
                    if runner.runq or entry.queue or entry.idempotent_queue:
                        break
                n -= 1
                chain.granted = True
                self.chain_steps += 1
                self._cond.notify_all()
                if not self._settle(chain):
                    break
        self.chains = [c for c in self.chains if not c.ended_]

    def _settle(self, chain: _ChainSteps) -> bool:
        """Wait until ``chain`` waits at a step or ended (False: it did not within
        ``max_wait``; counted in ``timeouts``, the schedule then depends on timing)."""
        if self._cond.wait_for(chain.settled, timeout=self.max_wait):
            return True
        self.timeouts += 1
        return False


def _chain_of_this_run() -> _ChainSteps | None:
    """``GroupCommitter``'s :data:`~harness.persistence._committer.chain_gate` while the
    gate is installed: the attempt's gate on its Trio thread, else ungated."""
    gate: _ThreadGate | None = getattr(_thread_local, "gate", None)
    return None if gate is None else gate.new_chain()


_original_start_thread_soon: Any = None


_gate_users = 0


def _gated_start_thread_soon(fn: Any, deliver: Any, name: str | None = None) -> None:
    gate: _ThreadGate | None = getattr(_thread_local, "gate", None)
    if gate is None:
        _original_start_thread_soon(fn, deliver, name)
        return
    token = gate.started(str(name or getattr(fn, "__name__", "worker thread")))

    def deliver_and_count(result: Any) -> None:
        gate.delivering(token)
        try:
            deliver(result)  # puts the result in the run loop's entry queue
        finally:
            gate.delivered(token)

    _original_start_thread_soon(fn, deliver_and_count, name)


@contextlib.contextmanager
def _thread_gate_installed() -> Iterator[None]:
    # Trio's to_thread looks start_thread_soon up in its module namespace on each call.
    global _original_start_thread_soon, _gate_users
    import trio._threads as threads_module

    if not hasattr(threads_module, _START):
        # A Trio whose to_thread no longer goes through this name: explore without the
        # gate (replays stay exact for pure-Trio paths only), rather than not at all.
        warnings.warn(
            f"harness.faults: trio._threads.{_START} not found; worker threads are not gated",
            RuntimeWarning,
            stacklevel=3,
        )
        yield
        return
    if _gate_users == 0:
        _original_start_thread_soon = getattr(threads_module, _START)
        setattr(threads_module, _START, _gated_start_thread_soon)
        _committer.chain_gate = _chain_of_this_run
    _gate_users += 1
    try:
        yield
    finally:
        _gate_users -= 1
        if _gate_users == 0:
            setattr(threads_module, _START, _original_start_thread_soon)
            _original_start_thread_soon = None
            _committer.chain_gate = None


#: Priority change points per PCT schedule (seeds >= 1), and the largest gap in batches
#: between two of them (gaps are drawn from 1..CHANGE_GAP, so changes come early too).
PCT_DEPTH: Final = 3


CHANGE_GAP: Final = 6


class _PriorityScheduler(random.Random):
    """A PCT-style schedule (probabilistic concurrency testing) in Trio's batch model.

    Trio calls ``_r.shuffle(batch)`` on each batch of runnable tasks when deterministic
    scheduling is on, then runs the batch from its end. This ``shuffle`` instead gives
    every task a random priority when first seen and runs each batch in priority order
    (so one task consistently runs ahead of another, which random shuffles rarely do
    for long), and at up to ``depth`` change points demotes the batch's top task below
    every other: ``perturbations`` counts the change points taken.
    """

    def __init__(self, seed: int, depth: int = PCT_DEPTH) -> None:
        super().__init__(f"pct:{seed}")
        self.perturbations = 0
        self._prio: dict[object, float] = {}
        self._low = 0.0
        self._batch = 0
        at = 0
        self._changes: list[int] = []
        for _ in range(depth):
            at += self.randint(1, CHANGE_GAP)
            self._changes.append(at)

    def shuffle(self, x: Any) -> None:
        self._batch += 1
        prio = self._prio
        for task in x:
            if task not in prio:
                prio[task] = 1.0 + self.random()
        if self._changes and self._batch >= self._changes[0]:
            self._changes.pop(0)
            if len(x) > 1:
                self._low -= 1.0
                prio[max(x, key=prio.__getitem__)] = self._low
                self.perturbations += 1
        x.sort(key=prio.__getitem__)  # Trio pops from the end: highest priority first


class _TrioShuffle:
    perturbations = 0


@contextlib.contextmanager
def _seeded_scheduler(seed: int) -> Iterator[_PriorityScheduler | _TrioShuffle]:
    """Make Trio's batch order a function of ``seed``: seed 0 is Trio's own seeded
    shuffle (what hypothesis does per example), every other seed a PCT priority schedule
    (:class:`_PriorityScheduler`)."""
    previous = getattr(_trio_run, _FLAG)
    original = _trio_run._r
    state = original.getstate()
    setattr(_trio_run, _FLAG, True)
    scheduler: _PriorityScheduler | _TrioShuffle
    if seed == 0:
        original.seed(seed)
        scheduler = _TrioShuffle()
    else:
        scheduler = _PriorityScheduler(seed)
        _trio_run._r = scheduler
    try:
        yield scheduler
    finally:
        _trio_run._r = original
        original.setstate(state)
        setattr(_trio_run, _FLAG, previous)


@attrs.frozen
class Settings:
    """How attempts run.

    ``timeout``: seconds on the attempt's clock before a run counts as a hang (then the
    scenario is cancelled, and ``grace`` more seconds are given before it is abandoned as
    a hard hang — e.g. a deadlock in shielded code). ``real_timeout``: wall seconds
    after which an attempt is abandoned whatever its clock says. ``autojump_threshold``:
    ``None`` runs on the real clock; a number uses ``MockClock(autojump_threshold=...)``
    (idle time jumps ahead, so sleeps and deadlocks cost nothing). The default, 0,
    jumps as soon as every task waits; code that waits for something real (a socket,
    a subprocess) needs a threshold that lets it arrive first (the former default
    was 0.05) or ``None``. ``thread_wait``: how
    long the thread gate waits for one worker thread.
    ``allowed``: exception types that may escape a scenario without being a violation.
    ``log_level``: log records at this level or above (e.g. ``actor 'x' crashed``,
    logged at ERROR) are violations; ``None`` turns that off. Every record at WARNING
    or above is kept in :attr:`Attempt.logs` (and not printed). ``scratch``: the
    directory each attempt's fresh ``probe.tmp_path`` is made in (``None``: the
    system's temporary directory).
    """

    timeout: float = 120.0
    grace: float = 30.0
    real_timeout: float = 60.0
    autojump_threshold: float | None = 0.0
    thread_wait: float = 5.0
    allowed: tuple[type[BaseException], ...] = LIBRARY_ERRORS
    log_level: int | None = logging.ERROR
    scratch: str | None = None


Finish: TypeAlias = Callable[[Probe, "BaseException | None"], None]


def run_attempt(
    fn: ScenarioFn,
    name: str,
    *,
    seed: int,
    k: int,
    canceller: str | None,
    settings: Settings,
    label: str | None = None,
    faults: object | None = None,
    expected: tuple[type[BaseException], ...] = (),
    finish: Finish | None = None,
) -> Attempt:
    """Run ``fn`` once in a fresh ``trio.run`` (on its own thread, so a hard hang can be
    abandoned) and collect what it found.

    ``canceller``: the canceller called right before step ``k`` (``None``: inject no
    cancellation). ``label`` names the attempt's fault in its replay key (default: the
    canceller, or ``dry``). ``faults`` is handed to the scenario as ``probe.faults``.
    ``expected`` exception types may escape (e.g. a simulated crash); ``finish(probe,
    escaped)`` runs after the Trio run, outside it (e.g. power loss + reload checks).
    """
    started = time.perf_counter()
    label = label or canceller or "dry"
    with contextlib.ExitStack() as stack:
        def make_tmp() -> Path:
            scratch = tempfile.TemporaryDirectory(prefix="harness-chaos-", dir=settings.scratch, ignore_cleanup_errors=True)
            return Path(stack.enter_context(scratch))

        probe = Probe(scenario=name, seed=seed, k=k, canceller_name=canceller, tmp_path=make_tmp, faults=faults)
        gate = _ThreadGate(settings.thread_wait, None if seed == 0 and k == 0 else f"{name}:{seed}:{k}:{label}")
        counter = _StepCounter(probe, gate)
        box: dict[str, Any] = {}
        hard_hang = threading.Event()

        def target() -> None:
            _thread_local.gate = gate
            clock = (
                None
                if settings.autojump_threshold is None
                else trio.testing.MockClock(autojump_threshold=settings.autojump_threshold)
            )
            try:
                trio.run(_main, fn, probe, settings, hard_hang, box, clock=clock, instruments=[counter])
            except BaseException as exc:  # reported below; nothing may be lost
                box["crash"] = exc
            finally:
                _thread_local.gate = None

        collector = _LogCollector()
        with _GLOBAL, _thread_gate_installed(), _seeded_scheduler(seed) as scheduler, _collecting(collector):
            thread = threading.Thread(target=target, name=f"chaos {name} k={k} {label}", daemon=True)
            thread.start()
            deadline = time.monotonic() + settings.real_timeout
            while thread.is_alive():
                thread.join(0.05)
                if not thread.is_alive() or hard_hang.is_set():
                    break
                if time.monotonic() > deadline:
                    if box.get("wall_timeout"):
                        break  # it had its last chance
                    # Too slow in wall time (its clock may not even have moved): cancel the
                    # scenario from outside and give it a last chance to unwind, so no
                    # abandoned run keeps working next to the following attempts.
                    box["wall_timeout"] = True
                    with contextlib.suppress(trio.RunFinishedError, KeyError):
                        box["token"].run_sync_soon(box["scope"].cancel)
                    deadline = time.monotonic() + min(10.0, settings.real_timeout)
        abandoned = thread.is_alive()
        # runner findings: (message, traceback, kind, detected at)
        extra: list[tuple[str, str | None, str, TaskSite | None]] = []
        # Chains of rounds the run left behind run on ungated (and end) before any
        # post-run check reads what they wrote.
        with _collecting(collector):
            for chain_name in gate.free_chains(settings.thread_wait):
                extra.append((f"{chain_name} still running {settings.thread_wait}s after the run", None, "thread", None))
        if not abandoned:
            # Every worker thread of a finished run has handed its result back before
            # the task waiting for it resumed; one that has not was abandoned by the run
            # and works on after its runtime is gone.
            gate.finished = True
            with _collecting(collector):
                left = gate.still_running(settings.thread_wait)
            for thread_name in [*gate.late, *left]:
                state = "still running" if thread_name in left else "finished after the run ended"
                extra.append((f"worker thread outlived the run ({state}): {thread_name}", None, "thread", None))
        outcome_ = "ok"
        escaped: BaseException | None = box.get("escaped")
        blocked: tuple[TaskSite, ...] = tuple(box.get("blocked", ()))
        if abandoned:
            outcome_ = "hang"
            why = "a hard hang (it ignored cancellation)" if hard_hang.is_set() else f"{settings.real_timeout}s of wall time"
            dump = box.get("dump") or "(no task dump: the run loop did not answer)"
            extra.append((f"hang at step {k}: the run did not finish (abandoned after {why})", dump, "hang", None))
        elif "crash" in box:
            outcome_ = "raw exception"
            exc = box["crash"]
            extra.append((f"trio.run failed: {type(exc).__name__}: {exc}", _format_tb(exc), "exception", _site_of_traceback(exc)))
        elif box.get("hung"):
            outcome_ = "hang"
            extra.append((f"deadlock/hang at step {k}: still running after {settings.timeout}s", box.get("dump"), "hang", None))
        elif box.get("wall_timeout"):
            outcome_ = "hang"
            extra.append((f"hang at step {k}: still running after {settings.real_timeout}s of wall time (cancelled)", None, "hang", None))
        if escaped is not None and not abandoned:
            raw, typed, expected_seen = _classify(escaped, settings.allowed, expected)
            for leaf in raw:
                extra.append(
                    (f"raw non-library exception escaped: {type(leaf).__name__}: {leaf}", _format_tb(leaf), "exception", _site_of_traceback(leaf))
                )
            if raw:
                outcome_ = "raw exception"
            elif outcome_ == "ok":
                outcome_ = "expected" if expected_seen else ("typed error" if typed else "ok")
        if finish is not None and not abandoned:
            try:
                with _collecting(collector):
                    finish(probe, escaped)
            except Exception as exc:
                extra.append((f"post-run check failed: {type(exc).__name__}: {exc}", _format_tb(exc), "post-run", _site_of_traceback(exc)))
        if settings.log_level is not None:
            for record in collector.records:
                if record.levelno >= settings.log_level:
                    at = TaskSite("(logged)", (f"{record.module}:{record.lineno} {record.funcName}",), f"{record.pathname}:{record.lineno}")
                    extra.append((f"logged {record.levelname} ({record.name}): {record.getMessage()}", _record_tb(record), "log", at))
    found: list[tuple[str, str | None, str, TaskSite | None]] = [
        (m, None, "canceller" if m.startswith("canceller ") and i not in probe._detected else "check", probe._detected.get(i))
        for i, m in enumerate(probe.messages)
    ] + extra
    if found and outcome_ in ("ok", "typed error", "expected"):
        outcome_ = "violation"
    info = probe.fired_task
    cancelled = tuple(probe.cancelled.values())
    injection = _injection_of(probe)
    violations = tuple(
        Violation(
            scenario=name,
            canceller=label,
            k=k,
            seed=seed,
            message=message,
            task=info.name if info else None,
            stack=info.stack if info else (),
            traceback=tb,
            kind=kind,
            injection=injection,
            cancelled=cancelled,
            detected=detected,
            blocked=blocked if kind == "hang" else (),
            perturbations=scheduler.perturbations,
        )
        for message, tb, kind, detected in found
    )
    return Attempt(
        scenario=name,
        seed=seed,
        k=k,
        canceller=label,
        steps=probe.steps,
        fired=probe.fired,
        task=info.name if info else None,
        stack=info.stack if info else (),
        violations=violations,
        outcome=outcome_,
        wall_time=time.perf_counter() - started,
        gate_timeouts=gate.timeouts,
        cancellers=tuple(probe.cancellers),
        logs=tuple(f"{r.levelname} {r.name}: {r.getMessage()}" for r in collector.records),
        injection=injection,
        cancelled=cancelled,
        perturbations=scheduler.perturbations,
        chain_steps=gate.chain_steps,
        chains=gate.chains_started,
    )


async def _main(
    fn: ScenarioFn, probe: Probe, settings: Settings, hard_hang: threading.Event, box: dict[str, Any]
) -> None:
    probe._root = trio.lowlevel.current_root_task()
    probe._main = trio.lowlevel.current_task()
    probe._main.name = f"scenario {probe.scenario}"  # reports name it, not this wrapper
    probe._paths[probe._main] = "scenario"
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:
            box["token"], box["scope"] = trio.lowlevel.current_trio_token(), scope
            # start(), not start_soon(): the watchdog is excluded from the step count
            # before the scenario can arm the probe.
            await nursery.start(_watchdog, probe, settings, scope, done, hard_hang, box, name="chaos watchdog")
            try:
                await fn(probe)
            except BaseException as exc:
                box["escaped"] = exc
        probe._armed = False
        done.set()
        nursery.cancel_scope.cancel()


async def _watchdog(
    probe: Probe,
    settings: Settings,
    scope: trio.CancelScope,
    done: trio.Event,
    hard_hang: threading.Event,
    box: dict[str, Any],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Turn a hang into a finding: after ``timeout`` dump every task and cancel the
    scenario; if it is still running ``grace`` later, tell the runner to abandon it."""
    probe._excluded.add(trio.lowlevel.current_task())
    task_status.started()
    with trio.move_on_after(settings.timeout):
        await done.wait()
    if done.is_set():
        return
    box["hung"] = True
    box["dump"] = _dump_tasks()
    box["blocked"] = _blocked_tasks(probe)
    scope.cancel()
    with trio.move_on_after(settings.grace):
        await done.wait()
    if not done.is_set():
        box["dump"] = _dump_tasks()
        box["blocked"] = _blocked_tasks(probe)
        clock = trio.lowlevel.current_clock()
        if isinstance(clock, trio.testing.MockClock):
            # The run is about to be abandoned with tasks stuck forever: stop the clock
            # from autojumping, or the dead loop would spin on a zero timeout.
            clock.autojump_threshold = math.inf
        hard_hang.set()


class _LogCollector(logging.Handler):
    """Keeps the records logged during an attempt (instead of printing them)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _collecting(collector: _LogCollector) -> Iterator[None]:
    root = logging.getLogger()
    root.addHandler(collector)
    try:
        yield
    finally:
        root.removeHandler(collector)


def _record_tb(record: logging.LogRecord) -> str | None:
    if record.exc_info and record.exc_info[1] is not None:
        return _format_tb(record.exc_info[1])
    return None


def _classify(
    exc: BaseException, allowed: tuple[type[BaseException], ...], expected: tuple[type[BaseException], ...]
) -> tuple[list[BaseException], bool, bool]:
    """Split an escaped exception (group) into raw leaves, and whether typed library
    errors or expected exceptions were among the rest."""
    raw: list[BaseException] = []
    typed = expected_seen = False
    for leaf in _leaves(exc):
        if isinstance(leaf, KeyboardInterrupt):
            raise leaf
        if isinstance(leaf, trio.Cancelled):
            continue
        if expected and isinstance(leaf, expected):
            expected_seen = True
        elif isinstance(leaf, allowed):
            typed = True
        else:
            raw.append(leaf)
    return raw, typed, expected_seen


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from _leaves(sub)
    else:
        yield exc


def _format_tb(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _frame_label(frame: FrameType, lineno: int) -> str:
    module = frame.f_globals.get("__name__", "?")
    return f"{module}:{lineno} {frame.f_code.co_name}"


def _task_info(task: trio.lowlevel.Task) -> TaskInfo:
    try:
        # The explorer's own frames (the wrapper around the scenario) are noise.
        stack = tuple(_frame_label(f, n) for f, n in task.iter_await_frames() if f.f_globals.get("__name__") != __name__)
    except Exception:  # a task that just finished has no frames left to walk
        stack = ()
    return TaskInfo(task.name, stack)


def _function_of(task: trio.lowlevel.Task) -> str:
    code = getattr(task.coro, "cr_code", None)
    frame = getattr(task.coro, "cr_frame", None)
    module = str(frame.f_globals.get("__name__", "")) if frame is not None else ""
    if code is None or f"{module}:".startswith(_INTERNAL) or module.startswith(_INTERNAL):
        # A wrapper (AnyIO's task runner, ...): the task's name is the function's.
        qual = task.name
        qual = qual.rsplit("<locals>.", 1)[-1] if "<locals>." in qual else qual.rsplit(".", 1)[-1]
        return qual
    return str(code.co_qualname).rsplit("<locals>.", 1)[-1]


def _injection_of(probe: Probe) -> TaskSite | None:
    """The injection point: the first task to receive ``Cancelled`` that is not an
    ancestor of another receiver (a parent waiting at its nursery's end receives it in
    the same batch as the child it waits for, in either order)."""
    receivers = list(probe.cancelled)
    parents: set[trio.lowlevel.Task] = set()
    for task in receivers:
        nursery = task.parent_nursery
        while nursery is not None and nursery.parent_task not in parents:
            parents.add(nursery.parent_task)
            nursery = nursery.parent_task.parent_nursery
    for task in receivers:
        if task not in parents:
            return probe.cancelled[task]
    return probe.injection


def _frame_file(frame: FrameType, lineno: int) -> str:
    return f"{frame.f_code.co_filename}:{lineno}"


def _task_site(probe: Probe, task: trio.lowlevel.Task) -> TaskSite:
    try:
        frames = [(f, n) for f, n in task.iter_await_frames() if f.f_globals.get("__name__") != __name__]
    except Exception:  # a task that just finished has no frames left to walk
        frames = []
    stack = tuple(_frame_label(f, n) for f, n in frames)
    site = TaskSite(probe.path_of(task), stack)
    for (f, n), label in zip(reversed(frames), reversed(stack), strict=True):
        if label == site.site:
            return attrs.evolve(site, file=_frame_file(f, n))
    return site


def _site_of_frame(path: str, frame: FrameType | None) -> TaskSite:
    frames: list[tuple[FrameType, int]] = []
    while frame is not None and len(frames) < 40:
        frames.append((frame, frame.f_lineno))
        frame = frame.f_back
    frames.reverse()
    frames = [(f, n) for f, n in frames if f.f_globals.get("__name__") != __name__]
    stack = tuple(_frame_label(f, n) for f, n in frames)
    site = TaskSite(path, stack)
    for (f, n), label in zip(reversed(frames), reversed(stack), strict=True):
        if label == site.site:
            return attrs.evolve(site, file=_frame_file(f, n))
    return site


def _site_of_traceback(exc: BaseException) -> TaskSite:
    tb = traceback.extract_tb(exc.__traceback__)
    stack = tuple(f"{_module_of(fs.filename)}:{fs.lineno} {fs.name}" for fs in tb)
    site = TaskSite("(raised)", stack)
    for fs, label in zip(reversed(tb), reversed(stack), strict=True):
        if label == site.site:
            return attrs.evolve(site, file=f"{fs.filename}:{fs.lineno}")
    return site


def _module_of(filename: str) -> str:
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name
    return Path(filename).stem


def _blocked_tasks(probe: Probe) -> list[TaskSite]:
    """The scenario's tasks still alive (for a hang report), innermost first."""
    out: list[TaskSite] = []

    def walk(task: trio.lowlevel.Task) -> None:
        children = [c for n in task.child_nurseries for c in n.child_tasks]
        if task is not probe._root and task not in probe._excluded and probe._counts(task) and not children:
            out.append(_task_site(probe, task))
        for child in children:
            walk(child)

    root = trio.lowlevel.current_root_task()
    if root is not None:
        walk(root)
    return sorted(out, key=lambda t: t.path)


def _dump_tasks() -> str:
    """Every task of the run with its await stack (for hang reports)."""
    lines: list[str] = []

    def walk(task: trio.lowlevel.Task, depth: int) -> None:
        info = _task_info(task)
        lines.append("  " * depth + info.name)
        lines.extend("  " * depth + "    " + s for s in info.stack)
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child, depth + 1)

    root = trio.lowlevel.current_root_task()
    if root is not None:
        walk(root, 0)
    return "\n".join(lines)


@attrs.frozen
class Scenario:
    """A named scenario with what it declares: its cancellers (explored in this order),
    the backend it persists to (if any), the exploration modes it supports
    (``checkpoints``, ``io``, ``crash``) and default :class:`Settings`."""

    name: str
    run: ScenarioFn
    description: str = ""
    cancellers: tuple[str, ...] = ()
    backend: str | None = None
    modes: tuple[str, ...] = ("checkpoints",)
    settings: Settings | None = None
    allowed: tuple[type[BaseException], ...] | None = None
    """Exception types that may escape this scenario (instead of ``Settings.allowed``)."""


def _settings_of(spec: Scenario, settings: Settings | None) -> Settings:
    conf = settings or spec.settings or Settings()
    return conf if spec.allowed is None else attrs.evolve(conf, allowed=spec.allowed)


def _ref_of(fn: object) -> str | None:
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qual or "<" in qual:
        return None
    return f"{module}:{qual}"


def as_scenario(scenario: Scenario | ScenarioFn, name: str | None = None) -> Scenario:
    """Wrap a bare scenario function (named after it unless ``name`` is given)."""
    if isinstance(scenario, Scenario):
        return scenario if name is None else attrs.evolve(scenario, name=name)
    return Scenario(name or str(getattr(scenario, "__name__", "scenario")), scenario)


def _seed_list(seeds: int | Sequence[int]) -> list[int]:
    if isinstance(seeds, int):
        if seeds < 1:
            raise ValueError("seeds must be >= 1")
        return list(range(seeds))
    return list(seeds)


def step_plan(n: int, *, seed: int, stride: int = 1, max_steps: int | None = None) -> range:
    """The steps ``k`` explored for a dry run of ``n`` steps: ``1..n`` every ``stride``-th,
    starting at ``1 + seed % stride`` (so ``stride`` seeds cover every step), at most
    ``max_steps``."""
    if stride < 1:
        raise ValueError("stride must be >= 1")
    last = n if max_steps is None else min(n, max_steps)
    return range(1 + seed % stride, last + 1, stride)


#: ``seeds=None`` (the default): seed 0 (Trio's seeded order) is explored at every step;
#: seeds 1..DEFAULT_SEEDS-1 (PCT schedules) each get their dry run (schedule exploration),
#: and full cancellation exploration when one seed's plan is at most AUTO_SEED_ATTEMPTS
#: attempts, while the total stays within AUTO_ATTEMPTS (small scenarios: every schedule;
#: a large one costs seed 0's exploration and DEFAULT_SEEDS - 1 dry runs more).
DEFAULT_SEEDS: Final = 8


AUTO_SEED_ATTEMPTS: Final = 100


AUTO_ATTEMPTS: Final = 600


def explore(
    scenario: Scenario | ScenarioFn,
    *,
    name: str | None = None,
    cancellers: Sequence[str] | None = None,
    seeds: int | Sequence[int] | None = None,
    stride: int = 1,
    max_steps: int | None = None,
    settings: Settings | None = None,
    progress: ProgressFn | None = None,
    allowed: Sequence[type[BaseException]] | None = None,
    max_attempts: int | None = None,
    max_seconds: float | None = None,
    confirm: bool = True,
) -> ExploreReport:
    """Explore schedules, and a cancellation at every scheduler step of ``scenario`` by
    every canceller, under each schedule.

    Per seed (seed 0: Trio's seeded batch order; seed >= 1: a PCT priority schedule):
    one dry run counts the ``N`` steps taken while the probe is armed (and is itself a
    schedule-exploration attempt: nothing is injected); then for each canceller
    (``cancellers``, else the scenario's declared ones, else those it bound in the dry
    run) and each ``k`` of :func:`step_plan`, one attempt runs with that canceller called
    right before step ``k``. ``seeds=None``: :data:`DEFAULT_SEEDS` schedules, every one
    dry-run first, then cancellations under seed 0, and under the others when a seed's
    plan is at most :data:`AUTO_SEED_ATTEMPTS` attempts and the total stays within
    :data:`AUTO_ATTEMPTS`. ``max_attempts`` / ``max_seconds`` stop the
    exploration early (a note says so). A violation is anything the scenario recorded, a
    hang, or an exception escaping the scenario other than ``Cancelled`` and the allowed
    ones (``allowed``, else the scenario's, else ``settings.allowed``).

    ``confirm``: replay each group's minimal attempt once more to check that it still
    fails the same way (:attr:`ExploreReport.confirmed`).

    Synchronous: each attempt is a fresh ``trio.run`` on its own thread; call it from
    plain code. One exploration at a time per process (Trio's scheduler RNG is global);
    concurrent calls are serialised.
    """
    spec = as_scenario(scenario, name)
    conf = _settings_of(spec, settings)
    if allowed is not None:
        conf = attrs.evolve(conf, allowed=tuple(allowed))
    started = time.perf_counter()
    steps: dict[str, int] = {}
    dry_steps: dict[int, int] = {}
    violations: list[Violation] = []
    notes: list[str] = []
    attempts = 0
    auto = seeds is None
    seed_list = list(range(DEFAULT_SEEDS)) if seeds is None else _seed_list(seeds)

    def spent() -> str | None:
        if max_attempts is not None and attempts >= max_attempts:
            return f"{max_attempts} attempts"
        if max_seconds is not None and time.perf_counter() - started >= max_seconds:
            return f"{max_seconds}s"
        return None

    # Every schedule's dry run first: the cheap schedule exploration.
    dries: dict[int, Attempt] = {}
    for seed in seed_list:
        if spent() is not None:
            break
        dry = run_attempt(spec.run, spec.name, seed=seed, k=0, canceller=None, settings=conf)
        dries[seed] = dry
        attempts += 1
        violations.extend(dry.violations)
        dry_steps[seed] = dry.steps
        if progress is not None:
            progress(f"{spec.name} schedules", len(dries), len(seed_list))
    stopped: str | None = None
    hung = [seed for seed, dry in dries.items() if dry.outcome == "hang"]
    if hung:
        notes.append(f"seed(s) {', '.join(map(str, hung))}: the dry run hung; their steps were not explored")
    for seed, dry in dries.items():
        if dry.outcome == "hang":
            continue
        if dry.gate_timeouts:
            notes.append(f"seed {seed}: {dry.gate_timeouts} worker thread(s) outlived the gate (replay may drift)")
        names = list(cancellers or spec.cancellers or dry.cancellers)
        unknown = [c for c in names if c not in dry.cancellers]
        if unknown:
            raise ScenarioError(f"scenario {spec.name!r} did not bind canceller(s) {', '.join(unknown)} in its dry run")
        plan = step_plan(dry.steps, seed=seed, stride=stride, max_steps=max_steps)
        total = len(plan) * len(names)
        if auto and seed != seed_list[0] and (total > AUTO_SEED_ATTEMPTS or attempts + total > AUTO_ATTEMPTS):
            notes.append(
                f"seeds {seed}..{seed_list[-1]}: schedules explored (dry runs), cancellations not "
                f"({total} per seed; the default explores them up to {AUTO_SEED_ATTEMPTS} per seed and "
                f"{AUTO_ATTEMPTS} in all: pass seeds= to explore them)"
            )
            break
        done = 0
        for canceller in names:
            steps.setdefault(canceller, 0)
            for k in plan:
                stopped = spent()
                if stopped is not None:
                    break
                attempt = run_attempt(spec.run, spec.name, seed=seed, k=k, canceller=canceller, settings=conf)
                attempts += 1
                done += 1
                steps[canceller] += 1
                violations.extend(attempt.violations)
                if progress is not None:
                    progress(f"{spec.name} seed={seed} {canceller}", done, total)
            if stopped is not None:
                break
        if stopped is not None:
            break
    if stopped is None and len(dries) < len(seed_list):
        stopped = spent()
    if stopped is not None:
        notes.append(f"budget of {stopped} spent after {attempts} attempts: the exploration stopped early")
    confirmed: dict[str, bool] = {}
    if confirm:
        for group in group_violations(violations):
            small = group.smallest
            again = replay(spec, small.key, settings=conf)
            confirmed[group.signature] = any(v.signature == group.signature for v in again.violations)
    return ExploreReport(
        scenario=spec.name,
        mode="checkpoints",
        steps=steps,
        attempts=attempts,
        violations=tuple(violations),
        wall_time=time.perf_counter() - started,
        dry_steps=dry_steps,
        backend=spec.backend,
        notes=tuple(notes),
        confirmed=confirmed,
        scenario_ref=_ref_of(spec.run),
    )


def replay(scenario: Scenario | ScenarioFn, key: ReplayKey | str, *, settings: Settings | None = None) -> Attempt:
    """Run exactly the attempt ``key`` names (``k == 0``: the dry run) and return it.

    Exact for scenarios whose schedule depends only on Trio and the seed; see the
    determinism notes in docs/faults.md for worker threads.
    """
    spec = as_scenario(scenario)
    if isinstance(key, str):
        key = ReplayKey.parse(key)
    conf = _settings_of(spec, settings)
    canceller = None if key.k == 0 else key.canceller
    return run_attempt(spec.run, key.scenario, seed=key.seed, k=key.k, canceller=canceller, settings=conf)
