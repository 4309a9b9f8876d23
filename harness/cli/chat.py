"""`harness chat`: an interactive agent in the terminal, on the embedded defaults.

A JSONL store under a data directory, an agent loop with persistence, the DeepSeek
provider (or the offline scripted one), two read-only tools confined to a working
directory. Replies stream as they arrive; tool calls are shown as they run. Ctrl-C
cancels the running turn (recorded as aborted by the user); a second Ctrl-C exits,
after the session is flushed and closed.

``command()`` is the Click command and ``run(args)`` runs it (``python -m
harness.cli.chat`` works on its own too). Heavy imports happen in ``run``: building
the command costs nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TextIO

from harness.cli._output import default_root
from harness.errors import HarnessError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from harness.agent import AgentHandle, Tool, ToolSet, TurnResult
    from harness.providers import ModelProvider, ModelRequest, StreamChunk
    from harness.runtime import Store

PROVIDERS: Final = ("deepseek", "scripted")
DEFAULT_KEY_ENV: Final = "DEEPSEEK_API_KEY"
READ_LIMIT: Final = 200_000  # bytes of a file read_file returns
LIST_LIMIT: Final = 500  # entries list_dir returns

SYSTEM: Final = (
    "You are a helpful assistant in a terminal. You can read files and list directories "
    "inside the working directory {root} with the read_file and list_dir tools (paths are "
    "relative to it; nothing outside it can be read). Answer concisely."
)


def command() -> Any:
    """The ``harness chat`` Click command; it runs :func:`run` on the parsed options."""
    import click

    from harness.cli._output import CONTEXT

    @click.command("chat", context_settings=CONTEXT)
    @click.option("--root", metavar="DIR", default=None, help=f"session store directory (a JSONL root; default: {default_root()})")
    @click.option("--provider", type=click.Choice(PROVIDERS), default="deepseek", show_default=True, help="model provider")
    @click.option("--model", default=None, help="model name (default: deepseek-chat)")
    @click.option("--base-url", default=None, metavar="URL", help="OpenAI-compatible endpoint (default: https://api.deepseek.com)")
    @click.option("--api-key-env", default=DEFAULT_KEY_ENV, metavar="VAR", show_default=True, help="environment variable holding the API key")
    @click.option("--workdir", "-C", default=None, metavar="DIR", help="directory the tools may read (default: the current one)")
    @click.option("--system", default=None, help="system prompt (default: a short one naming the tools)")
    @click.option("--max-tokens", type=int, default=None, metavar="N", help="maximum output tokens per reply")
    @click.option("--hide-reasoning", is_flag=True, help="do not print the model's reasoning")
    @click.option("--new-id", "new_id", metavar="ID", default=None, help="id of the session this creates (new, or the --fork child; not a stored one: --resume continues that; default: generated)")
    @click.option("--session", "session_alias", metavar="ID", default=None, hidden=True)
    @click.option("--resume", metavar="ID", default=None, help="continue a stored session")
    @click.option("--fork", metavar="ID@SEQ", default=None, help="continue a copy of a session cut after event SEQ")
    @click.option("--list", "list_", is_flag=True, help="list the stored sessions and exit")
    def chat(**values: Any) -> None:
        """Chat with an agent in the terminal. Sessions are stored as JSONL under --root
        and can be resumed (--resume ID) or forked at a turn boundary (--fork ID@SEQ).
        Line editing and history on a terminal; /help lists the commands. Ctrl-C cancels
        the running turn; a second Ctrl-C (or Ctrl-D, or /exit) exits."""
        new_id = values.pop("new_id") or values.pop("session_alias")
        values.pop("session_alias", None)
        chosen = [flag for flag, given in (("--resume", values["resume"]), ("--fork", values["fork"]), ("--list", values["list_"])) if given]
        if new_id is not None and values["resume"] is not None:
            chosen.append("--new-id")
        if len(chosen) > 1:
            raise click.UsageError(f"{' and '.join(chosen)} do not go together")
        list_only = values.pop("list_")
        args = argparse.Namespace(**values, list=list_only, session=new_id)
        raise SystemExit(run(args))

    return chat


def main(argv: list[str] | None = None) -> None:
    """``python -m harness.cli.chat ARGS``: ``harness chat ARGS``."""
    from harness.cli._output import run_alone

    run_alone(command(), ["chat", *(sys.argv[1:] if argv is None else argv)])


def run(args: argparse.Namespace, *, stdout: TextIO | None = None, stdin_fd: int = 0) -> int:
    """Run ``harness chat``; return the exit status (0, 1: the session could not be
    opened, 2: bad arguments or no API key)."""
    out = stdout or sys.stdout
    err = sys.stderr
    if args.max_tokens is not None and args.max_tokens <= 0:
        print("harness chat: --max-tokens must be a positive integer", file=err)
        return 2
    fork: tuple[str, int] | None = None
    if args.fork is not None:
        sid, at, seq = args.fork.rpartition("@")
        if not at or not sid or not seq.isdigit():
            print(f"harness chat: --fork expects ID@SEQ (a session id and an event seq), got {args.fork!r}", file=err)
            return 2
        fork = (sid, int(seq))
    workdir = Path(args.workdir).expanduser().resolve() if args.workdir else None
    if workdir is not None and not workdir.is_dir():
        print(f"harness chat: --workdir {args.workdir!r} is not a directory", file=err)
        return 2
    provider: Any = None
    if args.provider == "deepseek" and not args.list:
        import attrs

        from harness.providers import DEEPSEEK, OpenAICompatibleProvider

        endpoint = attrs.evolve(DEEPSEEK, api_key_env=args.api_key_env)
        provider = OpenAICompatibleProvider(endpoint, model=args.model, base_url=args.base_url)
        if not provider.has_api_key:
            print(
                f"harness chat: no API key. Set {args.api_key_env} to your DeepSeek API key:\n\n"
                f"    export {args.api_key_env}=sk-...\n\n"
                "(keys: https://platform.deepseek.com/api_keys), or try it offline:\n\n"
                "    harness chat --provider scripted",
                file=err,
            )
            return 2
    root = Path(args.root).expanduser() if args.root else default_root()
    from harness._paths import blocking_file

    blocked = blocking_file(root)
    if blocked is not None:
        # As `harness sessions` refuses a file that is not a store: the chat's is a
        # JSONL directory (it would otherwise write nothing, or fail at the first flush).
        print(f'harness chat: NOT_A_STORE: "{blocked}" is not a directory: --root names a JSONL store directory', file=err)
        return 2
    import trio

    options = _Options(
        root=root,
        provider=provider,
        workdir=workdir,
        system=args.system,
        max_tokens=args.max_tokens,
        hide_reasoning=args.hide_reasoning,
        session=args.session,
        resume=args.resume,
        fork=fork,
        list_only=args.list,
        again=_again(args),
    )
    return trio.run(_main, options, out, stdin_fd)


def _again(args: argparse.Namespace) -> tuple[str, ...]:
    """The options a later ``harness chat --resume ID`` needs to find the session and
    talk to the same provider: an absolute ``--root`` unless it is the default, and
    the provider options that were given."""
    extra: list[str] = []
    if args.root is not None:
        root = Path(args.root).expanduser().resolve()
        if root != default_root().expanduser().resolve():
            extra += ["--root", str(root)]
    if args.provider != "deepseek":
        extra += ["--provider", args.provider]
    for flag, value, default in (
        ("--base-url", args.base_url, None),
        ("--model", args.model, None),
        ("--api-key-env", args.api_key_env, DEFAULT_KEY_ENV),
    ):
        if value is not None and value != default and args.provider == "deepseek":
            extra += [flag, value]
    return tuple(extra)


def continue_command(session_id: str, again: tuple[str, ...]) -> str:
    """The shell command that continues ``session_id``, quoted for a POSIX shell."""
    import shlex

    return shlex.join(["harness", "chat", "--resume", session_id, *again])


class _Options(NamedTuple):
    root: Path
    provider: Any  # an OpenAICompatibleProvider; None: the offline one
    workdir: Path | None
    system: str | None
    max_tokens: int | None
    hide_reasoning: bool
    session: str | None
    resume: str | None
    fork: tuple[str, int] | None
    list_only: bool
    again: tuple[str, ...] = ()  # options the "continue with" command repeats


# -- the workspace and its tools --------------------------------------------------------------------


class Workspace:
    """The directory the tools may read; every path is resolved (symlinks followed)
    and refused unless it stays inside."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def resolve(self, path: object) -> Path:
        from harness.agent import ToolError

        if not isinstance(path, str) or not path or "\x00" in path:
            raise ToolError("path must be a non-empty string")
        candidate = Path(path).expanduser()
        real = (candidate if candidate.is_absolute() else self.root / candidate).resolve()
        if real != self.root and not real.is_relative_to(self.root):
            raise ToolError(f"{path!r} is outside the working directory {self.root}")
        return real

    def shown(self, path: Path) -> str:
        return "." if path == self.root else str(path.relative_to(self.root))


