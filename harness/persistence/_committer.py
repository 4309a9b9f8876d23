"""Group commit: one writer thread per backend, many sessions' batches per round (issue 26).

Every :class:`~harness.persistence._writer.SessionWriter` of a persistence hands its
batches to the persistence's :class:`GroupCommitter` instead of taking a worker thread
of its own. The committer writes *rounds*, one at a time, each through
``backend.write_group`` (one transaction, or one round of fsyncs) or, for a backend
without it, :func:`~._backend.write_each`. A round takes every batch submitted since the
previous round started.

Rounds are *chained* on the writer thread (decision 0015): the first batch submitted to
an idle committer starts a chain there; as soon as a round is written the thread starts
the next one itself with the batches submitted meanwhile (a lock-protected pending list
the Trio side appends to), and ends the chain when none is pending. The outcomes come
back to the Trio thread through ``run_sync_soon`` -- one per round, or one for several
rounds written before the Trio thread got to the first -- which reschedules every
waiter: no per-batch wake-ups, and no round waits for the Trio thread to dispatch it.

Under ``harness.faults.explore`` the chain is the same code, with its hand-offs made
deterministic: each step of it (take the pending batches, write the round, publish it,
wake the Trio thread) first waits for the explorer's permission (:data:`chain_gate`),
given between two batches of Trio's scheduler, so a replay composes the same rounds and
interleaves them with the Trio side's submits, withdrawals and cancellations the same way
(decision 0015, amended).
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import outcome
import trio

from harness.persistence._backend import Backend, GroupWrite, write_each

log = logging.getLogger("harness.persistence")

#: Seconds the committer's writer thread waits for the next round before it ends (the
#: next round starts a new one): a persistence that was never closed, or a process
#: running many ``trio.run``\\ s, is not left with threads that sleep forever.
THREAD_IDLE_LINGER: Final = 10.0

#: ``trio.lowlevel.start_thread_soon`` as Trio ships it: another function under the
#: name ``trio._threads.start_thread_soon`` means a harness gates worker threads.
_TRIO_START: Final = trio.lowlevel.start_thread_soon


class ChainSteps(Protocol):
    """What a fault explorer gives one chain (see :data:`chain_gate`): ``step(point)``
    (writer thread) returns when the chain may take its next step, ``point`` naming it
    (``take``, ``write``, ``publish``, ``wake``; inside a round, :func:`run_round`'s
    ``start`` and ``finish``); ``ended()`` (writer thread) is called
    once the chain gave up the carrier role and returns."""

    def step(self, point: str) -> None: ...

    def ended(self) -> None: ...


#: Set by a fault explorer while its thread gate is installed (``harness.faults.explore``),
#: else ``None``: called on the Trio thread as a chain starts, it returns the steps gate
#: of that chain (``None``: the chain runs free, as in production). A chain costs one
#: ``is None`` test per step for it.
chain_gate: Callable[[], ChainSteps | None] | None = None

try:
    # Private, read only to find ``start_thread_soon`` where ``to_thread`` finds it
    # (the thread gate of ``harness.faults.explore`` replaces it there); a Trio that
    # moved it falls back to the public function.
    import trio._threads as _trio_threads
except ImportError:  # pragma: no cover
    _trio_threads = None  # type: ignore[assignment]


def thread_starter() -> Callable[..., None]:
    """``start_thread_soon`` as ``trio.to_thread`` finds it now, looked up at each call:
    a harness that wraps it for ``to_thread`` (the thread gate of
    ``harness.faults.explore``, which makes thread completions deterministic) sees the
    writer's hops too (the committer's rounds are gated by :data:`chain_gate`)."""
    return getattr(_trio_threads, "start_thread_soon", _TRIO_START)


class Withdrawn(Exception):
    """A job whose waiter gave up before its round reached it (internal): never written."""


class CommitJob:
    """One session's batch on its way through a round.

    The session's side is three callables run on the writer thread: ``prepare``
    (returns the :class:`GroupWrite`, e.g. after taking the writer lock; raising fails
    this job alone), ``finish(error)`` (after the round, whatever its outcome, with
    this job's error or ``None``). The Trio side waits in :meth:`GroupCommitter.write`.
    """

    __slots__ = ("_finish", "_mutex", "_prepare", "_started", "_withdrawn", "result", "task")

    def __init__(self, prepare: Callable[[], GroupWrite], finish: Callable[[BaseException | None], None]) -> None:
        self._prepare = prepare
        self._finish = finish
        self._mutex = threading.Lock()
        self._started = False
        self._withdrawn = False
        self.task: trio.lowlevel.Task | None = None  # the waiter, while it waits (Trio thread)
        self.result: outcome.Outcome[None] | None = None  # set on the Trio thread

    def start(self) -> bool:
        """Writer thread: claim the job for its round (False: it was withdrawn)."""
        with self._mutex:
            if self._withdrawn:
                return False
            self._started = True
            return True

    def withdraw_if_not_started(self) -> bool:
        """Trio side: withdraw the job if its round has not reached it (True: it never runs)."""
        with self._mutex:
            if not self._started:
                self._withdrawn = True
            return self._withdrawn


def _defined_in(cls: type, name: str) -> type | None:
    return next((k for k in cls.__mro__ if name in vars(k)), None)


def _group_capable(cls: type) -> bool:
    """Whether ``cls``'s ``write_group`` sees its ``append`` and ``materialize`` (no
    class below the one defining ``write_group`` replaces them)."""
    owner = _defined_in(cls, "write_group")
    if owner is None:
        return False
    mro = cls.__mro__
    for name in ("append", "materialize"):
        where = _defined_in(cls, name)
        if where is not None and mro.index(where) < mro.index(owner):
            return False
    return True


class GroupWriterCache:
    """The last :func:`group_writer` decision about a backend's *class*, with what it
    was made from (the class and the functions its ``write_group``, ``append`` and
    ``materialize`` resolve to): a class whose methods were replaced since (a test's
    ``monkeypatch.setattr`` on it or on a base) no longer matches, and is decided
    again. Instance attributes are looked at every round (they cost a dict lookup)."""

    __slots__ = ("capable", "key")

    def __init__(self) -> None:
        self.key: tuple[object, ...] | None = None
        self.capable = False


def group_writer(
    backend: Backend, cache: GroupWriterCache | None = None
) -> Callable[[Sequence[GroupWrite]], list[BaseException | None]] | None:
    """``backend.write_group``, unless the backend's ``append`` or ``materialize`` was
    replaced where its ``write_group`` does not see it (a subclass overriding them
    below the class that defines ``write_group``, or an instance attribute: a test's
    fault injection, a wrapper): the round then writes through them one by one
    (:func:`write_each`), so a replacement is never silently bypassed.

    Called every round (a replacement made at any time, e.g. by a fault layer after the
    persistence opened, is seen by the next round); ``cache`` spares the walk of the
    class's MRO while the class is unchanged (see :class:`GroupWriterCache`)."""
    own = getattr(backend, "__dict__", None)
    if own and ("append" in own or "materialize" in own):
        return None
    cls = type(backend)
    if cache is None:
        capable = _group_capable(cls)
    else:
        key = (
            cls,
            getattr(cls, "write_group", None),
            getattr(cls, "append", None),
            getattr(cls, "materialize", None),
        )
        if key != cache.key:
            cache.capable = _group_capable(cls)
            cache.key = key
        capable = cache.capable
    return backend.write_group if capable else None  # type: ignore[attr-defined]


