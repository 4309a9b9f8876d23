"""Doors into a trio-harness runtime for code that is not Trio (``docs/asyncio.md``):
:class:`RuntimeThread` (a runtime on its own Trio thread, called from asyncio or
blocking code) and :class:`AgentsSession` / :class:`TrioAgentsSession` (the OpenAI
Agents SDK's ``Session`` protocol on a harness session; ``pip install
'trio-harness[agents]'`` installs the SDK, which only type checks need)."""

from harness.bridge._agents import AgentsSession, TrioAgentsSession
from harness.bridge._thread import RuntimeThread, open_runtime_in_thread

__all__ = ["AgentsSession", "RuntimeThread", "TrioAgentsSession", "open_runtime_in_thread"]
