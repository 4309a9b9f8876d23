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
    from harness.bridge import RuntimeThread, open_runtime_in_thread

__all__ = [
    "HarnessError",
    "Runtime",
    "RuntimeConfigError",
    "RuntimeThread",
    "errors",
    "open_runtime",
    "open_runtime_in_thread",
]
__version__ = "0.1.0"

_LAZY = {"Runtime", "RuntimeConfigError", "open_runtime"}
_LAZY_BRIDGE = {"RuntimeThread", "open_runtime_in_thread"}


def __getattr__(name: str) -> Any:
    if name in _LAZY or name in _LAZY_BRIDGE:
        if name in _LAZY:
            from harness import _runtime_api as source
        else:
            from harness import bridge as source  # type: ignore[no-redef]

        value = getattr(source, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
