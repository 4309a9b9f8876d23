"""What every built-in scenario shares: the lifecycle errors it may meet, the guarded
call, the rig (store, persistence, agent loop over one backend), the cancellers'
helpers, the agent and store frames (:func:`agent_run`, :func:`store_run`), turn
drafts, and the live and exit checks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final

import attrs
import trio

from actors import ActorError, LifetimeClosedError, Owner
from harness.agent import (
    AgentCompaction,
    AgentDisposedError,
    AgentHandle,
    AgentLoop,
    Call,
    Say,
    ScriptedProvider,
    Think,
    ToolSet,
    open_agent_loop,
    tool,
)
from harness.errors import HarnessError, PersistenceError, SessionNotLiveError, StoreError
from harness.faults._backends import Backend, check_at_rest, close_backend, make_backend
from harness.faults._explore import Probe, Settings
from harness.faults._invariants import (
    check_log,
    check_no_tasks_left,
    check_preparations,
    check_writer_locks,
)
from harness.persistence import Persistence, open_persistence
from harness.runtime import SessionHandle, Store, open_store
from harness.session import EventDraft, event_to_record

#: Lifecycle answers a scenario may legitimately get when it is cancelled or torn down
#: at an arbitrary step: a closed lifetime, a disposed agent, a session or store no
#: longer live. Anything else typed (an invariant veto, corruption, an actor crash) is
#: reported as a violation by the scenarios.
LIFECYCLE_ERRORS: Final[tuple[type[BaseException], ...]] = (
    LifetimeClosedError,
    AgentDisposedError,
    SessionNotLiveError,
    StoreError,
)


# Built-in scenarios do no real I/O outside worker threads (which the explorer's thread
# gate waits for), so the mock clock may jump as soon as every task is idle.
SETTINGS: Final = Settings(autojump_threshold=0.0, timeout=600.0, grace=60.0, real_timeout=60.0)


def leaves(exc: BaseException) -> Iterable[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from leaves(sub)
    else:
        yield exc


def allowed_errors(probe: Probe) -> tuple[type[BaseException], ...]:
    """The typed errors a scenario accepts as answers in this attempt: lifecycle
    errors always, persistence errors only when I/O faults are injected."""
    return (*LIFECYCLE_ERRORS, PersistenceError) if probe.faults is not None else LIFECYCLE_ERRORS


def note_errors(probe: Probe, exc: BaseException, what: str) -> None:
    """Record every leaf of ``exc`` that is not an accepted answer here."""
    allowed = allowed_errors(probe)
    for leaf in leaves(exc):
        if not isinstance(leaf, allowed):
            probe.fail(f"{what}: unexpected {type(leaf).__name__}: {leaf}")


async def guarded(probe: Probe, what: str, fn: Callable[[], Awaitable[Any]]) -> Any:
    """``await fn()``; a typed library error is checked against :func:`allowed_errors`
    and swallowed (``None`` is returned).

    Cancellation: ``Cancelled`` propagates untouched (so do raw exceptions: they are the
    explorer's to report)."""
    try:
        return await fn()
    except* (HarnessError, ActorError) as group:
        note_errors(probe, group, what)
    return None


@attrs.define
class Rig:
    """A running runtime: store, persistence and agent loop over one backend."""

    store: Store
    persistence: Persistence
    loop: AgentLoop
    backend: Backend


@asynccontextmanager
async def rig(
    probe: Probe,
    backend: Backend,
    *,
    script: Sequence[Any] = (),
    write_delay: float = 0.2,
    context_window: int | None = 128_000,
    compaction: AgentCompaction | None = None,
) -> AsyncIterator[Rig]:
    """Store + persistence + agent loop (the scripted provider with ``context_window``,
    two tools; ``compaction`` installed on every agent when given)."""
    provider = ScriptedProvider(list(script), context_window=context_window)
    async with (
        open_store() as store,
        open_persistence(store, backend, write_delay=write_delay) as persistence,
        open_agent_loop(store, provider=provider, tools=TOOLS, persistence=persistence, compaction=compaction) as loop,
    ):
        yield Rig(store, persistence, loop, backend)


class OwnerCloser:
    """The ``owner`` canceller: closes the owner's lifetime at once (synchronously, from
    the instrument) and wakes a helper task that awaits ``owner.aclose`` (cancelling the
    tasks the owner owns), as an owner going away does."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.reason = "owner closed"
        self._go = trio.Event()

    def __call__(self) -> None:
        self.owner.close(self.reason)
        self._go.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The helper task (start it with ``nursery.start`` before arming). Cancellation:
        cancel its nursery when done; a cancelled ``aclose`` still cancelled the tasks."""
        task_status.started()
        await self._go.wait()
        await self.owner.aclose(self.reason)


class Caller:
    """The ``caller`` canceller: the scenario's own calls run in ``with caller.scope():``
    blocks; cancelling the caller cancels the open block and every later one (a caller
    that gave up does not come back)."""

    def __init__(self) -> None:
        self.cancelled = False
        self._open: list[trio.CancelScope] = []

    def cancel(self) -> None:
        self.cancelled = True
        for scope in self._open:
            scope.cancel()

    @contextmanager
    def scope(self) -> Iterator[trio.CancelScope]:
        with trio.CancelScope() as scope:
            if self.cancelled:
                scope.cancel()
            self._open.append(scope)
            try:
                yield scope
            finally:
                self._open.remove(scope)


def bind_teardown(probe: Probe, loop: AgentLoop | None, store: Store, body: trio.CancelScope) -> None:
    def teardown() -> None:
        if loop is not None:
            loop.teardown.close("agent loop is not active")
        store.runtime.teardown.close("runtime stopping")
        body.cancel()

    probe.canceller("teardown", teardown)


@tool("add", "Add a and b", {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}})
async def _add(args: dict[str, Any]) -> Any:
    await trio.sleep(0.01)
    return {"sum": args.get("a", 0) + args.get("b", 0)}


