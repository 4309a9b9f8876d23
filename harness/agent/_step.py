"""A step's records: what a step logged so far (:class:`Step`), its reply streamed into
``assistant/chunk`` events, an interrupted step closed so the log stays balanced, and
the messages and results the agent appends. Functions of the session and the provider:
the agent (``_agent``) runs the steps and calls them."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import trio

from actors import ActorError
from harness.agent._types import AgentArgumentError
from harness.errors import HarnessError
from harness.providers import (
    Finish,
    ModelProvider,
    ModelRequest,
    ProviderError,
    ReasoningDelta,
    TextDelta,
    ToolArgumentsTooLargeError,
    ToolCallDelta,
    Usage,
    close_stream,
    next_chunk,
)
from harness.runtime import SessionHandle
from harness.session import EventDraft

log = logging.getLogger("harness.agent")


class Step:
    """What the current step has logged (for closing it on abort or error)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.chunk_seqs: list[int] = []
        self.texts: dict[int, list[str]] = {}
        self.reasoning: dict[int, list[str]] = {}
        self.usage: dict[str, int] | None = None
        self.streaming = False
        self.calls: list[dict[str, Any]] = []  # {id, name, arguments}

    def reset_attempt(self) -> None:
        """Forget a failed request's stream (before a retry in the same step)."""
        self.chunk_seqs = []
        self.texts = {}
        self.reasoning = {}
        self.usage = None
        self.calls = []


async def stream_reply(
    session: SessionHandle,
    provider: ModelProvider,
    turn: int,
    step: Step,
    request: ModelRequest,
    *,
    chunk_batch: int,
    close_grace: float,
    max_tool_arguments: int,
) -> str:
    """Stream the reply to ``request`` into ``assistant/chunk`` events of ``session``
    (appended ``chunk_batch`` at a time); return the finish reason, and leave the
    texts, reasoning, usage and complete calls in ``step``.

    Cancellation: the chunks that arrived are appended even so (shielded); the
    provider's stream is closed within ``close_grace``."""
    pending: list[EventDraft] = []
    calls: dict[str, dict[str, Any]] = {}
    # A call's arguments arrive in many small deltas: kept as pieces and joined once
    # at the end (``+=`` on a str held by a dict copies it each time: a 3 MB argument
    # in 64-byte deltas took 91 s, issue 24 §2). ``sizes``: characters so far.
    pieces: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    limit = max_tool_arguments
    finish = "stop"

    async def flush_chunks() -> None:
        if pending:
            events = await session.append_batch(pending)
            step.chunk_seqs.extend(e.seq for e in events)
            pending.clear()

    step.streaming = True
    try:
        agen = provider.stream(request)
        try:
            while (chunk := await next_chunk(agen, provider.name)) is not None:
                if isinstance(chunk, TextDelta):
                    step.texts.setdefault(chunk.index, []).append(chunk.text)
                    raw: dict[str, Any] = {"type": "text-delta", "index": chunk.index, "text": chunk.text}
                elif isinstance(chunk, ReasoningDelta):
                    step.reasoning.setdefault(chunk.index, []).append(chunk.text)
                    raw = {"type": "reasoning-delta", "index": chunk.index, "text": chunk.text}
                elif isinstance(chunk, ToolCallDelta):
                    call = calls.get(chunk.id)
                    if call is None:
                        call = calls[chunk.id] = {"id": chunk.id, "name": chunk.name, "arguments": ""}
                        pieces[chunk.id] = []
                        sizes[chunk.id] = 0
                    if chunk.name is not None:
                        call["name"] = chunk.name
                    size = sizes[chunk.id] = sizes[chunk.id] + len(chunk.arguments_delta)
                    if size > limit:
                        raise ToolArgumentsTooLargeError(
                            f'agent "{session.id}": the arguments of tool call {chunk.id!r} exceed {limit} characters',
                            call_id=chunk.id,
                            limit=limit,
                        )
                    pieces[chunk.id].append(chunk.arguments_delta)
                    raw = {"type": "tool-call-delta", "index": chunk.index, "id": chunk.id}
                    if chunk.name is not None:
                        raw["name"] = chunk.name
                    raw["argumentsDelta"] = chunk.arguments_delta
                elif isinstance(chunk, Usage):
                    step.usage = {"inputTokens": chunk.input_tokens, "outputTokens": chunk.output_tokens}
                    raw = {"type": "usage", "usage": step.usage}
                elif isinstance(chunk, Finish):
                    finish = chunk.reason
                    raw = {"type": "finish", "reason": chunk.reason}
                else:  # pragma: no cover - protocol violation
                    raise ProviderError(f"unknown stream chunk {chunk!r}")
                pending.append(EventDraft("assistant/chunk", {"turn": turn, "step": step.step, "chunk": raw}))
                if len(pending) >= chunk_batch:
                    await flush_chunks()
        finally:
            await close_stream(agen, grace=close_grace, who=f'agent "{session.id}"')
    except ProviderError:
        # A failed stream commits nothing more: the chunks still buffered are
        # dropped (batches logged before the failure stay, log-only), and no
        # assistant message is built from it (committed_stream=False).
        pending.clear()
        raise
    finally:
        # Chunks that arrived are facts: log them even if the stream was cut
        # by a cancellation.
        with trio.CancelScope(shield=True):
            await flush_chunks()
        step.streaming = False
    for call_id, call in calls.items():
        call["arguments"] = "".join(pieces[call_id])
    step.calls = [c for c in calls.values() if c["name"]]
    return finish


