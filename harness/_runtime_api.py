"""The front door: one ``async with`` that opens a store, its persistence and an
agent loop, nested the way the demo and the CLI nest them.

    async with harness.open_runtime("sessions/", provider=provider) as rt:
        agent = await rt.create("assistant", cwd="/repo")
        result = await agent.run_turn("hello")

The three layers (:func:`~harness.runtime.open_store`,
:func:`~harness.persistence.open_persistence`,
:func:`~harness.agent.open_agent_loop`) stay public and usable on their own;
``open_runtime`` only composes them. See ``docs/embedding.md``.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Literal, final

import attrs
import trio

from actors import Owner, open_guard
from harness._open import OpenGate, get_or_create, live_agent
from harness._paths import blocking_file
from harness.agent._compaction import AgentCompaction
from harness.agent._loop import AgentHandle, AgentLoop, Setup, open_agent_loop
from harness.agent._tools import ToolSet
from harness.errors import HarnessError, SessionLogExistsError
from harness.persistence import (
    Backend,
    JsonlBackend,
    OsFiles,
    Persistence,
    SqliteBackend,
    open_persistence,
)
from harness.persistence._postgres_schema import is_postgres_url
from harness.providers import ModelProvider
from harness.runtime import SessionHandle, Store, Warnings, open_store
from harness.session import AppendValidator, RelationalInvariants

BackendName = Literal["jsonl", "sqlite", "postgres"]
_BACKEND_METHODS = ("list_headers", "load", "append", "materialize", "acquire_writer")


class RuntimeConfigError(HarnessError, ValueError):
    """:func:`open_runtime` was given arguments it cannot make a runtime of (an
    unknown ``backend``, a backend name without a ``root``, a backend instance
    together with a ``root``, an empty ``root``, a JSONL root that is a regular file,
    a negative ``write_delay``, ...), or
    :func:`harness.testing.open_test_runtime` an unknown backend kind. Raised when the
    block is entered, before anything opens; the message names the value at fault.
    """

    code = "RUNTIME_CONFIG"


@final
@attrs.frozen
class Runtime:
    """What :func:`open_runtime` yields: the three layers and a runtime-level owner.

    ``persistence`` is ``None`` for an in-memory runtime (nothing is written; resume
    is refused). ``owner`` owns every agent :meth:`create`/:meth:`resume` publishes,
    and every child :meth:`fork` makes, without an explicit ``owner=``: it is closed
    first when the block is left.
    """

    store: Store
    persistence: Persistence | None
    loop: AgentLoop
    owner: Owner
    _gate: OpenGate = attrs.field(factory=OpenGate, init=False, repr=False, eq=False)

    async def create(
        self,
        session_id: str | None = None,
        *,
        owner: Owner | None = None,
        setup: Setup | None = None,
        provider: ModelProvider | None = None,
        tools: ToolSet | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
        **meta: Any,
    ) -> AgentHandle:
        """:meth:`AgentLoop.create` with the runtime's owner unless ``owner`` is given;
        ``provider``/``tools``/``system``/``max_tokens`` override the runtime's defaults
        for this agent; other keywords are session metadata (``cwd=...``).

        An id whose log is already stored is refused
        (:class:`~harness.errors.SessionLogExistsError`, ``SESSION_LOG_EXISTS``): a
        create starts a new log, so resume that one (:meth:`resume`, or :meth:`open`
        to get or create) or choose another id. The store alone would take the id and
        fail the new session's first write as an id collision, after its turn.

        Cancellation: :meth:`AgentLoop.create`'s. A cancellation of the caller
        propagates as ``Cancelled`` with nothing published (the steps done are
        unwound; the stored-log probe runs on a worker thread and finishes first); the
        owner or the runtime closing meanwhile raises
        :class:`~harness.agent.AgentSetupAbortedError` instead."""
        await self._refuse_stored(session_id, "create")
        return await self.loop.create(
            session_id,
            owner=self.owner if owner is None else owner,
            setup=setup,
            provider=provider,
            tools=tools,
            system=system,
            max_tokens=max_tokens,
            **meta,
        )

    async def resume(
        self,
        session_id: str,
        *,
        owner: Owner | None = None,
        setup: Setup | None = None,
        provider: ModelProvider | None = None,
        tools: ToolSet | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
    ) -> AgentHandle:
        """:meth:`AgentLoop.resume` with the runtime's owner unless ``owner`` is given
        (same per-agent overrides as :meth:`create`). Needs persistence: an in-memory
        runtime raises :class:`~harness.agent.AgentLoopError`.

        Cancellation: as :meth:`create` (``Cancelled`` means nothing was published:
        the steps done are unwound and the store is left as it was)."""
        return await self.loop.resume(
            session_id,
            owner=self.owner if owner is None else owner,
            setup=setup,
            provider=provider,
            tools=tools,
            system=system,
            max_tokens=max_tokens,
        )

    async def open(
        self,
        session_id: str,
        *,
        owner: Owner | None = None,
        setup: Setup | None = None,
        provider: ModelProvider | None = None,
        tools: ToolSet | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
        **meta: Any,
    ) -> AgentHandle:
        """Get or create the agent ``session_id``: the live agent if there is one, else
        :meth:`resume` of the stored session, else :meth:`create` of a new one (``meta``
        is its metadata; in memory there is nothing to resume). ``owner``, ``setup``
        and the per-agent overrides apply only when this call resumes or creates it:
        a live agent is returned as it is.

        Concurrent opens of one id are serialised (one lock per id): exactly one
        resumes or creates, the others get the same handle. An agent being disposed
        is waited for, then resumed. :meth:`create`/:meth:`resume` called directly,
        concurrently with an open of the same id, are not serialised with it and may
        fail as they would against each other (``SESSION_LIVE``,
        ``SESSION_ALREADY_EXISTS``).

        Cancellation: as :meth:`create` and :meth:`resume` (``Cancelled`` means this
        call published nothing); a cancelled open waiting for the id's lock leaves it
        to the next waiter, which opens the id itself."""
        async def live() -> AgentHandle | None:
            return await live_agent(self.loop.get(session_id))

        async def resume() -> AgentHandle:
            return await self.resume(
                session_id, owner=owner, setup=setup, provider=provider, tools=tools, system=system, max_tokens=max_tokens
            )

        async def create() -> AgentHandle:
            return await self.create(
                session_id,
                owner=owner,
                setup=setup,
                provider=provider,
                tools=tools,
                system=system,
                max_tokens=max_tokens,
                **meta,
            )

        async with self._gate.hold(session_id):
            return await get_or_create(live, None if self.persistence is None else resume, create)

    async def fork(
        self,
        source: AgentHandle | SessionHandle | str,
        boundary: int | None = None,
        child_id: str | None = None,
        *,
        owner: Owner | None = None,
    ) -> SessionHandle:
        """:meth:`Store.fork <harness.runtime.Store.fork>` of a live session (an agent's,
        by its handle), the child owned by the runtime's owner unless ``owner`` is
        given: closing that owner detaches the child (``session/disposed``). A closed
        owner is refused (:class:`~harness.errors.SessionOwnerClosedError`).

        A ``child_id`` whose log is already stored is refused
        (:class:`~harness.errors.SessionLogExistsError`), as :meth:`create` refuses it.

        Cancellation: the store's (``Cancelled`` means no child was created; once the
        store actor took the request, the child exists and belongs to the owner).
        The stored-log probe runs on a worker thread and finishes first."""
        if isinstance(source, AgentHandle):
            source = source.session
        await self._refuse_stored(child_id, "fork into")
        return await self.store.fork(source, boundary, child_id, owner=self.owner if owner is None else owner)

    async def _refuse_stored(self, session_id: str | None, what: str) -> None:
        """Refuse a new session ``session_id`` whose log is already stored. An id that
        is live here, or that storage cannot name, is left to the store, which refuses
        it in its own words (``SESSION_ALREADY_EXISTS``, ``INVALID_SESSION_ID``). A
        log that appears after the probe (another process's first write) is still the
        id collision of the new session's first write."""
        persistence = self.persistence
        if persistence is None or type(session_id) is not str or self.store.get_nowait(session_id) is not None:
            return
        try:
            # A detached incarnation may still be writing its first batch: the probe
            # must see it.
            await persistence.wait_retired(session_id)
        except HarnessError:
            return  # not a storable id: the store's refusal
        if await trio.to_thread.run_sync(persistence.backend.revision, session_id) is not None:
            raise SessionLogExistsError(
                f'{what} "{session_id}": a log of that id is already stored; resume it '
                "(rt.resume, or rt.open to get or create) or choose another id",
                session_id=session_id,
            )

    def get(self, agent_id: str) -> AgentHandle | None:
        """The live agent ``agent_id``, or ``None``."""
        return self.loop.get(agent_id)

    def agents(self) -> list[AgentHandle]:
        """The live agents, in publication order."""
        return self.loop.list()

    def session_ids(self) -> tuple[str, ...]:
        """The ids of the store's live sessions, in enter order (an immutable snapshot,
        no round trip: :meth:`Store.live_ids <harness.runtime.Store.live_ids>`)."""
        return self.store.live_ids()

    def session(self, session_id: str) -> SessionHandle | None:
        """The live session ``session_id``'s handle, or ``None`` (no round trip:
        :meth:`Store.get_nowait <harness.runtime.Store.get_nowait>`). Read it with
        :meth:`SessionHandle.snapshot <harness.runtime.SessionHandle.snapshot>`."""
        return self.store.get_nowait(session_id)

    @property
    def warnings(self) -> Warnings:
        """The runtime's warnings channel (``store.warnings``): subscribe to receive
        contained listener failures and background write failures as
        :class:`~harness.runtime.WarningReport` values (they are logged as well)."""
        return self.store.warnings


def _check_jsonl_root(root: Path, given: object) -> None:
    """Refuse a JSONL root that is not a directory and cannot become one: the root, or
    the nearest of its ancestors that exists, is not a directory (a regular file). A
    root that does not exist yet is fine (the first write creates it). Blocking (it
    stats the path): :func:`open_runtime` runs it on a worker thread."""
    path = blocking_file(root)
    if path is not None:
        what = "a file" if path.is_file() else "not a directory"
        where = "" if path == root else "its ancestor "
        raise RuntimeConfigError(
            f"root {given!r}: a JSONL root must be a directory, and {where}{str(path)!r} is {what} "
            '(a SQLite database file takes backend="sqlite"); nothing was opened'
        )


def _backend(
    root: str | os.PathLike[str] | None, backend: BackendName | Backend | None, files: OsFiles | None = None
) -> Backend | None:
    if files is not None:
        if not isinstance(files, OsFiles):
            raise RuntimeConfigError(f"files must be an OsFiles (a file layer), got {files!r}")
        named = backend is None or (isinstance(backend, str) and backend in ("jsonl", "sqlite"))
        if root is None or not named or is_postgres_url(root):
            raise RuntimeConfigError(
                "files applies to a JSONL or SQLite backend built here from a root; give it to your Backend instead"
            )
        return SqliteBackend(root, files=files) if backend == "sqlite" else JsonlBackend(root, files=files)
    if backend == "postgres" or (backend is None and is_postgres_url(root)):
        if not is_postgres_url(root):
            raise RuntimeConfigError(f'backend "postgres" needs a root "postgresql://…[#schema]" URL, got {root!r}')
        from harness.persistence import PostgresBackend  # psycopg is optional: imported on use

        return PostgresBackend.from_url(str(root))
    if isinstance(backend, str):
        if backend not in ("jsonl", "sqlite"):
            raise RuntimeConfigError(f'backend must be "jsonl", "sqlite", "postgres" or a Backend instance, got {backend!r}')
        if root is None:
            raise RuntimeConfigError(f'backend "{backend}" needs a root (a directory for jsonl, a file for sqlite)')
        return JsonlBackend(root) if backend == "jsonl" else SqliteBackend(root)
    if backend is None:
        return None if root is None else JsonlBackend(root)
    missing = [m for m in _BACKEND_METHODS if not callable(getattr(backend, m, None))]
    if missing:
        raise RuntimeConfigError(
            f"backend must be \"jsonl\", \"sqlite\", \"postgres\" or a Backend instance, got {backend!r} "
            f"(no {', '.join(missing)})"
        )
    if root is not None:
        raise RuntimeConfigError("give either a root or a Backend instance (it has its own location), not both")
    return backend


async def _close_backend(backend: Backend) -> None:
    """Close a backend built here (a SQLite connection, a PostgreSQL pool and its
    threads) on a worker thread.
    Cancellation: shielded, so a cancelled block still closes its connections."""
    close = getattr(backend, "close", None)
    if close is not None:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(close)


def _validator(invariants: bool | Callable[[], AppendValidator]) -> Callable[[], AppendValidator] | None:
    if invariants is True:
        return RelationalInvariants
    if invariants is False:
        return None
    if callable(invariants):
        return invariants
    raise RuntimeConfigError(f"invariants must be a bool or a validator factory, got {invariants!r}")


def _abort_turns(loop: AgentLoop) -> None:
    for handle in loop.list():
        handle.agent.cancel("disposed")


@asynccontextmanager
async def open_runtime(
    root: str | os.PathLike[str] | None = None,
    backend: BackendName | Backend | None = None,
    *,
    provider: ModelProvider | None = None,
    tools: ToolSet | None = None,
    system: str | None = None,
    max_tokens: int | None = None,
    compaction: AgentCompaction | None = None,
    invariants: bool | Callable[[], AppendValidator] = True,
    write_delay: float = 0.2,
    owner_name: str = "runtime",
    shutdown_grace: float = 30.0,
    checkpoint: bool = True,
    prepared_session_cache_size: int = 5,
    files: OsFiles | None = None,
) -> AsyncIterator[Runtime]:
    """Open a store, its persistence (unless in memory) and an agent loop, and a
    runtime-level :class:`~actors.Owner`, for the duration of the block.

    Storage:

    * ``open_runtime()`` — in memory: no persistence, ``rt.persistence is None``,
      sessions vanish with the block and :meth:`Runtime.resume` is refused;
    * ``open_runtime(root)`` or ``backend="jsonl"`` — a JSONL directory tree at ``root``;
    * ``backend="sqlite"`` — a SQLite database *file* at ``root``;
    * ``root="postgresql://…[#schema]"`` (``backend`` ``None`` or ``"postgres"``) — a
      PostgreSQL schema (default ``harness``; needs ``trio-harness[postgres]``);
    * ``backend=<a Backend instance>`` (e.g. ``JsonlBackend(root, compression="zstd")``)
      — used as is; ``root`` must then be ``None``.

    Anything else raises :class:`RuntimeConfigError` on entry, before anything opens;
    so does an empty ``root`` (``""`` would be the current directory) and a JSONL root
    that is not a directory and cannot become one (a regular file, or a path under
    one): a root that does not exist yet is created by the first write. That check
    stats the path on a worker thread; cancelled meanwhile, the entry waits for the
    stat, then ``Cancelled`` propagates with nothing opened.

    ``write_delay``: how long (seconds, a finite number >= 0) persistence batches
    appends before writing them; anything else is a :class:`RuntimeConfigError`.

    Agents: ``provider``, ``tools``, ``system`` and ``max_tokens`` are defaults that
    :meth:`Runtime.create`/:meth:`Runtime.resume` override per agent. There is no
    default provider: an agent needs one from here or from its create/resume call
    (:class:`~harness.agent.AgentLoopError` otherwise). For tests and offline runs
    pass a :class:`~harness.agent.ScriptedProvider`. ``compaction`` (an
    :class:`~harness.agent.AgentCompaction`) is installed on every agent.

    ``checkpoint`` (default ``True``): the checkpoint policy (a flush before each model
    request, tool body and step; docs/agent.md); ``False`` leaves durability to the
    write-behind window, explicit flushes and teardown. ``prepared_session_cache_size``
    bounds persistence's LRU of cold inspections (``open_persistence``). ``files``: the
    file layer (an :class:`~harness.persistence.OsFiles`, e.g. a fault layer of
    :mod:`harness.faults`) of a JSONL or SQLite backend built here from ``root``; with
    a Backend instance or PostgreSQL it is a :class:`RuntimeConfigError`.

    ``invariants=True`` installs :class:`~harness.session.RelationalInvariants` on the
    store (every append checked before it commits, every loaded log replayed); pass
    ``False`` to skip, or your own validator factory.

    Teardown — after a normal exit, an exception of the body, or a cancellation of
    the body or of any scope enclosing the block, always the same orderly one,
    innermost first: the runtime owner closes (its agents are disposed: a running
    turn is cancelled and logged ``aborted`` with cause ``disposed``), the loop
    disposes any agent left (those of other owners) and closes its commands,
    persistence flushes and retires every writer, and the store detaches its
    sessions and stops. The layers run under a shield (:func:`actors.open_guard`):
    an enclosing cancellation is relayed to the body — every running turn is first
    cancelled with cause ``disposed`` — and never reaches the runtime's own actors.
    The teardown is bounded by ``shutdown_grace`` seconds; past it (logged) what is
    left is cancelled, and a turn still open is closed by crash repair on its next
    load. Then the body's exception (unwrapped), else a teardown error (a failed
    final flush: :class:`~harness.persistence.PersistenceError`), else the enclosing
    ``Cancelled`` propagates.
    """
    validator = _validator(invariants)
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise RuntimeConfigError(f"root must be a path (a str or an os.PathLike), got {root!r}")
    if root is not None and not os.fspath(root):
        # Path("") is the current directory: never what an empty setting meant.
        raise RuntimeConfigError(f"root must be a non-empty path, got {root!r} (None for an in-memory runtime)")
    chosen = _backend(root, backend, files)
    if type(shutdown_grace) not in (int, float) or not shutdown_grace > 0:
        raise RuntimeConfigError(f"shutdown_grace must be a positive number of seconds, got {shutdown_grace!r}")
    if type(write_delay) not in (int, float) or not 0 <= write_delay < math.inf:
        raise RuntimeConfigError(f"write_delay must be a finite number of seconds >= 0, got {write_delay!r}")
    if isinstance(chosen, JsonlBackend):
        # On a worker thread: a stat is blocking work, never done on the Trio thread.
        await trio.to_thread.run_sync(_check_jsonl_root, chosen.root, chosen.root if root is None else root)
    # The guard keeps the layers' actors and tasks out of reach of a scope enclosing
    # this block: cancelled together with the body, a session actor would be gone
    # before the body's turn could log its turn/end (the log left with an open turn).
    async with open_guard(f"runtime {owner_name!r}", grace=shutdown_grace) as guard, AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store(validator_factory=validator))
        persistence: Persistence | None = None
        if chosen is not None:
            if chosen is not backend:
                # Built here (from a path or a URL): owned, closed after persistence, so
                # a SQLite connection is closed (its WAL checkpointed) when the block
                # ends, not whenever the collector gets to it. A backend passed in
                # stays the caller's to close.
                stack.push_async_callback(_close_backend, chosen)
            persistence = await stack.enter_async_context(
                open_persistence(
                    store, chosen, write_delay=write_delay, prepared_session_cache_size=prepared_session_cache_size
                )
            )
        loop = await stack.enter_async_context(
            open_agent_loop(
                store,
                provider=provider,
                tools=tools,
                persistence=persistence,
                checkpoint=checkpoint,
                system=system,
                max_tokens=max_tokens,
                compaction=compaction,
            )
        )
        owner = await stack.enter_async_context(Owner(owner_name))
        # Before the body is cancelled, every running turn is cancelled with the
        # teardown's cause, so it logs turn/end {aborted, reason: disposed}.
        guard.on_cancel(lambda: _abort_turns(loop))
        with guard.body():
            yield Runtime(store=store, persistence=persistence, loop=loop, owner=owner)
