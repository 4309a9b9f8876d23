"""The agent loop, the model-provider protocol, the scripted provider, tools and resume."""

from harness.agent._agent import Agent, AgentBusyError, AgentDisposedError, TurnResult
from harness.agent._loop import (
    AgentAlreadyRegisteredError,
    AgentHandle,
    AgentLoop,
    AgentLoopError,
    open_agent_loop,
)
from harness.agent._provider import (
    ContextWindowExceededError,
    Finish,
    ModelProvider,
    ModelRequest,
    ProviderError,
    RateLimitedError,
    ReasoningDelta,
    ScriptExhaustedError,
    StreamChunk,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from harness.agent._scripted import Call, Delay, Fail, Say, ScriptedProvider, Think, Truncated
from harness.agent._tools import Tool, ToolError, ToolSet, tool

__all__ = [
    "Agent",
    "AgentAlreadyRegisteredError",
    "AgentBusyError",
    "AgentDisposedError",
    "AgentHandle",
    "AgentLoop",
    "AgentLoopError",
    "Call",
    "ContextWindowExceededError",
    "Delay",
    "Fail",
    "Finish",
    "ModelProvider",
    "ModelRequest",
    "ProviderError",
    "RateLimitedError",
    "ReasoningDelta",
    "Say",
    "ScriptExhaustedError",
    "ScriptedProvider",
    "StreamChunk",
    "TextDelta",
    "Think",
    "Tool",
    "ToolCallDelta",
    "ToolError",
    "ToolSet",
    "ToolSpec",
    "Truncated",
    "TurnResult",
    "Usage",
    "open_agent_loop",
    "tool",
]