def workspace_tools(ws: Workspace) -> list[Tool]:
    """``read_file`` and ``list_dir``, confined to ``ws`` (file I/O on worker threads)."""
    import trio

    from harness.agent import ToolError, tool

    @tool(
        "read_file",
        "Read a text file inside the working directory.",
        {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "file path, relative to the working directory"}},
            "required": ["path"],
        },
    )
    async def read_file(args: dict[str, Any]) -> Any:
        target = ws.resolve(args.get("path"))

        def work() -> str:
            if not target.exists():
                raise ToolError(f"{ws.shown(target)}: no such file")
            if not target.is_file():
                raise ToolError(f"{ws.shown(target)}: not a regular file")
            size = target.stat().st_size
            with open(target, "rb") as f:
                data = f.read(READ_LIMIT)
            if b"\x00" in data[:8192]:
                return f"[{ws.shown(target)} is a binary file of {size} bytes]"
            text = data.decode("utf-8", errors="replace")
            if size > len(data):
                text += f"\n[truncated: showing the first {len(data)} of {size} bytes]"
            return text

        return await trio.to_thread.run_sync(work)

    @tool(
        "list_dir",
        "List a directory inside the working directory (directories end with /).",
        {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "directory path, relative to the working directory (default .)"}},
        },
    )
    async def list_dir(args: dict[str, Any]) -> Any:
        target = ws.resolve(args.get("path") or ".")

        def work() -> str:
            if not target.is_dir():
                raise ToolError(f"{ws.shown(target)}: not a directory")
            entries = sorted(target.iterdir(), key=lambda e: e.name)
            lines = []
            for entry in entries[:LIST_LIMIT]:
                if entry.is_dir():
                    lines.append(entry.name + "/")
                else:
                    try:
                        lines.append(f"{entry.name}  ({entry.stat().st_size} bytes)")
                    except OSError:
                        lines.append(entry.name)
            if len(entries) > LIST_LIMIT:
                lines.append(f"[{len(entries) - LIST_LIMIT} more entries not shown]")
            return "\n".join(lines) if lines else "[empty directory]"

        return await trio.to_thread.run_sync(work)

    return [read_file, list_dir]


