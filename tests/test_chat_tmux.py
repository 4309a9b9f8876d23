"""``harness chat`` driven through a real terminal: tmux runs it on the offline scripted
provider, ``send-keys`` types (arrow keys, history, ``/compact``, Ctrl-C in the middle of
a reply, ``/exit``) and ``capture-pane`` reads the screen (issue 25).

No verdict depends on time: every step waits for the text it expects on the screen
with a bounded poll (a generous timeout only turns a hang into a failure), and the
reply interrupted by Ctrl-C streams for an hour unless cancelled. Skipped when tmux
is not installed (``python3 dev.py test`` installs it where it can: apt as root).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

TMUX = shutil.which("tmux")
pytestmark = [
    pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install tmux)"),
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX terminals"),
]
TIMEOUT = 90.0  # seconds a step may take before it counts as hung (not a speed verdict)


class Pane:
    """One tmux server (a private socket) with one window running a command."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def tmux(self, *args: str) -> str:
        assert TMUX is not None
        done = subprocess.run([TMUX, "-S", str(self.socket), *args], capture_output=True, text=True, timeout=60, check=True)
        return done.stdout

    def screen(self) -> str:
        # -J joins wrapped lines; -S - includes the scrollback.
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "chat")

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.tmux("send-keys", "-t", "chat", *(["-l"] if literal else []), *keys)

    def type(self, text: str) -> None:
        self.keys(text, literal=True)

    def wait_for(self, pattern: str, *, count: int = 1) -> str:
        """Poll the screen until ``pattern`` (a regex) shows ``count`` times."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            screen = self.screen()
            if len(re.findall(pattern, screen, re.M)) >= count:
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} x{count} never appeared; the screen:\n{screen}")
            time.sleep(0.1)


@pytest.fixture
def pane(tmp_path: Path) -> Iterator[Pane]:
    # A short socket path: AF_UNIX paths are limited to ~100 bytes.
    socket = Path("/tmp") / f"harness-tmux-{uuid.uuid4().hex[:8]}"
    p = Pane(socket)
    try:
        yield p
    finally:
        subprocess.run([str(TMUX), "-S", str(socket), "kill-server"], capture_output=True, timeout=60, check=False)
        socket.unlink(missing_ok=True)


def test_chat_in_a_terminal(tmp_path: Path, pane: Pane) -> None:
    root, work = tmp_path / "store", tmp_path / "project"
    work.mkdir()
    (work / "README.md").write_text("# Project\n" + "".join(f"Line {i} of a readme long enough to compact.\n" for i in range(60)))
    env = {
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "HARNESS_SESSIONS_ROOT": "",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "DEEPSEEK_API_KEY": "",
    }
    chat = [sys.executable, "-m", "harness.cli", "chat", "--provider", "scripted", "--root", str(root), "-C", str(work), "--new-id", "tty"]
    # The pane stays after the chat exits, showing its status.
    script = f"env {shlex.join(f'{k}={v}' for k, v in env.items())} {shlex.join(chat)}; echo \"[chat exited $?]\"; sleep 3600"
    pane.tmux("new-session", "-d", "-s", "chat", "-x", "160", "-y", "50", script)

    pane.wait_for(r"^you>")
    pane.type("hello")
    pane.keys("Enter")
    pane.wait_for(r"You said: hello")

    # Line editing: the cursor goes back with the left arrow and the "r" lands in front.
    pane.wait_for(r"^you>", count=2)
    pane.type("ead README.md")
    pane.keys(*["Left"] * len("ead README.md"))
    pane.type("r")
    pane.keys("Enter")
    pane.wait_for(r"The tool returned:")
    assert "^[[D" not in pane.screen()  # arrow keys edit, they are not echoed as escapes

    # History: up twice recalls "hello".
    pane.wait_for(r"^you>", count=3)
    pane.keys("Up", "Up")
    pane.wait_for(r"^you> hello$")
    pane.keys("Enter")
    pane.wait_for(r"You said: hello", count=2)

    # /compact runs the command (it was sent to the model as text).
    pane.wait_for(r"^you>", count=4)
    pane.type("/compact")
    pane.keys("Enter")
    pane.wait_for(r"Compacted \d+ history items")

    # Ctrl-C in the middle of a reply cancels the turn; the chat goes on.
    pane.wait_for(r"^you>", count=5)
    pane.type("slow 3600")
    pane.keys("Enter")
    pane.wait_for(r"3\.\.\. ")
    pane.keys("C-c")
    pane.wait_for(r"\[turn cancelled \(user\)\]")

    pane.wait_for(r"^you>", count=6)
    pane.type("/exit")
    pane.keys("Enter")
    screen = pane.wait_for(r"^\[chat exited \d+\]")
    assert "[chat exited 0]" in screen, screen
    assert re.search(r"continue with: harness chat --resume tty --root \S+ --provider scripted", screen), screen

    (log,) = root.rglob("session.jsonl")
    records = [orjson.loads(line) for line in log.read_bytes().splitlines()[1:]]
    users = [r["data"]["content"][0]["text"] for r in records if r["type"] == "user/message" and r["data"]["source"]["kind"] == "user"]
    assert users[:4] == ["hello", "read README.md", "hello", "slow 3600"], users
    assert [r["data"]["name"] for r in records if r["type"] == "command/run"] == ["compact"]
    ends = [r["data"]["reason"]["kind"] for r in records if r["type"] == "turn/end"]
    assert ends == ["completed", "completed", "completed", "aborted"], ends
    assert (tmp_path / "state" / "trio-harness" / "chat-history").read_text().count("hello") >= 2


def test_sessions_rm_asks_on_a_terminal(tmp_path: Path, pane: Pane) -> None:
    """`harness sessions rm ID` asks before deleting (it deleted at once): "n" keeps the
    session (exit 6), "y" deletes it."""
    root = tmp_path / "store"
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    made = subprocess.run(
        [sys.executable, "-m", "harness.cli", "chat", "--provider", "scripted", "--root", str(root), "--new-id", "victim"],
        input="hello\n", capture_output=True, text=True, timeout=120, env={**os.environ, **env}, check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    rm = shlex.join([sys.executable, "-m", "harness.cli", "sessions", "rm", "victim", "--root", str(root)])
    script = f"env {shlex.join(f'{k}={v}' for k, v in env.items())} {rm}; echo \"[rm exited $?]\"; " \
             f"env {shlex.join(f'{k}={v}' for k, v in env.items())} {rm}; echo \"[rm exited $?]\"; sleep 3600"
    pane.tmux("new-session", "-d", "-s", "chat", "-x", "200", "-y", "50", script)
    pane.wait_for(r'delete session "victim" \(.*\)\? \[y/N\]')
    pane.type("n")
    pane.keys("Enter")
    screen = pane.wait_for(r"^\[rm exited \d+\]")
    assert "[rm exited 6]" in screen and "NOT_CONFIRMED" in screen, screen
    assert list(root.rglob("victim/session.jsonl"))
    pane.wait_for(r'delete session "victim"', count=2)
    pane.type("y")
    pane.keys("Enter")
    screen = pane.wait_for(r"^\[rm exited \d+\]", count=2)
    assert screen.count("[rm exited 0]") == 1 and "deleted victim" in screen, screen
    assert not list(root.rglob("victim/session.jsonl"))
