"""Phase two: the default summarizer over the provider protocol (reference §5.2).

One streamed request replays the shadowed span (see :mod:`._framing`) followed by
:data:`COMPACTION_INSTRUCTION` as a user message; the reply's text blocks are the
summary. There is no retry and no timeout here: a caller that wants a bound puts
the call in a cancel scope.

Images: the reference rejects image output (``UNSUPPORTED_CONTENT``). Our
:data:`~harness.providers.StreamChunk` union has no image chunk, so a reply here can
hold only text, reasoning and tool calls; a custom summarizer's
:class:`SummaryOutput` can, and :func:`check_output_content` refuses it before
anything is committed.
"""

from __future__ import annotations

import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from harness.compaction._config import BasicCompactionConfig, CompactionPolicy
from harness.compaction._framing import (
    COMPACTION_INSTRUCTION,
    SUMMARIZER_PLUGIN,
    SummarizationInput,
)
from harness.errors import (
    EmptySummaryError,
    SummaryContentError,
    SummaryTargetError,
    SummaryTruncatedError,
    UnsupportedSummaryContentError,
)
from harness.providers import (
    Finish,
    ModelProvider,
    ModelRequest,
    ProviderStreamError,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    close_stream,
    next_chunk,
)
from harness.session import FrozenDict, freeze, thaw

PURPOSE: Final = "compaction"
"""``ModelRequest.purpose`` of a summarization request."""

CLOSE_GRACE: Final = 10.0
"""Seconds a provider gets to close its stream after the summary ends or is cut
(the agent loop's default ``close_grace``)."""


@attrs.frozen(slots=True)
class SummaryTarget:
    """Who summarizes (``provider``/``model``), under which ``policy``, with which
    token cap (``max_tokens``, the policy's)."""

    provider: str
    model: str
    policy: CompactionPolicy

    @property
    def max_tokens(self) -> int:
        return self.policy.max_tokens


def _pair(provider: object, model: object) -> tuple[str, str] | None:
    if type(provider) is str and type(model) is str and provider and model:
        return provider, model
    return None


def _header_pair(header: object) -> tuple[str, str] | None:
    if not isinstance(header, Mapping):
        return None
    config = header.get("config")
    if not isinstance(config, Mapping):
        return None
    return _pair(config.get("provider"), config.get("model"))


def resolve_summary_target(
    config: BasicCompactionConfig,
    header: object,
    *,
    agent_provider: str | None = None,
    agent_model: str | None = None,
) -> SummaryTarget:
    """Resolve the summarization target (reference §5.2), purely.

    ``header`` is the session's latest request header (``session.request_header()``,
    or ``None``); ``agent_provider``/``agent_model`` are the agent's configured pair
    (the reference's AgentOptions).

    The *policy* is the exact-target policy of the conversation target (the header's
    provider/model when both are non-empty, else the agent pair when both are), or
    the top level with no target. The *target*, in order: the policy's
    ``summarizationProvider``/``Model`` when set; the header's pair whenever there is
    a header; the agent pair when both are non-empty. Otherwise
    :class:`~harness.errors.SummaryTargetError`.

    A header whose provider or model is empty (or not a string) counts as no header:
    the reference assumes a valid one (the session checks seeded headers for a
    non-empty pair), and an empty target could only fail later, less clearly.
    """
    from_header = _header_pair(header)
    from_agent = _pair(agent_provider, agent_model)
    conversation = from_header or from_agent
    policy = config.policy_for(*conversation) if conversation is not None else config.defaults
    configured = _pair(policy.summarization_provider, policy.summarization_model)
    target = configured or from_header or from_agent
    if target is None:
        raise SummaryTargetError(
            "no provider/model available for summarization: set both BasicCompactionConfig "
            "summarization fields, route one request, or set both AgentOptions fields"
        )
    return SummaryTarget(target[0], target[1], policy)


