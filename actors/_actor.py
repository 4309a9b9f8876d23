"""Actors: one Trio task owning its state, reading a bounded mailbox one message at a time."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Any, ClassVar, Generic, TypeVar, final

import outcome
import trio

from actors._bounded import run_bounded
from actors._errors import ActorCrashedError, ActorStoppedError, Rejected, ReplyOverdueError
from actors._mailbox import Mailbox

log = logging.getLogger("actors")

M = TypeVar("M")


class _State(Enum):
    QUEUED = "queued"
    TAKEN = "taken"
    WITHDRAWN = "withdrawn"
    DONE = "done"


class _Envelope:
    """One message in a mailbox, and for a :meth:`ActorRef.call` its reply slot.

    The reply is handed to the caller directly: the actor stores ``result`` and
    reschedules the parked caller task (``waiter``), no event or channel per call.
    ``done`` is made only when a caller is cancelled after its message was taken
    (the rare bounded wait of decision 0007).
    """

    __slots__ = ("done", "message", "reply", "result", "state", "waiter")

    def __init__(self, message: Any, reply: bool) -> None:
        self.message = message
        self.reply = reply
        self.state = _State.QUEUED
        self.result: outcome.Outcome[Any] | None = None
        self.done: trio.Event | None = None
        # The caller task parked on this reply, while it is parked.
        self.waiter: trio.lowlevel.Task | None = None


class Actor(Generic[M]):
    """Subclass and implement :meth:`handle`; optionally :meth:`on_stop`.

    Exceptions of the types in :attr:`rejections`, and any exception wrapped in
    :class:`Rejected`, are *replies*: the caller gets them with their type intact
    and the actor goes on. Any other exception is a
    crash: the failing caller gets it, every pending and later call fails with
    :class:`ActorCrashedError`, and the runtime's supervisor is told.

    Inline messages (decision 0013): messages whose exact type is in
    :attr:`inline_messages` are handled by the synchronous :meth:`handle_inline`
    instead of :meth:`handle`, always. When such a message is *called* while the actor
    is idle, :meth:`ActorRef.call` runs :meth:`handle_inline` on the caller's own task
    (no task switch); otherwise the actor task runs it, in mailbox order, as any
    message.
    """

    rejections: ClassVar[tuple[type[Exception], ...]] = ()
    #: Exact message types that :meth:`handle_inline` handles (opt-in; none by default).
    #: Only for handlers that are synchronous, short, and correct on any task: they
    #: must not rely on running in the actor task (its context variables, its
    #: cancel scope, ``trio.lowlevel.current_task()``).
    inline_messages: ClassVar[frozenset[type[Any]]] = frozenset()
    mailbox_size: ClassVar[int] = 64
    #: Seconds a cancelled caller keeps waiting for a message the actor already took
    #: (see :meth:`ActorRef.call`). Handlers are expected to be short; long work
    #: belongs in child tasks.
    reply_grace: ClassVar[float] = 30.0

    name: str = "actor"
    #: This actor's own ref (set when it is spawned): how its children reach it.
    ref: ActorRef[Any] | None = None
    _children: trio.Nursery | None = None  # set while the actor runs

    def start_child(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> None:
        """Run ``fn(*args)`` as a child task of this actor (call it from :meth:`handle`).

        Children run alongside the actor, which keeps serving messages; they reach the
        actor's state only through messages to its ref, like anyone else. When the
        actor stops normally, its children are cancelled once the mailbox is drained
        and waited for, *before* :meth:`on_stop` runs (so ``on_stop`` can settle what
        they left open). An exception escaping a child crashes the actor.

        Raises :class:`ActorStoppedError` once the actor no longer runs.
        """
        children = self._children
        if children is None:
            raise ActorStoppedError(f"actor {self.name!r} is not running")
        children.start_soon(fn, *args, name=name or f"{self.name} child")

    async def handle(self, message: M) -> Any:
        """Handle one message; runs in the actor task. Cancelled only when the runtime is
        cancelled (a caller's cancellation never interrupts a taken message)."""
        raise NotImplementedError

    def handle_inline(self, message: M) -> Any:
        """Handle one message of an :attr:`inline_messages` type, synchronously.

        Runs either in the actor task (the message was mailed: the actor was busy, or
        it was a cast) or in the task of the caller of :meth:`ActorRef.call` while
        the actor task stays parked; in both cases with the actor's mutual exclusion
        (nothing else of this actor runs meanwhile; messages sent meanwhile queue
        behind it). Replies and crashes as :meth:`handle`'s.
        """
        raise NotImplementedError

    async def on_stop(self) -> None:
        """Called once, after the mailbox is drained and the children have ended, when
        the actor stops normally.

        Runs in a shielded scope: it completes even if the runtime is cancelled meanwhile.
        """

    def on_exit(self) -> None:
        """Called once when the actor's task ends, however it ends (a normal stop, after
        :meth:`on_stop`; a crash; a cancellation), after its children have ended.

        Synchronous: settle what must never be left pending (e.g. wake waiters on work
        the actor owned). An exception here is logged, never raised.
        """


@final
class ActorRef(Generic[M]):
    """A cheap handle to send messages to one actor.

    Cancellation contract (decision 0007): a :meth:`call` that raises ``Cancelled``
    was never applied (withdrawn before the actor took it); once taken, the caller
    waits for the reply and gets it, the cancellation landing at its next checkpoint
    (bounded by ``reply_grace``: past it, :class:`ReplyOverdueError`, outcome unknown).
    :meth:`cast` cancelled while it waits for mailbox space sends nothing.
    """

    __slots__ = ("_cell", "_mailbox", "name")

    def __init__(self, name: str, mailbox: Mailbox[_Envelope], cell: _Cell) -> None:
        self.name = name
        self._mailbox = mailbox
        self._cell = cell

    @property
    def alive(self) -> bool:
        """False once the actor stopped accepting messages (stopped or crashed)."""
        return self._cell.crash is None and not self._cell.closing

    @property
    def idle(self) -> bool:
        """True when the actor is alive and parked waiting for its next message with
        none queued: every message sent before this moment has been handled (a
        barrier need not make a round trip). ``False`` is always a safe answer."""
        # A message handed to the waiting actor leaves it not waiting at once, and
        # one being handled means the actor is not waiting: either way not idle.
        return self._mailbox.idle and self.alive

    async def call(self, message: M) -> Any:
        """Send ``message`` and wait for the handler's result (or its exception).

        Backpressure: waits while the mailbox is full. Raises
        :class:`ActorStoppedError` if the actor no longer accepts messages and
        :class:`ActorCrashedError` if it crashed.

        Cancellation (Trio's rule: ``Cancelled`` means it did not happen):

        * cancelled before the actor takes the message: it is withdrawn, never
          applied, and ``Cancelled`` propagates;
        * cancelled once the actor has taken it: the caller keeps waiting, shielded,
          for the handler to finish, and gets its result (or error) as if it had not
          been cancelled; the cancellation is delivered at the caller's next
          checkpoint. So a caller that returns normally knows the message was
          applied, and one that gets ``Cancelled`` knows it was not;
        * the shielded wait is bounded by the actor's ``reply_grace``: a handler
          that overruns it makes the call raise :class:`ReplyOverdueError` (the
          outcome is unknown: reconcile from the actor's state).

        Inline (decision 0013): a message of one of the actor's ``inline_messages``
        types, called while the actor is idle (parked, nothing queued), is handled
        on this task at once by ``handle_inline``, the actor task left parked and
        the actor busy to everyone meanwhile. Same contract: cancelled before, it is
        not applied; once applied, its result (or error) is returned and a
        cancellation lands at the next checkpoint; a call is a checkpoint either way.
        """
        self._check()
        await trio.lowlevel.checkpoint_if_cancelled()  # cancelled already: nothing sent
        if type(message) in self._cell.inline and self._mailbox.borrow():
            return await self._call_inline(message)
        env = _Envelope(message, reply=True)
        try:
            # The common case: space in the mailbox, so no checkpoint here; the one
            # checkpoint of the call is the wait for the reply below.
            self._mailbox.put_nowait(env)
        except trio.WouldBlock:
            try:
                await self._enqueue(env)  # full: wait for space (cancelled: never sent)
            except BaseException:
                env.state = _State.WITHDRAWN
                raise
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._raise_stopped()
        if env.result is None:  # (the actor may have answered while we waited for space)
            await self._wait_reply(env)
        assert env.result is not None
        return env.result.unwrap()

    def call_nowait(self, message: M) -> Any:
        """Handle ``message`` now, on the calling task, and return the handler's result
        (or raise its exception), if it is one of the actor's ``inline_messages`` types
        and the actor is idle; else raise ``trio.WouldBlock`` with nothing sent.

        Synchronous, so not a checkpoint (Trio's ``*_nowait`` rule): the caller owns
        the schedule point that :meth:`call` would have been, e.g. a wait that follows
        for the message's effect. It never sees a cancellation, so a caller that wants
        :meth:`call`'s contract checks for one first
        (``trio.lowlevel.checkpoint_if_cancelled``) and, once this returned, does not
        report ``Cancelled`` for a message that was applied.

        Errors: as :meth:`call`'s inline path (a rejection is raised to the caller and
        the actor goes on; any other exception crashes the actor and is raised);
        :class:`ActorStoppedError` if the actor no longer accepts messages. A handler's
        own ``trio.WouldBlock`` is raised as it is, like any of its errors: a caller
        that must tell it from "not now" decides on :attr:`idle` first (an idle actor
        handles an inline type at once)."""
        self._check()
        if type(message) not in self._cell.inline or not self._mailbox.borrow():
            raise trio.WouldBlock
        try:
            result = self._cell.handle_inline(message)
        except BaseException as exc:
            # Raised outside this block: no implicit ``__context__`` on the error.
            error = self._inline_failed(exc)
        else:
            self._mailbox.end_borrow()
            return result
        raise error

    async def _call_inline(self, message: M) -> Any:
        """Handle ``message`` on this task, the mailbox borrowed (:meth:`call` took it:
        the actor is parked and idle): a rejection is this caller's reply; any other
        exception crashes the actor as in its own task (the parked actor is woken to
        end crashed) and is raised here, as the mailed path raises it.

        One schedule point, after the handler, shielded: the message is applied, so
        its answer is returned and a cancellation waits for the next checkpoint."""
        cell = self._cell
        mailbox = self._mailbox
        try:
            result = cell.handle_inline(message)
        except BaseException as exc:
            # The reply or crash is decided here; the error is raised after the
            # checkpoint, outside this block (no implicit ``__context__`` on it).
            error = self._inline_failed(exc)
        else:
            mailbox.end_borrow()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return result
        await trio.lowlevel.cancel_shielded_checkpoint()
        raise error

    def _inline_failed(self, exc: BaseException) -> BaseException:
        """End the borrow after a raising inline handler; the error for its caller."""
        cell = self._cell
        if isinstance(exc, Rejected):
            self._mailbox.end_borrow()
            return exc.error
        if isinstance(exc, cell.rejections):
            self._mailbox.end_borrow()
            return exc
        # A crash, as _serve's: no later message is served, the parked actor task
        # wakes into its crash path (queued calls fail, on_exit runs).
        cell.crash = exc
        self._mailbox.end_borrow(_CrashedInline())
        cell.on_crash(self.name, exc)
        return exc

    async def _wait_reply(self, env: _Envelope) -> None:
        """Park until the actor hands ``env`` its result (:func:`_finish` reschedules
        this task), keeping :meth:`call`'s cancellation contract."""
        env.waiter = trio.lowlevel.current_task()

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            # Called synchronously when the cancellation is delivered, so the state
            # read here is the state the caller's answer is decided by.
            env.waiter = None
            if env.state is _State.QUEUED:
                env.state = _State.WITHDRAWN  # the actor will skip it: never applied
            else:
                env.done = trio.Event()  # taken: the handler's end sets it
            return trio.lowlevel.Abort.SUCCEEDED

        try:
            await trio.lowlevel.wait_task_rescheduled(abort)
        except trio.Cancelled:
            if env.state is _State.WITHDRAWN:
                raise
            if env.result is None:
                # Taken: the message is being applied. Reporting ``Cancelled`` now
                # would tell the caller "not applied" about a message that will be.
                done = env.done
                assert done is not None
                await run_bounded(done.wait, self._cell.reply_grace, shield=True)
                if env.result is None:
                    raise ReplyOverdueError(self.name, env.message, self._cell.reply_grace) from None

    async def cast(self, message: M) -> None:
        """Send ``message`` without waiting for it to be handled (waits for space only).

        Cancellation while waiting for space: the message is not sent.
        """
        await self._enqueue(_Envelope(message, reply=False))

    def cast_nowait(self, message: M) -> None:
        """Send without waiting; raises ``trio.WouldBlock`` if the mailbox is full."""
        self._check()
        try:
            self._mailbox.put_nowait(_Envelope(message, reply=False))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._raise_stopped()

    async def _enqueue(self, env: _Envelope) -> None:
        self._check()
        try:
            await self._mailbox.put(env)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._raise_stopped()

    def _check(self) -> None:
        if self._cell.crash is not None:
            raise ActorCrashedError(self.name, self._cell.crash)
        if self._cell.closing:
            raise ActorStoppedError(f"actor {self.name!r} is stopped")

    def _raise_stopped(self) -> None:
        if self._cell.crash is not None:
            raise ActorCrashedError(self.name, self._cell.crash) from self._cell.crash
        raise ActorStoppedError(f"actor {self.name!r} is stopped")

    def __repr__(self) -> str:
        return f"<ActorRef {self.name}>"


class _CrashedInline(Exception):
    """Wakes a parked actor task whose handler crashed on a caller's task (decision
    0013): it ends crashed (``cell.crash`` is set already)."""


def _no_inline(message: Any) -> Any:
    raise AssertionError(f"no inline handler for {message!r}")


class _Cell:
    """Shared run state of one actor (its ref, its loop and the runtime see it)."""

    __slots__ = (
        "closing",
        "crash",
        "current",
        "handle_inline",
        "inline",
        "on_crash",
        "rejections",
        "reply_grace",
        "scope",
        "stopped",
    )

    def __init__(self, reply_grace: float = Actor.reply_grace) -> None:
        # What ActorRef.call needs to handle a message inline (set by the runtime's
        # spawn from the actor; none by default).
        self.inline: frozenset[type[Any]] = frozenset()
        self.handle_inline: Callable[[Any], Any] = _no_inline
        self.rejections: tuple[type[Exception], ...] = ()
        self.on_crash: Callable[[str, BaseException], None] = _ignore_crash
        self.closing = False
        self.crash: BaseException | None = None
        self.stopped = trio.Event()
        self.current: _Envelope | None = None  # the message being handled
        self.reply_grace = reply_grace
        # The actor task's own scope: cancelling it stops this actor alone (used
        # when an orderly stop overruns its grace period).
        self.scope = trio.CancelScope()


def _ignore_crash(name: str, exc: BaseException) -> None:
    pass


async def run_actor(
    actor: Actor[Any],
    mailbox: Mailbox[_Envelope],
    cell: _Cell,
    on_crash: Callable[[str, BaseException], None],
) -> None:
    """The actor's task: handle messages until the mailbox closes, then stop.

    Whatever way it exits (normal stop, crash, cancellation), no envelope is left
    without an answer: the current and all queued calls are failed.
    """
    try:
        with cell.scope:
            drained = False
            try:
                async with trio.open_nursery() as children:
                    actor._children = children
                    try:
                        drained = await _serve_all(actor, mailbox, cell, on_crash)
                    finally:
                        # No new child once serving ends; the running ones are
                        # cancelled (the mailbox is closed: they can no longer
                        # reach the actor) and waited for.
                        actor._children = None
                        children.cancel_scope.cancel()
            except Exception as exc:
                # A child failed (the nursery raises it in a group): a crash.
                drained = False
                cell.crash = exc
                on_crash(actor.name, exc)
            if drained:
                with trio.CancelScope(shield=True):
                    # Shielded and local: a normal stop always runs the actor's
                    # shutdown, even if the runtime is being cancelled meanwhile.
                    await actor.on_stop()
    finally:
        cell.closing = True
        # The cell outlives the actor in every ref to it; its bound inline handler
        # would keep the actor (and all it owns) alive in a reference cycle after
        # the actor ended, so it is dropped with the actor.
        cell.inline = frozenset()
        cell.handle_inline = _no_inline
        failure = (
            ActorCrashedError(actor.name, cell.crash)
            if cell.crash is not None
            else ActorStoppedError(f"actor {actor.name!r} stopped before handling the message")
        )
        current = cell.current
        cell.current = None
        if current is not None and current.state is _State.TAKEN:
            _finish(current, outcome.Error(failure))
        while True:
            try:
                env = mailbox.take_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            if env.state is _State.QUEUED:
                _finish(env, outcome.Error(failure))
        mailbox.close_receive()
        try:
            actor.on_exit()
        except Exception:
            log.exception("actor %r: on_exit failed", actor.name)
        cell.stopped.set()


async def _serve_all(
    actor: Actor[Any],
    mailbox: Mailbox[_Envelope],
    cell: _Cell,
    on_crash: Callable[[str, BaseException], None],
) -> bool:
    """Serve until the mailbox closes (True: drained) or a handler crashes (False)."""
    take = mailbox.take
    while True:
        try:
            env = await take()
        except trio.EndOfChannel:
            return True
        except _CrashedInline:
            return False  # a handler crashed on a caller's task (cell.crash is set)
        if env.state is _State.WITHDRAWN:
            continue
        env.state = _State.TAKEN
        cell.current = env
        crashed = not await _serve(actor, env, cell, on_crash)
        # An idle actor must not keep its last message (and all it references)
        # alive until the next one arrives.
        cell.current = None
        del env
        if crashed:
            return False
    return True


async def _serve(
    actor: Actor[Any], env: _Envelope, cell: _Cell, on_crash: Callable[[str, BaseException], None]
) -> bool:
    """Handle one taken envelope and answer it; False if the actor crashed."""
    message = env.message
    try:
        if type(message) in cell.inline:
            result = actor.handle_inline(message)
        else:
            result = await actor.handle(message)
    except Rejected as carrier:
        _finish(env, outcome.Error(carrier.error))
        if not env.reply:
            log.warning("actor %r: cast %r rejected: %r", actor.name, env.message, carrier.error)
    except actor.rejections as exc:
        _finish(env, outcome.Error(exc))
        if not env.reply:
            log.warning("actor %r: cast %r rejected: %r", actor.name, env.message, exc)
    except trio.Cancelled:
        raise
    except Exception as exc:
        cell.crash = exc
        _finish(env, outcome.Error(exc))
        on_crash(actor.name, exc)
        return False
    else:
        _finish(env, outcome.Value(result))
    return True


def _finish(env: _Envelope, result: outcome.Outcome[Any]) -> None:
    env.state = _State.DONE
    if env.reply:
        env.result = result
        waiter = env.waiter
        if waiter is not None:
            env.waiter = None
            trio.lowlevel.reschedule(waiter)
        elif env.done is not None:
            env.done.set()