# -- the display ------------------------------------------------------------------------------------


class _Display:
    """Writes what happens, as it happens: reasoning (dim on a terminal), text, tool
    calls and their outcome, how each turn ended."""

    def __init__(self, out: TextIO, *, hide_reasoning: bool) -> None:
        self.out = out
        from harness.cli._output import use_color

        self.tty = use_color(out)  # dim only on a terminal, and never with NO_COLOR
        self.hide_reasoning = hide_reasoning
        self._mode: str | None = None  # "reasoning" | "text" while a reply streams

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.tty else text

    def line(self, text: str) -> None:
        self.end_reply()
        self.write(text + "\n")

    def chunk(self, chunk: StreamChunk) -> None:
        from harness.providers import ReasoningDelta, TextDelta

        if isinstance(chunk, ReasoningDelta) and not self.hide_reasoning:
            if self._mode != "reasoning":
                self.end_reply()
                self.write(self.dim("(thinking) "))
                self._mode = "reasoning"
            self.write(self.dim(chunk.text))
        elif isinstance(chunk, TextDelta):
            if self._mode != "text":
                self.end_reply()
                self._mode = "text"
            self.write(chunk.text)

    def end_reply(self) -> None:
        if self._mode is not None:
            self.write("\n")
            self._mode = None

    def tool_start(self, name: str, args: dict[str, Any]) -> None:
        shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
        self.line(f"  -> {name}({shown})")

    def tool_end(self, name: str, result: str | None, error: BaseException | None) -> None:
        if error is not None:
            self.line(f"  <- {name} failed: {error}")
        else:
            n = len(result or "")
            self.line(f"  <- {name}: {n} characters")

    def turn_end(self, result: TurnResult, seq: int, usage: tuple[int, int] | None) -> None:
        self.end_reply()
        kind = result.kind
        if kind == "aborted":
            self.line(f"[turn cancelled ({result.reason.get('reason', {}).get('kind', 'user')})]")
        elif kind == "error":
            error = result.reason.get("error", {})
            status = f" {error['status']}" if "status" in error else ""
            self.line(f"[error {error.get('code')}{status}: {error.get('message')}]")
        elif kind == "max-tokens":
            self.line("[stopped: the reply reached the max-tokens limit]")
        tokens = f" · {usage[0]} in / {usage[1]} out tokens" if usage else ""
        self.line(self.dim(f"(turn {result.turn} {kind} · seq {seq}{tokens})"))


