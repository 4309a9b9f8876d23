"""The model-provider protocol: a request in, a stream of typed chunks out."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final, Protocol, TypeAlias

import attrs
import trio

from actors import run_bounded
from harness.errors import HarnessError
from harness.session import FrozenDict

log = logging.getLogger("harness.providers")


@attrs.frozen
class TextDelta:
    index: int
    text: str


@attrs.frozen
class ReasoningDelta:
    index: int
    text: str


@attrs.frozen
class ToolCallDelta:
    """Part of a tool call's JSON arguments; ``name`` arrives with the first delta."""

    index: int
    id: str
    arguments_delta: str
    name: str | None = None


@attrs.frozen
class Usage:
    input_tokens: int
    output_tokens: int


@attrs.frozen
class Finish:
    """``reason``: ``stop``, ``tool-calls`` or ``length`` (the output hit max tokens)."""

    reason: str


StreamChunk: TypeAlias = TextDelta | ReasoningDelta | ToolCallDelta | Usage | Finish


@attrs.frozen
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@attrs.frozen
class ModelRequest:
    """What the loop asks the model: the surface messages plus the epoch header."""

    session_id: str
    provider: str
    model: str
    messages: Sequence[FrozenDict]
    tools: tuple[ToolSpec, ...] = ()
    system: str | None = None
    max_tokens: int | None = None
    # Why the request is made, for a provider that treats some kinds differently
    # (the reference's DeepSeek adapter flags "compaction" requests); None for the
    # agent's own turns.
    purpose: str | None = None


class ModelProvider(Protocol):
    """Streams a reply. Raise :class:`ProviderError` subclasses for failures.

    Cancellation: the loop cancels the iteration (and ``aclose``s the iterator)
    when a turn is cancelled; a provider must not swallow ``Cancelled``.
    """

    name: str
    model: str

    @property
    def context_window(self) -> int | None:
        """The model's context window in tokens (``None``: unknown). Read-only here, so
        a provider may expose it as a plain attribute or as a property."""
        ...

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]: ...


class ProviderError(HarnessError):
    """The model call failed. ``status`` and ``retry_after_ms`` when known."""

    code = "PROVIDER_ERROR"

    def __init__(self, message: str, *, status: int | None = None, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_ms = retry_after_ms


class ContextWindowExceededError(ProviderError):
    """The request does not fit the model's context window (compaction recovers)."""

    code = "CONTEXT_WINDOW_EXCEEDED"


class RateLimitedError(ProviderError):
    code = "RATE_LIMITED"


class ProviderStreamError(ProviderError):
    """A provider's stream raised something that is not a :class:`ProviderError` (a
    provider bug, a raw transport error); the original is chained as the cause."""

    code = "PROVIDER_STREAM_FAILED"


#: The longest tool-call arguments text (characters) a reply may stream for one call.
#: 16 Mi characters is far beyond any real tool call (the SSE parser bounds one event at
#: 8 MiB; arguments arrive across many events), and short of what would make a session's
#: log or a tool's JSON parse a memory hazard.
MAX_TOOL_ARGUMENTS: Final = 16 * 1024 * 1024


class ToolArgumentsTooLargeError(ProviderStreamError):
    """A streamed tool call's arguments grew beyond the bound
    (:data:`MAX_TOOL_ARGUMENTS` unless configured): the reply is refused as a failed
    stream (nothing of it is committed), never handed to a tool. ``call_id`` names
    the call, ``limit`` the bound in characters."""

    code = "TOOL_ARGUMENTS_TOO_LARGE"

    def __init__(self, message: str, *, call_id: str | None, limit: int) -> None:
        super().__init__(message)
        self.call_id = call_id
        self.limit = limit


class ScriptExhaustedError(ProviderError):
    """The scripted provider was asked for more replies than its script holds."""

    code = "SCRIPT_EXHAUSTED"


# -- consuming a stream: what every caller of ``ModelProvider.stream`` needs ------------------


async def next_chunk(stream: AsyncIterator[StreamChunk], provider: str) -> StreamChunk | None:
    """The next chunk of a provider's stream, or ``None`` at its end.

    Whatever the stream raises is typed: a :class:`ProviderError` as it is, anything
    else as :class:`ProviderStreamError` (the original chained). Except while the
    caller is being cancelled: a stream whose cleanup fails while unwinding that
    cancellation did not fail the call, so the pending ``Cancelled`` is raised instead
    (the failure is logged).

    Cancellation: a checkpoint, like the stream's own ``__anext__``.
    """
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None
    except ProviderError:
        raise
    except Exception as exc:
        if trio.current_effective_deadline() == -math.inf:
            log.warning("provider %s failed while its caller was cancelled: %r", provider, exc)
            await trio.lowlevel.checkpoint()  # raises the pending Cancelled
        raise ProviderStreamError(f"provider {provider} stream failed: {exc!r}") from exc


async def close_stream(stream: object, *, grace: float, who: str) -> None:
    """Close a provider's stream (``aclose``, when it has one).

    Shielded, so the provider can release its connection even when the caller was
    cancelled; bounded by ``grace`` seconds (:func:`actors.run_bounded`), so a provider
    that hangs in its cleanup cannot hold the caller. A failing or overrunning close
    is logged (naming ``who``), never raised: it must not replace how the stream
    itself ended (a finish, an error, a cancellation).
    """
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    try:
        closed = await run_bounded(aclose, grace, shield=True)
    except Exception as exc:
        log.warning("%s: the provider failed to close its stream: %r", who, exc)
        return
    if not closed:
        log.warning("%s: the provider did not close its stream within %g s", who, grace)
