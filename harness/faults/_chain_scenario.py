"""The ``group-chain`` scenario: the group committer's chained rounds (decision 0015)
driven directly, so that its races are reached: the runtime's writers withdraw a batch
only after a 30 s bound on the wall clock, and three sessions flushing at once meet in
one round.

Three sessions submit three batches each to one :class:`GroupCommitter` over a real
backend, staggered by a different number of checkpoints, so their submits land while
the chain (gated step by step by the explorer, see ``_ChainSteps``) takes, writes,
publishes and wakes: a submit while the carrier decides to end (the ``_busy``
hand-over), several rounds written before the Trio thread completes the first
(coalesced completions), a close while a chain runs (canceller ``close``). A waiter
cancelled (cancellers ``waiter``: session ``b``'s, ``caller``: every one) withdraws its
batch, which is either still pending (taken back), taken by a round not yet at it
(withdrawn by the job's own lock) or being written (then waited for, shielded). Checks:

* every batch gets exactly one outcome; a clean run acknowledges all of them and
  composes at least one round of several batches;
* each session's stored log is its seed and exactly its acknowledged batches, in order
  (a batch that failed under an injected fault may or may not have landed, and ends
  that session); a withdrawn batch is never written;
* once the last waiter returned the chain ends: nothing pending, every round completed,
  no carrier left;
* at rest (also after a crash mid-round): every acknowledged batch is there
  (:func:`~harness.faults.check_at_rest`, run by the I/O and crash explorers).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import outcome
import trio

from harness.faults._backends import Backend, close_backend, make_backend, plain_backend
from harness.faults._explore import Probe
from harness.faults._group_scenario import _events, _header
from harness.persistence._backend import GroupWrite
from harness.persistence._committer import CommitJob, GroupCommitter
from harness.persistence._files import SimulatedCrash

#: Session -> (seeded events, checkpoints between its batches).
_SESSIONS = {"a": (2, 0), "b": (0, 1), "c": (2, 2)}
_BATCHES = 3
_SIZE = 2  # events per batch
#: Checkpoints the end of the scenario waits at most for the chain to end (each is a
#: scheduler batch, where the gate grants it steps).
_END_POLLS = 400


class _Session:
    """One session's side: its batches, what came of them, and why it stopped."""

    def __init__(self, sid: str, seeded: int) -> None:
        self.sid = sid
        self.seed = _events(sid, 0, seeded)
        self.batches: list[list[dict[str, Any]]] = []
        self.acked = 0  # batches acknowledged (a prefix of ``batches``)
        self.failed: BaseException | None = None  # the batch after the acked ones failed
        self.withdrawn = False  # the batch after the acked ones was withdrawn


async def group_chain(probe: Probe, kind: str) -> None:
    """See the module docstring."""
    seed = plain_backend(probe, kind)
    try:
        for sid, (seeded, _) in _SESSIONS.items():
            if seeded:
                await trio.to_thread.run_sync(seed.materialize, _header(sid), _events(sid, 0, seeded))
    finally:
        close_backend(seed)
    sessions = {sid: _Session(sid, seeded) for sid, (seeded, _) in _SESSIONS.items()}
    tracked: dict[str, dict[str, Any]] = probe.data.setdefault("sessions", {})
    for s in sessions.values():
        tracked[s.sid] = _header(s.sid)
        if s.seed:
            probe.acknowledge(s.sid, len(s.seed) - 1, s.seed)
    backend = make_backend(probe, kind)
    committer = GroupCommitter(backend)
    crashed = False
    try:
        with trio.CancelScope() as caller:
            probe.canceller("caller", caller.cancel)
            probe.canceller("close", committer.close)
            scopes = {sid: trio.CancelScope() for sid in _SESSIONS}
            probe.canceller("waiter", scopes["b"].cancel)
            probe.arm()
            async with trio.open_nursery() as n:
                for sid, (_, stagger) in _SESSIONS.items():
                    n.start_soon(_session, probe, committer, sessions[sid], stagger, scopes[sid])
        crashed = any(isinstance(s.failed, SimulatedCrash) for s in sessions.values())
        await _chain_ends(probe, committer)
        if not crashed:
            await trio.to_thread.run_sync(_check_stored, probe, kind, list(sessions.values()))
        clean = probe.canceller_name is None and probe.faults is None
        if clean:
            for s in sessions.values():
                probe.check(
                    s.acked == _BATCHES and s.failed is None and not s.withdrawn,
                    f'clean run: session "{s.sid}" had {s.acked} of {_BATCHES} batches acknowledged '
                    f"(failed: {s.failed!r}, withdrawn: {s.withdrawn})",
                )
            probe.check(
                committer.batches > committer.rounds,
                f"clean run: no round carried more than one batch ({committer.batches} in {committer.rounds} rounds)",
            )
    finally:
        committer.close()
        close_backend(backend)
        probe.disarm()