class _Shown:
    """The provider, with every chunk shown as it streams."""

    def __init__(self, inner: ModelProvider, display: _Display) -> None:
        self.inner = inner
        self.display = display
        self.name = inner.name
        self.model = inner.model
        self.context_window = inner.context_window

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return _ShownStream(self.inner.stream(request), self.display)


class _ShownStream:
    def __init__(self, inner: AsyncIterator[StreamChunk], display: _Display) -> None:
        self._inner = inner
        self._display = display

    def __aiter__(self) -> _ShownStream:
        return self

    async def __anext__(self) -> StreamChunk:
        chunk = await self._inner.__anext__()
        self._display.chunk(chunk)
        return chunk

    async def aclose(self) -> None:
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()


def _shown_tools(tools: list[Tool], display: _Display) -> ToolSet:
    import trio

    from harness.agent import Tool, ToolSet

    def wrap(t: Tool) -> Tool:
        async def fn(args: dict[str, Any]) -> Any:
            display.tool_start(t.name, args)
            try:
                result = await t.fn(args)
            except trio.Cancelled:
                display.tool_end(t.name, None, RuntimeError("cancelled"))
                raise
            except Exception as exc:
                display.tool_end(t.name, None, exc)
                raise
            display.tool_end(t.name, result if isinstance(result, str) else str(result), None)
            return result

        return Tool(t.name, t.description, fn, t.parameters)

    return ToolSet([wrap(t) for t in tools])


# -- the offline provider ---------------------------------------------------------------------------


class OfflineProvider:
    """``--provider scripted``: the scripted provider, answering from rules instead of a
    model. ``ls [PATH]`` lists a directory, ``read PATH`` reads a file, ``slow [SECONDS]``
    streams for a while (try Ctrl-C), anything else is echoed; a tool result is
    summarized, and a ``/compact`` summary lists what the user said."""

    def __init__(self) -> None:
        from harness.agent import ScriptedProvider

        self._inner = ScriptedProvider([], model="offline-1", delta_size=4)
        self.name = self._inner.name
        self.model = self._inner.model
        self.context_window = self._inner.context_window

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self._inner.extend([self._reply(request)])
        return self._inner.stream(request)

    def _reply(self, request: ModelRequest) -> list[Any]:
        from harness.agent import Call, Delay, Say, Think
        from harness.compaction._summarize import PURPOSE
        from harness.session import thaw

        if request.purpose == PURPOSE:  # /compact: a short summary of what the user said
            said = [
                str(b.get("text", ""))
                for m in map(thaw, request.messages[:-1])
                if m.get("role") == "user"
                for b in m.get("content") or []
                if b.get("type") == "text"
            ]
            return [Say(("The user said: " + "; ".join(said))[:120])]
        last: Any = thaw(request.messages[-1]) if request.messages else {}
        blocks = last.get("content") or []
        results = [b for b in blocks if b.get("type") == "tool-result"]
        if results:
            text = "".join(str(c.get("text", "")) for c in results[0].get("content") or [])
            head = text if len(text) <= 400 else text[:400] + " ..."
            return [Say(f"The tool returned:\n{head}")]
        text = " ".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text").strip()
        word, _, rest = text.partition(" ")
        rest = rest.strip()
        if word in ("ls", "list"):
            return [Think(f"List {rest or '.'}."), Call("list_dir", {"path": rest or "."})]
        if word in ("read", "cat") and rest:
            return [Think(f"Read {rest}."), Call("read_file", {"path": rest})]
        if word == "slow":
            # `slow [SECONDS]` (default 10): a reply long enough to press Ctrl-C in.
            seconds = min(int(rest), 86_400) if rest.isdigit() else 10
            parts: list[Any] = [Think("This will take a while.")]
            for i in range(1, seconds * 4 + 1):
                parts += [Say(f"{i}... "), Delay(0.25)]
            return [*parts, Say("done.")]
        return [
            Think("No model here: echo."),
            Say(f"You said: {text}\n(offline scripted provider: try `ls`, `read FILE` or `slow`; set DEEPSEEK_API_KEY for a model)"),
        ]


