"""The built-in scenarios: the runtime's own code paths under every canceller.

Each scenario runs a real store, persistence backend and (where it applies) agent
loop, arms the probe at its trigger, and checks the built-in invariants twice: on the
live state while the runtime runs, and at rest (after everything closed) by reloading
every session it touched from disk with a fresh backend. Persistence scenarios exist
in a JSONL and a SQLite variant (``agent-turn/jsonl``, ``agent-turn/sqlite``, ...).

Cancellers (what each may do at step k, all synchronous):

* ``caller`` — cancel the cancel scope around the scenario's own calls;
* ``owner`` — close the agent's :class:`~actors.Owner` (its lifetime at once; a helper
  task then awaits ``owner.aclose``, cancelling the tasks it owns);
* ``teardown`` — close the runtime's teardown lifetime and cancel the scenario's body,
  as an application shutting down does (the runtime's blocks then exit normally);
* ``agent-cancel`` — ``agent.cancel("parent")`` on the running turn.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import partial
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
    ContextWindowExceededError,
    Delay,
    Fail,
    Say,
    ScriptedProvider,
    Think,
    ToolSet,
    TurnResult,
    open_agent_loop,
    tool,
)
from harness.compaction import SummarizationInput, SummaryOutput, load_basic_compaction_config
from harness.errors import (
    HarnessError,
    OpenTurnError,
    PersistedSessionNotFoundError,
    PersistenceCloseError,
    PersistenceError,
    SessionNotLiveError,
    StoreError,
)
from harness.faults._backends import (
    BACKENDS,
    Backend,
    check_at_rest,
    close_backend,
    make_backend,
    plain_backend,
    scenario_modes,
    track_session,
)
from harness.faults._explore import Probe, Scenario, Settings
from harness.faults._invariants import (
    _canonical,
    check_log,
    check_no_tasks_left,
    check_preparations,
    check_writer_locks,
    open_compaction,
)
from harness.persistence import Persistence, open_persistence
from harness.persistence._files import SimulatedCrash
from harness.runtime import SessionHandle, Store, open_store
from harness.session import EventDraft, FrozenDict, Session, event_to_record, freeze, thaw

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


def _leaves(exc: BaseException) -> Iterable[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from _leaves(sub)
    else:
        yield exc


def allowed_errors(probe: Probe) -> tuple[type[BaseException], ...]:
    """The typed errors a scenario accepts as answers in this attempt: lifecycle
    errors always, persistence errors only when I/O faults are injected."""
    return (*LIFECYCLE_ERRORS, PersistenceError) if probe.faults is not None else LIFECYCLE_ERRORS


def note_errors(probe: Probe, exc: BaseException, what: str) -> None:
    """Record every leaf of ``exc`` that is not an accepted answer here."""
    allowed = allowed_errors(probe)
    for leaf in _leaves(exc):
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


# -- the rig ----------------------------------------------------------------------------------


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


# -- checks -----------------------------------------------------------------------------------


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


# -- scenarios --------------------------------------------------------------------------------


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


async def agent_turn(probe: Probe, kind: str) -> None:
    """Create an agent, run a turn with two tool calls, flush, dispose."""
    async with agent_run(probe, kind, agent_cancel=True) as run:
        with run.caller.scope():
            h = await guarded(probe, "create", lambda: run.rig.loop.create("chat", owner=run.owner, cwd="/chaos"))
            if h is not None:
                run.handles.append(h)
                track_session(probe, h.session)
                await guarded(probe, "run_turn", lambda: h.run_turn("please add 1 and 2"))
                await flush_and_acknowledge(probe, h.session, "flush")


async def _seed(probe: Probe, kind: str, sid: str) -> None:
    """A stored session with one completed turn (run disarmed)."""
    backend = make_backend(probe, kind)
    try:
        async with rig(probe, backend, script=TURN_SCRIPT) as r, Owner("seed") as owner:
            h = await r.loop.create(sid, owner=owner, cwd="/chaos")
            track_session(probe, h.session)
            await h.run_turn("seed turn")
            await flush_and_acknowledge(probe, h.session, "seed flush")
            await h.dispose()
    finally:
        close_backend(backend)


async def resume(probe: Probe, kind: str) -> None:
    """Resume a persisted session through ``AgentLoop.resume``, run a turn, dispose."""
    await _seed(probe, kind, "s1")
    async with agent_run(probe, kind) as run:
        r = run.rig
        with run.caller.scope():
            h = await guarded(probe, "resume", lambda: r.loop.resume("s1", owner=run.owner))
            if h is not None:
                run.handles.append(h)
        if not run.handles:
            # Nothing was published: nothing may be left half-published.
            live = await guarded(probe, "store.list", r.store.list)
            probe.check(not live, f"resume failed but left live sessions: {live}")
            probe.check(not r.loop.list(), f"resume failed but left agents: {r.loop.list()}")
        with run.caller.scope():
            for h in run.handles:
                await guarded(probe, "run_turn", partial(h.run_turn, "continue"))
                await flush_and_acknowledge(probe, h.session, "flush")
    await _prepare_again(probe, kind, "s1")


async def _prepare_again(probe: Probe, kind: str, sid: str) -> None:
    """The writer lock was released: the session can be prepared again (disarmed)."""
    backend = plain_backend(probe, kind)
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            try:
                prep = await p.prepare(sid)
            except HarnessError as exc:
                probe.fail(f'"{sid}" cannot be prepared again after the run: {type(exc).__name__}: {exc}')
            else:
                await prep.dispose()
    finally:
        close_backend(backend)


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


async def fork(probe: Probe, kind: str) -> None:
    """Fork a live session at its last turn boundary (a closed prefix), then at its last
    seq (refused while a turn is open), while turns are being appended to it."""
    backend = make_backend(probe, kind)
    children: list[SessionHandle] = []
    try:
        async with rig(probe, backend, write_delay=0.05) as r:
            with trio.CancelScope() as body:
                parent = await r.store.create("parent", cwd="/chaos")
                track_session(probe, parent)
                await append_turns(parent, [1])
                caller = Caller()
                probe.canceller("caller", caller.cancel)
                bind_teardown(probe, None, r.store, body)
                probe.arm()

                async def writer() -> None:
                    await guarded(probe, "append", lambda: append_turns(parent, [2, 3]))

                async def fork_one(child_id: str, boundary: int | None) -> None:
                    child: SessionHandle | None = None
                    try:
                        child = await r.store.fork(parent, boundary, child_id)
                    except* OpenTurnError:
                        pass  # the prefix ends mid-turn: refused, nothing created
                    except* (HarnessError, ActorError) as group:
                        note_errors(probe, group, f"fork {child_id}")
                    if child is None:
                        return
                    children.append(child)
                    track_session(probe, child)
                    await guarded(probe, f"append to {child_id}", lambda: child.append("feedback/record", {"text": "branch"}))

                async def forker() -> None:
                    with caller.scope():
                        for _ in range(3):
                            await trio.lowlevel.checkpoint()
                        # At the last turn boundary (always a closed prefix) while the
                        # writer appends; then at the last seq (refused mid-turn).
                        ends = [e.seq for e in parent.events if e.type == "turn/end"]
                        await fork_one("child", ends[-1])
                        await fork_one("child2", None)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(writer)
                    nursery.start_soon(forker)
                with caller.scope():
                    for h in [parent, *children]:
                        if h.alive:
                            await flush_and_acknowledge(probe, h, f'flush "{h.id}"')
                if not caller.cancelled and not body.cancel_called:
                    check_live(probe, parent, idle=True)
                for child in children:
                    check_live(probe, child, idle=True)
                    _check_fork_prefix(probe, parent, child)
                # A child the store created for a cancelled caller is live too: track it.
                for h in await guarded(probe, "store.list", r.store.list) or []:
                    track_session(probe, h)
                await check_runtime_live(probe, r)
        check_runtime_exited(probe, None)
    finally:
        close_backend(backend)
    probe.disarm()
    check_at_rest(probe, kind)


def _check_fork_prefix(probe: Probe, parent: SessionHandle, child: SessionHandle) -> None:
    header = child.header
    probe.check(header.parent_session == parent.id, f"fork child names parent {header.parent_session!r}")
    seed = header.seed_length
    if seed is None:
        probe.fail("fork child has no seedLength")
        return
    mine = [event_to_record(e) for e in list(child.events)[:seed]]
    theirs = [event_to_record(e) for e in list(parent.events)[:seed]]
    probe.check(mine == theirs, f"fork child's first {seed} events differ from the parent's")


async def lifecycle(probe: Probe, kind: str) -> None:
    """Create, append, flush and detach sessions concurrently; re-open a detached one
    while it retires."""
    backend = make_backend(probe, kind)
    try:
        async with rig(probe, backend, write_delay=0.05) as r:
            store, p = r.store, r.persistence
            with trio.CancelScope() as body:
                caller = Caller()
                probe.canceller("caller", caller.cancel)
                bind_teardown(probe, None, store, body)
                probe.arm()
                detached = trio.Event()

                async def first() -> None:
                    try:
                        a = await guarded(probe, "create a", lambda: store.create("a", cwd="/chaos"))
                        if a is None:
                            return
                        track_session(probe, a)
                        await guarded(probe, "append a", lambda: append_turns(a, [1]))
                        await flush_and_acknowledge(probe, a, "flush a")
                        await guarded(probe, "detach a", lambda: store.detach(a))
                    finally:
                        detached.set()

                async def second() -> None:
                    b = await guarded(probe, "create b", lambda: store.create("b", cwd="/chaos"))
                    if b is None:
                        return
                    track_session(probe, b)
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(guarded, probe, "append b", lambda: append_turns(b, [1, 2]))
                        nursery.start_soon(flush_and_acknowledge, probe, b, "flush b (concurrent)")
                    await flush_and_acknowledge(probe, b, "flush b")

                async def reopen() -> None:
                    await detached.wait()
                    if probe.acknowledged.get("a", -1) < 0:
                        return  # "a" never became durable: nothing to re-open
                    prep = await guarded(probe, "prepare a", lambda: p.prepare("a"))
                    if prep is None:
                        return
                    a2 = await guarded(probe, "publish a", lambda: p.publish(prep))
                    if a2 is not None:
                        await guarded(probe, "append a again", lambda: append_turns(a2, [2]))
                        await flush_and_acknowledge(probe, a2, "flush a again")

                with caller.scope():
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(first)
                        nursery.start_soon(second)
                        nursery.start_soon(reopen)
                live = await guarded(probe, "store.list", store.list) or []
                # Plain appends stop wherever the caller was cancelled (the turn stays
                # open, as after a crash); uninterrupted, every turn was closed.
                interrupted = caller.cancelled or body.cancel_called
                for h in live:
                    probe.check(h.alive, f'store.list() returned a handle that is not live: "{h.id}"')
                    check_live(probe, h, idle=not interrupted)
                await check_runtime_live(probe, r)
        check_runtime_exited(probe, None)
    finally:
        close_backend(backend)
    probe.disarm()
    check_at_rest(probe, kind)


async def write_behind(probe: Probe, kind: str) -> None:
    """Turns appended in small batches with the write window running in the background,
    a flush after every second turn, then a clean close."""
    backend = make_backend(probe, kind)
    try:
        async with rig(probe, backend, write_delay=0.05) as r:
            with trio.CancelScope() as body:
                caller = Caller()
                probe.canceller("caller", caller.cancel)
                bind_teardown(probe, None, r.store, body)
                probe.arm()
                with caller.scope():
                    w = await guarded(probe, "create", lambda: r.store.create("w", cwd="/chaos"))
                    if w is not None:
                        track_session(probe, w)
                        for pair in ([1, 2], [3, 4]):
                            await guarded(probe, "append", partial(append_turns, w, pair, pause=0.02))
                            await flush_and_acknowledge(probe, w, "flush")
                interrupted = caller.cancelled or body.cancel_called
                for h in await guarded(probe, "store.list", r.store.list) or []:
                    check_live(probe, h, idle=not interrupted)
                await check_runtime_live(probe, r)
        check_runtime_exited(probe, None)
    finally:
        close_backend(backend)
    probe.disarm()
    check_at_rest(probe, kind)


async def agents_session(probe: Probe, kind: str) -> None:
    """The OpenAI Agents SDK Session on a stored session (``TrioAgentsSession``): items
    added in two batches, one popped, the list cleared, one more added; each mutation
    durable when it returns (acknowledged then). A cancelled or failed operation
    changed nothing or everything it meant to; the list is a fold of the log."""
    from harness._runtime_api import Runtime  # imported here: the bridge imports the agent loop
    from harness.bridge import TrioAgentsSession

    backend = make_backend(probe, kind)
    answers: list[Any] = []
    try:
        async with rig(probe, backend, write_delay=0.05) as r, Owner("chaos") as owner:
            rt = Runtime(store=r.store, persistence=r.persistence, loop=r.loop, owner=owner)
            session = TrioAgentsSession(rt, "sdk", cwd="/chaos")
            ops: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
                ("add_items", partial(session.add_items, [{"role": "user", "content": "a"}])),
                ("add_items", partial(session.add_items, [{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])),
                ("pop_item", session.pop_item),
                ("clear_session", session.clear_session),
                ("add_items", partial(session.add_items, [{"role": "user", "content": "d"}])),
            ]
            with trio.CancelScope() as body:
                caller = Caller()
                probe.canceller("caller", caller.cancel)
                bind_teardown(probe, None, r.store, body)
                probe.arm()
                with caller.scope():
                    for what, op in ops:
                        handle = await guarded(probe, "open", session.handle)
                        if handle is None:
                            break
                        track_session(probe, handle)
                        ok = [False]

                        async def run(op: Callable[[], Awaitable[Any]] = op, ok: list[bool] = ok) -> None:
                            answers.append(await op())
                            ok[0] = True

                        await guarded(probe, what, run)
                        if not ok[0]:
                            break
                        events = handle.events  # the mutation flushed all of them
                        if len(events):
                            probe.acknowledge(handle.id, len(events) - 1, [event_to_record(e) for e in events])
                listed = await guarded(probe, "get_items", session.get_items)
                live = r.store.get_nowait("sdk")
                if listed is not None and live is not None:
                    folded = [thaw(e.data)["item"] for e in live.events if e.type == "openai-agents/item"]
                    probe.check(all(item in folded for item in listed), f"get_items {listed} not in the log {folded}")
                    if not (caller.cancelled or body.cancel_called) and probe.faults is None:
                        probe.check(
                            listed == [{"role": "user", "content": "d"}] and answers[2] == {"role": "user", "content": "c"},
                            f"clean run: items {listed}, answers {answers}",
                        )
                await check_runtime_live(probe, r)
        check_runtime_exited(probe, None)
    finally:
        close_backend(backend)
    probe.disarm()
    check_at_rest(probe, kind)


async def close_writes(probe: Probe, kind: str) -> None:
    """Two sessions leave events for the close to write: ``a`` is detached with its
    turn unwritten (its retirement runs in the background, racing the close), ``b``
    stays live with a flushed turn and an unflushed one. Under one transient I/O fault
    the close still loses nothing and reports nothing: the final write of a live
    session is tried once more, and a background retirement that failed is retried
    (or found already done by the writer's own retry). Checked against every event the
    sessions committed, not only the acknowledged ones."""
    backend = make_backend(probe, kind)
    handles: list[SessionHandle] = []
    close_error: PersistenceError | None = None
    try:
        try:
            async with rig(probe, backend, write_delay=0.05) as r:
                with trio.CancelScope() as body:
                    caller = Caller()
                    probe.canceller("caller", caller.cancel)
                    bind_teardown(probe, None, r.store, body)
                    probe.arm()
                    with caller.scope():
                        for sid in ("a", "b"):
                            h = await guarded(probe, f"create {sid}", partial(r.store.create, sid, cwd="/chaos"))
                            if h is not None:
                                track_session(probe, h)
                                handles.append(h)
                                await guarded(probe, "append", partial(append_turns, h, [1]))
                        if len(handles) == 2:
                            await flush_and_acknowledge(probe, handles[1], "flush b")
                            await guarded(probe, "append", partial(append_turns, handles[1], [2]))
                        if handles and handles[0].id == "a":
                            await guarded(probe, "detach a", partial(r.store.detach, handles[0]))
        except* PersistenceCloseError as group:
            close_error = group.exceptions[0]  # type: ignore[assignment]
    finally:
        close_backend(backend)
    probe.disarm()
    # With no fault, or one transient I/O fault, closing loses nothing (a cancelled
    # caller or teardown stops the appends, not the close).
    probe.check(close_error is None, f"closing reported a loss: {close_error}")
    if close_error is None:
        plain = plain_backend(probe, kind)
        try:
            for h in handles:
                committed = [event_to_record(e) for e in h.events]
                try:
                    stored = list(plain.load(h.id).records)
                except PersistedSessionNotFoundError:
                    stored = []
                probe.check(
                    [_canonical(x) for x in stored[: len(committed)]] == [_canonical(x) for x in committed],
                    f'session "{h.id}": {len(committed)} event(s) committed, {len(stored)} stored after the close',
                )
        finally:
            close_backend(plain)
    check_at_rest(probe, kind)


class Detacher:
    """The ``actor-stop`` canceller: detaches a session (its actor stops: drain, children
    cancelled, ``on_stop``) from a helper task, as an application closing it would."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.handle: SessionHandle | None = None
        self._go = trio.Event()

    def __call__(self) -> None:
        self._go.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The helper task. Cancellation: cancel its nursery when done."""
        task_status.started()
        await self._go.wait()
        if self.handle is not None:
            await guarded_detach(self.store, self.handle)


async def guarded_detach(store: Store, handle: SessionHandle) -> None:
    with contextlib.suppress(HarnessError):
        await store.detach(handle)


LONG_TEXT: Final = "the compaction scenario needs enough text to be worth summarizing " * 12


async def chaos_summarizer(inp: SummarizationInput) -> SummaryOutput:
    """A summarizer with a few checkpoints and no provider (deterministic)."""
    for _ in range(3):
        await trio.lowlevel.checkpoint()
    block = freeze({"type": "text", "text": f"- {len(inp.messages)} messages condensed"})
    assert isinstance(block, FrozenDict)
    return SummaryOutput(summary=(block,), raw_output=(block,), provider="chaos", model="chaos-1", max_tokens=64)


async def compaction(probe: Probe, kind: str) -> None:
    """A session with two closed turns and an open one is compacted (automatic, owned by
    the open turn) while a log-only event is appended; then the turn is closed, flushed."""
    backend = make_backend(probe, kind)
    try:
        async with rig(probe, backend, write_delay=0.05) as r, trio.open_nursery() as helpers:
            detacher = Detacher(r.store)
            await helpers.start(detacher.run)
            with trio.CancelScope() as body:
                caller = Caller()
                probe.canceller("caller", caller.cancel)
                probe.canceller("actor-stop", detacher)
                bind_teardown(probe, None, r.store, body)
                s = await r.store.create("c", cwd="/chaos")
                track_session(probe, s)
                detacher.handle = s
                seqs = await _compaction_seed(s)
                await flush_and_acknowledge(probe, s, "seed flush")
                probe.arm()
                with caller.scope():
                    await guarded(probe, "compact", partial(s.compact_region, seqs[0], seqs[3], summarizer=chaos_summarizer))
                    await guarded(probe, "request/header", partial(s.append, "request/header", {"header": {"config": {"provider": "chaos", "model": "chaos-1"}}, "reason": "initial"}))
                # Whatever happened, no live session is left with an open bracket.
                if s.alive:
                    probe.check(open_compaction(list(s.events)) is None, 'live "c": a compaction bracket is left open after compact_region returned')
                with caller.scope():
                    await guarded(probe, "turn/end", partial(s.append, "turn/end", {"turn": 3, "reason": {"kind": "completed"}}))
                    await flush_and_acknowledge(probe, s, "flush")
                for h in await guarded(probe, "store.list", r.store.list) or []:
                    check_live(probe, h, idle=False)
                await check_runtime_live(probe, r)
            helpers.cancel_scope.cancel()
        check_runtime_exited(probe, None)
    finally:
        close_backend(backend)
    probe.disarm()
    check_at_rest(probe, kind)
    if probe.faults is None:
        # No I/O fault, no crash: the runtime closed cleanly, so every bracket it opened
        # was closed on disk too (by the caller's path or by the actor's on_stop).
        stored = plain_backend(probe, kind)
        try:
            left = open_compaction(stored.load("c").records)
        finally:
            close_backend(stored)
        probe.check(left is None, f'stored "c": compaction {left} is left open after a clean close')


async def _compaction_seed(s: SessionHandle) -> list[int]:
    """Two closed turns and an open third (unarmed); the surface seqs of the messages."""
    seqs: list[int] = []
    for t in (1, 2):
        events = await s.append_batch(
            [
                EventDraft("turn/start", {"turn": t}),
                EventDraft("user/message", _message("user", f"u{t}", LONG_TEXT), "append"),
                EventDraft("step/start", {"turn": t, "step": 1}),
                EventDraft("assistant/message", {"turn": t, "step": 1, "message": _message("assistant", f"a{t}", LONG_TEXT)}, "append"),
                EventDraft("step/end", {"turn": t, "step": 1}),
                EventDraft("turn/end", {"turn": t, "reason": {"kind": "completed"}}),
            ]
        )
        seqs += [events[1].seq, events[3].seq]
    await s.append_batch([EventDraft("turn/start", {"turn": 3}), EventDraft("user/message", _message("user", "u3", "go on"), "append")])
    return seqs


def _message(role: str, mid: str, text: str, *, provider: str = "chaos", model: str = "chaos-1") -> dict[str, Any]:
    source = {"kind": "user"} if role == "user" else {"kind": "model", "provider": provider, "model": model}
    return {"id": mid, "role": role, "content": [{"type": "text", "text": text}], "source": source}


# -- agent compaction -------------------------------------------------------------------------

#: Pressure at half the window, keep a tenth of it: with the window below, two turns of
#: :data:`HISTORY_TEXT` reach the threshold (one does not), and one summary of the
#: oldest turn brings the surface back under it.
AGENT_COMPACTION_CONFIG: Final = {"thresholdRatio": 0.5, "retainRatio": 0.1}
AGENT_COMPACTION_WINDOW: Final = 700
HISTORY_TEXT: Final = "history that the next request cannot carry whole, so it is summarized first; " * 8
FOLLOW_UP_TEXT: Final = "and now the follow-up"
#: When the follow-up is sent (attempt clock), and how long each ``/compact`` summary
#: takes: the send lands while the summary runs.
FOLLOW_UP_AT: Final = 0.5
SUMMARY_DELAY: Final = 1.0
COMPACTED_TEXT: Final = re.compile(r"Compacted \d+ history items \(~\d+ tokens\)\.")


def agent_compaction_policy(*, summaries: int, delay: float = 0.0) -> AgentCompaction:
    """The policy of the agent compaction scenarios: the config above and a summary
    provider of its own (``summaries`` replies, each after ``delay`` seconds on the
    attempt's clock), so that the agent's script does not depend on how many summaries
    ran."""
    reply: list[Any] = [Delay(delay)] if delay else []
    reply.append(Say("- the earlier turns, summarized"))
    summary = ScriptedProvider([reply] * summaries, name="summary", model="summary-1")
    return AgentCompaction(load_basic_compaction_config(AGENT_COMPACTION_CONFIG), summary_provider=summary)


def history_drafts(turns: int) -> list[EventDraft]:
    """``turns`` completed turns of :data:`HISTORY_TEXT`, each answered ``noted``, as the
    rig's agent logs them (request header and context before the first reply, the
    scripted provider's usage on every reply): history without running the turns,
    which would cost every attempt two agent turns with their checkpoints."""
    provider, model = "scripted", "script-1"
    header = {
        "config": {"provider": provider, "model": model},
        "tools": [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in TOOLS.specs],
    }
    drafts: list[EventDraft] = []
    for t in range(1, turns + 1):
        drafts += [
            EventDraft("turn/start", {"turn": t}),
            EventDraft("step/start", {"turn": t, "step": 1}),
            EventDraft("user/message", _message("user", f"history-u{t}", HISTORY_TEXT), "append"),
        ]
        if t == 1:
            drafts += [
                EventDraft("request/header", {"header": header, "reason": "initial"}),
                EventDraft("request/context", {"provider": provider, "model": model, "contextWindow": AGENT_COMPACTION_WINDOW}),
            ]
        reply = _message("assistant", f"history-a{t}", "noted", provider=provider, model=model)
        # The scripted provider reports 10 input tokens per request message, plus 20.
        usage = {"inputTokens": 10 * (2 * t - 1) + 20, "outputTokens": 1}
        drafts += [
            EventDraft("assistant/message", {"turn": t, "step": 1, "message": reply, "usage": usage}, "append"),
            EventDraft("step/end", {"turn": t, "step": 1}),
            EventDraft("turn/end", {"turn": t, "reason": {"kind": "completed"}}),
        ]
    return drafts


def seed_history(probe: Probe, turns: int) -> Callable[[AgentRun], Awaitable[None]]:
    """An :func:`agent_run` setup (unarmed): agent ``"ac"`` is created with
    :func:`history_drafts` appended by ``create``'s ``setup`` (before it is published,
    so the agent numbers its next turn after them), then flushed."""

    async def fill(session: Session) -> None:
        session.append_batch(history_drafts(turns))

    async def setup(run: AgentRun) -> None:
        h = await run.rig.loop.create("ac", owner=run.owner, cwd="/chaos", setup=fill)
        run.handles.append(h)
        track_session(probe, h.session)
        await flush_and_acknowledge(probe, h.session, "seed flush")

    return setup


def _data(event: Any) -> dict[str, Any]:
    data = thaw(event.data)
    return data if type(data) is dict else {}


@contextmanager
def then_check(check: Callable[[], None]) -> Iterator[None]:
    """Run ``check`` once the block has exited, normally, with an error or cancelled,
    but not when the world stopped in it (a simulated crash: nothing runs after one)."""
    try:
        yield
    except BaseException as exc:
        if not any(isinstance(leaf, SimulatedCrash) for leaf in _leaves(exc)):
            check()
        raise
    check()


def check_brackets(probe: Probe, handle: SessionHandle, after: str) -> None:
    """In a live session: no compaction bracket left open, and no bracket ended twice."""
    if not handle.alive:
        return
    events = list(handle.events)
    left = open_compaction(events)
    probe.check(left is None, f'live "{handle.id}": compaction {left} is left open after {after}')
    ends: dict[str, int] = {}
    for e in events:
        if e.type == "compaction/end":
            cid = str(_data(e).get("compactionId"))
            ends[cid] = ends.get(cid, 0) + 1
    for cid, n in ends.items():
        probe.check(n <= 1, f'live "{handle.id}": compaction {cid} has {n} compaction/end records')


def _text(message: object) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")


async def agent_compaction(probe: Probe, kind: str) -> None:
    """An agent with compaction configured and two turns of history runs a turn: its
    pre-step compacts under pressure, its first request overflows the context window
    and the recovery compacts again and retries in the same step."""
    overflow = Fail(ContextWindowExceededError("the request does not fit the context window"))
    script = [[overflow], [Say("recovered")]]
    async with agent_run(
        probe,
        kind,
        agent_cancel=True,
        script=script,
        context_window=AGENT_COMPACTION_WINDOW,
        compaction=agent_compaction_policy(summaries=4),
        setup=seed_history(probe, 2),
    ) as run:
        h = run.handles[0]
        result: TurnResult | None = None
        with run.caller.scope():
            with then_check(partial(check_brackets, probe, h.session, "the turn returned")):
                result = await guarded(probe, "run_turn", partial(h.run_turn, "go on"))
            await flush_and_acknowledge(probe, h.session, "flush")
        if probe.faults is None and not probe.fired:
            _check_recovered(probe, h.session, result)


def _check_recovered(probe: Probe, s: SessionHandle, result: TurnResult | None) -> None:
    """A clean run: the turn completed in one step, with a successful pressure
    compaction before its step and a successful overflow compaction inside it (the
    retry ran in the same step)."""
    if result is None or result.kind != "completed":
        probe.fail(f"clean run: the compacting turn did not complete: {result}")
        return
    mine = [e for e in list(s.events) if _data(e).get("turn") == result.turn]
    steps = [e.seq for e in mine if e.type == "step/start"]
    probe.check(
        len(steps) == 1,
        f"clean run: turn {result.turn} has {len(steps)} step/start records (the overflow retry runs in the same step)",
    )
    done = [e.seq for e in mine if e.type == "compaction/end" and "error" not in _data(e)]
    probe.check(bool(done), f"clean run: turn {result.turn} has no successful compaction bracket")
    if steps and done:
        probe.check(
            done[0] < steps[0] < done[-1],
            f"clean run: turn {result.turn}: successful brackets end at {done}, its step starts at {steps[0]} "
            "(expected one from pressure before the step and one from overflow recovery in it)",
        )


async def compact_command(probe: Probe, kind: str) -> None:
    """An idle agent with history runs ``/compact`` while a follow-up is sent during
    the summary: the follow-up is recorded, and its turn runs, once the compaction has
    ended (reference: only ``compaction/start`` sits inside a manual bracket)."""
    script = [[Say("followed up")]]
    async with agent_run(
        probe,
        kind,
        agent_cancel=True,
        script=script,
        context_window=AGENT_COMPACTION_WINDOW,
        compaction=agent_compaction_policy(summaries=4, delay=SUMMARY_DELAY),
        setup=seed_history(probe, 2),
    ) as run:
        h = run.handles[0]
        commands = run.rig.loop.commands

        async def follow_up() -> None:
            await trio.sleep(FOLLOW_UP_AT)
            await guarded(probe, "send", partial(h.agent.send, FOLLOW_UP_TEXT, delivery="follow-up"))

        with run.caller.scope():
            with (
                then_check(partial(check_commands, probe, h.session)),
                then_check(partial(check_brackets, probe, h.session, "/compact returned")),
            ):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(guarded, probe, "/compact", partial(commands.run, h.agent, "/compact"))
                    nursery.start_soon(follow_up)
            await guarded(probe, "wait_idle", h.agent.wait_idle)
            await flush_and_acknowledge(probe, h.session, "flush")
        _check_follow_up(probe, h.session, clean=probe.faults is None and not probe.fired)


def check_commands(probe: Probe, s: SessionHandle) -> None:
    """In a live session: every ``command/run`` has exactly one ``command/done`` with
    its ``commandId``."""
    if not s.alive:
        return
    runs: dict[str, int] = {}
    dones: dict[str, int] = {}
    for e in list(s.events):
        if e.type in ("command/run", "command/done"):
            counts = runs if e.type == "command/run" else dones
            cid = str(_data(e).get("commandId"))
            counts[cid] = counts.get(cid, 0) + 1
    for cid in runs.keys() | dones.keys():
        n_run, n_done = runs.get(cid, 0), dones.get(cid, 0)
        probe.check(
            n_run == 1 and n_done == 1,
            f'live "{s.id}": command {cid}: {n_run} command/run and {n_done} command/done records',
        )


def _check_follow_up(probe: Probe, s: SessionHandle, *, clean: bool) -> None:
    """Nothing of the follow-up is written inside the ``/compact`` bracket: neither its
    inbox record nor its turn (reference: a send during a manual compaction waits for
    the bracket to close). A clean run also compacted successfully (the answer names
    what), recorded the follow-up after the bracket, and its turn completed."""
    events = list(s.events)
    commands = {str(_data(e).get("commandId")) for e in events if e.type == "command/run"}
    start: int | None = None
    end: int | None = None
    sent: int | None = None
    current: tuple[int, int] | None = None  # the latest turn/start: (turn, seq)
    turn: tuple[int, int] | None = None  # the turn that claimed the follow-up
    for e in events:
        d = _data(e)
        if e.type == "compaction/start" and d.get("sourceCommandId") in commands:
            start = e.seq
        elif e.type == "compaction/end" and d.get("sourceCommandId") in commands:
            end = e.seq
        elif e.type == "agent/inbox/spliced" and any(_text(m) == FOLLOW_UP_TEXT for m in d.get("inserted", [])):
            sent = e.seq
        elif e.type == "turn/start":
            current = (int(d.get("turn", 0)), e.seq)
        elif e.type == "user/message" and _text(d) == FOLLOW_UP_TEXT:
            turn = current
    if sent is not None and start is not None and sent > start:
        probe.check(
            end is not None and sent > end,
            f'live "{s.id}": the follow-up was recorded at seq {sent}, inside the /compact bracket (seqs {start}..{end})',
        )
    if turn is not None and start is not None and turn[1] > start:
        probe.check(
            end is not None and turn[1] > end,
            f'live "{s.id}": the follow-up\'s turn {turn[0]} starts at seq {turn[1]}, inside the /compact bracket (seqs {start}..{end})',
        )
    if not clean:
        return
    done = [_data(e) for e in events if e.type == "command/done"]
    probe.check(
        len(done) == 1 and done[0].get("kind") == "success" and COMPACTED_TEXT.fullmatch(str(done[0].get("text"))) is not None,
        f"clean run: /compact answered {done}",
    )
    probe.check(
        sent is not None and end is not None and sent > end,
        f"clean run: the follow-up (seq {sent}) was not recorded after the /compact bracket (seqs {start}..{end})",
    )
    reasons = [
        _data(e).get("reason") for e in events if e.type == "turn/end" and turn is not None and _data(e).get("turn") == turn[0]
    ]
    probe.check(
        turn is not None and reasons == [{"kind": "completed"}],
        f"clean run: the follow-up's turn {turn} did not complete: {reasons}",
    )


# -- group commit (issue 26) --------------------------------------------------------------------

GROUP_SESSIONS: Final = ("g1", "g2", "g3")


async def group_commit(probe: Probe, kind: str) -> None:
    """Three sessions append a turn and flush at the same time, twice: their batches
    meet in the group committer's rounds (``write_group``: one transaction, or one
    round of fsyncs, for several sessions), then a clean close. Every flush that
    returned is acknowledged for its own session; a crash mid-round must lose none of
    them. A clean run checks that some round did carry several sessions' batches."""
    backend = make_backend(probe, kind)
    try:
        async with rig(probe, backend, write_delay=60) as r:
            with trio.CancelScope() as body:
                caller = Caller()
                probe.canceller("caller", caller.cancel)
                bind_teardown(probe, None, r.store, body)
                committer = r.persistence.committer
                probe.arm()
                with caller.scope():
                    handles: list[SessionHandle] = []
                    for sid in GROUP_SESSIONS:
                        h = await guarded(probe, "create", partial(r.store.create, sid, cwd="/chaos"))
                        if h is None:
                            break
                        track_session(probe, h)
                        handles.append(h)

                    async def turn_then_flush(h: SessionHandle, turn: int) -> None:
                        await guarded(probe, "append", partial(append_turns, h, [turn]))
                        await flush_and_acknowledge(probe, h, "flush")

                    for turn in (1, 2):
                        async with trio.open_nursery() as n:
                            for h in handles:
                                n.start_soon(turn_then_flush, h, turn)
                interrupted = caller.cancelled or body.cancel_called
                for h in await guarded(probe, "store.list", r.store.list) or []:
                    check_live(probe, h, idle=not interrupted)
                await check_runtime_live(probe, r)
                if not interrupted and probe.canceller_name is None and probe.faults is None:
                    probe.check(
                        committer.batches > committer.rounds,
                        f"clean run: no round carried more than one batch ({committer.batches} batch(es) "
                        f"in {committer.rounds} round(s))",
                    )
        check_runtime_exited(probe, None)
    finally:
        close_backend(backend)
    probe.disarm()
    check_at_rest(probe, kind)


