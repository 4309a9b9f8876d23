"""What a session handle needs of its store, as a protocol: the leaf that lets
``_handles`` sit below ``_store`` (issue 27: the store builds handles; a handle only
asks its store these few things, and never imports it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from harness.runtime._warnings import Warnings

H = TypeVar("H")


class StorePort(Protocol[H]):
    """The store as its handles (``H``) see it; :class:`~harness.runtime.Store` is one.

    ``_live_entry`` is the store actor's liveness map read synchronously (the entry is
    compared by identity only); ``flush`` and ``fork`` are the store's own requests, and
    ``_flush_applied`` the flush half of ``append(..., durable=True)``.
    """

    def _live_entry(self, session_id: str) -> object | None: ...

    @property
    def warnings(self) -> Warnings: ...

    async def flush(self, handle: H) -> bool: ...

    async def _flush_applied(self, handle: H) -> None: ...

    async def fork(self, source: H, boundary: int | None = None, child_id: str | None = None) -> H: ...