async def abort_before_dispatch(session: SessionHandle, turn: int, step: int, call_id: str) -> None:
    """Answer a call whose body never started with the reference's
    ``TOOL_ABORTED_BEFORE_DISPATCH`` result (shielded; called while a cancellation
    propagates). A failed append is left to :func:`close_step`, which reads the
    log and answers whatever is still unanswered (``TOOL_ABORTED``)."""
    s = session
    with trio.CancelScope(shield=True):
        logged = logged_in_step(s, turn, step)
        if logged is None or call_id in logged[2]:
            return  # the step is closed, or the call is answered already
        text = "Error: tool call aborted before dispatch"
        error = {"name": "AbortError", "code": "TOOL_ABORTED_BEFORE_DISPATCH"}
        try:
            await s.append("tool/result", tool_result(turn, step, call_id, text, error), surface_op="append")
        except (HarnessError, ActorError) as exc:
            log.warning('agent "%s": recording an aborted tool call failed: %s', session.id, exc)


async def close_step(session: SessionHandle, provider: ModelProvider, turn: int, step: Step | None, *, committed_stream: bool) -> None:
    """Close an interrupted step so the log stays balanced (runs shielded).

    What the step already logged is read from the log, not from the step's own
    bookkeeping: a message whose append was applied but whose reply never came
    back (``ReplyOverdueError``) is still a fact, and answering a call twice
    would break the log's invariants.
    """
    if step is None:
        return
    s = session
    logged = logged_in_step(s, turn, step.step)
    if logged is None:
        return  # the step was closed already
    message_logged, dispatched, answered = logged
    drafts: list[EventDraft] = []
    if not message_logged and committed_stream:
        content = [{"type": "reasoning", "text": "".join(v)} for k, v in sorted(step.reasoning.items())]
        content += [{"type": "text", "text": "".join(v)} for k, v in sorted(step.texts.items())]
        content = [b for b in content if b["text"]]
        if content:
            data: dict[str, Any] = {
                "turn": turn,
                "step": step.step,
                "message": assistant_message(provider, content),
                "interrupted": True,
            }
            if step.usage is not None:
                data["usage"] = step.usage
            drafts.append(EventDraft("assistant/message", data, "append", step.chunk_seqs or None))
    if message_logged:
        for call in step.calls:
            if call["id"] in answered:
                continue
            if call["id"] not in dispatched:
                drafts.append(
                    EventDraft("tool/call", {"turn": turn, "step": step.step, "callId": call["id"], "name": call["name"], "arguments": call["arguments"]})
                )
                code = "TOOL_ABORTED_BEFORE_DISPATCH"
                text = "Error: tool call aborted before dispatch"
            else:
                code = "TOOL_ABORTED"
                text = "Error: tool call aborted"
            drafts.append(
                EventDraft("tool/result", tool_result(turn, step.step, call["id"], text, {"name": "AbortError", "code": code}), "append")
            )
    drafts.append(EventDraft("step/end", {"turn": turn, "step": step.step}))
    await s.append_batch(drafts)


def logged_in_step(s: SessionHandle, turn: int, step: int) -> tuple[bool, set[str], set[str]] | None:
    """What the log holds for the open ``step`` of ``turn``: whether its assistant
    message is logged, the call ids of its ``tool/call``s and of its ``tool/result``s.
    ``None`` when that step is not open (closed, or never started)."""
    events = s.events
    message = False
    calls: set[str] = set()
    results: set[str] = set()
    for i in range(len(events) - 1, -1, -1):
        ev = events[i]
        t = ev.type
        # Data is read only for the three types that need it: an appended event's data
        # is decoded on each read (decision 0023).
        data: Any  # shapes the invariants guarantee for these types
        if t == "step/start":
            data = ev.data
            return (message, calls, results) if (data["turn"], data["step"]) == (turn, step) else None
        if t in ("step/end", "turn/start", "turn/end"):
            return None
        if t == "assistant/message":
            message = True
        elif t == "tool/call":
            data = ev.data
            calls.add(data["callId"])
        elif t == "tool/result":
            data = ev.data
            results.update(
                b["toolCallId"] for b in data["message"]["content"] if b.get("type") == "tool-result"
            )
    return None


def as_append(draft: EventDraft) -> tuple[str, Any]:
    return draft.type, draft.data


def turn_started(s: SessionHandle, turn: int) -> bool:
    """Whether ``turn/start`` of ``turn`` is the log's latest turn boundary."""
    events = s.events
    for i in range(len(events) - 1, -1, -1):
        ev = events[i]
        if ev.type in ("turn/start", "turn/end"):
            data: Any = ev.data
            return ev.type == "turn/start" and data["turn"] == turn
    return False


def user_message(text: str, *, session_id: str, method: str) -> dict[str, Any]:
    """A user message of ``text``; :class:`AgentArgumentError` (naming the value) for a
    ``text`` that is not a ``str``, before anything is queued or logged."""
    if not isinstance(text, str):
        raise AgentArgumentError(
            f'agent "{session_id}": {method} text must be a str, got {type(text).__name__} {text!r}',
            session_id=session_id,
        )
    return {"id": str(uuid.uuid4()), "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}


def assistant_message(provider: ModelProvider, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "role": "assistant",
        "content": content,
        "source": {"kind": "model", "provider": provider.name, "model": provider.model},
    }


def tool_result(turn: int, step: int, call_id: str, text: str, error: dict[str, str] | None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": text}]}
    if error is not None:
        block["isError"] = True
    data: dict[str, Any] = {
        "turn": turn,
        "step": step,
        "message": {"id": str(uuid.uuid4()), "role": "user", "content": [block], "source": {"kind": "tool", "callId": call_id}},
    }
    if error is not None:
        data["error"] = error
    return data