# -- the session ------------------------------------------------------------------------------------


class _Lines:
    """Lines from a file descriptor, read on a worker thread (no buffered ``sys.stdin``:
    a thread abandoned at exit must not hold its lock). Used when stdin is not a
    terminal (piped prompts)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = b""
        self._eof = False

    async def readline(self) -> str | None:
        """The next line, ``None`` at the end of input. Cancellation: the read's thread
        is abandoned (it ends with the process)."""
        import trio

        while b"\n" not in self._buf and not self._eof:
            data = await trio.to_thread.run_sync(os.read, self.fd, 65536, abandon_on_cancel=True)
            if not data:
                self._eof = True
            self._buf += data
        if not self._buf:
            return None
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8", errors="replace").rstrip("\r")


class PromptInterrupted(Exception):
    """Ctrl-C typed at the prompt (the terminal is in raw mode there: no SIGINT)."""


def history_path() -> Path:
    """The chat's line history: ``$XDG_STATE_HOME/trio-harness/chat-history``
    (``~/.local/state`` without it); outside the store root, which holds sessions only."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "trio-harness" / "chat-history"


class PromptLines:
    """Lines typed at a terminal with prompt_toolkit: line editing (arrow keys, Emacs
    keys), history across runs (up/down, Ctrl-R). prompt_toolkit runs its own asyncio
    loop, so each prompt runs on a worker thread; Trio waits for it."""

    def __init__(self, message: str, *, input: Any = None, output: Any = None) -> None:
        """``input``/``output``: prompt_toolkit's (default: the terminal's; tests pass a
        pipe input and a dummy output)."""
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory

        self.message = message
        path = history_path()
        history: Any
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            history = FileHistory(str(path))
        except OSError:  # a read-only home: history for this run only
            history = InMemoryHistory()
        self.session: Any = PromptSession(history=history, input=input, output=output)

    async def readline(self) -> str | None:
        """The next line; ``None`` on Ctrl-D; :class:`PromptInterrupted` on Ctrl-C.

        Cancellation: the prompt is told to exit (its application is asked to stop on
        its own loop, so the terminal leaves raw mode) and its thread is abandoned."""
        import trio

        def work() -> str | None:
            try:
                line: str = self.session.prompt(self.message)
            except EOFError:
                return None
            except KeyboardInterrupt:
                raise PromptInterrupted() from None
            return line

        try:
            return await trio.to_thread.run_sync(work, abandon_on_cancel=True)
        except trio.Cancelled:
            self._stop()
            raise

    def _stop(self) -> None:
        app = self.session.app
        loop = getattr(app, "loop", None)
        if app.is_running and loop is not None:

            def exit_prompt() -> None:
                if app.is_running and not app.future.done():
                    app.exit(exception=EOFError())

            loop.call_soon_threadsafe(exit_prompt)


