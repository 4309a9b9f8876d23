"""The agent loop runtime: create and resume agents, publish them in a fixed order,
dispose them deterministically (reference §5 with Trio nurseries and lifetimes)."""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, final

import attrs
import trio

from actors import Lifetime, LifetimeClosedError, Owner, bind_all, run_abandonable, run_bounded
from harness.agent._agent import Agent
from harness.agent._commands import Commands, install_compact_command
from harness.agent._compaction import AgentCompaction
from harness.agent._hooks import AgentHooks, Status
from harness.agent._points import FaultPoints
from harness.agent._tools import ToolSet
from harness.agent._types import TurnResult, check_max_tokens, require_trio_task
from harness.errors import HarnessError, SessionArgumentError, SessionOwnerClosedError
from harness.persistence import CheckpointPolicy, Persistence, SessionPreparation
from harness.providers import ModelProvider
from harness.runtime import SessionHandle, SessionSnapshot, Store
from harness.runtime._listeners import refuse_awaitable, subscribe_sync
from harness.session import MessageList, Session

log = logging.getLogger("harness.agent")

Setup = Callable[[Session], Awaitable[None]]
AgentListener = Callable[["AgentHandle"], None]
SessionStartListener = Callable[["AgentHandle", str], None]
"""``agent/session-start(handle, source)``: ``source`` is ``"startup"`` or ``"resume"``."""
AgentStatusListener = Callable[["AgentHandle", Status], None]


class AgentLoopError(HarnessError):
    code = "AGENT_LOOP_ERROR"


class AgentAlreadyRegisteredError(AgentLoopError):
    code = "AGENT_ALREADY_REGISTERED"


@attrs.frozen
class AgentOptions:
    """Per-agent settings resolved for :meth:`AgentLoop.create` / :meth:`AgentLoop.resume`."""

    provider: ModelProvider
    tools: ToolSet
    system: str | None
    max_tokens: int | None


class AgentSetupAbortedError(LifetimeClosedError):
    """:meth:`AgentLoop.resume` or :meth:`AgentLoop.create` was aborted by the owner
    or the loop's teardown, whichever closed first (reference §5.2).

    The message is the reference's wording: ``agent "<id>" setup aborted: owner
    disposed during setup`` (the owner) or ``agent loop is not active`` (the
    teardown). ``lifetime`` names the lifetime and ``reason`` is the value it was
    closed with, as for any :class:`LifetimeClosedError`.
    """

    def __init__(self, lifetime: str, reason: object, message: str) -> None:
        super().__init__(lifetime, reason)
        self.message = message

    def __str__(self) -> str:
        return self.message