@tool("echo", "Echo the text back")
async def _echo(args: dict[str, Any]) -> Any:
    await trio.lowlevel.checkpoint()
    return str(args.get("text", ""))


TOOLS: Final = ToolSet([_add, _echo])


TURN_SCRIPT: Final = [
    [Think("plan"), Say("adding"), Call("add", {"a": 1, "b": 2}), Call("echo", {"text": "hi"})],
    [Say("done: 3")],
]


async def flush_and_acknowledge(probe: Probe, handle: SessionHandle, what: str) -> bool:
    """Flush ``handle``; once the flush returned, acknowledge everything it covered.
    Returns whether it did (a typed failure is checked as by :func:`guarded`).

    Cancellation: a cancelled flush acknowledges nothing; ``Cancelled`` propagates."""
    events = handle.events  # what the flush covers: everything appended before the call
    failed = False
    try:
        await handle.flush()
    except* (HarnessError, ActorError) as group:
        note_errors(probe, group, what)
        failed = True
    if failed:
        return False
    if len(events):
        probe.acknowledge(handle.id, len(events) - 1, [event_to_record(e) for e in events])
    return True


def check_live(probe: Probe, handle: SessionHandle, *, idle: bool) -> None:
    """The in-memory log: balanced, and closed once no turn runs on it."""
    probe.record(check_log(list(handle.events), live=not idle), prefix=f'live "{handle.id}": ')


async def check_runtime_live(probe: Probe, r: Rig) -> None:
    """While the runtime runs: every live session stored on disk holds its lock.

    Cancellation: only the store round trip is cancellable; then nothing is checked."""
    live = await guarded(probe, "store.list", r.store.list)
    if live is not None:
        probe.record(check_writer_locks(live, r.backend))


def check_runtime_exited(probe: Probe, loop: AgentLoop | None) -> None:
    """Once the runtime's blocks have exited: preparations settled, no task left."""
    if loop is not None:
        probe.record(check_preparations(loop.stats))
    probe.record(check_no_tasks_left(probe.live_tasks()))


@attrs.define
class AgentRun:
    """What an agent scenario's armed part works with (see :func:`agent_run`)."""

    rig: Rig
    owner: Owner
    caller: Caller
    handles: list[AgentHandle]


@asynccontextmanager
async def agent_run(
    probe: Probe,
    kind: str,
    *,
    agent_cancel: bool = False,
    script: Sequence[Any] = TURN_SCRIPT,
    context_window: int | None = 128_000,
    compaction: AgentCompaction | None = None,
    setup: Callable[[AgentRun], Awaitable[None]] | None = None,
) -> AsyncIterator[AgentRun]:
    """The frame every agent scenario shares: a rig with an owner, the cancellers
    (caller, owner, teardown, and ``agent-cancel`` if asked) bound and the probe armed
    on entry; on exit, the live checks, every published agent disposed (under the
    caller's scope), the runtime's exit checked, the backend closed, the probe
    disarmed and the stored sessions checked at rest.

    ``script``, ``context_window`` and ``compaction`` configure the rig; ``setup`` runs
    right before the probe is armed (unarmed: e.g. an agent and its history).

    Cancellation: the explorer's cancellers cancel parts of it at step k; anything
    else (the explorer's hang watchdog) cancels the whole scenario."""
    backend = make_backend(probe, kind)
    handles: list[AgentHandle] = []
    try:
        async with trio.open_nursery() as helpers, Owner("app") as owner:
            closer = OwnerCloser(owner)
            await helpers.start(closer.run)
            loop: AgentLoop | None = None
            async with rig(probe, backend, script=script, context_window=context_window, compaction=compaction) as r:
                loop = r.loop
                with trio.CancelScope() as body:
                    caller = Caller()
                    probe.canceller("caller", caller.cancel)
                    probe.canceller("owner", closer)
                    bind_teardown(probe, r.loop, r.store, body)
                    if agent_cancel:
                        probe.canceller("agent-cancel", lambda: handles[0].agent.cancel("parent") if handles else None)
                    run = AgentRun(r, owner, caller, handles)
                    if setup is not None:
                        await setup(run)
                    probe.arm()
                    yield run
                    for h in handles:
                        check_live(probe, h.session, idle=not h.agent.busy)
                    await check_runtime_live(probe, r)
                    with caller.scope():
                        for h in handles:
                            await h.dispose()
            check_runtime_exited(probe, loop)
            helpers.cancel_scope.cancel()
    finally:
        close_backend(backend)
    probe.disarm()
    check_at_rest(probe, kind)


