"""Issue 16, the command line: every ``harness`` command given fuzzed arguments exits
with one of its documented codes and a message, never a traceback; ``harness sessions``
runs for real over a store holding sessions, ``harness chat`` in a subprocess on the
offline provider, and the heavy commands (``bench``, ``chaos``, ``demo``) are fuzzed up
to the point where they would start running."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import harness
from harness import cli
from harness.agent import Say, ScriptedProvider
from harness.fuzz import budget, explored

pytestmark = pytest.mark.fuzz

SESSIONS_EXIT_CODES = set(range(8))  # the documented 0..7 of `harness sessions`
HARNESS = Path(sys.executable).with_name("harness")


async def _write_store(target: Path, backend: str) -> None:
    provider = ScriptedProvider([[Say("one")], [Say("two")]])
    async with harness.open_runtime(target, backend=backend, provider=provider) as rt:
        for sid in ("alpha", "b/eta"):
            agent = await rt.create(sid, cwd="/work")
            assert (await agent.run_turn("hi")).kind == "completed"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("cli-stores")
    out = {"jsonl": base / "tree", "sqlite": base / "db.sqlite"}
    for backend, target in out.items():
        trio.run(_write_store, target, backend)
    return out


@contextlib.contextmanager
def _captured() -> Iterator[list[str]]:
    """stdout and stderr as text streams with a binary ``buffer`` (the CLI writes
    both ways); yields a list that receives stderr's text on exit."""
    out, err = io.BytesIO(), io.BytesIO()
    wrapped_out = io.TextIOWrapper(out, encoding="utf-8", errors="backslashreplace", write_through=True)
    wrapped_err = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True)
    result: list[str] = []
    try:
        with contextlib.redirect_stdout(wrapped_out), contextlib.redirect_stderr(wrapped_err):
            yield result
    finally:
        wrapped_err.flush()
        result.append(err.getvalue().decode("utf-8", "replace"))
        wrapped_out.detach()
        wrapped_err.detach()


def _run_cli(argv: list[str]) -> tuple[int, str]:
    """``harness ARGV`` in this process: its exit code and stderr. Anything but
    ``SystemExit`` escaping is the failure this file looks for."""
    with _captured() as captured:
        try:
            cli.main(argv)
        except SystemExit as exc:
            code = exc.code
        else:
            code = 0
    text = captured[0]
    assert "Traceback" not in text, text
    if code is None:
        code = 0
    assert type(code) is int, (argv, code)
    return code, text


WEIRD = [
    "", "-", "--", "---", "-x", "--nope", "alpha", "b/eta", "ALPHA", "missing", "a" * 300, "é" * 60, "\x00", "\n",
    "\udcff", "alpha@", "alpha@0", "alpha@-1", "alpha@99999999999999999999", "alpha@x", "@3", "b/eta@2",
    "alpha@1@2", "0", "-1", "1e9", "nan", "99999999999999999999999", "..", "/", "~", "%s", "{}", "=",
]
session_commands = ["list", "show", "inspect", "verify", "repair", "fork", "export", "rm"]
session_flags = [
    "--json", "--events", "--surface", "--chunks", "--times", "--full", "--strict", "--closers", "--force",
    "--to", "--format", "--width", "--color", "--backend", "--compression", "-o", "--help",
]
tokens = st.one_of(st.sampled_from(WEIRD), st.sampled_from(session_flags), st.text(max_size=12),
                   st.sampled_from(["jsonl", "json", "sqlite", "auto", "zstd", "none", "always", "never"]))


@settings(max_examples=budget(80))
@given(backend=st.sampled_from(["jsonl", "sqlite"]), command=st.sampled_from(session_commands),
       args=st.lists(tokens, max_size=5), root_first=st.booleans())
