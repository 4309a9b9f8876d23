"""The model-provider protocol: requests, stream chunks, typed provider errors, and the
two helpers every consumer of a stream needs (:func:`next_chunk`, :func:`close_stream`).

It depends on nothing above the session core, so the agent loop and compaction's
summarizer can both use it without importing each other.
"""

from harness.providers._models import ModelCatalog, ModelInfo
from harness.providers._protocol import (
    ContextWindowExceededError,
    Finish,
    ModelProvider,
    ModelRequest,
    ProviderError,
    ProviderStreamError,
    RateLimitedError,
    ReasoningDelta,
    ScriptExhaustedError,
    StreamChunk,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    close_stream,
    next_chunk,
)

__all__ = [
    "ContextWindowExceededError",
    "Finish",
    "ModelCatalog",
    "ModelInfo",
    "ModelProvider",
    "ModelRequest",
    "ProviderError",
    "ProviderStreamError",
    "RateLimitedError",
    "ReasoningDelta",
    "ScriptExhaustedError",
    "StreamChunk",
    "TextDelta",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
    "close_stream",
    "next_chunk",
]