# -- the registry -----------------------------------------------------------------------------

_DEFS: Final[list[tuple[str, Callable[[Probe, str], Awaitable[None]], str, tuple[str, ...], tuple[str, ...]]]] = [
    (
        "agent-turn",
        agent_turn,
        "an agent with the scripted provider and two tools runs a turn with tool calls",
        ("caller", "owner", "teardown", "agent-cancel"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "resume",
        resume,
        "resume a persisted session through AgentLoop.resume, run a turn, dispose",
        ("caller", "owner", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "fork",
        fork,
        "fork a live session (at a turn boundary, then at its last seq) while turns are appended",
        ("caller", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "lifecycle",
        lifecycle,
        "create/append/flush/detach concurrency; re-open a detached session while it retires",
        ("caller", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "compaction",
        compaction,
        "an automatic compaction of two turns inside an open turn, with the actor owning the bracket",
        ("caller", "teardown", "actor-stop"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "agent-compaction",
        agent_compaction,
        "an agent's turn compacts under pressure, overflows the context window, recovers and retries in the same step",
        ("caller", "owner", "teardown", "agent-cancel"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "compact-command",
        compact_command,
        "an idle agent runs /compact while a follow-up is sent during the summary",
        ("caller", "owner", "teardown", "agent-cancel"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "close-writes",
        close_writes,
        "a detached and a live session leave events for the close; after one transient fault it loses nothing",
        ("caller", "teardown"),
        ("checkpoints", "io"),
    ),
    (
        "agents-session",
        agents_session,
        "the OpenAI Agents SDK Session (harness.bridge) adds, pops and clears items, each mutation durable",
        ("caller", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "write-behind",
        write_behind,
        "appends with the write window running, flushes, clean close",
        ("caller", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
    (
        "group-commit",
        group_commit,
        "three sessions append and flush at once, twice: their batches share group-commit rounds",
        ("caller", "teardown"),
        ("checkpoints", "io", "crash"),
    ),
]


def _bind(fn: Callable[[Probe, str], Awaitable[None]], kind: str) -> Callable[[Probe], Awaitable[None]]:
    async def run(probe: Probe) -> None:
        await fn(probe, kind)

    run.__name__ = f"{fn.__name__}_{kind}"
    return run



def builtin_scenarios() -> list[Scenario]:
    """Every built-in scenario, one per backend (``NAME/jsonl``, ``NAME/sqlite``, and
    for a subset ``NAME/jsonl-zstd`` and ``NAME/postgres``, see
    :func:`~harness.faults._backends.scenario_modes`)."""
    out: list[Scenario] = []
    for name, fn, description, cancellers, all_modes in _DEFS:
        for kind in BACKENDS:
            modes = scenario_modes(name, kind, all_modes)
            if not modes:
                continue
            out.append(
                Scenario(
                    name=f"{name}/{kind}",
                    run=_bind(fn, kind),
                    description=description,
                    cancellers=cancellers,
                    backend=kind,
                    modes=modes,
                    settings=SETTINGS,
                )
            )
    return out


def select_scenarios(names: Sequence[str]) -> list[Scenario]:
    """The built-in scenarios matching ``names`` (``agent-turn`` selects both backends,
    ``agent-turn/sqlite`` one); all of them for an empty list. Unknown names raise
    ``KeyError``."""
    every = builtin_scenarios()
    if not names:
        return every
    out: list[Scenario] = []
    for name in names:
        found = [s for s in every if s.name == name or s.name.split("/")[0] == name]
        if not found:
            raise KeyError(name)
        out.extend(s for s in found if s not in out)
    return out
