"""The chat's prompt (prompt_toolkit on a worker thread, awaited by Trio): lines,
Ctrl-D, Ctrl-C at the prompt, history on disk, and cancellation, which must make the
prompt itself exit (its thread would otherwise keep the terminal in raw mode).

Driven through prompt_toolkit's pipe input; every wait is on an observable state
(the application running, the thread done), bounded only against a hang."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from harness.cli.chat import PromptInterrupted, PromptLines, history_path

TIMEOUT = 60.0  # against a hang only


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def pipe() -> Iterator[object]:
    with create_pipe_input() as inp:
        yield inp


async def _until(predicate: object) -> None:
    """Wait, in real time and bounded, for a state another thread reaches."""
    with trio.fail_after(60):
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110 (a state of another thread: no event to wait on)
            await trio.sleep(0.01)


async def test_lines_eof_and_ctrl_c_at_the_prompt(state: Path, pipe: object) -> None:
    lines = PromptLines("you> ", input=pipe, output=DummyOutput())
    pipe.send_text("hello\r")  # type: ignore[attr-defined]
    assert await lines.readline() == "hello"
    pipe.send_text("\x03")  # type: ignore[attr-defined]  # Ctrl-C: a key in raw mode
    with pytest.raises(PromptInterrupted):
        await lines.readline()
    pipe.send_text("\x04")  # type: ignore[attr-defined]  # Ctrl-D on an empty line
    assert await lines.readline() is None
    assert history_path() == state / "trio-harness" / "chat-history"
    assert "+hello" in history_path().read_text()


async def test_a_cancelled_prompt_exits(state: Path, pipe: object) -> None:
    lines = PromptLines("you> ", input=pipe, output=DummyOutput())
    app = lines.session.app
    caught: list[bool] = []
    cancelled = trio.CancelScope()

    async def read() -> None:
        with cancelled:
            await lines.readline()
        caught.append(cancelled.cancelled_caught)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await _until(lambda: app.is_running)
        cancelled.cancel()
    assert caught == [True]
    # The abandoned thread's prompt was told to exit: the application stops running.
    await _until(lambda: not app.is_running)