def test_fuzz_sessions_cli(stores: dict[str, Path], backend: str, command: str, args: list[str], root_first: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / stores[backend].name
        if backend == "jsonl":
            shutil.copytree(stores[backend], target)
        else:
            shutil.copy(stores[backend], target)
        # -o must not write outside the temporary directory.
        args = [Path(tmp, "out").as_posix() if prev == "-o" else a for prev, a in zip(["", *args], args, strict=False)]
        root = ["--root", str(target)]
        argv = ["sessions", *root, command, *args] if root_first else ["sessions", command, *root, *args]
        explored(f"harness sessions {command}")
        code, _ = _run_cli(argv)
        assert code in SESSIONS_EXIT_CODES, (argv, code)


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
@pytest.mark.parametrize("command", ["show", "inspect", "repair", "rm", "verify", "fork", "export"])
def test_sessions_cli_non_utf8_ids(stores: dict[str, Path], backend: str, command: str) -> None:
    """Found by test_fuzz_sessions_cli: a command-line id holding bytes that are not
    UTF-8 (Python passes them as lone surrogates) raised UnicodeEncodeError out of both
    backends; it is a usage error (exit 2) now."""
    arg = "\udcff@1" if command == "fork" else "\udcff"
    explored(f"harness sessions {command}")
    code, err = _run_cli(["sessions", "--root", str(stores[backend]), command, arg])
    assert code == 2 and "not valid UTF-8" in err, (code, err)


@pytest.mark.parametrize("root", ["", "/nonexistent/deep/path", "/dev/null", "/proc/self", "\x00", "relative"])
def test_sessions_cli_odd_roots(root: str) -> None:
    for command in (["list"], ["show", "alpha"], ["verify"]):
        explored("harness sessions --root")
        code, _ = _run_cli(["sessions", "--root", root, *command])
        assert code in SESSIONS_EXIT_CODES


@pytest.fixture
def inert(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The heavy commands stop where they would start work: their parsed arguments
    are recorded instead."""
    calls: list[tuple[str, Any]] = []
    import harness.bench
    import harness.demo
    import harness.faults._cli

    monkeypatch.setattr(harness.bench, "run_bench", lambda *a, **k: calls.append(("bench", (a, k))) or 0)
    monkeypatch.setattr(harness.faults._cli, "main", lambda args: calls.append(("chaos", args)) or 0)
    monkeypatch.setattr(harness.demo, "run_demo", lambda **k: calls.append(("demo", k)) or 0)
    return calls


heavy_tokens = st.one_of(
    st.sampled_from(WEIRD),
    st.sampled_from(["--n", "--runs", "--json", "--seeds", "--mode", "--budget", "--jobs", "--list", "--replay",
                     "--root", "W1", "W4", "W99", "ci", "full", "all", "io", "crash", "checkpoints", "100", "0"]),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)


def test_fuzz_heavy_commands_parse(inert: list[tuple[str, Any]]) -> None:
    @settings(max_examples=budget(150))
    @given(command=st.sampled_from(["bench", "chaos", "demo", "nope", ""]), args=st.lists(heavy_tokens, max_size=5))
    def run(command: str, args: list[str]) -> None:
        explored(f"harness {command or '(none)'} (parsing)")
        code, _ = _run_cli([command, *args] if command else args)
        assert code in (0, 2), code

    run()
    assert inert, "no fuzzed argument list ever reached a command"


@pytest.mark.parametrize(
    "argv",
    [["chaos", "--list"], ["chaos", "no-such-scenario", "--mode", "io"], ["chaos", "--replay", "garbage"],
     ["chaos", "--replay", ""], ["bench", "W99", "--n", "100", "--runs", "1"]],
    ids=" ".join,
)
def test_heavy_commands_refuse_bad_names(argv: list[str]) -> None:
    """The few heavy-command inputs that fail fast, run for real."""
    explored(f"harness {argv[0]} (bad names)")
    proc = subprocess.run([str(HARNESS), *argv], capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1, 2), (proc.returncode, proc.stderr)


chat_args = st.one_of(
    st.tuples(st.sampled_from(["--session", "--resume", "--fork"]), st.sampled_from(WEIRD).filter(lambda s: "\x00" not in s and "\udcff" not in s)),
    st.tuples(st.just("--max-tokens"), st.sampled_from(["0", "-1", "x", "99999999999999999999", "1"])),
    st.tuples(st.just("--list")),
    st.tuples(st.just("--model"), st.sampled_from(["", "x" * 1000, "deepseek-chat"])),
)
chat_inputs = st.lists(st.sampled_from(["hi", "", "/exit", "/compact", "/nope", "ls", "read /etc/passwd", "read " + "x" * 5000,
                                        "\x1b[31mred", "é" * 100, "/help"]), max_size=4)


@settings(max_examples=budget(12))
@given(args=st.lists(chat_args, max_size=2), lines=chat_inputs)
def test_fuzz_chat(args: list[tuple[str, ...]], lines: list[str]) -> None:
    """``harness chat`` on the offline provider, in a subprocess (it owns the terminal)."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(HARNESS), "chat", "--provider", "scripted", "--root", tmp, "--workdir", tmp]
        for a in args:
            argv += list(a)
        explored("harness chat")
        env = {k: v for k, v in os.environ.items() if k != "DEEPSEEK_API_KEY"}
        proc = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120,
                              check=False, env=env)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode in (0, 1, 2), (proc.returncode, proc.stderr)
