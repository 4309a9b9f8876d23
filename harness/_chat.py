"""`harness chat`: an interactive agent in the terminal, on the embedded defaults.

A JSONL store under a data directory, an agent loop with persistence, the DeepSeek
provider (or the offline scripted one), two read-only tools confined to a working
directory. Replies stream as they arrive; tool calls are shown as they run. Ctrl-C
cancels the running turn (recorded as aborted by the user); a second Ctrl-C exits,
after the session is flushed and closed.

``register(subparsers)`` adds the subcommand to an ``argparse`` parser and ``run(args)``
runs it (``python -m harness._chat`` works on its own too). Heavy imports happen in
``run``: registering the command costs nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TextIO

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from harness.agent import AgentHandle, Tool, ToolSet, TurnResult
    from harness.providers import ModelProvider, ModelRequest, StreamChunk
    from harness.runtime import Store

PROVIDERS: Final = ("deepseek", "scripted")
READ_LIMIT: Final = 200_000  # bytes of a file read_file returns
LIST_LIMIT: Final = 500  # entries list_dir returns

SYSTEM: Final = (
    "You are a helpful assistant in a terminal. You can read files and list directories "
    "inside the working directory {root} with the read_file and list_dir tools (paths are "
    "relative to it; nothing outside it can be read). Answer concisely."
)


def default_root() -> Path:
    """``$HARNESS_SESSIONS_ROOT`` (the default of ``harness sessions`` too), else
    ``$XDG_DATA_HOME/trio-harness/sessions`` (``~/.local/share`` without it)."""
    explicit = os.environ.get("HARNESS_SESSIONS_ROOT")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "trio-harness" / "sessions"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``chat`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); the
    parsed namespace carries ``chat_run`` (this module's :func:`run`)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "chat",
        help="an interactive agent in the terminal (DeepSeek, or --provider scripted offline)",
        description=(
            "Chat with an agent in the terminal. Sessions are stored as JSONL under --root and can "
            "be resumed (--resume ID) or forked at a turn boundary (--fork ID@SEQ). Ctrl-C cancels "
            "the running turn; a second Ctrl-C (or Ctrl-D, or /exit) exits."
        ),
    )
    p.add_argument("--root", default=None, help=f"session store directory (default: {default_root()})")
    p.add_argument("--provider", choices=PROVIDERS, default="deepseek", help="model provider (default: deepseek)")
    p.add_argument("--model", default=None, help="model name (default: deepseek-chat)")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (default: https://api.deepseek.com)")
    p.add_argument("--api-key-env", default="DEEPSEEK_API_KEY", help="environment variable holding the API key")
    p.add_argument("--workdir", "-C", default=None, help="directory the tools may read (default: the current one)")
    p.add_argument("--system", default=None, help="system prompt (default: a short one naming the tools)")
    p.add_argument("--max-tokens", type=int, default=None, help="maximum output tokens per reply")
    p.add_argument("--hide-reasoning", action="store_true", help="do not print the model's reasoning")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--session", metavar="ID", default=None, help="id for the new session (default: generated)")
    which.add_argument("--resume", metavar="ID", default=None, help="continue a stored session")
    which.add_argument("--fork", metavar="ID@SEQ", default=None, help="continue a copy of a session cut after event SEQ")
    which.add_argument("--list", action="store_true", help="list the stored sessions and exit")
    p.set_defaults(chat_run=run)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="harness")
    register(parser.add_subparsers(dest="command", required=True))
    sys.exit(run(parser.parse_args(argv)))


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
    import trio

    options = _Options(
        root=Path(args.root).expanduser() if args.root else default_root(),
        provider=provider,
        workdir=workdir,
        system=args.system,
        max_tokens=args.max_tokens,
        hide_reasoning=args.hide_reasoning,
        session=args.session,
        resume=args.resume,
        fork=fork,
        list_only=args.list,
    )
    return trio.run(_main, options, out, stdin_fd)


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
        self.tty = bool(getattr(out, "isatty", lambda: False)())
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
    model. ``ls [PATH]`` lists a directory, ``read PATH`` reads a file, ``slow`` streams
    for a while (try Ctrl-C), anything else is echoed; a tool result is summarized."""

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
        from harness.session import thaw

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
            parts: list[Any] = [Think("This will take a while.")]
            for i in range(1, 41):
                parts += [Say(f"{i}... "), Delay(0.25)]
            return [*parts, Say("done.")]
        return [
            Think("No model here: echo."),
            Say(f"You said: {text}\n(offline scripted provider: try `ls`, `read FILE` or `slow`; set DEEPSEEK_API_KEY for a model)"),
        ]


# -- the session ------------------------------------------------------------------------------------


class _Lines:
    """Lines from a file descriptor, read on a worker thread (no buffered ``sys.stdin``:
    a thread abandoned at exit must not hold its lock)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = b""
        self._eof = False

    async def readline(self) -> str | None:
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


class _Chat:
    """The conversation: reads prompts, runs turns, handles Ctrl-C."""

    def __init__(self, display: _Display, lines: _Lines, *, interactive: bool) -> None:
        import trio

        self.display = display
        self.lines = lines
        self.interactive = interactive
        self.handle: AgentHandle | None = None
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
            if self.interactive:
                self.display.write("you> ")
            line = await self.lines.readline()
            if line is None:
                if self.interactive:
                    self.display.write("\n")
                return
            self.exit_armed = False
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                return
            if text == "/help":
                self.display.line("/exit (or Ctrl-D) leaves; Ctrl-C cancels a running turn; /session shows the session")
                continue
            if text == "/session":
                self.display.line(f"session {handle.id}: {handle.session.seq} events, turn {handle.session.last_turn()}")
                continue
            await self.turn(handle, text)

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
    chat = _Chat(display, _Lines(stdin_fd), interactive=os.isatty(stdin_fd))
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
    from harness.agent import open_agent_loop
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
            async with (
                open_agent_loop(store, provider=_Shown(provider, display), tools=tools, persistence=persistence, system=system) as loop,
                Owner("chat") as owner,
            ):
                with chat.scope:
                    try:
                        if options.resume:
                            handle = await loop.resume(options.resume, owner=owner)
                            how = "resumed"
                        elif options.fork:
                            source, seq = options.fork
                            child = f"{source}-fork-{uuid.uuid4().hex[:6]}"
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
                display.line(f"session {handle.id} saved under {options.root}; continue with: harness chat --resume {handle.id}")
    except* HarnessError as group:
        for failure in group.exceptions:
            display.line(f"harness chat: {getattr(failure, 'code', 'ERROR')}: {failure}")
        status = 1
    finally:
        if not offline:
            await provider.aclose()
    return status


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
    announced (persistence writes it), flushed and detached."""
    source = await store.enter(await store.adopt(await persistence.read_session(sid)))
    try:
        branch = await store.fork(source, seq, child)
        try:
            await branch.flush()
        finally:
            await store.detach(branch)
    finally:
        await store.detach(source)


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
