#!/usr/bin/env python3
"""Developer entry point that needs nothing but Python 3.11+ and pip.

    python3 dev.py demo     # create .venv if needed, then run `harness demo`
    python3 dev.py test     # create .venv if needed, then ruff and mypy --strict beside
                            # mkdocs + the browser check, pytest (on every core),
                            # harness chaos, harness fuzz
    python3 dev.py bench    # `harness bench` with any extra arguments

The virtual environment lives in `.venv/` next to this file and is rebuilt when
`pyproject.toml` changes (a stamp file records the hash it was built from).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
import venv
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".trio-harness-stamp"


def _ensure_venv() -> None:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if PY.exists() and STAMP.exists() and STAMP.read_text() == digest:
        return
    if not PY.exists():
        print(f"dev.py: creating virtual environment in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    _run([str(PY), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], install=True)
    _run([str(PY), "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[test,lint,docs]"], install=True)
    STAMP.write_text(digest)


# Debian packages that some checks drive when present: tmux (tests/test_chat_tmux.py
# drives `harness chat` in it) and Chromium (docs/_ext/browser_check.py measures the
# built site). Each check skips, saying so, where its program is missing.
SYSTEM_PACKAGES = {"tmux": "tmux", "chromium": "chromium"}


def _ensure_system_packages() -> None:
    """Install the missing SYSTEM_PACKAGES where that is possible without asking (root
    with apt-get, as CI is); elsewhere say which checks will be skipped."""
    missing = [pkg for exe, pkg in SYSTEM_PACKAGES.items() if not shutil.which(exe)]
    if missing and os.name == "posix" and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
            print("+ " + " ".join(cmd), flush=True)
            if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode != 0:
                break
    for exe in SYSTEM_PACKAGES:
        if not shutil.which(exe):
            print(f"dev.py: {exe} is not installed: the checks that drive it will be skipped", flush=True)


def _child_env() -> dict[str, str]:
    """The environment of every command run here: compiled bytecode goes to
    ``.venv/pycache``, never into the source tree, and is written even where
    ``PYTHONDONTWRITEBYTECODE`` is set (as in many containers). Without it every
    process -- each pytest worker, each CLI subprocess a test starts, each chaos
    worker -- compiles the whole package (and pytest rewrites every test module)
    again: 6 s of the test collection alone on a 2-core machine. (The cache mirrors
    each source's absolute path under the prefix, the standard library's too on a
    first run; where that passes a path-length limit, as on Windows, Python skips
    writing that file and only loses the saving.)"""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(VENV / "pycache")
    return env


def _run(cmd: list[str], *, install: bool = False) -> None:
    print("+ " + " ".join(cmd), flush=True)
    # pip runs in the caller's environment: it compiles what it installs next to it,
    # where a plain `.venv/bin/harness` finds it too.
    completed = subprocess.run(cmd, cwd=ROOT, env=None if install else _child_env())
    if completed.returncode != 0:
        sys.exit(completed.returncode)


def _lanes(*lanes: list[list[str] | Callable[[], None]]) -> None:
    """Run each lane's steps in order, the lanes side by side, and print each lane's
    command output whole when the lane ends (so no two commands' lines interleave);
    exit with the first failed command's status once every lane has ended. A step is
    a command or a function (run in the lane's thread, printing as it goes). For
    steps that keep at most one core busy each (mypy, mkdocs, apt-get's downloads):
    side by side they share the two."""
    # Failed until the lane says otherwise: a lane whose thread ends any other way
    # (a command that cannot start, a step calling sys.exit) must not pass.
    results: list[tuple[str, int]] = [("", 1)] * len(lanes)

    def run(i: int, lane: list[list[str] | Callable[[], None]]) -> None:
        out: list[str] = []
        for cmd in lane:
            try:
                if callable(cmd):
                    cmd()
                    continue
                out.append("+ " + " ".join(cmd) + "\n")
                done = subprocess.run(cmd, cwd=ROOT, env=_child_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, errors="replace")
            except BaseException as exc:  # a failed step fails the lane, as a command's status does
                # (BaseException: SystemExit in a thread would end it silently.)
                name = getattr(cmd, "__name__", None) or " ".join(cmd)  # type: ignore[arg-type]
                code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) and exc.code else 1
                results[i] = ("".join(out) + f"dev.py: {name} failed: {exc!r}\n", code)
                return
            out.append(done.stdout)
            if done.returncode != 0:
                results[i] = ("".join(out), done.returncode)
                return
        results[i] = ("".join(out), 0)

    threads = [threading.Thread(target=run, args=(i, lane)) for i, lane in enumerate(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for text, _ in results:
        print(text, end="", flush=True)
    for _, code in results:
        if code != 0:
            sys.exit(code)


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in {"demo", "test", "bench"}:
        sys.exit(__doc__)
    _ensure_venv()
    command, rest = argv[0], argv[1:]
    if command == "demo":
        _run([str(BIN / "harness"), "demo", *rest])
    elif command == "bench":
        _run([str(BIN / "harness"), "bench", *rest])
    else:
        os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")  # Material's end-of-life banner
        _lanes(
            # Lint and the strict type check.
            [[str(BIN / "ruff"), "check", "actors", "harness", "tests", "docs"], [str(PY), "-m", "mypy"]],
            # The packages some checks need; the docs site (mkdocs.yml): broken links and
            # missing references fail the build. Then every page of the built site in
            # headless Chromium at 1280 px: no code line, table or page wider than its
            # column (skipped with a notice where Chromium is missing, an error under CI,
            # where _ensure_system_packages installs it).
            [_ensure_system_packages,
             [str(BIN / "mkdocs"), "build", "--strict", "--quiet", "--site-dir", str(ROOT / "site")],
             [str(PY), str(ROOT / "docs" / "_ext" / "browser_check.py"), str(ROOT / "site")]],
        )
        # pytest-xdist: one worker per core; the PostgreSQL tests share one worker
        # (tests/conftest.py groups them), so one throwaway cluster serves them all.
        _run([str(PY), "-m", "pytest", "-q", "-n", "auto", "--dist", "loadgroup", *rest])
        # A bounded fault-exploration campaign over every built-in scenario on both
        # backends (docs/faults.md); it prints the steps explored per scenario and
        # canceller, and fails on any violation. Three workers on two cores: the
        # PostgreSQL attempts spend part of their time waiting for the server
        # (measured: 114 s with 3 or 4 workers, 125-130 s with 2).
        _run([str(BIN / "harness"), "chaos", "--budget", "ci", "--jobs", "3"])
        # Issue 16: the fuzz cases (marker `fuzz`, deselected from the pytest run above
        # by pyproject's addopts) on the CI budget, then the coverage-guided readers; it
        # prints the cases explored per entry point and fails on any crash.
        _run([str(BIN / "harness"), "fuzz", "--budget", "ci"])


if __name__ == "__main__":
    main(sys.argv[1:])
