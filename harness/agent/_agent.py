"""The agent loop: turns of steps, each a model request and its tool calls."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import orjson
import trio

from actors import ActorError
from harness.agent._hooks import (
    AgentHooks,
    AgentView,
    CheckpointContext,
    CheckpointPoint,
    RequestErrorContext,
    Retry,
    Status,
    StepContext,
)
from harness.agent._inbox import Inbox, Target, splice_draft
from harness.agent._step import (
    Step,
    abort_before_dispatch,
    as_append,
    assistant_message,
    close_step,
    stream_reply,
    tool_result,
    turn_started,
    user_message,
)
from harness.agent._tools import ToolSet
from harness.agent._types import (
    AbortKind,
    AgentArgumentError,
    AgentBusyError,
    AgentCancelledError,
    AgentDisposedError,
    Delivery,
    Phase,
    TurnResult,
    check_max_tokens,
    require_trio_task,
    require_trio_thread,
)
from harness.errors import HarnessError
from harness.persistence import CheckpointPolicy
from harness.providers import (
    ModelProvider,
    ModelRequest,
    ProviderError,
)
from harness.providers._protocol import MAX_TOOL_ARGUMENTS
from harness.runtime import SessionHandle
from harness.runtime._listeners import refuse_awaitable
from harness.session import EventDraft, FrozenDict, freeze, header_equals, thaw

log = logging.getLogger("harness.agent")

T = TypeVar("T")


class _NothingQueued(Exception):
    """The driver found the inbox emptied before its claim: no turn starts."""


class Agent:
    """Runs turns on one live session. One turn (or one maintenance task) at a time.

    Every turn it starts ends with a ``turn/end`` while the process lives: completed,
    ``max-tokens``, ``error`` (a provider failure), or ``aborted`` with the first
    cause given to :meth:`cancel` (``user``, ``parent``, ``disposed``). An aborted step
    is closed the way the reference closes it (visible text kept as an interrupted
    message, unanswered tool calls answered with abort errors).

    Work arrives two ways: :meth:`run_turn` runs one prompt in the caller's task, and
    :meth:`send` queues a message in the durable inbox; a waking send starts the
    agent's *driver* in ``nursery`` (the agent loop's), which runs turns while queued
    work remains. :meth:`run_maintenance` runs a task (manual compaction) while the
    agent is idle; sends that arrive meanwhile wait for it.
    """

    def __init__(
        self,
        session: SessionHandle,
        provider: ModelProvider,
        tools: ToolSet | None = None,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        checkpoint: CheckpointPolicy | None = None,
        tool_concurrency: int = 4,
        chunk_batch: int = 32,
        close_grace: float = 10.0,
        hooks: AgentHooks | None = None,
        nursery: trio.Nursery | None = None,
        max_tool_arguments: int = MAX_TOOL_ARGUMENTS,
    ) -> None:
        check_max_tokens(max_tokens)
        self.session = session
        self.provider = provider
        self.tools = tools or ToolSet()
        self.system = system
        self.max_tokens = max_tokens
        self.checkpoint = checkpoint
        self.hooks = hooks or AgentHooks()
        self._nursery = nursery
        self._limiter = trio.CapacityLimiter(tool_concurrency)
        self._chunk_batch = chunk_batch
        self.close_grace = close_grace
        self.max_tool_arguments = max_tool_arguments
        self._scope: trio.CancelScope | None = None
        self._cause: dict[str, Any] | None = None
        self._phase: Phase = "idle"
        self._idle = trio.Event()
        self._idle.set()
        self._requests = 0
        self._turn_task: trio.lowlevel.Task | None = None
        self.disposed = False
        self._last_turn = session.last_turn()
        # The inbox survives a resume: it is folded back from its splice records.
        self._inbox = Inbox.rebuild(session.events)
        self._inbox_lock = trio.Lock()
        self._waking_lock = trio.Lock()  # FIFO order of follow-ups and steers
        self._driver: trio.Event | None = None  # set when the running driver exits
        self._parked = False  # a cancel parks queued work until the next waking send
        # A waking send arrived while a turn or maintenance ran: start the driver when
        # it ends. Work merely pending (e.g. rebuilt on resume) waits for a waking send.
        self._latched = False

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def busy(self) -> bool:
        """A turn or a maintenance task is running."""
        return not self._idle.is_set()

    @property
    def phase(self) -> Phase:
        """``idle``, ``turn`` or ``maintenance``."""
        return self._phase

    @property
    def status(self) -> Status:
        """``running`` during a turn; ``idle`` otherwise (maintenance reads ``idle``)."""
        return "running" if self._phase == "turn" else "idle"

    @property
    def inbox(self) -> dict[str, tuple[FrozenDict, ...]]:
        """The queued messages, per target (a snapshot)."""
        return {t: tuple(cast(FrozenDict, freeze(m)) for m in q) for t, q in self._inbox.queues.items()}

    def cancel(self, kind: AbortKind = "user") -> None:
        """Abort the running turn or maintenance task (no-op when idle). The first
        cause wins. Queued inbox work is parked (kept, not started) until the next
        waking :meth:`send`; :meth:`clear_inbox` drops it.

        Call it on the runtime's Trio thread: from elsewhere (an asyncio task, another
        thread) it raises :class:`~harness.errors.RuntimeThreadError` and cancels
        nothing (``portal.run_sync(agent.cancel)`` does it)."""
        require_trio_thread(self.id, "Agent.cancel")
        if self._scope is None:
            if self._driver is not None:
                self._parked = True  # the driver is scheduled: it starts no turn
            return
        if self._cause is None:
            self._cause = {"kind": kind}
        self._parked = True
        self._scope.cancel()

    def cancel_requested(self) -> bool:
        """Whether :meth:`cancel` was called on the running turn or maintenance task
        (its cancellation may not have reached a checkpoint yet)."""
        scope = self._scope
        return scope is not None and scope.cancel_called

    def in_turn(self) -> bool:
        """Whether the current task is the running turn (or maintenance task) or one
        of its children (e.g. a tool body)."""
        turn_task = self._turn_task
        if turn_task is None:
            return False
        task: trio.lowlevel.Task | None = trio.lowlevel.current_task()
        while task is not None:
            if task is turn_task:
                return True
            parent = task.parent_nursery
            task = None if parent is None else parent.parent_task
        return False

    async def wait_idle(self) -> None:
        """Return once no turn, maintenance task or driver is running (always settles:
        it waits again if the driver started the next queued turn meanwhile).

        Cancellation: only the wait is cancelled; the turn goes on.
        """
        require_trio_task(self.id, "Agent.wait_idle")
        while True:
            await self._idle.wait()
            driver = self._driver
            if driver is None:
                if self._idle.is_set():
                    return
                continue
            await driver.wait()

    # -- the inbox -----------------------------------------------------------------------

    async def send(self, text: str, *, delivery: Delivery = "follow-up") -> str:
        """Queue a user message; return its id (the id of its ``user/message``).

        ``follow-up``: a prompt of its own, run as the next turn (FIFO). ``steer``:
        delivered at the next step of the running turn (a turn about to complete runs
        one more step for it), or starts a turn when idle. ``inject``: delivered at the
        next step of whatever turn runs next; it does not wake the agent. The first two
        wake an idle agent: its driver runs turns (in the loop's nursery) while queued
        work remains. During maintenance (manual compaction) a follow-up or steer is
        recorded only once it ends, so this call waits for it (in FIFO order); an
        inject is recorded at once (log-only, it reaches the surface at the next step).

        The queue change is one durable ``agent/inbox/spliced`` record. A ``text``
        that is not a ``str`` raises :class:`AgentArgumentError` (nothing is queued).

        Cancellation: cancelled before the record was appended (also while waiting
        for maintenance to end), nothing is queued.
        """
        require_trio_task(self.id, "Agent.send")
        if self.disposed:
            raise AgentDisposedError(f'agent "{self.id}" is disposed', session_id=self.id)
        if delivery not in ("follow-up", "steer", "inject"):
            raise AgentArgumentError(f'agent send delivery must be "follow-up", "steer" or "inject", got {delivery!r}')
        message = user_message(text, session_id=self.id, method="send")
        target: Target = "next-turn" if delivery == "follow-up" else "next-step"
        if delivery == "inject":
            await self._record_send(target, message, delivery)
            return str(message["id"])
        # A waking send during maintenance is recorded after it (reference §7.1: it
        # runs after the bracket's end, flush and release, and nothing of it is written
        # inside the bracket); the lock keeps such sends in their FIFO order. A send
        # from the maintenance task itself cannot wait for its own end.
        if (self._phase == "maintenance" and not self.in_turn()) or self._waking_lock.locked():
            async with self._waking_lock:
                while self._phase == "maintenance" and not self.in_turn():
                    await self._idle.wait()
                if self.disposed:
                    raise AgentDisposedError(f'agent "{self.id}" is disposed', session_id=self.id)
                await self._record_send(target, message, delivery)
        else:
            await self._record_send(target, message, delivery)
        self._parked = False
        self._wake()
        return str(message["id"])

    def inject_nowait(self, text: str) -> str:
        """Queue an ``inject`` message synchronously (no checkpoint); return its id.

        As ``send(text, delivery="inject")``: delivered at the next step of whatever
        turn runs next, it does not wake the agent. The message is queued now and its
        ``agent/inbox/spliced`` record is sent to the session actor without waiting
        (:meth:`SessionHandle.append_nowait`, in order with every later append). When
        another inbox change is being recorded at this moment, the record is written
        right after it, by a task in the agent's nursery (FIFO with other sends).

        Raises :class:`AgentDisposedError`, :class:`AgentArgumentError` (``text`` not
        a ``str``), ``SessionNotLiveError`` (stale session), and
        :class:`AgentBusyError` when a record is in flight and the agent has no nursery
        to defer to (then nothing is queued); :class:`~harness.errors.RuntimeThreadError`
        off the runtime's Trio thread (nothing is queued).
        """
        require_trio_thread(self.id, "Agent.inject_nowait")
        if self.disposed:
            raise AgentDisposedError(f'agent "{self.id}" is disposed', session_id=self.id)
        message = user_message(text, session_id=self.id, method="inject_nowait")
        if self._inbox_lock.locked():
            if self._nursery is None:
                raise AgentBusyError(
                    f'agent "{self.id}": an inbox change is being recorded; use await send(..., delivery="inject")',
                    session_id=self.id,
                )
            self._nursery.start_soon(self._record_send, "next-step", message, "inject")
            return str(message["id"])
        queue = self._inbox.queues["next-step"]
        # No inbox record is in flight (the lock is free): this one is next, at the
        # queue's current end, in memory and in the actor's order alike.
        self.session.append_nowait(*as_append(splice_draft("next-step", len(queue), 0, [message])))
        self._inbox.apply("next-step", len(queue), 0, [message])
        return str(message["id"])

    async def _record_send(self, target: Target, message: dict[str, Any], delivery: Delivery) -> None:
        """Append the send's ``agent/inbox/spliced`` record and queue the message.
        Cancellation: cancelled before the record was appended, nothing is queued."""
        async with self._inbox_lock:
            queue = self._inbox.queues[target]
            await self.session.append(*as_append(splice_draft(target, len(queue), 0, [message])))
            self._inbox.apply(target, len(queue), 0, [message])
            if delivery == "steer":
                self._inbox.waking.add(message["id"])

    async def clear_inbox(self) -> int:
        """Drop every queued message (one ``agent/inbox/spliced {outcome: canceled}``
        record per non-empty target); return how many were dropped.

        Cancellation: the kernel's call contract per record (a target whose record was
        not appended keeps its messages).
        """
        require_trio_task(self.id, "Agent.clear_inbox")
        dropped = 0
        async with self._inbox_lock:
            for target in ("next-step", "next-turn"):  # the reference's order
                queue = self._inbox.queues[target]
                if queue:
                    n = len(queue)
                    await self.session.append(*as_append(splice_draft(target, 0, n, [], outcome="canceled")))
                    self._inbox.apply(target, 0, n, [])
                    dropped += n
        return dropped

    async def run_queued(self) -> list[TurnResult]:
        """Run turns while queued work would wake the agent; return their results.

        This is the driver's body; call it directly on an agent without a nursery.
        Stops early when the agent is cancelled (the rest stays queued) or disposed.

        Cancellation: as :meth:`run_turn`, for the turn running when it comes.
        """
        require_trio_task(self.id, "Agent.run_queued")
        self._parked = False
        return await self._drain()

    async def _drain(self) -> list[TurnResult]:
        results: list[TurnResult] = []
        while self._inbox.wakes() and not self.disposed and not self._parked:
            self._latched = False  # the drain takes whatever was sent meanwhile
            result = await self._run(None)
            if result is not None:
                results.append(result)
        return results

    def _wake(self) -> None:
        if self._phase != "idle":
            self._latched = True  # a waking send during a turn or maintenance: at its end
            return
        if self._driver is not None or self.disposed or self._nursery is None:
            return
        if not self._inbox.wakes():
            return
        done = self._driver = trio.Event()
        try:
            self._nursery.start_soon(self._drive, done, name=f"agent driver {self.id}")
        except RuntimeError:  # the loop's nursery is closed: nothing can run turns
            self._driver = None
            done.set()

    def _wake_latched(self) -> None:
        latched, self._latched = self._latched, False
        if latched and not self._parked:
            self._wake()

    async def _drive(self, done: trio.Event) -> None:
        try:
            if self._phase == "idle":
                await self._drain()
            else:
                self._latched = True  # a direct turn started first: its end wakes us
        except (HarnessError, ActorError) as exc:
            # The session went away under the queued work: it stays in the log.
            log.warning('agent "%s": queued work stopped: %s', self.id, exc)
        except Exception as exc:
            # A bug under a queued turn (a hook's): the turn is closed (INTERNAL_ERROR);
            # it must not take the loop's nursery, and every other agent, down with it.
            self.session.store.warnings.report(
                log,
                "listener-failed",
                "agent/queued-work",
                f'agent "{self.id}": queued work stopped by an unexpected error: {exc!r}',
                session_id=self.id,
                error=exc,
                level=logging.ERROR,
                traceback=True,
            )
        finally:
            self._driver = None
            done.set()

    # -- maintenance ---------------------------------------------------------------------

    async def run_maintenance(self, task: Callable[[], Awaitable[T]]) -> T:
        """Run ``task`` while the agent is idle (the ``maintenance`` phase; status
        still reads ``idle``). Turns cannot start meanwhile; waking sends are queued
        and start the driver when it ends.

        Raises :class:`AgentBusyError` at once (before any checkpoint) when a turn,
        another maintenance task or the driver is running, and
        :class:`AgentDisposedError` when disposed.

        Cancellation: :meth:`cancel` cancels the task (it sees ``trio.Cancelled``)
        and this raises :class:`AgentCancelledError` carrying the cause; cancelling
        the caller propagates ``Cancelled`` as usual.

        Off the runtime's Trio thread (an asyncio task calling it directly, not through
        the portal) it raises :class:`~harness.errors.RuntimeThreadError` before
        anything changes.
        """
        current = require_trio_task(self.id, "Agent.run_maintenance")
        if self.disposed:
            raise AgentDisposedError(f'agent "{self.id}" is disposed', session_id=self.id)
        if self._phase != "idle" or self._driver is not None:
            raise AgentBusyError(
                f'agent "{self.id}" is not idle (a turn, maintenance or queued work is running)', session_id=self.id
            )
        self._phase = "maintenance"
        self._idle = trio.Event()
        self._cause = None
        self._turn_task = current
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                result = await task()
            if scope.cancelled_caught:
                cause = self._cause or {"kind": "user"}
                raise AgentCancelledError(
                    f'agent "{self.id}" maintenance was cancelled ({cause["kind"]})', cause, session_id=self.id
                )
            return result
        finally:
            self._scope = None
            self._turn_task = None
            self._phase = "idle"
            self._idle.set()
            self._wake_latched()

    # -- a turn ------------------------------------------------------------------------

    async def run_turn(self, text: str) -> TurnResult:
        """Run one turn for a user message; return how it ended.

        The prompt goes through the inbox like any message (``agent/inbox/spliced``
        inserting it, ``turn/start``, the claim), then runs now, ahead of queued
        work. ``text`` is a ``str`` (the message's one text part); anything else raises
        :class:`AgentArgumentError` naming the value, before anything is logged.

        Cancellation: :meth:`cancel` ends the turn as ``aborted`` and this returns the
        result. If the *caller* is cancelled, the turn is recorded as aborted (cause
        ``user`` unless one was given) in a shielded cleanup, then ``Cancelled``
        propagates. Either way ``turn/end`` is in the log before this returns.

        Called off the runtime's Trio thread (from an asyncio task directly instead of
        through ``portal.arun(agent.run_turn, ...)``) it raises
        :class:`~harness.errors.RuntimeThreadError` before anything changes or is logged.
        """
        result = await self._run(user_message(text, session_id=self.id, method="run_turn"))
        assert result is not None  # a direct prompt is always claimed
        return result

    async def _run(self, prompt: dict[str, Any] | None) -> TurnResult | None:
        # The Trio context is confirmed before anything changes: called from asyncio,
        # a turn marked running here would never end (the agent refused as busy).
        task = require_trio_task(self.id, "Agent.run_turn")
        if self.disposed:
            raise AgentDisposedError(f'agent "{self.id}" is disposed', session_id=self.id)
        if self.busy:
            raise AgentBusyError(f'agent "{self.id}" is already running a turn', session_id=self.id)
        self._phase = "turn"
        self._idle = trio.Event()
        self._cause = None
        self._turn_task = task
        turn = self._last_turn + 1
        self._last_turn = turn
        # The scope exists before the "running" notification: a listener that cancels
        # there stops the turn before turn/start (no turn at all).
        scope = self._scope = trio.CancelScope()
        self._notify("running")
        try:
            return await self._turn(turn, prompt, scope)
        finally:
            # Set only after turn/end is logged: whoever waits for idle (dispose) can
            # detach the session knowing the turn is closed.
            self._scope = None
            self._turn_task = None
            self._phase = "idle"
            self._idle.set()
            self._notify("idle")
            if prompt is not None:
                self._wake_latched()  # work sent while a direct turn ran

    def _checkpointed(self, turn: int, step: int, point: CheckpointPoint, call_id: str | None = None) -> None:
        """Tell the checkpoint listeners that a checkpoint flush completed."""
        if not self.hooks.checkpoint:
            return
        context = CheckpointContext(self, turn, step, point, call_id, self.session.seq)
        self._call_listeners("agent/checkpoint", "checkpoint", self.hooks.checkpoint, context)

    def _notify(self, status: Status) -> None:
        self._call_listeners("agent/status", "status", self.hooks.status, self, status)

    def _call_listeners(self, source: str, what: str, listeners: Iterable[Callable[..., object]], *args: object) -> None:
        """Call each synchronous listener with ``args``; a failure (or an awaitable
        returned) is reported as a ``listener-failed`` warning, never raised."""
        for listener in list(listeners):
            try:
                result: object = listener(*args)
                if result is not None:
                    refuse_awaitable(source, listener, result)
            except Exception as exc:
                self.session.store.warnings.report(
                    log,
                    "listener-failed",
                    source,
                    f'agent "{self.id}": a {what} listener failed: {exc!r}',
                    session_id=self.id,
                    error=exc,
                    level=logging.ERROR,
                )

    async def _claim(self, turn: int, prompt: dict[str, Any] | None, *, first: bool) -> list[dict[str, Any]]:
        """Claim the step's input from the inbox: on the turn's first step the prompt
        (given, or the oldest ``next-turn`` message), then every ``next-step``
        message. ``turn/start`` (first step) and the claim records are one batch."""
        async with self._inbox_lock:
            drafts: list[EventDraft] = []
            claimed: list[dict[str, Any]] = []
            changes: list[tuple[Target, int, int, list[dict[str, Any]]]] = []
            if first and prompt is None and not self._inbox.next_turn and not self._inbox.next_step:
                raise _NothingQueued  # cleared under the driver's feet: no turn at all
            if first and prompt is not None:
                # A direct prompt is recorded like a send, and claimed at once.
                drafts.append(splice_draft("next-turn", 0, 0, [prompt]))
            if first:
                drafts.append(EventDraft("turn/start", {"turn": turn}))
            if first and prompt is not None:
                drafts.append(splice_draft("next-turn", 0, 1, []))
                claimed.append(prompt)
            elif first and self._inbox.next_turn:
                drafts.append(splice_draft("next-turn", 0, 1, []))
                changes.append(("next-turn", 0, 1, []))
                claimed.append(self._inbox.next_turn[0])
            if self._inbox.next_step:
                n = len(self._inbox.next_step)
                drafts.append(splice_draft("next-step", 0, n, []))
                changes.append(("next-step", 0, n, []))
                claimed.extend(self._inbox.next_step)
            if drafts:
                await self.session.append_batch(drafts)
            for change in changes:
                self._inbox.apply(*change)
            return claimed

    async def _turn(self, turn: int, prompt: dict[str, Any] | None, scope: trio.CancelScope) -> TurnResult | None:
        steps: list[Step] = []
        outcome: dict[str, Any] | None = None
        started = False
        try:
            with scope:
                while outcome is None:
                    first = not steps
                    claimed = await self._claim(turn, prompt, first=first)
                    started = True
                    step = Step(len(steps) + 1)
                    for hook in list(self.hooks.pre_step):
                        await hook(StepContext(self, turn, step.step, tuple(cast(FrozenDict, freeze(m)) for m in claimed)))
                    if self.checkpoint is not None:
                        await self.checkpoint.at_step_boundary(self.session)
                        self._checkpointed(turn, step.step, "step")
                    steps.append(step)
                    outcome = await self._run_step(turn, step, claimed)
                    if outcome is not None and outcome["kind"] == "completed" and self._inbox.steered():
                        outcome = None  # a steer arrived: one more step for it
        except _NothingQueued:
            self._last_turn = turn - 1  # the number was never used
            return None
        except ProviderError as exc:
            outcome = {"kind": "error", "error": {"message": str(exc), "code": exc.code}}
            if exc.status is not None:
                outcome["error"]["status"] = exc.status
            await self._finish(turn, steps, outcome, committed_stream=False)
            return TurnResult(turn, outcome)
        except (HarnessError, ActorError) as exc:
            # The runtime refused or failed (a flush, a session no longer live, a reply
            # whose outcome is unknown): an error of the turn, not an abort by anyone.
            outcome = {"kind": "error", "error": {"message": str(exc), "code": exc.code}}
            await self._finish(turn, steps, outcome, committed_stream=True, started=started)
            return TurnResult(turn, outcome)
        except Exception as exc:
            # A bug (ours or a hook's): the turn is still closed, as an error, and the
            # exception propagates so that it is seen.
            outcome = {"kind": "error", "error": {"message": repr(exc), "code": "INTERNAL_ERROR"}}
            await self._finish(turn, steps, outcome, committed_stream=True, started=started)
            raise
        except BaseException:
            # The caller was cancelled: the turn still ends.
            outcome = {"kind": "aborted", "reason": self._cause or {"kind": "user"}}
            await self._finish(turn, steps, outcome, committed_stream=True, started=started)
            raise
        if outcome is None:  # cancelled through self.cancel()
            outcome = {"kind": "aborted", "reason": self._cause or {"kind": "user"}}
        await self._finish(turn, steps, outcome, committed_stream=True, started=started)
        return TurnResult(turn, outcome)

    async def _finish(
        self, turn: int, steps: list[Step], outcome: dict[str, Any], *, committed_stream: bool, started: bool = True
    ) -> None:
        """Close the open step and log ``turn/end`` (shielded: a turn is never left
        without its end while the session is live).

        If ``turn/start`` was never appended (cancelled before the first claim landed),
        there is nothing to close. If the session is no longer live, nothing can be
        logged: the turn is left open for crash repair to close on the next load, and
        the error propagates.
        """
        with trio.CancelScope(shield=True):
            if not started and not turn_started(self.session, turn):
                self._last_turn = turn - 1  # the number was never used
                return
            if outcome["kind"] in ("aborted", "error") and steps:
                await close_step(self.session, self.provider, turn, steps[-1], committed_stream=committed_stream)
            await self.session.append("turn/end", {"turn": turn, "reason": outcome})

    async def _run_step(self, turn: int, step: Step, claimed: list[dict[str, Any]]) -> dict[str, Any] | None:
        """One step; returns the turn's end reason, or None to run another step."""
        s = self.session
        await s.append_batch(
            [EventDraft("step/start", {"turn": turn, "step": step.step})]
            + [EventDraft("user/message", m, "append") for m in claimed]
        )
        attempt = 0
        while True:
            attempt += 1
            await self._request_header()
            request = ModelRequest(
                session_id=s.id,
                provider=self.provider.name,
                model=self.provider.model,
                messages=await s.derive_messages(),
                tools=self.tools.specs,
                system=self.system,
                max_tokens=self.max_tokens,
            )
            if self.checkpoint is not None:
                await self.checkpoint.before_model_request(s)
                self._checkpointed(turn, step.step, "model-request")
            try:
                finish = await stream_reply(
                    self.session,
                    self.provider,
                    turn,
                    step,
                    request,
                    chunk_batch=self._chunk_batch,
                    close_grace=self.close_grace,
                    max_tool_arguments=self.max_tool_arguments,
                )
                break
            except ProviderError as exc:
                # The failed attempt commits nothing, even if the recovery below is
                # cancelled (its logged chunks are log-only); a retry rebuilds the
                # request from the surface as it is then.
                step.reset_attempt()
                if not await self._retry(RequestErrorContext(self, turn, step.step, exc, attempt)):
                    raise
        content: list[dict[str, Any]] = []
        for index in sorted({*step.texts, *step.reasoning}):
            if index in step.reasoning:
                content.append({"type": "reasoning", "text": "".join(step.reasoning[index])})
            if index in step.texts:
                content.append({"type": "text", "text": "".join(step.texts[index])})
        for call in step.calls:
            content.append({"type": "tool-call", "id": call["id"], "name": call["name"], "arguments": call["arguments"]})
        data: dict[str, Any] = {"turn": turn, "step": step.step, "message": assistant_message(self.provider, content)}
        if step.usage is not None:
            data["usage"] = step.usage
        await s.append("assistant/message", data, surface_op="append")
        if step.calls:
            await self._run_tools(turn, step)
            await s.append("step/end", {"turn": turn, "step": step.step})
            return None
        await s.append("step/end", {"turn": turn, "step": step.step})
        return {"kind": "max-tokens"} if finish == "length" else {"kind": "completed"}

    async def _retry(self, context: RequestErrorContext) -> bool:
        """The ``agent/request-error`` waterfall: the first hook with a decision ends
        it; a hook that raises counts as no retry. Then the cancellation is re-checked."""
        decision: Retry | None = None
        for hook in list(self.hooks.request_error):
            try:
                decision = await hook(context)
            except Exception as exc:
                self.session.store.warnings.report(
                    log,
                    "listener-failed",
                    "agent/request-error",
                    f'agent "{self.id}": a request-error hook failed; no retry: {exc!r}',
                    session_id=self.id,
                    error=exc,
                    traceback=True,
                )
                decision = None
                break
            if decision is not None:
                break
        await trio.lowlevel.checkpoint_if_cancelled()
        return isinstance(decision, Retry)

    async def _request_header(self) -> None:
        s = self.session
        header: dict[str, Any] = {"config": {"provider": self.provider.name, "model": self.provider.model}}
        if self.max_tokens is not None:
            header["config"]["maxTokens"] = self.max_tokens
        if self.system:
            header["system"] = self.system
        specs = self.tools.specs
        if specs:
            header["tools"] = [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in specs]
        previous = s.request_header()
        first = self._requests == 0
        self._requests += 1
        drafts = []
        if first:
            reason = "resume" if previous is not None else "initial"
            drafts.append(EventDraft("request/header", {"header": header, "reason": reason}))
        elif previous is None or not header_equals(previous, freeze(header)):
            drafts.append(EventDraft("request/header", {"header": header, "reason": "change"}))
        context = {"provider": self.provider.name, "model": self.provider.model}
        if self.provider.context_window is not None:
            context["contextWindow"] = self.provider.context_window  # type: ignore[assignment]
        last = s.request_context()
        if last is None or thaw(last) != context:
            drafts.append(EventDraft("request/context", context))
        if drafts:
            await s.append_batch(drafts)

    async def _run_tools(self, turn: int, step: Step) -> None:
        s = self.session
        await s.append_batch(
            [
                EventDraft("tool/call", {"turn": turn, "step": step.step, "callId": c["id"], "name": c["name"], "arguments": c["arguments"]})
                for c in step.calls
            ]
        )

        async def run_one(call: dict[str, Any]) -> None:
            # Reference §4.2: flush before the body; a failed flush is this call's
            # error result (the body never runs, the turn goes on); a turn cancelled
            # before the body started (queued on the limiter, during the flush, or
            # with the flush done but the cancellation not yet delivered) records
            # TOOL_ABORTED_BEFORE_DISPATCH and the body never starts.
            body_started = False
            try:
                async with self._limiter:
                    error: dict[str, str] | None = None
                    flush_failure: Exception | None = None
                    if self.checkpoint is not None:
                        try:
                            await self.checkpoint.before_tool(s)
                        except Exception as exc:  # Cancelled is a BaseException: it propagates
                            flush_failure = exc
                        else:
                            self._checkpointed(turn, step.step, "tool", call["id"])
                    # The flush may have returned with a cancellation pending (the call
                    # contract delivers it at the next checkpoint): deliver it here,
                    # before any of the body runs.
                    await trio.lowlevel.checkpoint_if_cancelled()
                    tool = self.tools.get(call["name"])
                    if flush_failure is not None:
                        log.warning('agent "%s": the before-tool flush failed: %s', self.id, flush_failure)
                        text = f"Error: {flush_failure}"
                        error = {"name": type(flush_failure).__name__, "code": getattr(flush_failure, "code", "TOOL_FAILED")}
                    elif tool is None:
                        text, error = f"Error: unknown tool {call['name']!r}", {"name": "UnknownToolError", "code": "UNKNOWN_TOOL"}
                    else:
                        body_started = True
                        try:
                            args = orjson.loads(call["arguments"] or "{}")
                            result = await tool.fn(args if isinstance(args, dict) else {"value": args})
                            text = result if isinstance(result, str) else orjson.dumps(result).decode()
                        except trio.Cancelled:
                            raise
                        except Exception as exc:
                            text = f"Error: {exc}"
                            error = {"name": type(exc).__name__, "code": getattr(exc, "code", "TOOL_FAILED")}
                    await s.append("tool/result", tool_result(turn, step.step, call["id"], text, error), surface_op="append")
            except trio.Cancelled:
                if not body_started:
                    await abort_before_dispatch(self.session, turn, step.step, call["id"])
                raise

        failures: list[Exception] = []

        async def guarded(call: dict[str, Any], cancel: trio.CancelScope) -> None:
            try:
                await run_one(call)
            except Exception as exc:
                # The runtime failed under a tool (its result append, a dead session): the
                # step cannot go on. Stop the siblings and report one typed error,
                # not an ExceptionGroup.
                failures.append(exc)
                cancel.cancel()

        async with trio.open_nursery() as nursery:
            for call in step.calls:
                nursery.start_soon(guarded, call, nursery.cancel_scope)
        if failures:
            raise failures[0]


if TYPE_CHECKING:
    # What the hooks see of an agent (harness.agent._hooks.AgentView) is this class.
    _conforms: type[AgentView] = Agent
