"""A throwaway PostgreSQL cluster (tests and ``harness bench --backend postgres``).

:func:`start_cluster` runs ``initdb`` in a new temporary directory and starts
``postgres`` on a free loopback port (unix socket in that directory, trust auth,
``fsync`` on: durability is measured, not assumed). Run as root, the server runs as
the ``postgres`` system user (PostgreSQL refuses root). The directory records the
pid that started it, so a later start reaps clusters whose starter died without
stopping them (a run killed by a timeout). :func:`missing` says why a cluster cannot
be started here (no binaries, no psycopg, root without a ``postgres`` user).

Blocking (subprocesses): call from a worker thread in async code.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import attrs

BINARIES = ("initdb", "pg_ctl", "postgres")
_PREFIX = "harness-pg-"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _server_user() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    pw = pwd.getpwnam("postgres")
    return pw.pw_uid, pw.pw_gid


@attrs.define
class PgCluster:
    """A throwaway cluster: ``url`` of its ``postgres`` database (superuser ``postgres``)."""

    root: Path
    port: int
    user: tuple[int, int] | None  # (uid, gid) the server runs as, when we are root

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        kw: dict[str, Any] = {}
        if self.user is not None:
            kw = {"user": self.user[0], "group": self.user[1], "extra_groups": []}
        return subprocess.run(args, capture_output=True, text=True, check=check, cwd=self.root, timeout=120, **kw)

    def start(self) -> None:
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c fsync=on -c synchronous_commit=on -c max_connections=200 -c shared_buffers=64MB"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", opts, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate``: as a crash; the next start replays the WAL)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop", check=False)

    def destroy(self) -> None:
        """Stop the server at once and remove its directory."""
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        """The tail of the server log (for failure messages)."""
        with contextlib.suppress(OSError):
            return (self.root / "log").read_text(errors="replace")[-4000:]
        return ""


def missing() -> str | None:
    """Why no cluster can be started here, or ``None``."""
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return f"PostgreSQL server binaries not on PATH ({', '.join(absent)})"
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        return f'psycopg / psycopg-pool not installed ({exc}): pip install "trio-harness[postgres]"'
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server as"
    return None


def reap_orphans() -> None:
    """Stop and remove clusters whose starting process is gone."""
    for owner in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*/owner"):
        try:
            pid, port = (int(x) for x in owner.read_text().split())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            pass  # gone: reap
        except PermissionError:
            continue  # alive, another user's
        else:
            continue  # its run is still going
        PgCluster(owner.parent, port, _server_user()).destroy()


def start_cluster() -> PgCluster:
    """Create and start a cluster (see the module); raises ``RuntimeError`` with the
    server log when it does not come up."""
    reap_orphans()
    user = _server_user()
    root = Path(tempfile.mkdtemp(prefix=_PREFIX))
    if user is not None:
        os.chown(root, *user)
    cluster = PgCluster(root, _free_port(), user)
    try:
        cluster._run("initdb", "-D", str(cluster.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        for _attempt in range(3):  # the free port may be taken between probe and bind
            (root / "owner").write_text(f"{os.getpid()} {cluster.port}")
            try:
                cluster.start()
                return cluster
            except subprocess.CalledProcessError:
                cluster.port = _free_port()
        raise RuntimeError(f"could not start a PostgreSQL cluster in {root}:\n{cluster.log()}")
    except BaseException:
        cluster.destroy()
        raise