@final
class AgentHandle:
    """A published agent and its session. :meth:`dispose` is idempotent."""

    def __init__(self, loop: AgentLoop, agent: Agent, session: SessionHandle, owner: Lifetime) -> None:
        self._loop = loop
        self.agent = agent
        self.session = session
        self.owner = owner
        self.announced = False
        self._disposing = False
        self._disposed = trio.Event()
        self._watch_scope: trio.CancelScope | None = None

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def disposed(self) -> bool:
        return self._disposed.is_set()

    # -- reads (synchronous, no round trip) ------------------------------------------------

    @property
    def session_id(self) -> str:
        """The agent's session id (an agent's id is its session's)."""
        return self.session.id

    @property
    def status(self) -> Status:
        """``running`` during a turn, else ``idle`` (:attr:`Agent.status`)."""
        return self.agent.status

    @property
    def messages(self) -> MessageList:
        """The model-visible messages of the agent's session, an immutable snapshot
        (``session.snapshot().messages``; no actor round trip)."""
        return self.session.messages

    def snapshot(self) -> SessionSnapshot:
        """The agent's session snapshot (:meth:`SessionHandle.snapshot`)."""
        return self.session.snapshot()

    @property
    def hooks(self) -> AgentHooks:
        """The agent's hooks, :attr:`Agent.hooks` itself (``handle.hooks is
        handle.agent.hooks``): ``on_pre_step``, ``on_request_error``, ``on_checkpoint``,
        ``on_status``, each returning its unsubscribe (docs/agent.md). Register on the
        runtime's Trio thread (from asyncio, through the portal's ``run_sync``)."""
        return self.agent.hooks

    async def run_turn(self, text: str) -> TurnResult:
        """``agent.run_turn`` (see :meth:`Agent.run_turn` for the cancellation contract;
        off the runtime's Trio thread it raises :class:`~harness.errors.RuntimeThreadError`)."""
        return await self.agent.run_turn(text)

    async def dispose(self) -> None:
        """Refuse new turns, cancel the running one (cause ``disposed``), wait until it
        has logged its ``turn/end``, detach the agent (``agent/disposed``), then the
        session (``session/disposed``; persistence retires its writer).

        Idempotent: every caller, concurrent or later, waits for the same teardown,
        which runs in the loop's nursery: a cancelled caller stops waiting (at once),
        the teardown still completes. The wait for the turn is bounded by the loop's
        ``dispose_grace`` (an overrun is logged; the session is detached anyway and
        crash repair closes the turn on its next load). A failure to detach (the
        store already closed) is logged, not raised: the session is gone either way.

        Called from inside the agent's own turn (a tool disposing its agent), it
        cancels the turn and returns at once (waiting there would wait for itself).

        Off the runtime's Trio thread (an asyncio task calling it directly, not through
        ``portal.arun(agent.dispose)``) it raises
        :class:`~harness.errors.RuntimeThreadError` and the agent is left as it was.
        """
        require_trio_task(self.id, "AgentHandle.dispose")
        await self._dispose(wait=not self.agent.in_turn())

    async def _dispose(self, *, wait: bool) -> None:
        if not self._disposing:
            self._disposing = True
            self.agent.disposed = True  # before any checkpoint: no new turn can start
            self.agent.cancel("disposed")
            try:
                self._loop._nursery.start_soon(self._teardown, name=f"dispose {self.id}")
            except RuntimeError:
                # The loop's nursery has closed (the loop is gone): tear down here.
                await self._teardown()
        if wait:
            await self._disposed.wait()

    async def _teardown(self) -> None:
        """Shielded from the start (no checkpoint before the shield): it completes
        even in a loop nursery that is being cancelled."""
        try:
            with trio.CancelScope(shield=True):
                if not await run_bounded(self.agent.wait_idle, self._loop.dispose_grace):
                    log.warning(
                        'agent "%s": the turn did not end within %g s of dispose; detaching anyway',
                        self.id,
                        self._loop.dispose_grace,
                    )
                self._loop._unregister(self)
                try:
                    await self._loop.store.detach(self.session)
                except HarnessError as exc:
                    log.warning('agent "%s": detaching its session failed: %s', self.id, exc)
                if self._watch_scope is not None:
                    self._watch_scope.cancel()
        finally:
            self._disposed.set()

    def __repr__(self) -> str:
        return f"<AgentHandle {self.id!r}{' disposed' if self.disposed else ''}>"