class _Chat:
    """The conversation: reads prompts, runs turns and slash commands, handles Ctrl-C."""

    def __init__(self, display: _Display, lines: _Lines | PromptLines, *, interactive: bool) -> None:
        import trio

        self.display = display
        self.lines = lines
        self.interactive = interactive
        self.handle: AgentHandle | None = None
        self.commands: Any = None  # the loop's Commands, once the loop runs
        self.running = False
        self.exit_armed = False
        self.leaving = False
        # Around opening the session and the prompt loop; made now so that a Ctrl-C
        # before it is entered still cancels it.
        self.scope = trio.CancelScope()

    def interrupt(self) -> None:
        """Ctrl-C: cancel the running turn; with none running (or the second time),
        leave."""
        if self.leaving:
            self.display.line("(exiting: saving the session...)")
            return
        if self.running and self.handle is not None and not self.handle.agent.cancel_requested():
            self.handle.agent.cancel("user")
            self.exit_armed = True
            self.display.line("^C cancelling the turn (Ctrl-C again to exit)")
            return
        if self.exit_armed:
            self.leave()
            return
        self.exit_armed = True
        self.display.line("^C (Ctrl-C again, Ctrl-D or /exit to exit)")

    def leave(self) -> None:
        self.leaving = True
        self.scope.cancel()

    async def prompts(self, handle: AgentHandle) -> None:
        self.handle = handle
        while True:
            if self.interactive and isinstance(self.lines, _Lines):
                self.display.write("you> ")
            try:
                line = await self.lines.readline()
            except PromptInterrupted:
                self.interrupt()
                if self.leaving:
                    return
                continue
            if line is None:
                if self.interactive and isinstance(self.lines, _Lines):
                    self.display.write("\n")
                return
            self.exit_armed = False
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                return
            if text.startswith("/") and len(text) > 1 and not text[1].isspace():
                await self.command(handle, text)
                continue
            await self.turn(handle, text)

    async def command(self, handle: AgentHandle, text: str) -> None:
        """A slash command, through the loop's ``Commands`` (logged as
        ``command/run``/``command/done``); an unknown one is answered here and nothing
        is sent to the model or written."""
        from harness.agent import UnknownCommandError

        self.running = True
        try:
            result = await self.commands.run(handle.agent, text)
        except UnknownCommandError:
            name = text[1:].split(maxsplit=1)[0]
            self.display.line(f"unknown command /{name}; /help lists the commands")
            return
        except HarnessError as exc:  # the handler failed; command/done recorded it
            self.display.line(f"/{text[1:].split(maxsplit=1)[0]} failed: {exc.code}: {exc}")
            return
        finally:
            self.running = False
        if result.text:
            self.display.line(result.text if result.kind == "success" else f"error: {result.text}")

    async def turn(self, handle: AgentHandle, text: str) -> None:
        self.running = True
        try:
            result = await handle.run_turn(text)
        finally:
            self.running = False
        seq, usage = _turn_facts(handle, result.turn)
        self.display.turn_end(result, seq, usage)


def _turn_facts(handle: AgentHandle, turn: int) -> tuple[int, tuple[int, int] | None]:
    """The seq of ``turn``'s ``turn/end`` (a fork boundary) and its summed usage."""
    from harness.session import thaw

    seq = handle.session.seq - 1
    tokens_in = tokens_out = 0
    seen = False
    for e in reversed(list(handle.session.events)):
        data: Any = thaw(e.data) if e.type in ("turn/end", "assistant/message", "turn/start") else None
        if e.type == "turn/end" and data.get("turn") == turn:
            seq = e.seq
        elif e.type == "assistant/message" and data.get("turn") == turn and "usage" in data:
            tokens_in += int(data["usage"].get("inputTokens", 0))
            tokens_out += int(data["usage"].get("outputTokens", 0))
            seen = True
        elif e.type == "turn/start" and data.get("turn") == turn:
            break
    return seq, (tokens_in, tokens_out) if seen else None


async def _watch_signals(signals: AsyncIterator[Any], chat: _Chat) -> None:
    async for _ in signals:
        chat.interrupt()


async def _main(options: _Options, out: TextIO, stdin_fd: int) -> int:
    import signal

    import trio

    display = _Display(out, hide_reasoning=options.hide_reasoning)
    interactive = os.isatty(stdin_fd)
    # Line editing and history when a person types at a terminal (stdin and stdout);
    # anything else reads plain lines.
    editing = interactive and stdin_fd == 0 and out.isatty() and not options.list_only
    lines: _Lines | PromptLines = PromptLines("you> ") if editing else _Lines(stdin_fd)
    chat = _Chat(display, lines, interactive=interactive)
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_signals, signals, chat)
            try:
                return await _session(options, display, chat)
            finally:
                nursery.cancel_scope.cancel()