@attrs.frozen(slots=True)
class SummaryOutput:
    """The summarizer's result, in the shape ``compaction/summary`` records.

    ``summary`` is the text blocks of the reply (the safe blocks); ``raw_output`` is
    every block the reply held, in stream order (text, reasoning, tool calls).
    ``usage`` is ``{inputTokens, outputTokens}`` when the provider reported it.

    Every field but ``summary`` is optional, as in the reference: a field left
    ``None`` is absent from ``compaction/summary`` (never written as ``null``).
    ``llm_stream_call`` marks output that came from one streamed model request (the
    default summarizer sets it); it needs ``raw_output``.
    """

    summary: tuple[FrozenDict, ...]
    raw_output: tuple[FrozenDict, ...] | None = None
    provider: str | None = None
    model: str | None = None
    max_tokens: int | None = None
    usage: FrozenDict | None = None
    llm_stream_call: bool = False

    def __attrs_post_init__(self) -> None:
        if self.llm_stream_call and self.raw_output is None:
            raise SummaryContentError("a summary output marked llm_stream_call must supply raw_output")


# JavaScript's String.prototype.trim() whitespace: WhiteSpace (incl. BOM and Zs) plus
# LineTerminator. Python's str.strip() differs (it keeps U+FEFF, strips U+001C..1F).
JS_SPACE: Final = frozenset("\t\n\v\f\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff")


def is_blank(text: str) -> bool:
    """True when ``text.trim()`` would be empty in JavaScript."""
    return all(c in JS_SPACE or unicodedata.category(c) == "Zs" for c in text)


def instruction_message() -> FrozenDict:
    """The instruction as a user message from the ``dsh-compaction-basic`` plugin."""
    message = freeze(
        {
            "id": str(uuid.uuid4()),
            "role": "user",
            "content": [{"type": "text", "text": COMPACTION_INSTRUCTION}],
            "source": {"kind": "plugin", "plugin": SUMMARIZER_PLUGIN},
        }
    )
    assert isinstance(message, FrozenDict)
    return message


def _tool_specs(tools: tuple[FrozenDict, ...]) -> tuple[ToolSpec, ...]:
    specs = []
    for tool in tools:
        spec = thaw(tool)
        params = spec.get("parameters")
        specs.append(
            ToolSpec(
                str(spec.get("name", "")),
                str(spec.get("description", "")),
                params if type(params) is dict else {},
            )
        )
    return tuple(specs)


