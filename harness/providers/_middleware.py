"""Provider middleware: the reference's ``llm/stream`` wrapping, as a provider.

A :class:`MiddlewareProvider` is a :class:`~harness.providers.ModelProvider` whose
``stream`` runs through a chain of middlewares before it reaches a provider. Each
middleware gets the request and ``next`` (the rest of the chain) and returns the
stream: it may pass the request on unchanged, pass on a changed one (a *reroute*: another
provider name and/or model), wrap the stream it gets back (log, meter, filter chunks), or
answer without calling ``next`` at all. The request that finally reaches a provider is
the *dispatched* one: its ``provider`` names the provider that streams it (one of
``providers``, else the wrapped default), and callers that record who answered
(compaction's ``compaction/summary``) read it from :attr:`RoutedStream.dispatched`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from typing import final

from harness.providers._protocol import ModelProvider, ModelRequest, StreamChunk

StreamNext = Callable[[ModelRequest], AsyncIterator[StreamChunk]]
"""The rest of a middleware chain: call it with the request to pass on."""

StreamMiddleware = Callable[[ModelRequest, StreamNext], AsyncIterator[StreamChunk]]
"""A middleware: ``(request, next) -> stream`` (typically an async generator that
``async for``-s over ``next(request)``, changed or not)."""


@final
class RoutedStream:
    """The stream of one :meth:`MiddlewareProvider.stream` call. Lazy, as the
    reference's: nothing of the chain runs until the first chunk is pulled.

    ``dispatched`` is the request as it reached a provider (after every reroute), or
    ``None`` while no provider was called (not pulled yet, or a middleware answered
    by itself). Cancellation: as the underlying stream's; :meth:`aclose` closes it.
    """

    __slots__ = ("_make", "_stream", "dispatched")

    def __init__(self, make: Callable[[RoutedStream], AsyncIterator[StreamChunk]]) -> None:
        self._make = make
        self._stream: AsyncIterator[StreamChunk] | None = None
        self.dispatched: ModelRequest | None = None

    def __aiter__(self) -> RoutedStream:
        return self

    async def __anext__(self) -> StreamChunk:
        if self._stream is None:
            self._stream = self._make(self)
        return await self._stream.__anext__()

    async def aclose(self) -> None:
        """Close the chain's stream (no-op if it never started)."""
        stream, self._stream = self._stream, None
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


@final
class MiddlewareProvider:
    """``provider`` with ``middlewares`` around its ``stream`` (the first is the
    outermost); ``providers`` are the other providers a reroute may name (by their
    ``name``). ``name``, ``model`` and ``context_window`` are the default provider's.

    :meth:`use` adds a middleware (innermost) and returns the function that removes it;
    a stream already started keeps the chain it started with.
    """

    def __init__(
        self,
        provider: ModelProvider,
        middlewares: Iterable[StreamMiddleware] = (),
        *,
        providers: Iterable[ModelProvider] = (),
    ) -> None:
        self.provider = provider
        self.name = provider.name
        self.model = provider.model
        self._middlewares: list[StreamMiddleware] = list(middlewares)
        self._providers = {p.name: p for p in providers}

    @property
    def context_window(self) -> int | None:
        return self.provider.context_window

    def use(self, middleware: StreamMiddleware) -> Callable[[], None]:
        self._middlewares.append(middleware)

        def remove() -> None:
            for i, registered in enumerate(self._middlewares):
                if registered is middleware:
                    del self._middlewares[i]
                    return

        return remove

    def stream(self, request: ModelRequest) -> RoutedStream:
        chain = list(self._middlewares)

        def make(routed: RoutedStream) -> AsyncIterator[StreamChunk]:
            def dispatch(req: ModelRequest) -> AsyncIterator[StreamChunk]:
                routed.dispatched = req
                target = self._providers.get(req.provider, self.provider)
                return target.stream(req)

            call: StreamNext = dispatch
            for middleware in reversed(chain):
                call = _layer(middleware, call)
            return call(request)

        return RoutedStream(make)


def _layer(middleware: StreamMiddleware, nxt: StreamNext) -> StreamNext:
    def call(request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return middleware(request, nxt)

    return call