async def _session(options: _Options, display: _Display, chat: _Chat) -> int:
    import uuid

    from actors import Owner
    from harness.agent import AgentCompaction, open_agent_loop
    from harness.demo import make_private_dirs
    from harness.errors import HarnessError
    from harness.persistence import JsonlBackend, open_persistence
    from harness.runtime import open_store
    from harness.session import RelationalInvariants

    make_private_dirs(options.root)  # owner-only, as the backend creates its own directories
    workspace = Workspace(options.workdir or Path.cwd())
    offline = options.provider is None
    provider: Any = OfflineProvider() if offline else options.provider
    tools = _shown_tools(workspace_tools(workspace), display)
    status = 0
    try:
        async with (
            open_store(validator_factory=RelationalInvariants) as store,
            open_persistence(store, JsonlBackend(options.root)) as persistence,
        ):
            if options.list_only:
                await _list(persistence, display)
                return 0
            if options.resume or options.fork:
                # A resumed session keeps its working directory unless one is given.
                source = options.resume or (options.fork[0] if options.fork else "")
                headers = {h.get("id"): h for h in await persistence.list()}
                stored = _directory(headers.get(source, {}).get("cwd"))
                if options.workdir is None and stored is not None:
                    workspace.root = stored
            system = options.system or SYSTEM.format(root=workspace.root)
            handle: AgentHandle | None = None
            # /compact summarizes with the provider itself (not the shown one: a summary is
            # not a reply to print).
            compaction = AgentCompaction(summary_provider=provider)
            async with (
                open_agent_loop(
                    store, provider=_Shown(provider, display), tools=tools, persistence=persistence, system=system, compaction=compaction
                ) as loop,
                Owner("chat") as owner,
            ):
                chat.commands = loop.commands
                install_chat_commands(loop.commands, store, options)
                with chat.scope:
                    try:
                        if options.session is not None and not options.resume:
                            await _refuse_stored(persistence, options.session, options.again)
                        if options.resume:
                            handle = await loop.resume(options.resume, owner=owner)
                            how = "resumed"
                        elif options.fork:
                            source, seq = options.fork
                            child = options.session or f"{source}-fork-{uuid.uuid4().hex[:6]}"
                            await _fork(store, persistence, source, seq, child)
                            handle = await loop.resume(child, owner=owner)
                            how = f"forked from {source} after seq {seq}"
                        else:
                            handle = await loop.create(options.session or _new_id(), owner=owner, cwd=str(workspace.root))
                            how = "new"
                    except HarnessError as exc:
                        display.line(f"harness chat: cannot open the session: {exc.code}: {exc}")
                        return 1
                    if options.max_tokens is not None:
                        handle.agent.max_tokens = options.max_tokens
                    where = "offline scripted provider" if offline else f"{provider.name}/{provider.model}"
                    display.line(f"session {handle.id} ({how}) · {where} · tools read {workspace.root}")
                    if chat.interactive:
                        display.line(display.dim("Ctrl-C cancels a reply, Ctrl-C twice or Ctrl-D exits, /help"))
                    await chat.prompts(handle)
                chat.leaving = True
            if handle is not None:
                display.line(f"session {handle.id} saved under {options.root}; continue with: {continue_command(handle.id, options.again)}")
    except* HarnessError as group:
        for failure in group.exceptions:
            display.line(f"harness chat: {getattr(failure, 'code', 'ERROR')}: {failure}")
        status = 1
    finally:
        if not offline:
            await provider.aclose()
    return status


EXIT_COMMANDS: Final = ("exit", "quit")
"""Handled by the prompt loop itself (they end it); listed by /help."""


