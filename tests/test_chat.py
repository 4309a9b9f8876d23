"""`harness chat`: piped stdin and a pseudo-terminal, against the fake OpenAI server."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from harness.agent import ToolError
from harness.cli.chat import Workspace, default_root, workspace_tools
from tests.fake_openai import FakeOpenAI, Stream, call_events, chunk, fake_openai, text_events

KEY = "sk-chat-test-secret-42"
REPO = Path(__file__).resolve().parent.parent


def chat_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPSEEK_API_KEY", "HARNESS_SESSIONS_ROOT", "NO_COLOR")}
    env.update({"XDG_DATA_HOME": str(tmp_path / "xdg"), "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1", "NO_PROXY": "*"})
    env.update(extra)
    return env


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli", "chat", *args]


class Chat:
    """A ``harness chat`` child process with piped stdin and stdout (stderr merged)."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.out = ""

    async def expect(self, pattern: str, within: float = 15) -> re.Match[str]:
        assert self.proc.stdout is not None
        with trio.fail_after(within):
            while (m := re.search(pattern, self.out)) is None:
                data = await self.proc.stdout.receive_some(65536)
                if not data:
                    raise AssertionError(f"no {pattern!r} before the output ended:\n{self.out}")
                self.out += data.decode(errors="replace")
        return m

    async def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(text.encode())

    async def finish(self, within: float = 20) -> int:
        """Close stdin (EOF), read the rest of the output, return the exit status."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        await self.proc.stdin.aclose()
        with trio.fail_after(within):
            while data := await self.proc.stdout.receive_some(65536):
                self.out += data.decode(errors="replace")
            return await self.proc.wait()


async def start(tmp_path: Path, *args: str, key: str | None = KEY) -> Chat:
    env = chat_env(tmp_path, **({"DEEPSEEK_API_KEY": key} if key else {}))
    proc = await trio.lowlevel.open_process(
        command(*args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=str(tmp_path)
    )
    return Chat(proc)


async def run_chat(tmp_path: Path, stdin: str, *args: str) -> tuple[int, str]:
    chat = await start(tmp_path, *args)
    await chat.send(stdin)
    code = await chat.finish()
    return code, chat.out


def stored(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Every stored session under ``root``: its records (the header line dropped)."""
    out = {}
    for path in root.rglob("session.jsonl"):
        lines = path.read_bytes().splitlines()
        out[path.parent.name] = [orjson.loads(line) for line in lines[1:] if line.strip()]
    return out


