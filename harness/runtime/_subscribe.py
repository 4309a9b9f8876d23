"""Subscribing listeners, and refusing async ones where the runtime calls them
synchronously: the leaf under the listener sets (``_listeners``) and the warnings
channel (``_warnings``), which both subscribe this way."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

from harness.errors import AsyncListenerError


class Keyed(Protocol):
    """A listener set that keys its registrations (``_listeners.Registry``)."""

    def add(self, listener: Any) -> int: ...

    def discard(self, key: int) -> None: ...


def _name(fn: object) -> str:
    name = getattr(fn, "__qualname__", None)
    return name if type(name) is str else repr(fn)


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` makes a coroutine (or an async generator): an ``async
    def``, a ``functools.partial`` of one, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return True
    if inspect.isroutine(fn):
        return False
    call = inspect.getattr_static(type(fn), "__call__", None)  # an object's own __call__
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


def subscribe_sync(kind: str, items: list[Any] | Keyed, item: Any) -> Callable[[], None]:
    """:func:`subscribe` for a listener the store calls synchronously: an async
    callable is refused (:class:`AsyncListenerError`), never called and dropped."""
    if is_async_callable(item):
        raise AsyncListenerError(
            f"{kind} listener {_name(item)} is async; store listeners must be synchronous "
            "(start async work from it instead)"
        )
    return subscribe(items, item)


def refuse_awaitable(kind: str, listener: object, result: object) -> None:
    """A synchronous listener returned ``result``: if it is awaitable, close it (it will
    never run) and raise :class:`AsyncListenerError`."""
    if not inspect.isawaitable(result):
        return
    close = getattr(result, "close", None)
    if callable(close):
        close()  # no "coroutine was never awaited" warning: it is refused, on purpose
    raise AsyncListenerError(
        f"{kind} listener {_name(listener)} returned an awaitable; store listeners must be "
        "synchronous (it was closed, not awaited)"
    )


def subscribe(items: list[Any] | Keyed, item: Any) -> Callable[[], None]:
    """Add ``item`` to ``items``; return an idempotent unsubscribe function.

    The unsubscribe removes this registration only, once: a callable registered twice
    stays registered once after one of its unsubscribes (called any number of times),
    and an equal but distinct callable (``==`` without ``is``) is never removed.
    """
    if not isinstance(items, list):
        registry, key = items, items.add(item)
        return lambda: registry.discard(key)
    items.append(item)
    removed = False

    def remove() -> None:
        nonlocal removed
        if removed:
            return
        removed = True
        for i, registered in enumerate(items):  # by identity, not ==
            if registered is item:
                del items[i]
                return

    return remove
