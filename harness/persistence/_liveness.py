"""Who holds a writer lease, and when its holder is *provably* dead (SQLite and
PostgreSQL leases; the JSONL backend's ``flock`` needs none of this: the kernel
drops it with its holder).

A holder is named by ``(host, pid, start_time, pid_scope)``. ``pid_scope`` says in
which pid space ``pid`` and ``start_time`` mean something: the kernel's boot id
(``/proc/sys/kernel/random/boot_id``, new on every boot, the same in every container of
one kernel) and the identity of the holder's pid and time namespaces
(``/proc/self/ns/pid``, ``/proc/self/ns/time``). The host name alone is no such thing:
two containers, two pods or two cloned machines may share one name while each has its
own pids — a pid "gone" or "reused" in our namespace says nothing about theirs.

The rule: a holder can be judged dead before its lease expires only if its row names
*our* host name and *our* pid scope (so ``os.kill(pid, 0)`` and ``/proc/<pid>/stat``
here see the very process it was), and then only if its pid is gone or now belongs to
a process with another start time. Anything else — another host, another scope, a
scope this process cannot establish (no ``/proc``, a ``/proc`` of another pid
namespace mounted here), a row written by an older build (no scope) — is *remote*:
respected until it expires. A stopped (SIGSTOP), slow or partitioned holder is alive by
this rule too; the lease's fence refuses its writes once its lease was taken over.
"""

from __future__ import annotations

import os
import socket
from typing import Final

_BOOT_ID: Final = "/proc/sys/kernel/random/boot_id"

_UNSET: Final = object()
_scope: object | str | None = _UNSET
_self_start: int | None = None


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` (``/proc/<pid>/stat`` field 22, clock ticks after
    boot), or ``None`` where that is unavailable (not Linux, no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        # Field 2 (comm) may hold spaces and parentheses: split after the last ")".
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def read_pid_scope() -> str | None:
    """This process's pid scope, read afresh: ``boot:<boot id>/pid:<dev>:<ino>/time:<dev>:<ino>``
    (``time:-`` on a kernel without time namespaces), or ``None`` if it cannot be
    established — then no holder is ever provably dead here.

    ``None`` also when ``/proc`` is not this process's own pid namespace's (``/proc/self``
    names another pid than :func:`os.getpid`: a ``/proc`` mounted by an ancestor
    namespace), since ``/proc/<pid>`` would then describe someone else's process."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
        with open(_BOOT_ID, encoding="ascii") as f:
            boot = f.read().strip()
        pid_ns = os.stat("/proc/self/ns/pid")
    except (OSError, ValueError):
        return None
    if not boot:
        return None
    try:
        time_ns = os.stat("/proc/self/ns/time")
        time_part = f"{time_ns.st_dev}:{time_ns.st_ino}"
    except FileNotFoundError:
        time_part = "-"  # a kernel before time namespaces: one clock for all
    except OSError:
        return None
    return f"boot:{boot}/pid:{pid_ns.st_dev}:{pid_ns.st_ino}/time:{time_part}"


def pid_scope() -> str | None:
    """:func:`read_pid_scope` of this process, read once (namespaces of a process do
    not change under it; a fork re-reads, see :func:`_after_fork`)."""
    global _scope
    if _scope is _UNSET:
        _scope = read_pid_scope()
    return _scope  # type: ignore[return-value]


def identity(host: str | None = None) -> tuple[str, int, int | None, str | None]:
    """``(host, pid, pid start time, pid scope)`` of this process; ``host`` overrides
    the machine's name (a distinct name makes a separate, remote, holder)."""
    global _self_start
    if _self_start is None:
        _self_start = process_start_time(os.getpid())
    return host or socket.gethostname(), os.getpid(), _self_start, pid_scope()


def _after_fork() -> None:
    global _scope, _self_start
    _scope, _self_start = _UNSET, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def holder_dead(
    my_host: str,
    live_tokens: set[str],
    token: str,
    host: str | None,
    pid: int | None,
    start: int | None,
    scope: str | None,
) -> bool:
    """Whether the holder of a lease row is provably dead (see the module docstring).
    ``my_host``: this backend's holder name; ``live_tokens``: the tokens this process
    holds (exact knowledge of a row naming this very process)."""
    _, my_pid, my_start, my_scope = identity(my_host)
    if host != my_host or pid is None or my_scope is None or scope != my_scope:
        return False  # remote: its pids are not ours to judge
    if pid == my_pid and start is not None and start == my_start:
        return token not in live_tokens  # this very process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # exists, owned by someone else
    if start is None:
        return False
    current = process_start_time(pid)
    return current is not None and current != start  # the pid was reused
