"""A pytest plugin for testing code built on trio-harness (see ``docs/testing.md``).

Enable it with ``pytest_plugins = ["harness.testing"]`` in a ``conftest.py`` (the
package also registers it as the ``harness`` entry point of ``pytest11``, so an
installed trio-harness loads it automatically). The async fixtures need pytest-trio
(``trio_mode = true``, or ``@pytest.mark.trio`` on the test); they work with its
``autojump_clock``.

Fixtures:

* ``harness_runtime`` — a :class:`harness.Runtime` from :func:`harness.open_runtime`
  with :class:`~harness.session.RelationalInvariants`, on a fresh ``tmp_path``,
  parametrised over the backends ``jsonl``, ``sqlite`` and ``memory``
  (``harness_backend`` names the one in use);
* ``scripted_provider`` — a factory of :class:`~harness.agent.ScriptedProvider`;
* ``failing_files`` — a fresh :class:`~harness.faults.FailingFiles` (fails nothing
  until told to); ``faulty_files`` — a factory of :class:`~harness.faults.FaultyFiles`;
* ``explore_checkpoints`` — runs an ``async def body(probe)`` with a cancellation
  injected at every scheduler step (:func:`harness.faults.explore`), asserts no
  violation and returns the :class:`~harness.faults.ExploreReport`.

Marker: ``@pytest.mark.explore(cancellers=..., seeds=..., ...)`` on an ``async def``
test taking ``probe`` explores the test itself the same way (every schedule seed, a
cancellation by every canceller at every step) and fails with the report's grouped
summary (see docs/testing.md).

Helpers: :func:`assert_log_ok` (a session log satisfies :func:`harness.faults.check_log`
and replays through :class:`~harness.session.RelationalInvariants`) and
:func:`open_test_runtime` (the runtime of ``harness_runtime``, with your options).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, Literal

import pytest

from harness._runtime_api import Runtime, RuntimeConfigError, open_runtime
from harness.agent import Say, ScriptedProvider
from harness.errors import HarnessError
from harness.faults import (
    FailingFiles,
    FaultyFiles,
    check_log,
)
from harness.faults._checkpoints import ExploreCheckpoints
from harness.faults._pytest import (  # the explore marker's hooks: pytest finds them on this plugin
    pytest_collection_modifyitems as pytest_collection_modifyitems,
)
from harness.faults._pytest import pytest_configure as pytest_configure
from harness.faults._pytest import pytest_pyfunc_call as pytest_pyfunc_call
from harness.session import Event, RelationalInvariants

__all__ = [
    "BACKENDS",
    "BackendKind",
    "ExploreCheckpoints",
    "ScriptedProviderFactory",
    "assert_log_ok",
    "explore_checkpoints",
    "failing_files",
    "faulty_files",
    "harness_backend",
    "harness_runtime",
    "open_test_runtime",
    "probe",
    "scripted_provider",
]

BackendKind = Literal["jsonl", "sqlite", "memory"]
#: The backends ``harness_runtime`` is parametrised over, in order.
BACKENDS: Final[tuple[BackendKind, ...]] = ("jsonl", "sqlite", "memory")


# -- helpers -------------------------------------------------------------------------------


@asynccontextmanager
async def open_test_runtime(
    kind: BackendKind, tmp_path: str | os.PathLike[str], **options: Any
) -> AsyncIterator[Runtime]:
    """:func:`harness.open_runtime` on backend ``kind`` under ``tmp_path``, with
    :class:`~harness.session.RelationalInvariants` (unless ``invariants=`` says
    otherwise). ``jsonl`` uses the directory ``tmp_path/"sessions"``, ``sqlite`` the
    file ``tmp_path/"sessions.db"``, ``memory`` nothing. Other ``options`` go to
    :func:`~harness.open_runtime` (``provider``, ``tools``, ``write_delay``, ...).
    Another ``kind`` raises :class:`~harness.RuntimeConfigError` (a ``ValueError``) on entry.

    Cancellation and ownership: as :func:`harness.open_runtime`, which it is: the runtime
    belongs to the block; a cancellation of the enclosing scope closes it in order
    (agents disposed, writers retired, bounded by ``shutdown_grace``) before the
    ``Cancelled`` propagates.
    """
    options.setdefault("invariants", RelationalInvariants)
    root = Path(tmp_path)
    if kind == "jsonl":
        cm = open_runtime(root / "sessions", "jsonl", **options)
    elif kind == "sqlite":
        cm = open_runtime(root / "sessions.db", "sqlite", **options)
    elif kind == "memory":
        cm = open_runtime(**options)
    else:
        raise RuntimeConfigError(f"open_test_runtime: backend kind must be one of {BACKENDS}, got {kind!r}")
    async with cm as rt:
        yield rt


def _events_of(target: Any) -> Sequence[Any]:
    """The events of an AgentHandle, SessionHandle, Session or a sequence of events/records."""
    session = getattr(target, "session", None)  # an AgentHandle
    if session is not None and hasattr(session, "events"):
        target = session
    events = getattr(target, "events", None)  # a SessionHandle or a Session
    if events is not None and not callable(events):
        return list(events)
    if isinstance(target, Iterable) and not isinstance(target, (str, bytes, Mapping)):
        return list(target)
    raise TypeError(
        "assert_log_ok takes an AgentHandle, a SessionHandle, a Session or a sequence of "
        f"events / stored records, got {target!r}"
    )


def assert_log_ok(target: Any, *, live: bool = False) -> None:
    """Assert that a session log is well formed.

    ``target`` is an :class:`~harness.agent.AgentHandle`, a
    :class:`~harness.runtime.SessionHandle`, a :class:`~harness.session.Session`, or a
    sequence of :class:`~harness.session.Event` / stored records (dicts, e.g.
    ``backend.load(id).records``). Checks :func:`harness.faults.check_log` (``live``:
    an open turn at the end is allowed) and, for events, replays them through
    :class:`~harness.session.RelationalInvariants` as a seed. Raises
    ``AssertionError`` listing every problem.
    """
    events = _events_of(target)
    problems = check_log(events, live=live)
    typed = [e for e in events if isinstance(e, Event)]
    if typed and len(typed) == len(events):
        inv = RelationalInvariants()
        state = inv.begin_seed(inv.initial(), [e.type for e in typed])
        for event in typed:
            try:
                state = inv.check(state, event)
            except HarnessError as exc:
                problems.append(f"RelationalInvariants at seq {event.seq} ({event.type}): {exc}")
                break
    if problems:
        raise AssertionError("session log violates its invariants:\n  " + "\n  ".join(problems))


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def harness_backend(request: pytest.FixtureRequest) -> BackendKind:
    """The backend ``harness_runtime`` runs on: ``"jsonl"``, ``"sqlite"`` or ``"memory"``.
    Override it (a fixture of the same name, or ``@pytest.mark.parametrize(
    "harness_backend", ["sqlite"])``) to narrow the matrix."""
    kind: BackendKind = request.param
    return kind


@pytest.fixture
async def harness_runtime(harness_backend: BackendKind, tmp_path: Path) -> AsyncIterator[Runtime]:
    """A :class:`harness.Runtime` on ``harness_backend`` under ``tmp_path``, with
    ``RelationalInvariants``, no default provider (pass ``provider=`` to ``rt.create``)
    and a write-behind delay of 0. Torn down (agents disposed, writers retired) after
    the test. Cancellation: as :func:`open_test_runtime`; the fixture owns the runtime,
    the test only borrows it."""
    async with open_test_runtime(harness_backend, tmp_path, write_delay=0.0) as rt:
        yield rt


#: A reply: a text (one Say), one part (Say, Call, ...) or a sequence of parts.
ReplyLike = Any


class ScriptedProviderFactory:
    """``scripted_provider(*replies, **options)``: a new
    :class:`~harness.agent.ScriptedProvider`. Each reply is a string (the assistant
    says it), one part (``Say``, ``Call``, ...) or a sequence of parts; ``options`` go
    to ``ScriptedProvider`` (``name``, ``model``, ``context_window``, ``delta_size``).
    Every provider made is kept in :attr:`made`."""

    def __init__(self) -> None:
        self.made: list[ScriptedProvider] = []

    def __call__(self, *replies: ReplyLike, **options: Any) -> ScriptedProvider:
        script: list[list[Any]] = []
        for reply in replies:
            if isinstance(reply, str):
                script.append([Say(reply)])
            elif isinstance(reply, (list, tuple)):
                script.append(list(reply))
            else:
                script.append([reply])
        provider = ScriptedProvider(script, **options)
        self.made.append(provider)
        return provider


@pytest.fixture
def scripted_provider() -> ScriptedProviderFactory:
    """A factory of :class:`~harness.agent.ScriptedProvider` (see
    :class:`ScriptedProviderFactory`)."""
    return ScriptedProviderFactory()


@pytest.fixture
def failing_files() -> FailingFiles:
    """A fresh :class:`~harness.faults.FailingFiles` for a ``JsonlBackend(root,
    files=...)``: it fails nothing until ``fail_writes`` / ``fail_fsyncs`` are set;
    ``injected`` counts the failures injected."""
    return FailingFiles()


@pytest.fixture
def faulty_files() -> Callable[..., FaultyFiles]:
    """The :class:`~harness.faults.FaultyFiles` class, as a factory: ``faulty_files()``
    is a counting dry run, ``faulty_files(fail_at=k, error=errno.ENOSPC)`` fails the
    k-th mutating file operation."""
    return FaultyFiles


@pytest.fixture
def explore_checkpoints(request: pytest.FixtureRequest) -> ExploreCheckpoints:
    """Explore a test body at every checkpoint (see :class:`ExploreCheckpoints`)."""
    return ExploreCheckpoints(request.node.name.replace(":", "_"))


@pytest.fixture
def probe() -> None:
    """The :class:`~harness.faults.Probe` of the attempt, in a test marked
    ``@pytest.mark.explore`` (each attempt passes its own; outside such a test it is
    ``None``)."""
    return None