@final
class AgentLoop:
    """Creates and resumes agents on a store. Get one with :func:`open_agent_loop`.

    Cancellation of :meth:`resume` and :meth:`create` comes from three places, and
    each publishes nothing and leaks nothing:

    * the **caller** (ordinary Trio cancellation): ``Cancelled`` propagates;
    * the **owner** closing: raises :class:`AgentSetupAbortedError` (a
      :class:`LifetimeClosedError`: ``agent "<id>" setup aborted: owner disposed
      during setup``, ``reason`` the owner's close reason);
    * the loop's **teardown**: raises :class:`AgentSetupAbortedError`
      ("agent loop is not active").

    When both the owner and the teardown closed, the one that closed first is
    reported (the reference's fused signal: first abort wins).

    The preparation runs as a child of the loop's nursery; if the wait is abandoned and
    the preparation still completes, that child disposes it — so when the loop exits,
    every preparation ever started was published or disposed, exactly once.
    """

    def __init__(
        self,
        store: Store,
        nursery: trio.Nursery,
        *,
        provider: ModelProvider | None,
        tools: ToolSet | None,
        persistence: Persistence | None,
        checkpoint: bool,
        faults: FaultPoints | None,
        system: str | None,
        dispose_grace: float = 30.0,
        compaction: AgentCompaction | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.store = store
        self.dispose_grace = dispose_grace
        self.provider = provider
        self.tools = tools or ToolSet()
        self.persistence = persistence
        self.checkpoint = CheckpointPolicy(store) if checkpoint else None
        self.system = system
        self.max_tokens = max_tokens
        self.compaction = compaction
        # Slash commands for this loop's agents; /compact when compaction is configured.
        self.commands = Commands()
        if compaction is not None:
            install_compact_command(self.commands, compaction)
        self.faults = faults or FaultPoints()
        self.teardown = Lifetime("agent loop")
        self._nursery = nursery
        self._agents: dict[str, AgentHandle] = {}
        self.created_listeners: list[AgentListener] = []
        self.disposed_listeners: list[AgentListener] = []
        self.session_start_listeners: list[SessionStartListener] = []
        self.status_listeners: list[AgentStatusListener] = []
        self.stats = {"prepared": 0, "published": 0, "disposed": 0}
        # Weak, by object: an id() could be reused by the next preparation once this
        # one is freed, which would make it look counted (and leave it undisposed).
        self._counted: weakref.WeakSet[Any] = weakref.WeakSet()

    # -- registry ----------------------------------------------------------------------

    def get(self, agent_id: str) -> AgentHandle | None:
        """The live agent ``agent_id``, or ``None`` (synchronous)."""
        # No agent has a non-string id; an unhashable one would raise TypeError here.
        return self._agents.get(agent_id) if type(agent_id) is str else None

    def list(self) -> list[AgentHandle]:
        """The live agents, in publication order (a fresh list)."""
        return list(self._agents.values())

    # -- listeners (synchronous callables; each registration returns its unsubscribe) --

    def on_created(self, listener: AgentListener) -> Callable[[], None]:
        """``agent/created(handle)``, step 4 of publication: a raise vetoes it (the
        create/resume unwinds and raises the listener's error). Returns an idempotent
        unsubscribe.

        Raises:
            AsyncListenerError: ``listener`` is async (``ASYNC_LISTENER``).
        """
        return subscribe_sync("agent/created", self.created_listeners, listener)

    def on_disposed(self, listener: AgentListener) -> Callable[[], None]:
        """``agent/disposed(handle)``, when an announced agent is disposed (before its
        session is detached); a raise is contained (logged and reported to
        ``store.warnings``). Returns an idempotent unsubscribe."""
        return subscribe_sync("agent/disposed", self.disposed_listeners, listener)

    def on_session_start(self, listener: SessionStartListener) -> Callable[[], None]:
        """``agent/session-start(handle, source)``, the last step of publication
        (``source``: ``"startup"`` or ``"resume"``); a raise vetoes the publication
        like ``on_created``'s. Returns an idempotent unsubscribe."""
        return subscribe_sync("agent/session-start", self.session_start_listeners, listener)

    def on_status(self, listener: AgentStatusListener) -> Callable[[], None]:
        """``agent/status(handle, status)`` for every agent of this loop, when it
        becomes ``running`` or ``idle``; a raise is contained (logged and reported to
        ``store.warnings``). Returns an idempotent unsubscribe. (One agent's:
        ``handle.agent.hooks.on_status``.)"""
        return subscribe_sync("agent/status", self.status_listeners, listener)

    def _forward_status(self, handle: AgentHandle, _agent: Agent, status: Status) -> None:
        for listener in list(self.status_listeners):
            try:
                result: object = listener(handle, status)
                if result is not None:
                    refuse_awaitable("agent/status", listener, result)
            except Exception as exc:
                self.store.warnings.report(
                    log,
                    "listener-failed",
                    "agent/status",
                    f'agent "{handle.id}": agent/status listener threw: {exc!r}',
                    session_id=handle.id,
                    error=exc,
                )

    def _unregister(self, handle: AgentHandle) -> None:
        if self._agents.get(handle.id) is handle:
            del self._agents[handle.id]
            if handle.announced:
                for listener in list(self.disposed_listeners):
                    try:
                        result: object = listener(handle)
                        if result is not None:
                            refuse_awaitable("agent/disposed", listener, result)
                    except Exception as exc:
                        self.store.warnings.report(
                            log,
                            "listener-failed",
                            "agent/disposed",
                            f'agent "{handle.id}": agent/disposed listener threw: {exc!r}',
                            session_id=handle.id,
                            error=exc,
                        )

    # -- create / resume --------------------------------------------------------------

    def _options(
        self,
        provider: ModelProvider | None,
        tools: ToolSet | None,
        system: str | None,
        max_tokens: int | None,
    ) -> AgentOptions:
        """One agent's settings: each one given overrides the loop's default."""
        chosen = provider if provider is not None else self.provider
        if chosen is None:
            raise AgentLoopError(
                "no model provider: pass provider= to create()/resume() or to the loop"
            )
        check_max_tokens(max_tokens)
        # Checked here, before anything is prepared: a wrong value would otherwise
        # surface as an AttributeError in the agent's first turn.
        if not callable(getattr(chosen, "stream", None)):
            raise AgentLoopError(f"provider must be a ModelProvider (with a stream method), got {chosen!r}")
        chosen_tools = tools if tools is not None else self.tools
        if not isinstance(chosen_tools, ToolSet):
            raise AgentLoopError(f"tools must be a ToolSet, got {chosen_tools!r}")
        chosen_system = system if system is not None else self.system
        if chosen_system is not None and type(chosen_system) is not str:
            raise AgentLoopError(f"system must be a str, got {chosen_system!r}")
        return AgentOptions(
            provider=chosen,
            tools=chosen_tools,
            system=chosen_system,
            max_tokens=max_tokens if max_tokens is not None else self.max_tokens,
        )

    async def resume(
        self,
        session_id: str,
        *,
        owner: Owner,
        setup: Setup | None = None,
        provider: ModelProvider | None = None,
        tools: ToolSet | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
    ) -> AgentHandle:
        """Load a persisted session into a new live agent (ownership transfer, no copy).

        Publication order: enter session, enter agent, announce session, announce
        agent, ``agent/session-start {source: "resume"}``; a failure or cancellation
        at any step unwinds the completed steps in reverse and leaves the store as it
        was. ``setup`` sees the restored session (stored events, repair closers,
        end-seed) before anything is published, under the same cancellation.

        ``provider``, ``tools``, ``system`` and ``max_tokens`` configure this agent,
        each overriding the loop's default (``None`` inherits it). None of them is
        stored in the session: a resume names them again or inherits the loop's.
        :class:`AgentLoopError` when neither the call nor the loop has a provider.
        """
        persistence = self.persistence
        if persistence is None:
            raise AgentLoopError("cannot resume: session persistence is not configured")
        options = self._options(provider, tools, system, max_tokens)
        return await self._open(session_id, owner, setup, "resume", lambda: persistence.prepare(session_id), options)

    async def create(
        self,
        session_id: str | None = None,
        *,
        owner: Owner,
        setup: Setup | None = None,
        provider: ModelProvider | None = None,
        tools: ToolSet | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
        **meta: Any,
    ) -> AgentHandle:
        """Create a fresh agent through the same prepare and publish path (source
        ``startup``). Same cancellation contract and per-agent ``provider``,
        ``tools``, ``system``, ``max_tokens`` overrides as :meth:`resume`; the other
        keywords are session metadata (``cwd=...``)."""
        options = self._options(provider, tools, system, max_tokens)

        async def prepare() -> SessionPreparation | Any:
            prepared = await self.store.prepare(session_id, **meta)
            return _FreshPreparation(prepared.session)

        return await self._open(session_id or "<new>", owner, setup, "startup", prepare, options)

    async def _open(
        self,
        name: str,
        owner: Owner,
        setup: Setup | None,
        source: str,
        prepare: Callable[[], Awaitable[Any]],
        options: AgentOptions,
    ) -> AgentHandle:
        what = f'{"create" if source == "startup" else "resume"} agent "{name}"'
        sid = None if name == "<new>" else name
        if not isinstance(owner, Owner):
            # Refused before anything starts, as the store refuses it (not an
            # AttributeError from deep inside the lifetimes).
            raise SessionArgumentError(f"{what}: owner must be an actors.Owner, got {owner!r}", session_id=sid)
        if not owner.is_open and not owner.closed:
            # Never entered: refused before the preparation (a resume would load and
            # claim the session first), in the store's words. A closed owner is the
            # reference's abort (AgentSetupAbortedError), below.
            raise SessionOwnerClosedError(
                f'{what}: owner "{owner.name}" is not open (enter it with async with)',
                session_id=sid,
                owner=owner.name,
                reason=None,
            )
        lifetimes = [owner, self.teardown]
        await self.faults.point("open.start")

        async def counted_prepare() -> Any:
            await self.faults.point("open.preparing")
            prep = await prepare()
            self.stats["prepared"] += 1
            try:
                await self.faults.point("open.prepare-returned")
            except BaseException:
                # Cancelled (abandoned) after the preparation exists: nobody else
                # will ever see it, so it is ours to dispose.
                with trio.CancelScope(shield=True):
                    await dispose_prep(prep)
                raise
            return prep

        async def dispose_prep(prep: Any) -> None:
            # Each preparation is counted once: as published, or as disposed here.
            if prep not in self._counted:
                self._counted.add(prep)
                self.stats["disposed"] += 1
            await prep.dispose()

        try:
            prep = await run_abandonable(
                self._nursery, counted_prepare, dispose=dispose_prep, lifetimes=lifetimes, name=f"prepare {name}"
            )
        except LifetimeClosedError as exc:
            raise self._aborted(name, owner, exc) from None
        try:
            with trio.CancelScope() as scope, bind_all(lifetimes, scope):
                await self.faults.point("open.prepared")
                if setup is not None:
                    await setup(prep.session)
                    await self.faults.point("open.setup")
                handle = await self._publish(prep, owner, source, options)
            if scope.cancelled_caught:
                raise self._aborted(name, owner, None)
            return handle
        except AgentSetupAbortedError:
            raise
        except (LifetimeClosedError, SessionOwnerClosedError) as exc:
            # E.g. the store refusing to enter the session in a closed owner's scope,
            # or owner.start_soon refusing it in the last publication step (already
            # unwound): still the first canceller's abort.
            raise self._aborted(name, owner, exc) from None
        finally:
            if prep not in self._counted:
                with trio.CancelScope(shield=True):
                    await dispose_prep(prep)

    def _aborted(
        self, name: str, owner: Owner, exc: LifetimeClosedError | SessionOwnerClosedError | None
    ) -> LifetimeClosedError | SessionOwnerClosedError:
        """The abort of an open, in the reference's wording, for the canceller (owner
        or teardown) that closed first. ``exc`` is returned unchanged when neither
        closed (it came from somewhere else)."""
        first = Lifetime.first_closed([owner, self.teardown])
        if first is None:
            assert exc is not None
            return exc
        if first is owner:
            message = f'agent "{name}" setup aborted: owner disposed during setup'
        else:
            message = "agent loop is not active"
        return AgentSetupAbortedError(first.name, first.reason, message)

    async def _publish(self, prep: Any, owner: Owner, source: str, options: AgentOptions) -> AgentHandle:
        store = self.store
        session = prep.session
        entered: SessionHandle | None = None
        handle: AgentHandle | None = None
        try:
            await self.faults.point("publish.start")
            prepared = await store.adopt(session)
            entered = await store.enter(prepared, scope=owner)  # 1. enter session (owner's scope)
            await self.faults.point("publish.session-entered")
            if session.id in self._agents:  # 2. enter agent
                raise AgentAlreadyRegisteredError(f'agent "{session.id}" is already registered', session_id=session.id)
            agent = Agent(
                entered,
                options.provider,
                options.tools,
                system=options.system,
                max_tokens=options.max_tokens,
                checkpoint=self.checkpoint,
                nursery=self._nursery,
            )
            if self.compaction is not None:
                self.compaction.install(agent)
            handle = AgentHandle(self, agent, entered, owner)
            agent.hooks.on_status(functools.partial(self._forward_status, handle))
            self._agents[session.id] = handle
            await self.faults.point("publish.agent-entered")
            await store.announce(entered)  # 3. announce session (persistence claims it)
            prep.published = True
            self._counted.add(prep)
            self.stats["published"] += 1
            await self.faults.point("publish.session-announced")
            handle.announced = True  # 4. announce agent
            for listener in list(self.created_listeners):
                created: object = listener(handle)
                if created is not None:
                    refuse_awaitable("agent/created", listener, created)  # a veto
            await self.faults.point("publish.agent-announced")
            for start in list(self.session_start_listeners):  # 5. agent/session-start
                started: object = start(handle, source)
                if started is not None:
                    refuse_awaitable("agent/session-start", start, started)  # a veto
            await self.faults.point("publish.session-started")
            owner.start_soon(self._watch_owner, handle)
            return handle
        except BaseException:
            with trio.CancelScope(shield=True):
                # Unwind in reverse: agent/disposed (if announced), the agent entry,
                # then the session (session/disposed only if it was announced).
                if handle is not None:
                    handle.agent.disposed = True
                    self._unregister(handle)
                if entered is None:
                    # Reconcile from the store's state, not from the reply: an enter
                    # whose outcome is unknown (ReplyOverdueError) may have happened.
                    live = await store.get(session.id)
                    if live is not None and live._entry.session is session:
                        entered = live
                if entered is not None:
                    await store.detach(entered)
            raise

    async def _watch_owner(self, handle: AgentHandle) -> None:
        # Runs in the owner's nursery: when the owner closes, its agent is disposed.
        with trio.CancelScope() as scope:
            handle._watch_scope = scope
            try:
                await trio.sleep_forever()
            finally:
                # Also when a dispose is already under way (e.g. started from inside
                # the turn, finishing in the loop's nursery): the owner's aclose
                # returns only once its agents are disposed (agent/disposed and
                # session/disposed emitted). Always wait: this task is never part of
                # the turn, even when it descends from the task running it (an owner
                # opened by that task), so waiting cannot wait for itself.
                with trio.CancelScope(shield=True):
                    await handle._dispose(wait=True)

    async def aclose(self) -> None:
        """Stop accepting, close the teardown lifetime, dispose every live agent.

        Shielded: it completes even if the caller is cancelled. Idempotent.
        """
        self.teardown.close("agent loop is not active")
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for handle in list(self._agents.values()):
                    nursery.start_soon(handle.dispose)


class _FreshPreparation:
    """A new session's preparation: nothing to release but the unpublished session."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.published = False
        self.disposed = False

    async def dispose(self) -> None:
        self.disposed = True


@asynccontextmanager
async def open_agent_loop(
    store: Store,
    *,
    provider: ModelProvider | None = None,
    tools: ToolSet | None = None,
    persistence: Persistence | None = None,
    checkpoint: bool = True,
    faults: FaultPoints | None = None,
    system: str | None = None,
    compaction: AgentCompaction | None = None,
    max_tokens: int | None = None,
) -> AsyncIterator[AgentLoop]:
    """Run an agent loop for the duration of the block.

    Leaving closes the teardown lifetime (pending resumes end with
    :class:`LifetimeClosedError`), disposes every live agent, and waits for every
    preparation still running in the loop's nursery (a late one is disposed).

    ``compaction`` (an :class:`AgentCompaction`) is installed on every agent the loop
    publishes (pressure at pre-step, overflow recovery at request-error) and registers
    ``/compact`` in ``loop.commands``; on exit the commands are closed after the agents
    (running handlers settle first).

    ``provider``, ``tools``, ``system`` and ``max_tokens`` are every agent's
    defaults; :meth:`AgentLoop.create` and :meth:`AgentLoop.resume` override them per
    agent. ``provider`` may be ``None`` when every create/resume passes one.

    Cancellation of the block cancels the loop's tasks; disposal still runs shielded.
    """
    check_max_tokens(max_tokens)
    async with trio.open_nursery() as nursery:
        loop = AgentLoop(
            store,
            nursery,
            provider=provider,
            tools=tools,
            persistence=persistence,
            checkpoint=checkpoint and persistence is not None,
            faults=faults,
            system=system,
            compaction=compaction,
            max_tokens=max_tokens,
        )
        try:
            yield loop
        finally:
            await loop.aclose()
            with trio.CancelScope(shield=True):
                await loop.commands.aclose()