@attrs.define
class StoreRun:
    """What a scenario without an agent works with (see :func:`store_run`)."""

    rig: Rig
    caller: Caller
    body: trio.CancelScope

    @property
    def interrupted(self) -> bool:
        """The caller or the teardown canceller fired: plain appends may have stopped
        mid-turn (the turn stays open, as after a crash)."""
        return self.caller.cancelled or self.body.cancel_called


@asynccontextmanager
async def store_run(probe: Probe, kind: str, *, write_delay: float = 0.05) -> AsyncIterator[StoreRun]:
    """The frame of the scenarios without an agent: a rig over a fresh backend, with the
    ``caller`` and ``teardown`` cancellers bound; the block does its unarmed setup and
    arms the probe itself. After the block: the runtime's live checks, its exit checked,
    the backend closed, the probe disarmed and the stored sessions checked at rest.

    Cancellation: as :func:`agent_run` (``teardown`` cancels the block's scope)."""
    backend = make_backend(probe, kind)
    try:
        async with rig(probe, backend, write_delay=write_delay) as r:
            with trio.CancelScope() as body:
                caller = Caller()
                probe.canceller("caller", caller.cancel)
                bind_teardown(probe, None, r.store, body)
                yield StoreRun(r, caller, body)
                await check_runtime_live(probe, r)
        check_runtime_exited(probe, None)
    finally:
        close_backend(backend)
    probe.disarm()
    check_at_rest(probe, kind)


def turn_batches(turn: int, n: int) -> list[list[EventDraft]]:
    """One complete turn as a list of append batches (no agent: cheap, deterministic)."""
    call = f"c{turn}-{n}"
    user = {"id": f"u{turn}", "role": "user", "content": [{"type": "text", "text": f"go {turn}"}], "source": {"kind": "user"}}
    assistant = {
        "turn": turn,
        "step": 1,
        "message": {
            "id": f"a{turn}",
            "role": "assistant",
            "content": [{"type": "tool-call", "id": call, "name": "t", "arguments": "{}"}],
            "source": {"kind": "model", "provider": "p", "model": "m"},
        },
    }
    result = {
        "turn": turn,
        "step": 1,
        "message": {
            "id": f"r{turn}",
            "role": "user",
            "content": [{"type": "tool-result", "toolCallId": call, "content": [{"type": "text", "text": "ok"}]}],
            "source": {"kind": "tool", "callId": call},
        },
    }
    return [
        [EventDraft("turn/start", {"turn": turn}), EventDraft("user/message", user, "append")],
        [EventDraft("step/start", {"turn": turn, "step": 1}), EventDraft("assistant/message", assistant, "append")],
        [EventDraft("tool/call", {"turn": turn, "step": 1, "callId": call, "name": "t", "arguments": "{}"})],
        [EventDraft("tool/result", result, "append")],
        [
            EventDraft("step/end", {"turn": turn, "step": 1}),
            EventDraft("turn/end", {"turn": turn, "reason": {"kind": "completed"}}),
        ],
    ]


async def append_turns(handle: SessionHandle, turns: Iterable[int], pause: float = 0.0) -> None:
    """Append complete turns batch by batch (optionally pausing between batches).

    Cancellation: the actor kernel's contract per batch; a cancelled caller leaves the
    turn open where it stopped (as a crash would), for repair or a later append."""
    for turn in turns:
        for batch in turn_batches(turn, handle.seq):
            await handle.append_batch(batch)
            if pause:
                await trio.sleep(pause)


def message(role: str, mid: str, text: str, *, provider: str = "chaos", model: str = "chaos-1") -> dict[str, Any]:
    source = {"kind": "user"} if role == "user" else {"kind": "model", "provider": provider, "model": model}
    return {"id": mid, "role": role, "content": [{"type": "text", "text": text}], "source": source}
