"""Get-or-create, single-flight per id: :meth:`Runtime.open <harness.Runtime.open>`
(an agent) and :func:`open_session_handle` (a bare session, the bridge's).

Kept out of ``_runtime_api.py`` so the front door stays a thin composition."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar, final

import trio

from harness.errors import PersistedSessionNotFoundError, SessionLogExistsError
from harness.session import check_lookup_id

if TYPE_CHECKING:
    from harness.agent import AgentHandle
    from harness.persistence import Persistence
    from harness.runtime import SessionHandle, Store

T = TypeVar("T")


@final
class OpenGate:
    """One :class:`trio.Lock` per id being opened, dropped when its last user leaves.

    Every get-or-create of an id runs under its lock, so concurrent opens of one id
    are serialised: the first creates or resumes, the later ones find it live."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[trio.Lock, list[int]]] = {}

    def busy(self) -> tuple[str, ...]:
        """The ids with an open in flight (for tests and diagnostics)."""
        return tuple(self._locks)

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """Hold ``session_id``'s lock for the block. Cancellation: the wait for the
        lock is cancellable; a cancelled waiter leaves the lock to the others."""
        check_lookup_id(session_id)
        lock, users = self._locks.setdefault(session_id, (trio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[session_id]


async def get_or_create(
    live: Callable[[], Awaitable[T | None]],
    resume: Callable[[], Awaitable[T]] | None,
    create: Callable[[], Awaitable[T]],
) -> T:
    """``live()`` if it answers, else ``resume()`` (when there is persistence), else
    ``create()`` if nothing is stored. A log that appears between the resume's
    not-found and the create (another process's first write) is resumed after all.

    Cancellation: each step's own; the caller holds the id's lock, so no other open of
    the id interleaves."""
    found = await live()
    if found is not None:
        return found
    if resume is None:
        return await create()
    try:
        return await resume()
    except PersistedSessionNotFoundError:
        pass
    try:
        return await create()
    except SessionLogExistsError:
        return await resume()


async def open_session_handle(
    store: Store,
    persistence: Persistence | None,
    gate: OpenGate,
    session_id: str,
    **meta: Any,
) -> SessionHandle:
    """The live session ``session_id``: the live one, else the stored one published
    (repaired as any load is), else a new one created with ``meta``.

    Cancellation: ``Cancelled`` means nothing was published by this call (the
    persistence's ``prepare``/``publish`` and the store's ``create`` unwind)."""

    async def live() -> SessionHandle | None:
        return store.get_nowait(session_id)

    async def resume() -> SessionHandle:
        assert persistence is not None
        prep = await persistence.prepare(session_id)
        return await persistence.publish(prep)

    async def create() -> SessionHandle:
        return await store.create(session_id, **meta)

    async with gate.hold(session_id):
        return await get_or_create(live, None if persistence is None else resume, create)


async def live_agent(handle: AgentHandle | None) -> AgentHandle | None:
    """``handle`` unless it is being disposed (then wait for the disposal: the id is
    free again once it returns). Cancellation: the wait is cancellable."""
    if handle is None:
        return None
    if handle.agent.disposed:
        await handle.dispose()
        return None
    return handle
