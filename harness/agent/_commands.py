"""Slash commands and ``/compact`` (compaction reference §7.2).

A :class:`Commands` registry runs ``/name args`` lines against an agent and records
each run as a log-only pair: ``command/run {commandId, name, args?, source}`` before
the handler, ``command/done {commandId, kind, text?, sourceEventSeq?}`` after it,
whatever happens (the handler's result, its error's message, or the command's
cancelled text).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs
import trio

from harness.agent._agent import Agent
from harness.compaction._summarize import is_blank
from harness.errors import HarnessError, ManualCompactionError

if TYPE_CHECKING:
    from harness.agent._compaction import AgentCompaction


class CommandError(HarnessError):
    code = "COMMAND_ERROR"


class UnknownCommandError(CommandError):
    code = "UNKNOWN_COMMAND"


class CommandsClosedError(CommandError):
    code = "COMMANDS_CLOSED"


@attrs.frozen
class CommandResult:
    """What a command answers: ``kind`` ``success`` or ``error``, a text for the user,
    and the seq of the event it produced, when one stands for it."""

    kind: Literal["success", "error"]
    text: str | None = None
    source_event_seq: int | None = None


@attrs.frozen
class CommandInvocation:
    agent: Agent
    command_id: str
    name: str
    raw_input: str  # everything after the command's name


CommandHandler = Callable[[CommandInvocation], Awaitable[CommandResult]]


@attrs.frozen
class Command:
    name: str
    description: str
    handler: CommandHandler
    cancelled_text: str = "Command cancelled."


def parse_command(line: str) -> tuple[str, str]:
    """``"/compact now"`` -> ``("compact", " now")``: the name, and the raw suffix.
    Whitespace is JavaScript's (``String.prototype.trim``), as the reference's."""
    start = next((i for i, ch in enumerate(line) if not is_blank(ch)), len(line))
    text = line[start:]
    if not text.startswith("/") or len(text) == 1 or is_blank(text[1]):
        raise CommandError(f"not a command: {line!r} (commands look like /name)")
    body = text[1:]
    end = next((i for i, ch in enumerate(body) if is_blank(ch)), len(body))
    return body[:end], body[end:]


class Commands:
    """A registry of slash commands. :meth:`aclose` unregisters every command, then
    waits for the handlers already running (including their close and flush)."""

    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}
        self._running = 0
        self._settled = trio.Event()
        self._settled.set()
        self._closed = False

    def register(
        self, name: str, description: str, handler: CommandHandler, *, cancelled_text: str = "Command cancelled."
    ) -> Callable[[], None]:
        """Register ``/name``; return the function that unregisters it."""
        if not name or any(ch.isspace() for ch in name) or name.startswith("/"):
            raise ValueError(f"command name must be a non-empty word without '/', got {name!r}")
        if name in self._commands:
            raise ValueError(f"command /{name} is already registered")
        command = Command(name, description, handler, cancelled_text)
        self._commands[name] = command

        def unregister() -> None:
            if self._commands.get(name) is command:
                del self._commands[name]

        return unregister

    def list(self) -> tuple[Command, ...]:
        return tuple(self._commands.values())

    async def run(self, agent: Agent, line: str, *, command_id: str | None = None) -> CommandResult:
        """Run one command line against ``agent`` and return its result.

        An unknown command raises :class:`UnknownCommandError` and writes nothing.
        Otherwise ``command/run`` is appended, the handler runs, and ``command/done``
        records its result; a handler that raises records ``{kind: error, text:
        message}`` and the error propagates.

        Cancellation: cancelled before ``command/run`` landed, nothing happened. After,
        the handler is cancelled, ``command/done {kind: error, text: <the command's
        cancelled text>}`` is appended (shielded), and ``Cancelled`` propagates.
        """
        if self._closed:
            raise CommandsClosedError("commands are closed", session_id=agent.id)
        name, args = parse_command(line)
        command = self._commands.get(name)
        if command is None:
            raise UnknownCommandError(f"unknown command /{name}", session_id=agent.id)
        command_id = command_id or str(uuid.uuid4())
        record: dict[str, Any] = {"commandId": command_id, "name": name}
        if args:
            record["args"] = args
        record["source"] = {"kind": "user"}
        # Counted before the first checkpoint: aclose() waits for every run that got
        # past its closed check, including one still appending its command/run.
        self._running += 1
        if self._running == 1:
            self._settled = trio.Event()
        try:
            await agent.session.append("command/run", record)
            try:
                result = await command.handler(CommandInvocation(agent, command_id, name, args))
            except Exception as exc:
                await self._done(agent, command_id, CommandResult("error", str(exc)))
                raise
            except BaseException:
                # Cancellation, however it arrives (a bare Cancelled or a group of them
                # from a nursery below): the run is still answered in the log.
                await self._done(agent, command_id, CommandResult("error", command.cancelled_text))
                raise
            await self._done(agent, command_id, result)
            return result
        finally:
            self._running -= 1
            if self._running == 0:
                self._settled.set()

    @staticmethod
    async def _done(agent: Agent, command_id: str, result: CommandResult) -> None:
        data: dict[str, Any] = {"commandId": command_id, "kind": result.kind}
        if result.text is not None:
            data["text"] = result.text
        if result.source_event_seq is not None:
            data["sourceEventSeq"] = result.source_event_seq
        # Shielded: a command that ran is always answered in the log while it lives.
        with trio.CancelScope(shield=True):
            await agent.session.append("command/done", data)

    async def aclose(self) -> None:
        """Unregister every command, then wait for running handlers to settle.

        Cancellation: only the wait is cancelled."""
        self._closed = True
        self._commands.clear()
        await self._settled.wait()


#: The texts ``/compact`` answers with, per manual compaction kind (§7.2).
COMPACT_TEXTS: Final[dict[str, str]] = {
    "busy": "Compaction is unavailable because this process has an active compaction, or the agent is not idle.",
    "cancelled": "Compaction cancelled.",
    "changed": "The history selected for compaction changed before it could be replaced. "
    "The conversation is unchanged; the attempt is recorded in the session log.",
    "summary": "Compaction could not produce a useful summary. "
    "The conversation is unchanged; the attempt is recorded in the session log.",
    "commit": "Compaction did not finish cleanly; some session history may have changed. "
    "Inspect the current session state before retrying.",
    "persistence": "Compaction finished, but the session could not be saved.",
}


def compact_command(compaction: AgentCompaction) -> CommandHandler:
    """The ``/compact`` handler: no arguments; manual compaction of the agent."""

    async def handler(invocation: CommandInvocation) -> CommandResult:
        if not is_blank(invocation.raw_input):  # the reference's rawInput.trim()
            return CommandResult("error", "Usage: /compact (no arguments)")
        try:
            result = await compaction.compact_now(invocation.agent, source_command_id=invocation.command_id)
        except ManualCompactionError as exc:
            return CommandResult("error", COMPACT_TEXTS[exc.kind])
        if result is None:
            return CommandResult("success", "No compactable history yet.")
        return CommandResult(
            "success",
            f"Compacted {len(result.shadowed_seqs)} history items (~{result.shadowed_token_count} tokens).",
            result.summary_seq,
        )

    return handler


def install_compact_command(commands: Commands, compaction: AgentCompaction) -> Callable[[], None]:
    """Register ``/compact`` (``Compact older conversation history``)."""
    return commands.register(
        "compact", "Compact older conversation history", compact_command(compaction), cancelled_text="Compaction cancelled."
    )