def run_round(
    backend: Backend,
    jobs: Sequence[CommitJob],
    cache: GroupWriterCache | None = None,
    steps: ChainSteps | None = None,
) -> list[BaseException | None]:
    """Blocking (the writer thread): one round. Each job still wanted is prepared; the
    prepared ones are written together (``write_group`` if the backend has it, else
    :func:`write_each`); each job's ``finish`` runs with its own outcome. The result is
    aligned with ``jobs`` (``None``: durable).

    ``steps`` (a fault explorer's, see :data:`chain_gate`): the round also waits for
    permission before claiming each job (``start``: a withdrawal can land between two
    jobs' claims, and after a job was prepared) and before each job's ``finish``, so
    the explorer reaches the interleavings inside a round too. The step before the
    first claim adds no interleaving to this code (nothing shared is touched between
    the chain's ``write`` step and it); it is there so that work a round does before
    its first claim (a variant that reads the jobs' state up front) is explored too."""
    results: list[BaseException | None] = [None] * len(jobs)
    writes: list[GroupWrite] = []
    at: list[int] = []
    for i, job in enumerate(jobs):
        if steps is not None:
            steps.step("start")
        if not job.start():
            results[i] = Withdrawn("withdrawn before its round started")
            continue
        try:
            writes.append(job._prepare())
            at.append(i)
        except BaseException as exc:
            results[i] = exc
    if writes:
        group = group_writer(backend, cache)
        try:
            done = group(writes) if group is not None else write_each(backend, writes)
            if len(done) != len(writes):
                raise RuntimeError(f"{backend.name}: write_group returned {len(done)} results for {len(writes)} batches")
        except BaseException as exc:
            # The shared step failed as a whole (or the world stopped: a simulated
            # crash is a BaseException on purpose): nothing of it counts as durable.
            done = [exc] * len(writes)
        for i, err in zip(at, done, strict=True):
            results[i] = err
    for i, job in enumerate(jobs):
        if not isinstance(results[i], Withdrawn):
            if steps is not None:
                steps.step("finish")
            try:
                job._finish(results[i])
            except BaseException as exc:  # a failed bookkeeping step fails its job only
                log.warning("%s: finishing a group-commit job failed: %r", backend.name, exc)
                if results[i] is None:
                    results[i] = exc
    return results


