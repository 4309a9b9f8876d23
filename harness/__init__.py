"""trio-harness: an actor-model runtime for event-sourced AI-agent sessions, on Trio.

The front door is :func:`open_runtime` (see ``docs/embedding.md``); it is imported
lazily, so ``import harness`` (and the CLI) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness import errors
from harness.errors import HarnessError

if TYPE_CHECKING:
    from harness._runtime_api import Runtime, RuntimeConfigError, open_runtime

__all__ = ["HarnessError", "Runtime", "RuntimeConfigError", "errors", "open_runtime"]
__version__ = "0.1.0"

_LAZY = {"Runtime", "RuntimeConfigError", "open_runtime"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from harness import _runtime_api

        value = getattr(_runtime_api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
