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

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal, final

import attrs

from actors import Owner
from harness.agent._compaction import AgentCompaction
from harness.agent._loop import AgentHandle, AgentLoop, Setup, open_agent_loop
from harness.agent._tools import ToolSet
from harness.errors import HarnessError
from harness.persistence import Backend, JsonlBackend, Persistence, SqliteBackend, open_persistence
from harness.providers import ModelProvider
from harness.runtime import Store, open_store
from harness.session import AppendValidator, RelationalInvariants

BackendName = Literal["jsonl", "sqlite"]
_BACKEND_METHODS = ("list_headers", "load", "append", "materialize", "acquire_writer")


class RuntimeConfigError(HarnessError, ValueError):
    """:func:`open_runtime` was given arguments it cannot make a runtime of (an
    unknown ``backend``, a backend name without a ``root``, a backend instance
    together with a ``root``). Raised when the block is entered, before anything opens.
    """

    code = "RUNTIME_CONFIG"


@final
@attrs.frozen
class Runtime:
    """What :func:`open_runtime` yields: the three layers and a runtime-level owner.

    ``persistence`` is ``None`` for an in-memory runtime (nothing is written; resume
    is refused). ``owner`` owns every agent :meth:`create`/:meth:`resume` publishes
    without an explicit ``owner=``: it is closed first when the block is left.
    """

    store: Store
    persistence: Persistence | None
    loop: AgentLoop
    owner: Owner

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
        for this agent; other keywords are session metadata (``cwd=...``)."""
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
        runtime raises :class:`~harness.agent.AgentLoopError`."""
        return await self.loop.resume(
            session_id,
            owner=self.owner if owner is None else owner,
            setup=setup,
            provider=provider,
            tools=tools,
            system=system,
            max_tokens=max_tokens,
        )

    def get(self, agent_id: str) -> AgentHandle | None:
        """The live agent ``agent_id``, or ``None``."""
        return self.loop.get(agent_id)

    def agents(self) -> list[AgentHandle]:
        """The live agents, in publication order."""
        return self.loop.list()


def _backend(root: str | os.PathLike[str] | None, backend: BackendName | Backend | None) -> Backend | None:
    if isinstance(backend, str):
        if backend not in ("jsonl", "sqlite"):
            raise RuntimeConfigError(f'backend must be "jsonl", "sqlite" or a Backend instance, got {backend!r}')
        if root is None:
            raise RuntimeConfigError(f'backend "{backend}" needs a root (a directory for jsonl, a file for sqlite)')
        return JsonlBackend(root) if backend == "jsonl" else SqliteBackend(root)
    if backend is None:
        return None if root is None else JsonlBackend(root)
    missing = [m for m in _BACKEND_METHODS if not callable(getattr(backend, m, None))]
    if missing:
        raise RuntimeConfigError(
            f"backend must be \"jsonl\", \"sqlite\" or a Backend instance, got {backend!r} "
            f"(no {', '.join(missing)})"
        )
    if root is not None:
        raise RuntimeConfigError("give either a root or a Backend instance (it has its own location), not both")
    return backend


def _validator(invariants: bool | Callable[[], AppendValidator]) -> Callable[[], AppendValidator] | None:
    if invariants is True:
        return RelationalInvariants
    if invariants is False:
        return None
    if callable(invariants):
        return invariants
    raise RuntimeConfigError(f"invariants must be a bool or a validator factory, got {invariants!r}")


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
) -> AsyncIterator[Runtime]:
    """Open a store, its persistence (unless in memory) and an agent loop, and a
    runtime-level :class:`~actors.Owner`, for the duration of the block.

    Storage:

    * ``open_runtime()`` — in memory: no persistence, ``rt.persistence is None``,
      sessions vanish with the block and :meth:`Runtime.resume` is refused;
    * ``open_runtime(root)`` or ``backend="jsonl"`` — a JSONL directory tree at ``root``;
    * ``backend="sqlite"`` — a SQLite database *file* at ``root``;
    * ``backend=<a Backend instance>`` (e.g. ``JsonlBackend(root, compression="zstd")``)
      — used as is; ``root`` must then be ``None``.

    Anything else raises :class:`RuntimeConfigError` on entry, before anything opens.

    Agents: ``provider``, ``tools``, ``system`` and ``max_tokens`` are defaults that
    :meth:`Runtime.create`/:meth:`Runtime.resume` override per agent. There is no
    default provider: an agent needs one from here or from its create/resume call
    (:class:`~harness.agent.AgentLoopError` otherwise). For tests and offline runs
    pass a :class:`~harness.agent.ScriptedProvider`. ``compaction`` (an
    :class:`~harness.agent.AgentCompaction`) is installed on every agent.

    ``invariants=True`` installs :class:`~harness.session.RelationalInvariants` on the
    store (every append checked before it commits, every loaded log replayed); pass
    ``False`` to skip, or your own validator factory.

    Teardown (also on error or cancellation), innermost first: the runtime owner
    closes (its agents are disposed: a running turn is cancelled and logged
    ``aborted`` with cause ``disposed``), the loop disposes any agent left (those of
    other owners) and closes its commands, persistence flushes and retires every
    writer, and the store detaches its sessions and stops. Each step runs shielded,
    as the layers already do, so a cancelled block still tears down completely.
    """
    validator = _validator(invariants)
    chosen = _backend(root, backend)
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store(validator_factory=validator))
        persistence: Persistence | None = None
        if chosen is not None:
            persistence = await stack.enter_async_context(
                open_persistence(store, chosen, write_delay=write_delay)
            )
        loop = await stack.enter_async_context(
            open_agent_loop(
                store,
                provider=provider,
                tools=tools,
                persistence=persistence,
                system=system,
                max_tokens=max_tokens,
                compaction=compaction,
            )
        )
        owner = await stack.enter_async_context(Owner(owner_name))
        yield Runtime(store=store, persistence=persistence, loop=loop, owner=owner)