_STOP: Final = object()  # the writer thread's inbox: "end once the inbox is empty"


class _WriterThread:
    """The committer's own long-lived thread: runs each round handed to it, in order;
    ends after :data:`THREAD_IDLE_LINGER` idle seconds or when stopped (after the
    round it is running). A daemon: a round stuck in the kernel cannot hold the
    interpreter's exit, exactly as Trio's cached worker threads.

    The inbox is a :class:`queue.SimpleQueue` (C, one lock, no Python-level waiter
    objects): a hand-off is one ``put`` and the thread's ``get``, instead of a
    ``Condition`` whose ``notify`` under its lock made the woken thread contend for it
    (issue 26). ``_lock`` guards only the thread's life (starting one, and the decision
    to end, which is made with the inbox seen empty under it: a ``start_soon`` that
    ``put`` before that check is run by this thread, one that ``put`` after it finds no
    thread and starts one)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start_soon(self, fn: Callable[[], Any], deliver: Callable[[outcome.Outcome[Any]], None]) -> None:
        """Any thread: run ``fn`` on the writer thread, then ``deliver`` its outcome
        there (the signature of ``trio.lowlevel.start_thread_soon``)."""
        self._inbox.put((fn, deliver))
        with self._lock:  # not a racy read outside it: an ending thread may not have cleared it yet
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
                self._thread.start()

    def stop(self) -> threading.Thread | None:
        """End the thread once its inbox is empty; the thread (to join), if one runs."""
        with self._lock:
            if self._thread is not None:
                self._inbox.put(_STOP)
            return self._thread

    def _main(self) -> None:
        get = self._inbox.get
        while True:
            try:
                item = get(timeout=THREAD_IDLE_LINGER)
            except queue.Empty:
                item = _STOP
            if item is _STOP:
                with self._lock:
                    if self._inbox.empty():
                        self._thread = None
                        return
                continue  # work arrived meanwhile (after a stop: a later round)
            fn, deliver = item
            deliver(outcome.capture(fn))
            # Not kept while idle: the round's closure holds its writers, and so
            # their sessions (a retired session must be freed by reference counting).
            del fn, deliver, item


class GroupCommitter:
    """Writes the batches of every session of one backend, a round at a time.

    Trio side only (:meth:`submit`, :meth:`withdraw`, the waits, :meth:`close`): one
    Trio run at a time (the persistence that owns it lives in one). Blocking work runs
    on the writer thread; see the module docstring for how rounds form.

    Shared with the writer thread, under ``_mutex``: ``_pending`` (submitted, not yet
    taken by a round), ``_busy`` (a carrier owns the rounds: a chain on the writer
    thread; at most one at a time, so rounds never overlap),
    ``_done`` (rounds written whose completion the Trio thread has not run yet) and
    the counters."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._mutex = threading.Lock()
        self._pending: list[CommitJob] = []
        self._busy = False
        self._done: list[tuple[list[CommitJob], outcome.Outcome[list[BaseException | None]]]] = []
        self._thread = _WriterThread(f"harness group commit ({backend.name})")
        # The bounded waits (:meth:`wait_bounded`): job -> its Trio-clock deadline, and
        # the one watchdog task that enforces them (see :meth:`_watch`).
        self._watched: dict[CommitJob, float] = {}
        self._watching = False
        self._watch_scope: trio.CancelScope | None = None  # the watchdog's sleep
        self._watch_idle_until = -math.inf  # it lingers until the last deadline seen
        self._watch_closing = False  # closed: it ends as soon as nothing is watched
        self._group_cache = GroupWriterCache()  # the carrier's (one round at a time)
        #: Rounds written, and batches in them (observability for tests and benches;
        #: counted as a round takes its batches).
        self.rounds = 0
        self.batches = 0

    # -- the Trio side -----------------------------------------------------------------------

    def submit(self, job: CommitJob) -> None:
        """Queue ``job`` for the next round (starting a carrier if none runs: the
        writer thread then takes it at once)."""
        with self._mutex:
            self._pending.append(job)
            if self._busy:
                return  # the running chain takes it
            self._busy = True
        self._dispatch()

    def withdraw(self, job: CommitJob) -> bool:
        """Take ``job`` back if no round took it yet or its round has not reached it
        (True: it is never written). Race-free against the writer thread: a round
        takes pending jobs under ``_mutex``, and a taken job is claimed by
        :meth:`CommitJob.start` under the job's own lock."""
        with self._mutex:
            try:
                self._pending.remove(job)
            except ValueError:
                pass  # taken by a round already: the job's own lock decides
            else:
                job.withdraw_if_not_started()
                return True
        return job.withdraw_if_not_started()

    async def wait(self, job: CommitJob) -> outcome.Outcome[None]:
        """Wait for the round that writes ``job``. Cancellation: the wait is abandoned
        at once (the job stays in its round; callers shield it, see
        :meth:`SessionWriter._write_some`); its outcome is kept in ``job.result``."""
        if job.result is not None:
            return job.result
        job.task = trio.lowlevel.current_task()

        def abort(_: Any) -> trio.lowlevel.Abort:
            job.task = None
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    async def wait_bounded(self, job: CommitJob, deadline: float) -> outcome.Outcome[None] | None:
        """Wait for the round that writes ``job``, not interruptible by cancellation,
        until ``deadline`` on the Trio clock: the job's outcome, or ``None`` if the
        deadline passed first (the job stays in its round; its outcome, when it comes,
        is kept in ``job.result``).

        The shielded, bounded wait of :meth:`SessionWriter._commit` without a cancel
        scope of its own: entering and leaving a shielded scope with a deadline was a
        tenth of a durable flush's Trio-thread work at 64 sessions (issue 26). The
        shield is the abort function's refusal; the deadline is kept by one watchdog
        task per committer (:meth:`_watch`), which a wait arms only when its deadline
        is earlier than the one the watchdog already sleeps to (i.e. not at all while
        the bound is the same for every wait).

        Cancellation: none is delivered here (the caller's cancellation stays pending
        for its next checkpoint, as after a shielded scope; so does a
        ``KeyboardInterrupt``)."""
        if job.result is not None:
            return job.result
        self.watch(job, deadline)
        return await trio.lowlevel.wait_task_rescheduled(refuse_abort)  # type: ignore[no-any-return]

    def watch(self, job: CommitJob, deadline: float) -> None:
        """The synchronous half of :meth:`wait_bounded` (``job.result`` not set yet):
        make the current task ``job``'s waiter, bounded by ``deadline``. The caller
        parks next, in its own frame, with
        ``trio.lowlevel.wait_task_rescheduled(refuse_abort)`` (the direct flush of
        :meth:`SessionWriter.flush_direct`: no coroutine frame for the wait)."""
        job.task = trio.lowlevel.current_task()
        self._watched[job] = deadline
        if deadline > self._watch_idle_until:
            self._watch_idle_until = deadline
        if not self._watching:
            self._watching = True
            # A system task: the bounds hold while the caller's nursery is cancelled
            # (a close in a cancelled block), as a shielded scope's deadline did, and
            # the watchdog never outlives the run.
            trio.lowlevel.spawn_system_task(self._watch, name="harness group-commit watchdog")
        else:
            scope = self._watch_scope
            if scope is not None and deadline < scope.deadline:
                scope.deadline = deadline  # a shorter bound than the watchdog's (rare)

    async def _watch(self) -> None:
        """The watchdog of the bounded waits: wakes every waiter whose deadline passed
        (with ``None``), sleeps until the earliest deadline still watched, and ends
        once nothing was watched up to the last deadline it saw (the next wait starts
        a new one). A system task: never raises (its cancellation, at the end of the
        run, finds no waiter left)."""
        try:
            while True:
                now = trio.current_time()
                watched = self._watched
                for job in [j for j, d in watched.items() if d <= now]:
                    del watched[job]
                    task, job.task = job.task, None
                    if task is not None:
                        trio.lowlevel.reschedule(task, outcome.Value(None))
                if watched:
                    until = min(watched.values())
                elif now < self._watch_idle_until and not self._watch_closing:
                    until = self._watch_idle_until
                else:
                    return
                with trio.CancelScope(deadline=until) as scope:
                    self._watch_scope = scope
                    await trio.sleep_forever()
                self._watch_scope = None
        except trio.Cancelled:
            return  # the run is ending: no waiter is left
        finally:
            self._watch_scope = None
            self._watching = False
            self._watch_idle_until = -math.inf

    def _dispatch(self) -> None:
        """Trio thread, owning the carrier role (``_busy`` set by the caller): start a
        *chain* on the committer's writer thread (:meth:`_chain`): it takes every
        pending batch as a round starts and, once the round is written, starts the
        next one itself with whatever was submitted meanwhile; the Trio thread only
        submits and completes. Under a fault explorer (:data:`chain_gate`) the same
        chain waits for the explorer's permission before each of its steps."""
        lookup = chain_gate
        steps = lookup() if lookup is not None else None
        self._thread.start_soon(
            functools.partial(self._chain, trio.lowlevel.current_trio_token(), steps), _chain_ended
        )

    def _chain(self, token: trio.lowlevel.TrioToken, steps: ChainSteps | None = None) -> None:
        """Blocking (the writer thread): write rounds back to back while batches are
        pending; then give up the carrier role (under ``_mutex``, with nothing pending:
        a later :meth:`submit` starts a new chain). Each written round is handed to
        the Trio thread in ``_done``, with one ``run_sync_soon`` for as many rounds as
        it has not completed yet (:meth:`_complete_rounds`). If the run ended, nobody
        waits: what is pending is dropped unwritten (never started, as a withdrawn
        job) and the chain ends.

        ``steps`` (a fault explorer's, see :data:`chain_gate`; ``None`` in production):
        each step waits for its permission first, so the explorer decides where the
        Trio side's submits, withdrawals and cancellations fall between them; the
        steps themselves are the production ones (the points are between the
        ``_mutex`` sections and the round: where another thread could interleave)."""
        mutex = self._mutex
        backend = self.backend
        cache = self._group_cache
        try:
            while True:
                if steps is not None:
                    steps.step("take")
                with mutex:
                    jobs, self._pending = self._pending, []
                    if not jobs:
                        self._busy = False
                        return
                    self.rounds += 1
                    self.batches += len(jobs)
                if steps is not None:
                    steps.step("write")
                # ``run_round`` looked up at each round (a profiler may wrap it, and
                # one that takes three arguments still can: ``steps`` only when gated).
                if steps is None:
                    result = outcome.capture(run_round, backend, jobs, cache)
                else:
                    result = outcome.capture(run_round, backend, jobs, cache, steps)
                if steps is not None:
                    steps.step("publish")
                with mutex:
                    done = self._done
                    done.append((jobs, result))
                    wake = len(done) == 1  # else a completion is already on its way
                del jobs, result  # not kept while the next round runs
                if wake:
                    if steps is not None:
                        steps.step("wake")
                    try:
                        token.run_sync_soon(self._complete_rounds)
                    except trio.RunFinishedError:
                        with mutex:
                            self._done.clear()
                            self._pending.clear()
                            self._busy = False
                        return
        except BaseException:  # pragma: no cover - a bug in the chain itself
            with mutex:
                self._busy = False  # the next submit starts a new chain for what is pending
            raise
        finally:
            if steps is not None:
                steps.ended()

    def _complete_rounds(self) -> None:
        """Trio thread (one ``run_sync_soon`` per batch of rounds written since the
        last one ran): complete each, in order."""
        with self._mutex:
            done, self._done = self._done, []
        for jobs, result in done:
            self._complete(jobs, result)

    def _complete(
        self, jobs: list[CommitJob], result: outcome.Outcome[list[BaseException | None]]
    ) -> None:
        """Trio thread: every waiter of the round is rescheduled with its own outcome."""
        if isinstance(result, outcome.Error):  # run_round itself failed: nothing is durable
            errors: list[BaseException | None] = [result.error] * len(jobs)
        else:
            errors = result.unwrap()
        watched = self._watched
        for job, err in zip(jobs, errors, strict=True):
            job.result = outcome.Value(None) if err is None else outcome.Error(err)
            task, job.task = job.task, None
            if task is not None:
                trio.lowlevel.reschedule(task, outcome.Value(job.result))
            watched.pop(job, None)
        if self._watch_closing:
            self._end_idle_watch()

    def close(self) -> threading.Thread | None:
        """Stop the writer thread once it is idle (a later round starts a new one); the
        thread, if one runs (to join). A chain on it finishes first (its round, and the
        rounds of what is still pending). The watchdog of
        the bounded waits ends once none is left (no task outlives the persistence);
        a later wait starts a new one, which no longer lingers."""
        self._watch_closing = True
        self._end_idle_watch()
        return self._thread.stop()

    def _end_idle_watch(self) -> None:
        if not self._watched and self._watch_scope is not None:
            self._watch_scope.cancel()  # it wakes, finds nothing watched, and ends


def refuse_abort(_: Any) -> trio.lowlevel.Abort:
    """The abort function of a bounded wait: shielded, the round's outcome (or the
    watchdog, at the deadline) wakes it."""
    return trio.lowlevel.Abort.FAILED


def _chain_ended(result: outcome.Outcome[None]) -> None:
    """The writer thread, after a chain: it returns nothing and raises nothing (each
    round's outcome is captured); anything else is a bug, logged, not lost."""
    if isinstance(result, outcome.Error):  # pragma: no cover - a bug in the chain
        log.error("group commit: a chain of rounds failed: %r", result.error)
