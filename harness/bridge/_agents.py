"""The OpenAI Agents SDK's ``Session`` protocol on a harness session (the ``agents``
extra). See ``docs/asyncio.md``.

An SDK conversation is a list of Responses-API input items. Here each item is one
event of the session's append-only log, ``openai-agents/item {item}``; ``pop_item``
and ``clear_session`` are events too (``openai-agents/pop {seq}``,
``openai-agents/clear {}``): the item list is a fold over the log, nothing is ever
deleted. The three types are logged ``ignorable: true``, so any reader that does not
know them (the reference's included) skips them instead of refusing the log.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, final

import trio

from harness._open import open_session_handle
from harness.bridge._thread import RuntimeThread
from harness.errors import SessionArgumentError
from harness.session import EventDraft, thaw
from harness.session._append_types import log_only_draft

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import SessionSettings

    from harness._runtime_api import Runtime
    from harness.runtime import SessionHandle
else:
    TResponseInputItem = dict

ITEM: Final = "openai-agents/item"
POP: Final = "openai-agents/pop"
CLEAR: Final = "openai-agents/clear"


# One lock per session of a store, shared by every TrioAgentsSession on it (and so by
# every AgentsSession over them): ``pop_item`` reads the latest item and then logs its
# removal, and another object's pop must not read between the two (both returned the
# same item when the actor was busy, so that the second read came before the first
# removal was applied). An entry lives while its lock is held or awaited.
_LOCKS: weakref.WeakKeyDictionary[Any, dict[str, trio.Lock]] = weakref.WeakKeyDictionary()


@asynccontextmanager
async def _session_lock(store: Any, session_id: str) -> AsyncIterator[None]:
    """Hold the lock of ``session_id`` in ``store``. Cancellation: while waiting for
    it, as ``trio.Lock`` (nothing held)."""
    locks = _LOCKS.get(store)
    if locks is None:
        locks = _LOCKS[store] = {}
    lock = locks.get(session_id)
    if lock is None:
        lock = locks[session_id] = trio.Lock()
    try:
        async with lock:
            yield
    finally:
        # Released to nobody (a release to a waiter leaves it locked): forget it.
        if locks.get(session_id) is lock and not lock.locked() and not lock.statistics().tasks_waiting:
            del locks[session_id]


def _limit_of(limit: int | None, settings: SessionSettings | None) -> int | None:
    """``SQLiteSession``'s rule: an explicit limit, else the settings' (None: all)."""
    if limit is not None:
        return limit
    return None if settings is None else settings.limit


@final
class TrioAgentsSession:
    """The ``Session`` protocol on Trio, over a runtime ``rt`` (use
    :class:`AgentsSession` from asyncio). ``session_id`` names a harness session:
    opened on first use — the live one, else the stored one (crash-repaired as any
    load), else a new one with ``meta`` as its metadata (``cwd=...``).

    Operations on one session are serialised, across every object on it in the
    runtime's store (a pop reads the latest item and logs its removal as one step for
    the others). Mutations (``add_items``, ``pop_item``,
    ``clear_session``) are durable when they return (``durable=False``: left to the
    write-behind flush) and, like the SDK's own sessions, run to their outcome even
    when the caller is cancelled (shielded: the append is atomic, the flush bounded by
    the persistence's own limits); the cancellation is then raised. ``get_items`` is
    a read of the session's snapshot and cancellable.
    """

    def __init__(
        self,
        rt: Runtime,
        session_id: str,
        *,
        session_settings: SessionSettings | None = None,
        durable: bool = True,
        **meta: Any,
    ) -> None:
        self.rt = rt
        self.session_id = session_id
        self.session_settings = session_settings
        self.durable = durable
        self._meta = meta
        self._handle: SessionHandle | None = None
        # The fold: the seqs of the items on the list, and how far the log was read. Seqs,
        # not the items: the log keeps each item (as its JSON, decision 0026), and an
        # item is decoded when it is read, as SQLiteSession decodes its rows.
        self._items: list[int] = []
        self._read = 0

    async def handle(self) -> SessionHandle:
        """The session's live handle, opened (get-or-create) on first use and again if
        the session was detached meanwhile. Cancellation: the open's (nothing published)."""
        if self._handle is None or not self._handle.alive:
            rt = self.rt
            self._handle = await open_session_handle(rt.store, rt.persistence, rt._gate, self.session_id, **self._meta)
            self._items, self._read = [], 0
        return self._handle

    def _fold(self, handle: SessionHandle) -> list[int]:
        events = handle.events
        items = self._items
        for seq in range(self._read, len(events)):
            event = events[seq]
            t = event.type
            if t == ITEM:
                items.append(seq)
            elif t == POP:
                data: Any = event.data  # a FrozenDict (written below)
                popped = data["seq"]
                items[:] = [s for s in items if s != popped]
            elif t == CLEAR:
                items.clear()
        self._read = len(events)
        return items

    @staticmethod
    def _item(handle: SessionHandle, seq: int) -> Any:
        """The item logged at ``seq``, as a fresh plain dict."""
        data: Any = handle.events[seq].data  # a FrozenDict (written below)
        return thaw(data["item"])

    async def _mutate(self, drafts: Sequence[EventDraft]) -> None:
        handle = await self.handle()
        with trio.CancelScope(shield=True):  # an SDK mutation runs to its outcome
            # One call when durable: the append and its flush with one schedule point.
            await handle.append_batch(drafts, durable=self.durable)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The items, oldest first; ``limit`` (else ``session_settings.limit``) keeps the
        latest ``limit`` of them: ``None`` or a negative limit all, ``0`` none. Each
        call returns fresh plain dicts."""
        async with _session_lock(self.rt.store, self.session_id):
            handle = await self.handle()
            items = self._fold(handle)
            n = _limit_of(limit, self.session_settings)
            chosen = items if n is None or n < 0 else items[len(items) - n :] if n else []
            return [self._item(handle, seq) for seq in chosen]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in one atomic batch (all land or none). An item that is not
        a JSON object is refused before anything is written."""
        drafts: list[EventDraft] = []
        push = drafts.append
        for item in items:
            if not isinstance(item, dict):
                raise SessionArgumentError(
                    f'session "{self.session_id}": an SDK item must be a dict, got {item!r}',
                    session_id=self.session_id,
                )
            push(log_only_draft(ITEM, {"item": item}, True))
        if not drafts:
            return
        async with _session_lock(self.rt.store, self.session_id):
            await self._mutate(drafts)

    async def pop_item(self) -> TResponseInputItem | None:
        """Take the latest item off the list and return it (``None`` if empty): logs
        ``openai-agents/pop {seq}``, the item's own event stays in the log."""
        async with _session_lock(self.rt.store, self.session_id):
            handle = await self.handle()
            items = self._fold(handle)
            if not items:
                return None
            seq = items[-1]
            item = self._item(handle, seq)
            await self._mutate([EventDraft(POP, {"seq": seq}, ignorable=True)])
            return item  # type: ignore[no-any-return]

    async def clear_session(self) -> None:
        """Empty the list: logs ``openai-agents/clear`` (nothing if already empty);
        the log and its earlier items stay (a fork before the clear still has them)."""
        async with _session_lock(self.rt.store, self.session_id):
            if self._fold(await self.handle()):
                await self._mutate([EventDraft(CLEAR, {}, ignorable=True)])


@final
class AgentsSession:
    """The OpenAI Agents SDK's ``Session`` protocol for asyncio code, on a harness
    session served by a :class:`RuntimeThread`:

        async with harness.open_runtime_in_thread("sessions/") as portal:
            result = await Runner.run(agent, "Hi", session=AgentsSession(portal, "chat-1"))

    Each method runs :class:`TrioAgentsSession`'s on the runtime's thread (see it for
    the semantics) and awaits it without blocking the event loop. Cancelling the
    awaiting task: ``get_items`` is cancelled on the Trio side; a mutation completes
    first (durable, as the SDK's ``SQLiteSession`` does); then ``CancelledError``
    propagates. No provider is needed: the SDK runs the model, the runtime stores.
    """

    def __init__(
        self,
        portal: RuntimeThread,
        session_id: str,
        *,
        session_settings: SessionSettings | None = None,
        durable: bool = True,
        **meta: Any,
    ) -> None:
        self.portal = portal
        self.session_id = session_id
        self.session_settings = session_settings
        self._trio = TrioAgentsSession(
            portal.runtime, session_id, session_settings=session_settings, durable=durable, **meta
        )

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """:meth:`TrioAgentsSession.get_items` (the session's settings as given here)."""
        self._trio.session_settings = self.session_settings
        return await self.portal.arun(self._trio.get_items, limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """:meth:`TrioAgentsSession.add_items`."""
        await self.portal.arun(self._trio.add_items, list(items))

    async def pop_item(self) -> TResponseInputItem | None:
        """:meth:`TrioAgentsSession.pop_item`."""
        return await self.portal.arun(self._trio.pop_item)

    async def clear_session(self) -> None:
        """:meth:`TrioAgentsSession.clear_session`."""
        await self.portal.arun(self._trio.clear_session)