async def _session(
    probe: Probe, committer: GroupCommitter, s: _Session, stagger: int, scope: trio.CancelScope
) -> None:
    """Submit this session's batches one after the other (at most one in flight, as a
    ``SessionWriter``), each waited for; a cancelled wait withdraws it."""
    seq = len(s.seed)
    materialized = bool(s.seed)
    with scope:
        for _ in range(_BATCHES):
            for _ in range(stagger):
                await trio.lowlevel.checkpoint()
            records = _events(s.sid, seq, _SIZE)
            s.batches.append(records)
            write = GroupWrite(s.sid, _header(s.sid), records, materialized, None)
            job = CommitJob(functools.partial(_prepared, write), _finished)
            committer.submit(job)
            try:
                result = await committer.wait(job)
            except trio.Cancelled:
                if committer.withdraw(job):
                    s.withdrawn = True
                    probe.check(job.result is None, f'session "{s.sid}": a withdrawn batch has an outcome: {job.result!r}')
                    raise
                with trio.CancelScope(shield=True):  # taken and started: it is written or fails
                    result = await committer.wait(job)
                _outcome_of(probe, s, seq, result)
                raise
            if not _outcome_of(probe, s, seq, result):
                return
            seq += _SIZE
            materialized = True


def _prepared(write: GroupWrite) -> GroupWrite:
    return write  # writer thread: nothing to take (no lease: the backends accept none)


def _finished(error: BaseException | None) -> None:
    pass  # writer thread: no bookkeeping of its own


def _outcome_of(probe: Probe, s: _Session, seq: int, result: outcome.Outcome[None]) -> bool:
    """Record one batch's outcome; whether the session goes on."""
    if isinstance(result, outcome.Error):
        s.failed = result.error
        if not isinstance(result.error, SimulatedCrash):
            probe.check(
                probe.faults is not None and bool(getattr(probe.faults, "injected", ())),
                f'session "{s.sid}": a batch failed with nothing injected: {result.error!r}',
            )
        return False
    s.acked += 1
    probe.acknowledge(s.sid, seq + _SIZE - 1, [*s.seed, *(r for b in s.batches[: s.acked] for r in b)])
    return True


async def _chain_ends(probe: Probe, committer: GroupCommitter) -> None:
    """Every waiter returned: the chain must end (each checkpoint is a scheduler batch,
    between which the gate grants the chain its steps), leaving nothing behind."""
    with trio.CancelScope(shield=True):
        for _ in range(_END_POLLS):
            with committer._mutex:
                # Ended, and its last completion ran (one still queued after the chain
                # ended, when every waiter had gone, runs at the next batch).
                if not committer._busy and not committer._done:
                    break
            await trio.lowlevel.checkpoint()
    with committer._mutex:
        probe.check(
            not committer._busy and not committer._pending and not committer._done,
            f"the chain did not end after every waiter returned: busy={committer._busy}, "
            f"{len(committer._pending)} batch(es) pending, {len(committer._done)} round(s) not completed",
        )


def _check_stored(probe: Probe, kind: str, sessions: list[_Session]) -> None:
    """Blocking: each log is its seed and exactly its acknowledged batches, in order
    (plus, after a failed batch, perhaps that one); a withdrawn batch never landed."""
    reader: Backend = plain_backend(probe, kind)
    try:
        for s in sessions:
            acked = [*s.seed, *(r for b in s.batches[: s.acked] for r in b)]
            try:
                stored = list(reader.load(s.sid).records)
            except Exception as exc:
                if acked:
                    probe.fail(f'session "{s.sid}" does not load: {type(exc).__name__}: {exc}')
                continue
            allowed = [acked]
            if s.failed is not None:  # a failed batch may have landed (e.g. a lost fsync answer)
                allowed.append([*acked, *s.batches[s.acked]])
            if stored not in allowed:
                what = "withdrawn" if s.withdrawn else "failed" if s.failed is not None else "last"
                probe.fail(
                    f'session "{s.sid}": stored {len(stored)} event(s), expected {len(acked)} '
                    f"({s.acked} acknowledged batch(es) after {len(s.seed)} seeded; the {what} batch "
                    f"{'must not' if s.withdrawn else 'may'} be there)"
                )
    finally:
        with contextlib.suppress(Exception):
            close_backend(reader)