def install_chat_commands(commands: Any, store: Store, options: _Options) -> None:
    """Register ``/session``, ``/fork`` and ``/help`` beside the loop's ``/compact``:
    every slash command of the chat runs through ``Commands`` and is logged."""
    from harness.agent import CommandInvocation, CommandResult

    async def session(invocation: CommandInvocation) -> CommandResult:
        s = invocation.agent.session
        return CommandResult("success", f"session {s.id}: {s.seq} events, turn {s.last_turn()}, stored under {options.root}")

    async def fork(invocation: CommandInvocation) -> CommandResult:
        words = invocation.raw_input.split()
        agent = invocation.agent
        if len(words) > 2 or (words and not words[0].isdigit()):
            return CommandResult("error", "Usage: /fork [SEQ [NEW_ID]] (SEQ: a turn's end seq; default: the last)")
        seq = int(words[0]) if words else agent.session.seq - 1
        child = words[1] if len(words) == 2 else f"{agent.session.id}-fork-{_hex(6)}"
        branch = await store.fork(agent.session, seq, child)
        try:
            await branch.flush()
        finally:
            await store.detach(branch)
        return CommandResult("success", f"forked {child} after seq {seq}; continue it with: {continue_command(child, options.again)}")

    async def help_(invocation: CommandInvocation) -> CommandResult:
        rows = [(f"/{c.name}", c.description) for c in commands.list()]
        rows += [("/exit, /quit", "Leave (as Ctrl-D); the session is saved")]
        width = max(len(name) for name, _ in rows)
        keys = "Ctrl-C cancels a running reply; Ctrl-C twice or Ctrl-D exits; up/down: history"
        return CommandResult("success", "\n".join([*(f"{n.ljust(width)}  {d}" for n, d in rows), keys]))

    commands.register("session", "Show the session: id, events, turn, store", session)
    commands.register("fork", "Store a copy of this session cut after SEQ (default: now): /fork [SEQ [NEW_ID]]", fork)
    commands.register("help", "List the commands", help_)


def _hex(n: int) -> str:
    import uuid

    return uuid.uuid4().hex[:n]


def _directory(path: object) -> Path | None:
    """``path`` resolved, if it names an existing directory."""
    return Path(path).resolve() if isinstance(path, str) and Path(path).is_dir() else None


def _new_id() -> str:
    import time
    import uuid

    return time.strftime("chat-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]


async def _fork(store: Store, persistence: Any, sid: str, seq: int, child: str) -> None:
    """Store a new session ``child``: the stored session ``sid`` cut after event
    ``seq``. The source is read without its lock (it may be open elsewhere) and entered
    in the store without being announced, so nothing of it is written; the child is
    announced (persistence writes it), flushed and detached. ``seq`` must be in the
    *stored* log, as for ``harness sessions fork``: the end-seed a load adds is not."""
    from harness.cli.sessions._write import stored_fork_boundary

    await stored_fork_boundary(persistence, sid, seq)
    source = await store.enter(await store.adopt(await persistence.read_session(sid)))
    try:
        branch = await store.fork(source, seq, child)
        try:
            await branch.flush()
        finally:
            await store.detach(branch)
    finally:
        await store.detach(source)


async def _refuse_stored(persistence: Any, sid: str, again: tuple[str, ...]) -> None:
    """``--new-id ID`` (a new session, or the ``--fork`` child) names an id that is not
    stored yet: a stored one is refused here, before anything is created (it failed at
    the first flush, as an id collision)."""
    from harness.errors import PersistedSessionNotFoundError, SessionAlreadyExistsError

    try:
        await persistence.read_from(sid, 0)
    except PersistedSessionNotFoundError:
        return
    except HarnessError as exc:  # stored, but its log does not read
        raise SessionAlreadyExistsError(
            f'session "{sid}" already exists ({exc.code}); pick another --new-id', session_id=sid
        ) from exc
    raise SessionAlreadyExistsError(
        f'session "{sid}" already exists; continue it with --resume: {continue_command(sid, again)}', session_id=sid
    )


async def _list(persistence: Any, display: _Display) -> None:
    import time

    headers = sorted(await persistence.list(), key=lambda h: h.get("createdAt", 0))
    if not headers:
        display.line("no stored sessions")
    for h in headers:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(h.get("createdAt", 0) / 1000))
        parent = f"  (fork of {h['parentSession']})" if h.get("parentSession") else ""
        display.line(f"{h.get('id')}  {when}  {h.get('cwd') or ''}{parent}")


if __name__ == "__main__":
    main()
