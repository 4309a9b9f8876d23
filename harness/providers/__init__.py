"""The model-provider protocol: requests, stream chunks, typed provider errors, and the
two helpers every consumer of a stream needs (:func:`next_chunk`, :func:`close_stream`).

It depends on nothing above the session core, so the agent loop and compaction's
summarizer can both use it without importing each other.
"""

from typing import TYPE_CHECKING, Any

from harness.providers._errors import (
    ContentFilteredError,
    ProviderAuthError,
    ProviderConnectionError,
    ProviderRequestError,
    ProviderServerError,
    ProviderTimeoutError,
    TruncatedStreamError,
)
from harness.providers._middleware import (
    MiddlewareProvider,
    RoutedStream,
    StreamMiddleware,
    StreamNext,
)
from harness.providers._models import ModelCatalog, ModelInfo
from harness.providers._protocol import (
    MAX_TOOL_ARGUMENTS,
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
    ToolArgumentsTooLargeError,
    ToolCallDelta,
    ToolSpec,
    Usage,
    close_stream,
    next_chunk,
)

if TYPE_CHECKING:
    from harness.providers._openai import OpenAICompatibleProvider
    from harness.providers._openai_config import DEEPSEEK, Endpoint, RetryPolicy, Timeouts

# The OpenAI-compatible provider needs httpx: imported on first use, so that the
# protocol (and everything built on it) does not pay for it.
_OPENAI = ("DEEPSEEK", "Endpoint", "OpenAICompatibleProvider", "RetryPolicy", "Timeouts")


def __getattr__(name: str) -> Any:
    if name in _OPENAI:
        from harness.providers import _openai, _openai_config

        return getattr(_openai if name == "OpenAICompatibleProvider" else _openai_config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEEPSEEK",
    "MAX_TOOL_ARGUMENTS",
    "ContentFilteredError",
    "ContextWindowExceededError",
    "Endpoint",
    "OpenAICompatibleProvider",
    "ProviderAuthError",
    "ProviderConnectionError",
    "ProviderRequestError",
    "ProviderServerError",
    "ProviderTimeoutError",
    "RetryPolicy",
    "Timeouts",
    "TruncatedStreamError",
    "Finish",
    "MiddlewareProvider",
    "ModelCatalog",
    "ModelInfo",
    "ModelProvider",
    "ModelRequest",
    "ProviderError",
    "ProviderStreamError",
    "RateLimitedError",
    "ReasoningDelta",
    "RoutedStream",
    "ScriptExhaustedError",
    "StreamChunk",
    "StreamMiddleware",
    "StreamNext",
    "TextDelta",
    "ToolArgumentsTooLargeError",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
    "close_stream",
    "next_chunk",
]
