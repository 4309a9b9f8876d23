"""Doors into a trio-harness runtime for code that is not Trio (``docs/asyncio.md``):
:class:`RuntimeThread` (a runtime on its own Trio thread, called from asyncio or
blocking code) and :class:`AgentsSession` (the OpenAI Agents SDK's ``Session``
protocol on a harness session; the ``agents`` extra installs the SDK)."""

from harness.bridge._thread import RuntimeThread, open_runtime_in_thread

__all__ = ["RuntimeThread", "open_runtime_in_thread"]