def everything_under(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "project"
    (wd / "src").mkdir(parents=True)
    (wd / "README.md").write_text("# Project\nA readme.\n")
    (wd / "src" / "main.py").write_text("print('hi')\n")
    (tmp_path / "secret.txt").write_text("TOP-SECRET-CONTENT")
    return wd


# -- arguments and the missing key ----------------------------------------------------------------


def test_without_an_api_key_it_says_how_to_set_one(tmp_path: Path) -> None:
    done = subprocess.run(command(), env=chat_env(tmp_path), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "export DEEPSEEK_API_KEY=sk-..." in done.stderr and "harness chat --provider scripted" in done.stderr
    other = subprocess.run(command("--api-key-env", "MY_KEY"), env=chat_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert other.returncode == 2 and "export MY_KEY=" in other.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fork", "nope"], "--fork expects ID@SEQ"),
        (["--max-tokens", "0"], "--max-tokens must be a positive integer"),
        (["--workdir", "/does/not/exist"], "is not a directory"),
    ],
)
def test_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    done = subprocess.run(command(*args), env=chat_env(tmp_path, DEEPSEEK_API_KEY=KEY), capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and message in done.stderr


def test_the_chat_command_parses_into_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import harness.cli.chat
    from harness.cli import main

    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(harness.cli.chat, "run", lambda args: seen.append(args) or 0)

    def harness(*argv: str) -> int | str | None:
        with pytest.raises(SystemExit) as exit_:
            main(list(argv))
        return exit_.value.code

    assert harness("chat", "--provider", "scripted", "--resume", "abc", "--root", str(tmp_path)) == 0
    (args,) = seen
    assert (args.provider, args.resume, args.root, args.session) == ("scripted", "abc", str(tmp_path), None)
    # --new-id names the new session; --session is its old, hidden spelling.
    assert harness("chat", "--new-id", "n1") == 0 and seen[-1].session == "n1"
    assert harness("chat", "--session", "n2") == 0 and seen[-1].session == "n2"
    assert "--session" not in capsys.readouterr().out
    assert harness("chat", "--resume", "a", "--fork", "a@1") == 2  # one of them
    assert "Usage: harness chat" in capsys.readouterr().err
    monkeypatch.delenv("HARNESS_SESSIONS_ROOT", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_root() == tmp_path / "data" / "trio-harness" / "sessions"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_root() == Path.home() / ".local" / "share" / "trio-harness" / "sessions"
    monkeypatch.setenv("HARNESS_SESSIONS_ROOT", str(tmp_path / "shared"))
    assert default_root() == tmp_path / "shared"


# -- the tools --------------------------------------------------------------------------------------


async def test_the_tools_stay_inside_the_working_directory(workdir: Path, tmp_path: Path) -> None:
    ws = Workspace(workdir)
    read, listing = (t.fn for t in workspace_tools(ws))
    assert await read({"path": "README.md"}) == "# Project\nA readme.\n"
    assert await read({"path": str(workdir / "src" / "main.py")}) == "print('hi')\n"
    assert await listing({}) == "README.md  (20 bytes)\nsrc/"
    assert await listing({"path": "src"}) == "main.py  (12 bytes)"
    (workdir / "escape").symlink_to(tmp_path / "secret.txt")
    (workdir / "inside").symlink_to(workdir / "README.md")
    assert (await read({"path": "inside"})).startswith("# Project")
    for bad in ["../secret.txt", str(tmp_path / "secret.txt"), "escape", "src/../../secret.txt", "/etc/passwd", "~/x", "", None, 3]:
        with pytest.raises(ToolError):
            await read({"path": bad})
    with pytest.raises(ToolError, match="outside the working directory"):
        await listing({"path": ".."})
    with pytest.raises(ToolError, match="not a regular file"):
        await read({"path": "src"})
    with pytest.raises(ToolError, match="no such file"):
        await read({"path": "missing.txt"})
    with pytest.raises(ToolError, match="not a directory"):
        await listing({"path": "README.md"})
    (workdir / "big.txt").write_text("x" * 300_000)
    assert (await read({"path": "big.txt"})).endswith("[truncated: showing the first 200000 of 300000 bytes]")
    (workdir / "blob.bin").write_bytes(b"\x00\x01" * 10)
    assert await read({"path": "blob.bin"}) == "[blob.bin is a binary file of 20 bytes]"


# -- piped stdin against the fake server ------------------------------------------------------------


async def test_a_piped_chat_streams_runs_tools_and_persists(tmp_path: Path, workdir: Path) -> None:
    script = [
        Stream(text_events("Hello! I can read files.", reasoning="Greet the user.", pieces=6), split=9),
        Stream(call_events([("c1", "list_dir", '{"path": "."}'), ("c2", "read_file", '{"path": "README.md"}'), ("c3", "read_file", '{"path": "../secret.txt"}')])),
        Stream(text_events("The README says: Project.")),
    ]
    root = tmp_path / "store"
    async with fake_openai(script) as server:
        code, out = await run_chat(tmp_path, "hi\nwhat is in the readme?\n", "--root", str(root), "--base-url", server.base_url, "-C", str(workdir))
    assert code == 0, out
    sid = re.search(r"session (\S+) \(new\) · deepseek/deepseek-chat", out)
    assert sid is not None, out
    assert "(thinking) Greet the user.\nHello! I can read files.\n" in out
    assert "-> list_dir(path='.')" in out and "-> read_file(path='README.md')" in out
    assert "<- read_file: 20 characters" in out
    assert "<- read_file failed: '../secret.txt' is outside the working directory" in out
    assert "The README says: Project." in out
    assert re.search(r"\(turn 2 completed · seq \d+ · 22 in / 14 out tokens\)", out), out
    assert f"continue with: harness chat --resume {sid[1]}" in out
    # The model saw the tool results, never the secret; the key went only into the header.
    third = server.requests[2].body["messages"]
    tool_messages = {m["tool_call_id"]: m["content"] for m in third if m["role"] == "tool"}
    assert tool_messages["c2"] == "# Project\nA readme.\n"
    assert "outside the working directory" in tool_messages["c3"]
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    assert b"TOP-SECRET" not in orjson.dumps([r.body for r in server.requests])
    logs = stored(root)
    assert list(logs) == [sid[1]]
    ends = [r["data"]["reason"]["kind"] for r in logs[sid[1]] if r["type"] == "turn/end"]
    assert ends == ["completed", "completed"]
    assert KEY.encode() not in everything_under(root)


async def test_resume_and_fork(tmp_path: Path, workdir: Path) -> None:
    root = str(tmp_path / "store")
    async with fake_openai([Stream(text_events("first answer")), Stream(text_events("second answer"))]) as server:
        code, out = await run_chat(tmp_path, "question one\nquestion two\n", "--root", root, "--base-url", server.base_url, "-C", str(workdir), "--session", "talk")
    assert code == 0, out
    first_end = re.search(r"\(turn 1 completed · seq (\d+)", out)
    assert first_end is not None, out

    async with fake_openai([Stream(text_events("resumed answer"))]) as server:
        code, out = await run_chat(tmp_path, "question three\n", "--root", root, "--base-url", server.base_url, "--resume", "talk")
        assert code == 0, out
        assert "session talk (resumed)" in out and f"tools read {workdir}" in out  # the stored working directory
        sent = [m["content"] for m in server.requests[0].body["messages"] if m["role"] != "system"]
        assert sent == ["question one", "first answer", "question two", "second answer", "question three"]
        assert re.search(r"\(turn 3 completed", out)

    talk_log = next(Path(root).rglob("talk/session.jsonl"))
    before = talk_log.read_bytes()
    async with fake_openai([Stream(text_events("branch answer"))]) as server:
        code, out = await run_chat(tmp_path, "another question two\n", "--root", root, "--base-url", server.base_url, "--fork", f"talk@{first_end[1]}")
        assert code == 0, out
        fork = re.search(r"session (talk-fork-\w+) \(forked from talk after seq (\d+)\)", out)
        assert fork is not None and fork[2] == first_end[1], out
        sent = [m["content"] for m in server.requests[0].body["messages"] if m["role"] != "system"]
        assert sent == ["question one", "first answer", "another question two"]
        assert re.search(r"\(turn 2 completed", out)

    assert talk_log.read_bytes() == before  # the source of a fork is only read
    logs = stored(Path(root))
    assert set(logs) == {"talk", fork[1]}
    ends = [r["data"]["turn"] for r in logs["talk"] if r["type"] == "turn/end"]
    assert ends == [1, 2, 3]

    code, out = await run_chat(tmp_path, "", "--root", root, "--list")
    assert code == 0 and "talk " in out and f"{fork[1]} " in out and "(fork of talk)" in out
    # --new-id names the fork's child (it was always minted).
    code, out = await run_chat(tmp_path, "", "--root", root, "--fork", f"talk@{first_end[1]}", "--new-id", "named-branch", "--provider", "scripted")
    assert code == 0 and "session named-branch (forked from talk" in out, out
    code, out = await run_chat(tmp_path, "", "--root", root, "--resume", "nobody", "--provider", "scripted")
    assert code == 1 and "cannot open the session: SESSION_NOT_FOUND" in out
    code, out = await run_chat(tmp_path, "", "--root", root, "--fork", "talk@3", "--provider", "scripted")
    assert code == 1 and "OPEN_TURN" in out


async def test_fork_past_the_stored_log_is_refused_as_by_sessions_fork(tmp_path: Path) -> None:
    """--fork ID@SEQ accepted the seq one past the stored log (the end-seed a load adds
    but never writes), storing a child `harness sessions verify` failed with
    LINEAGE_MISMATCH; its message said "(last seq: N+1)". Now the bound and message are
    `harness sessions fork`'s."""
    from harness.cli.sessions import run as sessions

    root = tmp_path / "store"
    code, out = await run_chat(tmp_path, "hi\n", "--provider", "scripted", "--root", str(root), "--new-id", "c1")
    assert code == 0, out
    end = re.search(r"\(turn 1 completed · seq (\d+)", out)
    assert end is not None, out
    last = int(end[1])
    tail = stored(root)["c1"][-1]
    assert (tail["type"], tail["seq"]) == ("turn/end", last)  # the last stored record
    before = everything_under(root)
    code, out = await run_chat(tmp_path, "", "--root", str(root), "--provider", "scripted", "--fork", f"c1@{last + 1}")
    assert code == 1, out
    assert f'INVALID_BOUNDARY: fork boundary {last + 1} does not exist in session "c1" (last stored seq: {last})' in out, out
    assert everything_under(root) == before and set(stored(root)) == {"c1"}  # no child
    assert await trio.to_thread.run_sync(sessions, ["sessions", "--root", str(root), "verify"]) == 0
    code, out = await run_chat(tmp_path, "", "--root", str(root), "--provider", "scripted", "--fork", f"c1@{last}", "--new-id", "c2")
    assert code == 0 and "session c2 (forked from c1" in out, out
    assert await trio.to_thread.run_sync(sessions, ["sessions", "--root", str(root), "verify"]) == 0


async def test_new_id_of_a_stored_session_and_a_file_as_root_are_refused_at_start(tmp_path: Path) -> None:
    """--new-id naming a stored session printed "(new)", failed the turn with FLUSH_FAILED
    (an id collision), claimed "saved" and ended with PERSISTENCE_CLOSE_FAILED (with no
    input: exit 0 and "saved"); a regular file as --root was taken too. Both are now
    refused before anything is created, in one line."""
    root = tmp_path / "store"
    code, out = await run_chat(tmp_path, "hi\n", "--provider", "scripted", "--root", str(root), "--new-id", "c1")
    assert code == 0, out
    before = everything_under(root)
    hint = f"continue it with --resume: harness chat --resume c1 --root {root} --provider scripted"
    for stdin in ("hi\n", ""):
        code, out = await run_chat(tmp_path, stdin, "--provider", "scripted", "--root", str(root), "--new-id", "c1")
        assert code == 1, out
        assert out.splitlines() == [f'harness chat: cannot open the session: SESSION_ALREADY_EXISTS: session "c1" already exists; {hint}'], out
        assert everything_under(root) == before
    # The --fork child too.
    code, out = await run_chat(tmp_path, "", "--provider", "scripted", "--root", str(root), "--fork", "c1@3", "--new-id", "c1")
    assert code == 1 and "SESSION_ALREADY_EXISTS" in out and "(new)" not in out, out
    assert everything_under(root) == before
    plain = tmp_path / "file"
    plain.write_bytes(b"not a store")
    for where, extra in ((plain, ()), (plain / "below", ()), (plain, ("--list",))):
        with trio.fail_after(30):
            done = await trio.run_process(
                command("--provider", "scripted", "--root", str(where), *extra),
                env=chat_env(tmp_path), capture_stdout=True, capture_stderr=True, stdin=b"", check=False,
            )
        err = done.stderr.decode()
        assert done.returncode == 2, done.stdout.decode() + err
        assert done.stdout == b"" and err == f'harness chat: NOT_A_STORE: "{plain}" is not a directory: --root names a JSONL store directory\n'
    assert plain.read_bytes() == b"not a store"


async def test_ctrl_c_cancels_the_turn_and_a_second_one_exits(tmp_path: Path, workdir: Path) -> None:
    # The server streams forever and ignores the client going away.
    script = [Stream([chunk(content="counting: ")], done=False, end="endless", delay=0.02)]
    root = tmp_path / "store"
    async with fake_openai(script) as server:
        chat = await start(tmp_path, "--root", str(root), "--base-url", server.base_url, "-C", str(workdir), "--session", "c")
        await chat.send("count forever\n")
        await chat.expect(r"la3 ")
        chat.proc.send_signal(signal.SIGINT)
        await chat.expect(r"\[turn cancelled \(user\)\]")
        await chat.expect(r"\(turn 1 aborted · seq \d+\)")
        with trio.fail_after(5):
            await server.conns[0].gone.wait()  # the stream was closed, not left running
        chat.proc.send_signal(signal.SIGINT)
        with trio.fail_after(20):
            code = await chat.proc.wait()
        await chat.expect(r"session c saved")
    assert code == 0, chat.out
    records = stored(root)["c"]
    end = next(r for r in records if r["type"] == "turn/end")
    assert end["data"]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
    interrupted = next(r for r in records if r["type"] == "assistant/message")
    assert interrupted["data"]["interrupted"] and interrupted["data"]["message"]["content"][0]["text"].startswith("counting: la1")


async def test_ctrl_c_at_the_prompt_then_eof(tmp_path: Path) -> None:
    chat = await start(tmp_path, "--provider", "scripted", "--root", str(tmp_path / "store"), "--session", "idle")
    await chat.expect(r"session idle \(new\)")
    chat.proc.send_signal(signal.SIGINT)
    await chat.expect(r"Ctrl-C again, Ctrl-D or /exit to exit")
    await chat.send("ls\n")  # a line disarms the exit
    await chat.expect(r"\(turn 1 completed")
    assert await chat.finish() == 0
    assert "session idle saved" in chat.out


async def test_the_offline_scripted_provider(tmp_path: Path, workdir: Path) -> None:
    code, out = await run_chat(tmp_path, "hello\nls src\nread README.md\n/session\n/exit\nnot reached\n", "--provider", "scripted", "-C", str(workdir), "--hide-reasoning")
    assert code == 0, out
    assert "You said: hello" in out and "(thinking)" not in out
    assert "The tool returned:\nmain.py  (12 bytes)" in out
    assert "The tool returned:\n# Project" in out
    assert re.search(r"session \S+: \d+ events, turn 3", out)
    assert "not reached" not in out
    assert list((tmp_path / "xdg" / "trio-harness" / "sessions").rglob("session.jsonl"))  # the default root


# -- a pseudo-terminal ------------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX pseudo-terminals")
async def test_a_terminal_session_with_ctrl_c(tmp_path: Path) -> None:
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()

    def controlling_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the pty becomes the child's terminal: ^C is SIGINT

    script = [Stream([chunk(reasoning="let me count"), chunk(content="counting: ")], done=False, end="endless", delay=0.02)]
    out = b""
    async with fake_openai(script) as server:
        proc = await trio.lowlevel.open_process(
            command("--root", str(tmp_path / "store"), "--session", "tty", "--base-url", server.base_url),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=chat_env(tmp_path, TERM="dumb", DEEPSEEK_API_KEY=KEY),
            start_new_session=True,
            preexec_fn=controlling_terminal,
        )
        os.close(slave)
        stream = trio.lowlevel.FdStream(master)

        async def expect(pattern: bytes) -> None:
            nonlocal out
            with trio.fail_after(15):
                while not re.search(pattern, out):
                    try:
                        out += await stream.receive_some(65536)
                    except trio.BrokenResourceError:  # EIO: the child closed the terminal
                        raise AssertionError(out.decode(errors="replace")) from None

        try:
            await expect(rb"you> ")
            await stream.send_all(b"count\n")
            await expect(rb"la3 ")
            await stream.send_all(b"\x03")  # Ctrl-C, through the terminal's line discipline
            await expect(rb"\[turn cancelled \(user\)\]")
            await expect(rb"you> ")
            with trio.fail_after(5):
                await server.conns[0].gone.wait()
            await stream.send_all(b"\x03")  # the second Ctrl-C: exit
            await expect(rb"session tty saved")
            with trio.fail_after(15):
                await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
            await stream.aclose()
    assert proc.returncode == 0
    assert b"\x1b[2m(thinking) \x1b[0m\x1b[2mlet me count" in out  # dim reasoning on a terminal
    records = stored(tmp_path / "store")["tty"]
    assert [r["data"]["reason"]["kind"] for r in records if r["type"] == "turn/end"] == ["aborted"]


def test_fake_server_is_loopback_only() -> None:
    assert FakeOpenAI().base_url.startswith("http://127.0.0.1:")


# -- issue 25: slash commands through Commands, the continue hint ----------------------------------


async def test_slash_commands_run_through_commands_and_unknown_ones_stay_local(tmp_path: Path, workdir: Path) -> None:
    """`/compact`, `/session`, `/help` run through the loop's `Commands` (logged as
    command/run + command/done); `/bogus` is answered here and never reaches the model
    (it was sent as a prompt: "You said: /bogus")."""
    root = tmp_path / "store"
    lines = "read README.md\nread README.md\nhello\n/bogus\n/help\n/compact\n/session\n"
    code, out = await run_chat(tmp_path, lines, "--provider", "scripted", "--root", str(root), "-C", str(workdir), "--new-id", "s")
    assert code == 0, out
    assert "unknown command /bogus; /help lists the commands" in out and "You said: /bogus" not in out
    for name in ("/compact", "/session", "/fork", "/help", "/exit"):
        assert re.search(rf"^{re.escape(name)}\b", out, re.M), (name, out)
    assert re.search(r"Compacted \d+ history items", out), out
    records = stored(root)["s"]
    runs = [r["data"]["name"] for r in records if r["type"] == "command/run"]
    assert runs == ["help", "compact", "session"]
    assert len([r for r in records if r["type"] == "command/done"]) == 3
    assert not [r for r in records if r["type"] == "user/message" and "/bogus" in orjson.dumps(r).decode()]


async def test_the_continue_hint_works_as_printed(tmp_path: Path, workdir: Path) -> None:
    """The printed `continue with: ...` command resumes the session as printed: it
    names the store root and the provider (it said `harness chat --resume ID` only,
    which looked in the default root and asked for a DeepSeek key)."""
    import shlex

    root = tmp_path / "elsewhere"
    code, out = await run_chat(tmp_path, "hello\n", "--provider", "scripted", "--root", str(root), "-C", str(workdir))
    assert code == 0, out
    hint = re.search(r"continue with: (.+)$", out, re.M)
    assert hint is not None, out
    argv = shlex.split(hint.group(1))
    assert argv[:3] == ["harness", "chat", "--resume"]
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", *argv[1:]], input="again\n", capture_output=True, text=True, timeout=120,
        env=chat_env(tmp_path), check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"session {argv[3]} (resumed)" in done.stdout and "You said: again" in done.stdout
