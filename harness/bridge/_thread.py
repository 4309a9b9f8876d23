"""A runtime on its own Trio thread, and the portal other threads (an asyncio event
loop, plain blocking code) call it through. See ``docs/asyncio.md``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, TypeVarTuple, Unpack, final

import trio

from harness._runtime_api import Runtime, open_runtime
from harness.errors import RuntimeThreadClosedError, RuntimeThreadError

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

State = Literal["new", "starting", "running", "closing", "closed"]


class _Call(Generic[T]):
    """One call's journey: submitted from any thread, run as a task on the Trio thread
    under its own cancel scope, answered through a :class:`concurrent.futures.Future`.

    ``cancel_requested`` and ``scope`` are touched on the Trio thread only."""

    def __init__(self, fn: Callable[[], Awaitable[T]]) -> None:
        self.fn = fn
        self.future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.scope: trio.CancelScope | None = None
        self.cancel_requested = False
        self.closing = False

    def cancel_on_trio(self, *, closing: bool) -> None:
        self.closing = self.closing or closing
        self.cancel_requested = True
        if self.scope is not None:
            self.scope.cancel()


class _CallCancelled(Exception):
    """The call's outcome when its caller cancelled it: the caller raises its own
    cancellation (``asyncio.CancelledError``, ``KeyboardInterrupt``), never this."""


@final
class RuntimeThread:
    """:func:`harness.open_runtime` running on a Trio thread of its own, for callers
    that are not Trio: an asyncio application, or plain blocking code.

    Enter it (``with`` from blocking code, ``async with`` from asyncio) to start the
    thread and open the runtime; leave it to shut down. Calls:

    * :meth:`run` / :meth:`arun` run ``await fn(*args)`` on the Trio thread and return
      its result (blocking the calling thread / awaiting without blocking the event
      loop); :meth:`run_sync` / :meth:`arun_sync` run a synchronous ``fn`` there;
    * :attr:`runtime` is the :class:`~harness.Runtime`: pass its bound methods, e.g.
      ``await portal.arun(portal.runtime.open, "id")``. Objects it returns (an
      :class:`~harness.agent.AgentHandle`) belong to the Trio thread: use them only
      inside functions run through the portal.

    **Cancellation.** Every call runs as its own task under its own cancel scope.
    Cancelling the asyncio task awaiting :meth:`arun` cancels that scope (the Trio call
    sees ``trio.Cancelled`` at its next checkpoint and follows its own cancellation
    contract: ``Runtime.create`` publishes nothing, ``AgentHandle.run_turn`` logs its
    turn ``aborted``) and waits until the Trio side has finished, then raises
    ``asyncio.CancelledError``: when it propagates, nothing of the call is still
    running. A :class:`KeyboardInterrupt` in a thread blocked in :meth:`run` does the
    same. The Trio side never cancels a call on its own except at shutdown.

    **Shutdown** (leaving the block, or :meth:`close` / :meth:`aclose`): new calls are
    refused with :class:`~harness.errors.RuntimeThreadClosedError`; calls still running
    are cancelled as above and end with ``RuntimeThreadClosedError``; once they have
    finished the runtime is left (its orderly teardown: agents disposed, writers
    flushed and retired, ``open_runtime``'s ``shutdown_grace`` bound), then the thread
    ends. A teardown error (a failed final flush) is raised by the close. The thread
    is a daemon: a runtime never closed is killed at interpreter exit, and crash repair
    closes what it left open at the next load.
    """

    def __init__(self, *args: Any, thread_name: str = "harness-runtime", **kwargs: Any) -> None:
        self._args = args
        self._kwargs = kwargs
        self._thread_name = thread_name
        self._lock = threading.Lock()
        self._state: State = "new"
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._runtime: Runtime | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._calls: set[_Call[Any]] = set()

    # -- state --------------------------------------------------------------------------

    @property
    def state(self) -> State:
        """``new``, ``starting``, ``running``, ``closing`` or ``closed``."""
        return self._state

    @property
    def runtime(self) -> Runtime:
        """The runtime (raises :class:`RuntimeThreadError` before it is open). Use it
        only on the Trio thread, i.e. in functions passed to :meth:`run`/:meth:`arun`."""
        if self._runtime is None:
            raise RuntimeThreadError("the runtime thread has not started (enter it first)")
        return self._runtime

    # -- start and stop -----------------------------------------------------------------

    def _launch(self) -> concurrent.futures.Future[None]:
        with self._lock:
            if self._state != "new":
                raise RuntimeThreadError(f"a RuntimeThread starts once; this one is {self._state}")
            self._state = "starting"
        self._thread = threading.Thread(target=self._thread_main, name=self._thread_name, daemon=True)
        self._thread.start()
        return self._started

    def start(self) -> None:
        """Start the thread and open the runtime; blocks until it is open. An error of
        ``open_runtime``'s entry (e.g. :class:`~harness.RuntimeConfigError`) is raised
        here, after the thread has ended."""
        self._launch().result()

    async def astart(self) -> None:
        """:meth:`start` for asyncio: awaits the opening without blocking the loop.
        Cancelled meanwhile, it shuts the half-started runtime down before raising."""
        started = asyncio.wrap_future(self._launch())
        try:
            await asyncio.shield(started)
        except asyncio.CancelledError:
            await _settle(asyncio.wrap_future(self._close()))
            if not started.cancelled():
                started.exception()  # retrieved: the cancellation is what we report
            raise

    def _close(self) -> concurrent.futures.Future[None]:
        """Begin the shutdown (idempotent); the future resolves when the thread ended."""
        with self._lock:
            state = self._state
            if state == "new":
                self._state = "closed"
            elif state in ("running", "starting"):
                # Starting: the Trio side sees "closing" once the runtime is open.
                self._state = "closing"
        if state == "new":
            self._finished.set_result(None)
        elif state == "running":
            self._trio_soon(self._begin_stop)
        return self._finished

    def close(self) -> None:
        """Shut down (see the class) and wait for the thread; idempotent. From the Trio
        thread itself it would wait for itself: :class:`RuntimeThreadError`."""
        if threading.current_thread() is self._thread:
            raise RuntimeThreadError("RuntimeThread.close from its own Trio thread would wait for itself")
        self._close().result()
        if self._thread is not None:
            self._thread.join()

    async def aclose(self) -> None:
        """:meth:`close` for asyncio: awaits the shutdown without blocking the loop. A
        cancellation of the awaiting task does not stop the shutdown; it is raised once
        the thread has ended."""
        await _settle(asyncio.wrap_future(self._close()))

    def __enter__(self) -> RuntimeThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RuntimeThread:
        await self.astart()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- the Trio thread ----------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:
            if not self._started.done():
                self._started.set_exception(exc)
            self._set_closed()
            self._finished.set_exception(exc)
        else:
            self._set_closed()
            if not self._started.done():
                self._started.set_exception(RuntimeThreadClosedError("the runtime thread was closed while starting"))
            self._finished.set_result(None)

    def _set_closed(self) -> None:
        with self._lock:
            self._state = "closed"

    async def _serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The Trio side: open the runtime, serve calls until the shutdown, close it.
        Run by the thread; a fault exploration runs it as a task of its own run."""
        self._stop = trio.Event()
        async with open_runtime(*self._args, **self._kwargs) as rt, trio.open_nursery() as nursery:
            self._runtime, self._nursery = rt, nursery
            self._token = trio.lowlevel.current_trio_token()
            with self._lock:
                closing = self._state == "closing"
                if not closing:
                    self._state = "running"
            if closing:
                return
            self._started.set_result(None)
            task_status.started()
            await self._stop.wait()
            # The nursery then waits for the calls, each cancelled by _begin_stop.

    def _begin_stop(self) -> None:
        """On the Trio thread: cancel every running call, then let the main task leave."""
        for call in list(self._calls):
            call.cancel_on_trio(closing=True)
        assert self._stop is not None
        self._stop.set()

    def _trio_soon(self, fn: Callable[[], object]) -> bool:
        """Schedule ``fn`` on the Trio thread; False if the run has finished."""
        assert self._token is not None
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            return False
        return True

    def _start_call(self, call: _Call[Any]) -> None:
        # A run_sync_soon callback: it must not raise (Trio would crash the run).
        if self._stop is not None and self._stop.is_set():
            call.future.set_exception(RuntimeThreadClosedError("the runtime thread is closing"))
            return
        assert self._nursery is not None
        self._calls.add(call)
        self._nursery.start_soon(self._run_call, call)

    async def _run_call(self, call: _Call[Any]) -> None:
        try:
            with trio.CancelScope() as scope:
                call.scope = scope
                if call.cancel_requested:
                    scope.cancel()
                value = await call.fn()
                call.future.set_result(value)
                return
            # Only our scope's cancellation lands here (the nursery is never cancelled).
            if call.closing:
                call.future.set_exception(
                    RuntimeThreadClosedError("the runtime thread closed while the call was running")
                )
            else:
                call.future.set_exception(_CallCancelled())
        except BaseException as exc:
            # Delivered to the caller, not to the nursery: one call's error must not
            # take the runtime down.
            if not call.future.done():
                call.future.set_exception(exc)
        finally:
            self._calls.discard(call)

    # -- calls --------------------------------------------------------------------------

    def _submit(self, fn: Callable[[], Awaitable[T]]) -> _Call[T]:
        with self._lock:
            state = self._state
            if state == "running":
                if threading.current_thread() is self._thread:
                    raise RuntimeThreadError(
                        "a RuntimeThread call from its own Trio thread would wait for itself; await the call directly"
                    )
                call: _Call[T] = _Call(fn)
                assert self._token is not None
                # Under the lock: a close cannot slip between the state check and the
                # scheduling, so _begin_stop always runs after _start_call.
                self._token.run_sync_soon(self._start_call, call)
                return call
        if state in ("new", "starting"):
            raise RuntimeThreadError("the runtime thread has not started (enter it first)")
        raise RuntimeThreadClosedError(f"the runtime thread is {state}")

    def _cancel(self, call: _Call[Any]) -> None:
        self._trio_soon(lambda: call.cancel_on_trio(closing=False))

    def run(self, fn: Callable[[Unpack[Ts]], Awaitable[T]], *args: *Ts) -> T:
        """``await fn(*args)`` on the Trio thread; blocks the calling thread until it
        returns or raises. Refused from the Trio thread itself (:class:`RuntimeThreadError`)
        and once closing (:class:`RuntimeThreadClosedError`). An exception interrupting
        the wait (``KeyboardInterrupt``) cancels the call, waits for it, and is re-raised."""
        call = self._submit(lambda: fn(*args))
        try:
            return call.future.result()
        except BaseException:
            if call.future.done():
                raise
            self._cancel(call)
            concurrent.futures.wait([call.future])
            raise

    def run_sync(self, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """``fn(*args)`` on the Trio thread (e.g. a consistent read of snapshots);
        blocks until it returns. Same refusals as :meth:`run`."""

        async def call() -> T:
            return fn(*args)

        return self.run(call)

    async def arun(self, fn: Callable[[Unpack[Ts]], Awaitable[T]], *args: *Ts) -> T:
        """``await fn(*args)`` on the Trio thread, awaited from an asyncio task without
        blocking its event loop. Cancelling the task cancels the Trio-side call and
        waits for it to finish before ``asyncio.CancelledError`` propagates (its result,
        if it finished anyway, is dropped). Same refusals as :meth:`run`."""
        call = self._submit(lambda: fn(*args))
        answer = asyncio.wrap_future(call.future)
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            if answer.done() and not answer.cancelled() and answer.exception() is None:
                raise  # it finished first: the cancellation is the task's own, after the call
            self._cancel(call)
            try:
                await _settle(answer)
            except BaseException as late:
                # The call's own outcome after the cancel (its error, or the shutdown's):
                # dropped, the task's cancellation is what propagates.
                if isinstance(late, asyncio.CancelledError):
                    raise
            raise

    async def arun_sync(self, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """:meth:`run_sync` awaited from asyncio (see :meth:`arun`)."""

        async def call() -> T:
            return fn(*args)

        return await self.arun(call)


async def _settle(answer: asyncio.Future[Any]) -> None:
    """Wait until ``answer`` is done however often the awaiting task is cancelled; the
    first cancellation is re-raised afterwards, else ``answer``'s error is."""
    cancelled: asyncio.CancelledError | None = None
    while not answer.done():
        try:
            await asyncio.wait({answer})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    error = None if answer.cancelled() else answer.exception()
    if cancelled is not None:
        raise cancelled
    if error is not None and not isinstance(error, _CallCancelled):
        raise error


def open_runtime_in_thread(*args: Any, thread_name: str = "harness-runtime", **kwargs: Any) -> RuntimeThread:
    """A :class:`RuntimeThread` running ``harness.open_runtime(*args, **kwargs)``, not
    started yet: enter it with ``with`` (blocking code) or ``async with`` (asyncio).

        async with harness.open_runtime_in_thread("sessions/", provider=provider) as portal:
            agent_id = await portal.arun(portal.runtime.open, "assistant")
    """
    return RuntimeThread(*args, thread_name=thread_name, **kwargs)