async def summarize(
    provider: ModelProvider,
    input: SummarizationInput,
    *,
    session_id: str,
    max_tokens: int,
    provider_name: str | None = None,
    model: str | None = None,
) -> SummaryOutput:
    """Summarize ``input`` with one streamed request to ``provider`` (reference §5.2).

    The request carries ``messages = input.messages + [instruction]``, the input's
    ``system`` and ``tools`` (for prefix alignment), ``max_tokens``, ``session_id``
    and ``purpose="compaction"``. ``provider_name``/``model`` label the request and
    the result (default: the provider's own ``name``/``model``); pass the pair from
    :func:`resolve_summary_target`.

    Raises, committing nothing:

    * the provider's :class:`~harness.providers.ProviderError` as is; anything else the
      stream raises as :class:`~harness.providers.ProviderStreamError` (the original is
      the cause), as the agent loop does;
    * :class:`~harness.errors.SummaryTruncatedError` (``MAX_TOKENS``) on finish
      ``length``;
    * :class:`~harness.errors.EmptySummaryError` when no text block has non-blank text.

    A stream that ends without a ``Finish`` counts as ``stop`` (as in the agent loop).

    Cancellation: cancelling the caller cancels the stream at its next checkpoint,
    and the stream is closed (``aclose``, shielded, bounded by :data:`CLOSE_GRACE`)
    before ``Cancelled`` propagates. The summarizer writes nothing anywhere, so a
    cancelled summary leaves no trace but the provider's request.
    """
    request = ModelRequest(
        session_id=session_id,
        provider=provider_name if provider_name is not None else provider.name,
        model=model if model is not None else provider.model,
        messages=(*input.messages, instruction_message()),
        tools=_tool_specs(input.tools),
        system=input.system,
        max_tokens=max_tokens,
        purpose=PURPOSE,
    )
    # Blocks keyed by stream index, so raw_output keeps the order the reply had.
    texts: dict[int, list[str]] = {}
    reasoning: dict[int, list[str]] = {}
    calls: dict[int, dict[str, Any]] = {}
    usage: dict[str, int] | None = None
    finish = "stop"
    agen = provider.stream(request)
    try:
        while (chunk := await next_chunk(agen, provider.name)) is not None:
            if isinstance(chunk, TextDelta):
                texts.setdefault(chunk.index, []).append(chunk.text)
            elif isinstance(chunk, ReasoningDelta):
                reasoning.setdefault(chunk.index, []).append(chunk.text)
            elif isinstance(chunk, ToolCallDelta):
                call = calls.setdefault(
                    chunk.index, {"type": "tool-call", "id": chunk.id, "name": "", "arguments": ""}
                )
                if chunk.name is not None:
                    call["name"] = chunk.name
                call["arguments"] += chunk.arguments_delta
            elif isinstance(chunk, Usage):
                usage = {"inputTokens": chunk.input_tokens, "outputTokens": chunk.output_tokens}
            elif isinstance(chunk, Finish):
                finish = chunk.reason
            else:  # pragma: no cover - a protocol violation by the provider
                raise ProviderStreamError(
                    f"provider {provider.name} sent an unknown stream chunk {chunk!r}"
                )
    finally:
        await close_stream(agen, grace=CLOSE_GRACE, who=f'summarizer for session "{session_id}"')
    if finish == "length":
        raise SummaryTruncatedError(
            "summarization truncated at the token cap (incomplete checkpoint)"
        )
    raw_output: list[dict[str, Any]] = []
    for index in sorted({*texts, *reasoning, *calls}):
        if index in reasoning:
            raw_output.append({"type": "reasoning", "text": "".join(reasoning[index])})
        if index in texts:
            raw_output.append({"type": "text", "text": "".join(texts[index])})
        if index in calls:
            raw_output.append(calls[index])
    summary = [b for b in raw_output if b["type"] == "text"]
    if all(is_blank(b["text"]) for b in summary):
        raise EmptySummaryError("summarization produced no text summary content")
    frozen_usage = freeze(usage) if usage is not None else None
    # Reference §5.2: provider and model are recorded after any reroute (a
    # MiddlewareProvider's stream says which request reached a provider).
    dispatched = getattr(agen, "dispatched", None)
    answered = dispatched if isinstance(dispatched, ModelRequest) else request
    return SummaryOutput(
        summary=tuple(_frozen(b) for b in summary),
        raw_output=tuple(_frozen(b) for b in raw_output),
        provider=answered.provider,
        model=answered.model,
        max_tokens=max_tokens,
        usage=frozen_usage if isinstance(frozen_usage, FrozenDict) else None,
        llm_stream_call=True,
    )


def _has_image(blocks: object) -> bool:
    """An ``image`` block anywhere in ``blocks``, also nested in a tool result."""
    stack = [blocks]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            if value.get("type") == "image":
                return True
            stack.append(value.get("content"))
        elif isinstance(value, Sequence) and not isinstance(value, str):
            stack.extend(value)
    return False


def check_output_content(output: SummaryOutput) -> None:
    """Refuse what a checkpoint cannot carry (reference §5.2): an image anywhere in
    the output (also nested in a ``tool-result`` block), and a ``tool-result`` block
    among the summary blocks (it would answer no call on the surface). Raises
    :class:`~harness.errors.UnsupportedSummaryContentError` (``UNSUPPORTED_CONTENT``);
    nothing is committed."""
    if _has_image(output.summary) or _has_image(output.raw_output):
        raise UnsupportedSummaryContentError("compaction summary cannot contain image output")
    for block in output.summary:
        if isinstance(block, Mapping) and block.get("type") == "tool-result":
            raise UnsupportedSummaryContentError("compaction summary cannot contain tool-result blocks")


def _frozen(block: dict[str, Any]) -> FrozenDict:
    value = freeze(block)
    assert isinstance(value, FrozenDict)
    return value
