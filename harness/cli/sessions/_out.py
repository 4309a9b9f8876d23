"""``harness sessions`` output: stdout as text or JSON, errors and progress on stderr,
colour and clipping only on a terminal."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import IO, TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    pass



_STYLES: Final = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}


class Out:
    """stdout (text or JSON) and stderr (errors, progress); colour only on a terminal."""

    def __init__(self, args: argparse.Namespace, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> None:
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.json = bool(getattr(args, "json", False))
        from harness.cli._output import text_width, use_color

        self.color = use_color(self.stdout, getattr(args, "color", "auto") or "auto")
        # Clipped to the terminal's width on a terminal only: a pipe gets every character.
        self.width = text_width(self.stdout, getattr(args, "width", None))

    def c(self, style: str, text: str) -> str:
        if not self.color or not text or not style:
            return text
        codes = ";".join(_STYLES[s] for s in style.split())
        return f"\x1b[{codes}m{text}\x1b[0m"

    def line(self, text: str = "") -> None:
        self.stdout.write(text + "\n")

    def emit(self, value: Any) -> None:
        import orjson

        self.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2, default=_json_default).decode() + "\n")

    def error(self, command: str, message: str, code: str) -> None:
        where = f"harness sessions {command}" if command else "harness sessions"
        self.stderr.write(f"{where}: error: {_one_line(message)} [{code}]\n")

    def warn(self, message: str) -> None:
        self.stderr.write(f"harness sessions: warning: {_one_line(message)}\n")


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _json_default(value: Any) -> Any:
    from harness.session import raw_of

    raw = raw_of(value)
    if raw is not value:
        return raw
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _clip(text: str, width: int) -> str:
    text = _one_line(text)
    return text if len(text) <= width else text[: max(width - 1, 1)] + "…"


class Progress:
    """Progress on stderr, only on a terminal: a Rich spinner with the step's label once
    a step has run for a short delay, or, while a command walks many sessions, the
    label on that walk's bar (:attr:`advance`). Erased when done."""

    DELAY: Final = 0.3

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.enabled = _isatty(stream)
        self.label = ""
        self.prefix = ""  # e.g. "[3/120] " while a command walks many sessions
        self.advance: Callable[..., None] | None = None

    @contextlib.contextmanager
    def walk(self, label: str, total: int) -> Iterator[Callable[..., None]]:
        """A bar over ``total`` sessions; the steps inside label it."""
        from harness.cli._output import progress

        with progress(self.stream, label, total) if self.enabled else contextlib.nullcontext(_ignore) as advance:
            self.advance = advance
            try:
                yield advance
            finally:
                self.advance = None

    @asynccontextmanager
    async def step(self, label: str) -> AsyncIterator[None]:
        import trio

        self.label = self.prefix + label
        if self.advance is not None:
            self.advance(0, label=self.label)
            yield
            return
        if not self.enabled:
            yield
            return

        async def show() -> None:
            from harness.cli._output import progress

            await trio.sleep(self.DELAY)
            with progress(self.stream, self.label, None):
                await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(show)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()


def _ignore(*_: object, **__: object) -> None:
    return None
