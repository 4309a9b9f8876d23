"""trio-harness: an actor-model runtime for event-sourced AI-agent sessions, on Trio."""

from harness import errors
from harness.errors import HarnessError

__all__ = ["HarnessError", "errors"]
__version__ = "0.1.0"
