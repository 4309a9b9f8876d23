"""Model info: the context window of a provider/model pair (compaction's capacity)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs
import trio

from harness.providers._protocol import ModelProvider


@attrs.frozen
class ModelInfo:
    """What is known about one model; ``context_window`` is ``None`` when unknown."""

    provider: str
    model: str
    context_window: int | None


class ModelCatalog:
    """Resolves a provider/model pair to its :class:`ModelInfo`.

    Configured windows (``windows[(provider, model)]``) win; otherwise a registered
    provider of that name answers with its own ``context_window``, also for models
    it does not list (the reference: capacity comes from the adapter). Unknown pairs
    have no window.
    """

    def __init__(
        self,
        windows: Mapping[tuple[str, str], int] | None = None,
        providers: Iterable[ModelProvider] = (),
    ) -> None:
        self._windows = dict(windows or {})
        for (provider, model), window in self._windows.items():
            if type(window) is not int or window <= 0:
                raise ValueError(f"context window of {provider}/{model} must be a positive integer, got {window!r}")
        self._providers: dict[str, ModelProvider] = {}
        for p in providers:
            self.add_provider(p)

    def add_provider(self, provider: ModelProvider) -> None:
        self._providers.setdefault(provider.name, provider)

    def lookup(self, provider: str, model: str) -> ModelInfo:
        """The synchronous lookup behind :meth:`resolve_model_info`."""
        window = self._windows.get((provider, model))
        if window is None:
            adapter = self._providers.get(provider)
            window = adapter.context_window if adapter is not None else None
        return ModelInfo(provider, model, window)

    async def resolve_model_info(self, provider: str, model: str) -> ModelInfo:
        """The model's info (a checkpoint: a catalog backed by a remote listing can
        take its time here). Cancellation: nothing to undo."""
        await trio.lowlevel.checkpoint()
        return self.lookup(provider, model)
