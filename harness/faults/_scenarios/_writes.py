"""The write-path family: ``write-behind`` (the write window running under appends)
and ``close-writes`` (the close writes what sessions left, under a transient fault)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Final, cast

import trio

from harness.errors import (
    HarnessError,
    PersistedSessionNotFoundError,
    PersistenceCloseError,
    PersistenceError,
)
from harness.faults._backends import (
    check_at_rest,
    close_backend,
    make_backend,
    plain_backend,
    track_session,
)
from harness.faults._explore import Probe
from harness.faults._invariants import _canonical
from harness.faults._scenarios._frame import (
    Caller,
    append_turns,
    bind_teardown,
    check_live,
    flush_and_acknowledge,
    guarded,
    note_errors,
    rig,
    store_run,
    turn_batches,
)
from harness.runtime import SessionHandle, Store
from harness.session import event_to_record


async def write_behind(probe: Probe, kind: str) -> None:
    """Turns appended in small batches with the write window running in the background,
    a flush after every second turn, then a clean close."""
    async with store_run(probe, kind) as run:
        r, caller = run.rig, run.caller
        probe.arm()
        with caller.scope():
            w = await guarded(probe, "create", lambda: r.store.create("w", cwd="/chaos"))
            if w is not None:
                track_session(probe, w)
                for pair in ([1, 2], [3, 4]):
                    await guarded(probe, "append", partial(append_turns, w, pair, pause=0.02))
                    await flush_and_acknowledge(probe, w, "flush")
        for h in await guarded(probe, "store.list", r.store.list) or []:
            check_live(probe, h, idle=not run.interrupted)


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


# -- group commit (issue 26) --------------------------------------------------------------------

GROUP_SESSIONS: Final = ("g1", "g2", "g3")


async def create_tracked(probe: Probe, store: Store, ids: Sequence[str]) -> list[SessionHandle]:
    """Create the sessions ``ids`` in order, each tracked by ``probe``; stops at the
    first that fails (a typed failure, checked by :func:`guarded`).

    Cancellation: ``Cancelled`` propagates; what was created stays tracked."""
    handles: list[SessionHandle] = []
    for sid in ids:
        h = await guarded(probe, "create", partial(store.create, sid, cwd="/chaos"))
        if h is None:
            break
        track_session(probe, h)
        handles.append(h)
    return handles


async def group_commit(probe: Probe, kind: str) -> None:
    """Three sessions append a turn and flush at the same time, twice: their batches
    meet in the group committer's rounds (``write_group``: one transaction, or one
    round of fsyncs, for several sessions), then a clean close. Every flush that
    returned is acknowledged for its own session; a crash mid-round must lose none of
    them. A clean run checks that some round did carry several sessions' batches."""
    async with store_run(probe, kind, write_delay=60) as run:
        r, caller = run.rig, run.caller
        committer = r.persistence.committer
        probe.arm()
        with caller.scope():
            handles = await create_tracked(probe, r.store, GROUP_SESSIONS)

            async def turn_then_flush(h: SessionHandle, turn: int) -> None:
                await guarded(probe, "append", partial(append_turns, h, [turn]))
                await flush_and_acknowledge(probe, h, "flush")

            for turn in (1, 2):
                async with trio.open_nursery() as n:
                    for h in handles:
                        n.start_soon(turn_then_flush, h, turn)
        for h in await guarded(probe, "store.list", r.store.list) or []:
            check_live(probe, h, idle=not run.interrupted)
        if not run.interrupted and probe.canceller_name is None and probe.faults is None:
            probe.check(
                committer.batches > committer.rounds,
                f"clean run: no round carried more than one batch ({committer.batches} batch(es) "
                f"in {committer.rounds} round(s))",
            )


# -- durable appends (issue 26) -----------------------------------------------------------------

DURABLE_SESSIONS: Final = ("d1", "d2")


def _landed(h: SessionHandle, since: int, type_: str) -> list[int]:
    """The seqs of ``h``'s events of type ``type_`` from seq ``since`` on."""
    return [e.seq for e in h.events if e.seq >= since and e.type == type_]


async def durable_append(probe: Probe, kind: str) -> None:
    """Two sessions append a turn at the same time, event by event, each with
    ``append(..., durable=True)`` (their flushes share group-commit rounds); every
    event of ``d2`` goes behind a cast (a ``feedback/record`` sent with
    ``append_nowait`` just before), so its durable appends take the busy-actor path
    (queued, then the store's general flush, shielded). Each durable append that
    returned is acknowledged with everything before it. One that raised ``Cancelled``
    must have applied nothing (the log holds no event of its own after the call
    started); one that returned after a cancellation must have been written (it was
    acknowledged). A crash mid-round loses nothing acknowledged."""
    async with store_run(probe, kind, write_delay=60) as run:
        r, caller = run.rig, run.caller
        probe.arm()
        with caller.scope():
            handles = await create_tracked(probe, r.store, DURABLE_SESSIONS)

            async def durable_turn(h: SessionHandle, behind_cast: bool) -> None:
                for batch in turn_batches(1, h.seq):
                    for draft in batch:
                        if behind_cast:
                            try:
                                h.append_nowait("feedback/record", {"before": draft.type})
                            except HarnessError as exc:  # e.g. the session was detached
                                note_errors(probe, exc, "cast")
                        before = h.seq
                        try:
                            ev = await guarded(
                                probe,
                                "durable append",
                                partial(h.append, draft.type, draft.data, surface_op=cast(Any, draft.surface_op), durable=True),
                            )
                        except trio.Cancelled:
                            mine = _landed(h, before, draft.type)
                            probe.check(
                                not mine,
                                f'session "{h.id}": append(durable=True) of {draft.type} raised Cancelled, '
                                f"yet the log holds it at seq {mine}",
                            )
                            raise
                        if ev is None:  # a typed failure, checked by guarded
                            if _landed(h, before, draft.type):
                                continue  # applied, its flush failed (FlushError): not acknowledged
                            return  # not applied (the session is gone): the turn stops here
                        events = h.events
                        probe.acknowledge(h.id, ev.seq, [event_to_record(e) for e in events[: ev.seq + 1]])

            async with trio.open_nursery() as n:
                for i, h in enumerate(handles):
                    n.start_soon(durable_turn, h, i == 1)
        for h in await guarded(probe, "store.list", r.store.list) or []:
            check_live(probe, h, idle=not run.interrupted)
