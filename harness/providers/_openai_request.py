"""A :class:`~harness.providers.ModelRequest` as a chat-completions request body:
messages, tools, and which reasoning is replayed (docs/providers.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.providers._openai_config import ReasoningReplay
from harness.providers._protocol import (
    ModelRequest,
    ToolSpec,
)
from harness.session import thaw


def chat_request_body(
    request: ModelRequest,
    *,
    reasoning_replay: ReasoningReplay = "never",
    extra_body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of a streamed chat-completions request for ``request``."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request, reasoning_replay=reasoning_replay),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [_tool_spec(t) for t in request.tools]
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    if extra_body:
        body.update(extra_body)
    return body


def _tool_spec(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": thaw(tool.parameters)},
    }


def chat_messages(request: ModelRequest, *, reasoning_replay: ReasoningReplay = "never") -> list[dict[str, Any]]:
    """The surface messages as OpenAI chat messages.

    * the system prompt first;
    * a user message: its ``tool-result`` blocks become ``tool`` messages (in order,
      first: they answer the preceding assistant message), its text blocks one
      ``user`` message (blocks joined by newlines; a block of another kind is named in
      brackets, e.g. ``[image omitted]``);
    * an assistant message: its text blocks as ``content``, its ``tool-call`` blocks as
      ``tool_calls``; its reasoning as ``reasoning_content`` only as
      ``reasoning_replay`` says (``tool-calls``: in a turn that called tools, DeepSeek's
      thinking-mode rule; ``always``; ``never``). An assistant message left with
      neither text nor calls (e.g. reasoning only, interrupted) is not sent.
    """
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    messages = [thaw(m) for m in request.messages]
    replay = _replayed_reasoning(messages, reasoning_replay)
    for i, m in enumerate(messages):
        role = m.get("role")
        blocks = m.get("content") or []
        if role == "assistant":
            texts: list[str] = []
            reasoning: list[str] = []
            calls: list[dict[str, Any]] = []
            for b in blocks:
                kind = b.get("type")
                if kind == "text":
                    texts.append(str(b.get("text", "")))
                elif kind == "reasoning":
                    reasoning.append(str(b.get("text", "")))
                elif kind == "tool-call":
                    calls.append(
                        {
                            "id": str(b.get("id")),
                            "type": "function",
                            "function": {"name": str(b.get("name")), "arguments": str(b.get("arguments") or "{}")},
                        }
                    )
            text = "\n".join(t for t in texts if t)
            if not text and not calls:
                continue
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                msg["tool_calls"] = calls
            thought = "".join(reasoning)
            if thought and i in replay:
                msg["reasoning_content"] = thought
            out.append(msg)
        elif role == "system":
            out.append({"role": "system", "content": _joined(blocks)})
        else:
            texts = []
            for b in blocks:
                kind = b.get("type")
                if kind == "tool-result":
                    out.append({"role": "tool", "tool_call_id": str(b.get("toolCallId")), "content": _joined(b.get("content") or [])})
                elif kind == "text":
                    texts.append(str(b.get("text", "")))
                else:
                    texts.append(f"[{kind} omitted]")
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _joined(blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    parts = []
    for b in blocks:
        kind = b.get("type") if isinstance(b, dict) else None
        parts.append(str(b.get("text", "")) if kind == "text" else f"[{kind} omitted]")
    return "\n".join(parts)


def _replayed_reasoning(messages: list[dict[str, Any]], policy: ReasoningReplay) -> set[int]:
    """Indices of the assistant messages whose reasoning is sent back."""
    assistants = {i for i, m in enumerate(messages) if m.get("role") == "assistant"}
    if policy == "always":
        return assistants
    if policy == "never":
        return set()
    # "tool-calls": every assistant message of a turn (the messages between two user
    # prompts) in which the model called a tool.
    out: set[int] = set()
    turn: list[int] = []
    called = False
    for i, m in enumerate(messages):
        blocks = m.get("content") or []
        if m.get("role") == "user" and any(b.get("type") != "tool-result" for b in blocks):
            if called:
                out.update(turn)
            turn, called = [], False
        elif i in assistants:
            turn.append(i)
            called = called or any(b.get("type") == "tool-call" for b in blocks)
    if called:
        out.update(turn)
    return out
