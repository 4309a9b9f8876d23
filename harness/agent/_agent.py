"""The agent loop: turns of steps, each a model request and its tool calls."""

from __future__ import annotations

import logging
import uuid
from typing import Any, Literal

import attrs
import orjson
import trio

from actors import ActorError
from harness.agent._tools import ToolSet
from harness.errors import HarnessError
from harness.persistence import CheckpointPolicy
from harness.providers import (
    Finish,
    ModelProvider,
    ModelRequest,
    ProviderError,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    close_stream,
    next_chunk,
)
from harness.runtime import SessionHandle
from harness.session import EventDraft, freeze, header_equals, thaw

log = logging.getLogger("harness.agent")

AbortKind = Literal["user", "parent", "disposed"]


class AgentBusyError(HarnessError):
    code = "AGENT_BUSY"


class AgentDisposedError(HarnessError):
    code = "AGENT_DISPOSED"


@attrs.frozen
class TurnResult:
    """How a turn ended: ``reason`` is the ``turn/end`` reason record."""

    turn: int
    reason: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.reason["kind"])


class _Step:
    """What the current step has logged (for closing it on abort or error)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.chunk_seqs: list[int] = []
        self.texts: dict[int, list[str]] = {}
        self.reasoning: dict[int, list[str]] = {}
        self.usage: dict[str, int] | None = None
        self.streaming = False
        self.calls: list[dict[str, Any]] = []  # {id, name, arguments}


class Agent:
    """Runs turns on one live session. One turn at a time.

    Every turn it starts ends with a ``turn/end`` while the process lives: completed,
    ``max-tokens``, ``error`` (a provider failure), or ``aborted`` with the first
    cause given to :meth:`cancel` (``user``, ``parent``, ``disposed``). An aborted step
    is closed the way the reference closes it (visible text kept as an interrupted
    message, unanswered tool calls answered with abort errors).
    """

    def __init__(
        self,
        session: SessionHandle,
        provider: ModelProvider,
        tools: ToolSet | None = None,
        *,
        system: str | None = None,
        max_tokens: int | None = None,
        checkpoint: CheckpointPolicy | None = None,
        tool_concurrency: int = 4,
        chunk_batch: int = 32,
        close_grace: float = 10.0,
    ) -> None:
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens <= 0):
            raise ValueError("agent max_tokens must be a positive integer")
        self.session = session
        self.provider = provider
        self.tools = tools or ToolSet()
        self.system = system
        self.max_tokens = max_tokens
        self.checkpoint = checkpoint
        self._limiter = trio.CapacityLimiter(tool_concurrency)
        self._chunk_batch = chunk_batch
        self.close_grace = close_grace
        self._scope: trio.CancelScope | None = None
        self._cause: dict[str, Any] | None = None
        self._idle = trio.Event()
        self._idle.set()
        self._requests = 0
        self._turn_task: trio.lowlevel.Task | None = None
        self.disposed = False
        self._last_turn = session.last_turn()

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def cancel(self, kind: AbortKind = "user") -> None:
        """Abort the running turn (no-op when idle). The first cause wins."""
        if self._scope is None:
            return
        if self._cause is None:
            self._cause = {"kind": kind}
        self._scope.cancel()

    def in_turn(self) -> bool:
        """Whether the current task is the running turn or one of its children
        (e.g. a tool body)."""
        turn_task = self._turn_task
        if turn_task is None:
            return False
        task: trio.lowlevel.Task | None = trio.lowlevel.current_task()
        while task is not None:
            if task is turn_task:
                return True
            parent = task.parent_nursery
            task = None if parent is None else parent.parent_task
        return False

    async def wait_idle(self) -> None:
        """Return once no turn is running (always settles).

        Cancellation: only the wait is cancelled; the turn goes on.
        """
        await self._idle.wait()

    # -- a turn ------------------------------------------------------------------------

    async def run_turn(self, text: str) -> TurnResult:
        """Run one turn for a user message; return how it ended.

        Cancellation: :meth:`cancel` ends the turn as ``aborted`` and this returns the
        result. If the *caller* is cancelled, the turn is recorded as aborted (cause
        ``user`` unless one was given) in a shielded cleanup, then ``Cancelled``
        propagates. Either way ``turn/end`` is in the log before this returns.
        """
        if self.disposed:
            raise AgentDisposedError(f'agent "{self.id}" is disposed', session_id=self.id)
        if self.busy:
            raise AgentBusyError(f'agent "{self.id}" is already running a turn', session_id=self.id)
        self._idle = trio.Event()
        self._cause = None
        self._turn_task = trio.lowlevel.current_task()
        turn = self._last_turn + 1
        self._last_turn = turn
        try:
            return await self._turn(turn, text)
        finally:
            # Set only after turn/end is logged: whoever waits for idle (dispose) can
            # detach the session knowing the turn is closed.
            self._scope = None
            self._turn_task = None
            self._idle.set()

    async def _turn(self, turn: int, text: str) -> TurnResult:
        steps: list[_Step] = []
        outcome: dict[str, Any] | None = None
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                await self.session.append_batch(
                    [
                        EventDraft("turn/start", {"turn": turn}),
                        EventDraft("user/message", _user_message(text), "append"),
                    ]
                )
                while outcome is None:
                    steps.append(_Step(len(steps) + 1))
                    outcome = await self._run_step(turn, steps[-1])
        except ProviderError as exc:
            outcome = {"kind": "error", "error": {"message": str(exc), "code": exc.code}}
            if exc.status is not None:
                outcome["error"]["status"] = exc.status
            await self._finish(turn, steps, outcome, committed_stream=False)
            return TurnResult(turn, outcome)
        except (HarnessError, ActorError) as exc:
            # The runtime refused or failed (a flush, a session no longer live, a reply
            # whose outcome is unknown): an error of the turn, not an abort by anyone.
            outcome = {"kind": "error", "error": {"message": str(exc), "code": exc.code}}
            await self._finish(turn, steps, outcome, committed_stream=True)
            return TurnResult(turn, outcome)
        except Exception as exc:
            # A bug (ours or a hook's): the turn is still closed, as an error, and the
            # exception propagates so that it is seen.
            outcome = {"kind": "error", "error": {"message": repr(exc), "code": "INTERNAL_ERROR"}}
            await self._finish(turn, steps, outcome, committed_stream=True)
            raise
        except BaseException:
            # The caller was cancelled: the turn still ends.
            outcome = {"kind": "aborted", "reason": self._cause or {"kind": "user"}}
            await self._finish(turn, steps, outcome, committed_stream=True)
            raise
        if outcome is None:  # cancelled through self.cancel()
            outcome = {"kind": "aborted", "reason": self._cause or {"kind": "user"}}
        await self._finish(turn, steps, outcome, committed_stream=True)
        return TurnResult(turn, outcome)

    async def _finish(self, turn: int, steps: list[_Step], outcome: dict[str, Any], *, committed_stream: bool) -> None:
        """Close the open step and log ``turn/end`` (shielded: a turn is never left
        without its end while the session is live).

        If the session is no longer live, nothing can be logged: the turn is left
        open for crash repair to close on the next load, and the error propagates.
        """
        with trio.CancelScope(shield=True):
            if outcome["kind"] in ("aborted", "error") and steps:
                await self._close_step(turn, steps[-1], committed_stream=committed_stream)
            await self.session.append("turn/end", {"turn": turn, "reason": outcome})

    async def _run_step(self, turn: int, step: _Step) -> dict[str, Any] | None:
        """One step; returns the turn's end reason, or None to run another step."""
        s = self.session
        if self.checkpoint is not None:
            await self.checkpoint.at_step_boundary(s)
        await s.append("step/start", {"turn": turn, "step": step.step})
        await self._request_header()
        request = ModelRequest(
            session_id=s.id,
            provider=self.provider.name,
            model=self.provider.model,
            messages=await s.derive_messages(),
            tools=self.tools.specs,
            system=self.system,
            max_tokens=self.max_tokens,
        )
        if self.checkpoint is not None:
            await self.checkpoint.before_model_request(s)
        finish = await self._stream(turn, step, request)
        content: list[dict[str, Any]] = []
        for index in sorted({*step.texts, *step.reasoning}):
            if index in step.reasoning:
                content.append({"type": "reasoning", "text": "".join(step.reasoning[index])})
            if index in step.texts:
                content.append({"type": "text", "text": "".join(step.texts[index])})
        for call in step.calls:
            content.append({"type": "tool-call", "id": call["id"], "name": call["name"], "arguments": call["arguments"]})
        data: dict[str, Any] = {"turn": turn, "step": step.step, "message": _assistant_message(self.provider, content)}
        if step.usage is not None:
            data["usage"] = step.usage
        await s.append("assistant/message", data, surface_op="append")
        if step.calls:
            await self._run_tools(turn, step)
            await s.append("step/end", {"turn": turn, "step": step.step})
            return None
        await s.append("step/end", {"turn": turn, "step": step.step})
        return {"kind": "max-tokens"} if finish == "length" else {"kind": "completed"}

    async def _request_header(self) -> None:
        s = self.session
        header: dict[str, Any] = {"config": {"provider": self.provider.name, "model": self.provider.model}}
        if self.max_tokens is not None:
            header["config"]["maxTokens"] = self.max_tokens
        if self.system:
            header["system"] = self.system
        specs = self.tools.specs
        if specs:
            header["tools"] = [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in specs]
        previous = s.request_header()
        first = self._requests == 0
        self._requests += 1
        drafts = []
        if first:
            reason = "resume" if previous is not None else "initial"
            drafts.append(EventDraft("request/header", {"header": header, "reason": reason}))
        elif previous is None or not header_equals(previous, freeze(header)):
            drafts.append(EventDraft("request/header", {"header": header, "reason": "change"}))
        context = {"provider": self.provider.name, "model": self.provider.model}
        if self.provider.context_window is not None:
            context["contextWindow"] = self.provider.context_window  # type: ignore[assignment]
        last = s.request_context()
        if last is None or thaw(last) != context:
            drafts.append(EventDraft("request/context", context))
        if drafts:
            await s.append_batch(drafts)

    async def _stream(self, turn: int, step: _Step, request: ModelRequest) -> str:
        """Stream the reply into ``assistant/chunk`` events (appended in batches)."""
        pending: list[EventDraft] = []
        calls: dict[str, dict[str, Any]] = {}
        finish = "stop"

        async def flush_chunks() -> None:
            if pending:
                events = await self.session.append_batch(pending)
                step.chunk_seqs.extend(e.seq for e in events)
                pending.clear()

        step.streaming = True
        try:
            agen = self.provider.stream(request)
            try:
                while (chunk := await next_chunk(agen, self.provider.name)) is not None:
                    if isinstance(chunk, TextDelta):
                        step.texts.setdefault(chunk.index, []).append(chunk.text)
                        raw: dict[str, Any] = {"type": "text-delta", "index": chunk.index, "text": chunk.text}
                    elif isinstance(chunk, ReasoningDelta):
                        step.reasoning.setdefault(chunk.index, []).append(chunk.text)
                        raw = {"type": "reasoning-delta", "index": chunk.index, "text": chunk.text}
                    elif isinstance(chunk, ToolCallDelta):
                        call = calls.setdefault(chunk.id, {"id": chunk.id, "name": chunk.name, "arguments": ""})
                        if chunk.name is not None:
                            call["name"] = chunk.name
                        call["arguments"] += chunk.arguments_delta
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
                    if len(pending) >= self._chunk_batch:
                        await flush_chunks()
            finally:
                await close_stream(agen, grace=self.close_grace, who=f'agent "{self.id}"')
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
        step.calls = [c for c in calls.values() if c["name"]]
        return finish

    async def _run_tools(self, turn: int, step: _Step) -> None:
        s = self.session
        await s.append_batch(
            [
                EventDraft("tool/call", {"turn": turn, "step": step.step, "callId": c["id"], "name": c["name"], "arguments": c["arguments"]})
                for c in step.calls
            ]
        )

        async def run_one(call: dict[str, Any]) -> None:
            async with self._limiter:
                if self.checkpoint is not None:
                    await self.checkpoint.before_tool(s)
                tool = self.tools.get(call["name"])
                error: dict[str, str] | None = None
                if tool is None:
                    text, error = f"Error: unknown tool {call['name']!r}", {"name": "UnknownToolError", "code": "UNKNOWN_TOOL"}
                else:
                    try:
                        args = orjson.loads(call["arguments"] or "{}")
                        result = await tool.fn(args if isinstance(args, dict) else {"value": args})
                        text = result if isinstance(result, str) else orjson.dumps(result).decode()
                    except trio.Cancelled:
                        raise
                    except Exception as exc:
                        text = f"Error: {exc}"
                        error = {"name": type(exc).__name__, "code": getattr(exc, "code", "TOOL_FAILED")}
                await s.append("tool/result", _tool_result(turn, step.step, call["id"], text, error), surface_op="append")

        failures: list[Exception] = []

        async def guarded(call: dict[str, Any], cancel: trio.CancelScope) -> None:
            try:
                await run_one(call)
            except Exception as exc:
                # The runtime failed under a tool (a flush, a dead session): the
                # step cannot go on. Stop the siblings and report one typed error,
                # not an ExceptionGroup.
                failures.append(exc)
                cancel.cancel()

        async with trio.open_nursery() as nursery:
            for call in step.calls:
                nursery.start_soon(guarded, call, nursery.cancel_scope)
        if failures:
            raise failures[0]

    async def _close_step(self, turn: int, step: _Step | None, *, committed_stream: bool) -> None:
        """Close an interrupted step so the log stays balanced (runs shielded).

        What the step already logged is read from the log, not from the step's own
        bookkeeping: a message whose append was applied but whose reply never came
        back (``ReplyOverdueError``) is still a fact, and answering a call twice
        would break the log's invariants.
        """
        if step is None:
            return
        s = self.session
        logged = _logged_in_step(s, turn, step.step)
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
                    "message": _assistant_message(self.provider, content),
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
                    EventDraft("tool/result", _tool_result(turn, step.step, call["id"], text, {"name": "AbortError", "code": code}), "append")
                )
        drafts.append(EventDraft("step/end", {"turn": turn, "step": step.step}))
        await s.append_batch(drafts)


def _logged_in_step(s: SessionHandle, turn: int, step: int) -> tuple[bool, set[str], set[str]] | None:
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
        data: Any = ev.data  # shapes the invariants guarantee for these types
        if t == "step/start":
            return (message, calls, results) if (data["turn"], data["step"]) == (turn, step) else None
        if t in ("step/end", "turn/start", "turn/end"):
            return None
        if t == "assistant/message":
            message = True
        elif t == "tool/call":
            calls.add(data["callId"])
        elif t == "tool/result":
            results.update(
                b["toolCallId"] for b in data["message"]["content"] if b.get("type") == "tool-result"
            )
    return None


def _user_message(text: str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}


def _assistant_message(provider: ModelProvider, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "role": "assistant",
        "content": content,
        "source": {"kind": "model", "provider": provider.name, "model": provider.model},
    }


def _tool_result(turn: int, step: int, call_id: str, text: str, error: dict[str, str] | None) -> dict[str, Any]:
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
