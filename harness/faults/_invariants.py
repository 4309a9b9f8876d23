"""Built-in invariants: pure checks that return a list of violation messages ([] = ok).

They take plain values (events or stored records, ``AgentLoop.stats``, task lists) so
they can be used from any test, scenario or tool, with or without the explorer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import orjson

from harness.errors import HarnessError, PersistedSessionNotFoundError
from harness.persistence import build_session
from harness.session import Event, closers_for_records, event_to_record, raw_of


class LockProbe(Protocol):
    """What :func:`check_writer_locks` needs of a backend."""

    def lock_held(self, header: dict[str, Any]) -> bool:
        """Whether any writer (in this or another process) holds the session's lock."""
        ...

    def revision(self, session_id: str) -> str | None: ...


class Loader(Protocol):
    """What :func:`check_stored` needs of a backend (every :class:`Backend` has it)."""

    def load(self, session_id: str) -> Any: ...


def _fields(item: Event | Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    """``(type, seq, data, surface_op)`` of an event or a stored record."""
    if isinstance(item, Event):
        return item.type, item.seq, raw_of(item.data), item.surface_op
    return item.get("type"), item.get("seq"), item.get("data"), item.get("surfaceOp")


def _call_id_of_result(data: Any) -> Any:
    message = data.get("message") if type(data) is dict else None
    source = message.get("source") if type(message) is dict else None
    return source.get("callId") if type(source) is dict else None


def _is_replace(op: Any) -> bool:
    return op is not None and op != "append"


def _error_code(data: Any) -> Any:
    error = data.get("error") if type(data) is dict else None
    return error.get("code") if type(error) is dict else None


def _tool_call_blocks(data: Any) -> list[str]:
    message = data.get("message") if type(data) is dict else None
    content = message.get("content") if type(message) is dict else None
    out: list[str] = []
    for block in content if isinstance(content, (list, tuple)) else ():
        if type(block) is dict and block.get("type") == "tool-call" and type(block.get("id")) is str:
            out.append(block["id"])
    return out


def check_log(events: Sequence[Event | Mapping[str, Any]], *, live: bool) -> list[str]:
    """Structural invariants of one session log.

    * seqs are contiguous ``0..n-1``;
    * turns and steps are balanced: ``turn/start``..``turn/end`` with matching numbers,
      increasing by one, never nested; ``step/start``..``step/end`` inside a turn; no
      ``turn/end`` over an open step. An open turn (or step) at the end is allowed only
      when ``live`` (a session still running); a log at rest must be closed;
    * within a turn, at most one ``tool/result`` per call id (surface replacements
      aside), each after a ``tool/call`` with that id (crash repair's synthetic
      ``TOOL_NOT_STARTED`` results aside). Call ids are scoped to their turn: a provider
      may reuse them in a later turn;
    * every tool call an ``assistant/message`` makes is answered before its step ends;
    * compaction brackets never nest and close what they opened: a ``compaction/start``
      while another of this lifecycle is open, a ``compaction/summary`` or
      ``compaction/end`` naming another compaction (or none) are violations. A start a
      later ``session/end-seed`` proves stale (a crash, a resume) is forgiven; an
      unmatched start at the end of the log is left to :func:`open_compaction`.
    """
    out: list[str] = []
    open_turn: Any = None
    last_turn: Any = None
    open_step: Any = None
    called: set[Any] = set()
    answered: set[Any] = set()
    step_calls: list[str] = []
    bracket: Any = None  # compactionId of the open compaction of this lifecycle
    for i, item in enumerate(events):
        t, seq, data, op = _fields(item)
        d = data if type(data) is dict else {}
        if seq != i:
            out.append(f"seq {seq!r} at position {i}: seqs are not contiguous")
        if t == "turn/start":
            turn = d.get("turn")
            if open_turn is not None:
                out.append(f"turn/start {turn} at seq {seq} while turn {open_turn} is open")
            if last_turn is not None and turn != last_turn + 1:
                out.append(f"turn/start {turn} at seq {seq} after turn {last_turn}")
            open_turn, last_turn, open_step, step_calls = turn, turn, None, []
            called, answered = set(), set()
        elif t == "turn/end":
            turn = d.get("turn")
            if open_turn is None or turn != open_turn:
                out.append(f"turn/end {turn} at seq {seq} does not match the open turn {open_turn}")
            if open_step is not None:
                out.append(f"turn/end {turn} at seq {seq} while step {open_step} is open")
            open_turn, open_step, step_calls = None, None, []
        elif t == "step/start":
            if open_turn is None:
                out.append(f"step/start at seq {seq} outside any turn")
            if open_step is not None:
                out.append(f"step/start at seq {seq} while step {open_step} is open")
            open_step, step_calls = d.get("step"), []
        elif t == "step/end":
            if open_step is None or d.get("step") != open_step:
                out.append(f"step/end {d.get('step')} at seq {seq} does not match the open step {open_step}")
            missing = [c for c in step_calls if c not in answered]
            if missing:
                out.append(f"step/end at seq {seq} leaves tool call(s) {', '.join(missing)} without a result")
            open_step, step_calls = None, []
        elif t == "session/end-seed":
            bracket = None  # an earlier lifecycle's unmatched start is stale
        elif t == "compaction/start":
            if bracket is not None:
                out.append(f"compaction/start at seq {seq} while compaction {bracket} is open")
            bracket = d.get("compactionId")
        elif t in ("compaction/summary", "compaction/end"):
            if bracket is None or d.get("compactionId") != bracket:
                out.append(f"{t} at seq {seq} names compaction {d.get('compactionId')} but the open one is {bracket}")
            if t == "compaction/end":
                bracket = None
        elif t == "assistant/message":
            step_calls.extend(_tool_call_blocks(d))
        elif t == "tool/call":
            called.add(d.get("callId"))
        elif t == "tool/result" and not _is_replace(op):
            cid = _call_id_of_result(d)
            if cid in answered:
                out.append(f"second tool/result for call {cid} at seq {seq}")
            answered.add(cid)
            if cid not in called and _error_code(d) != "TOOL_NOT_STARTED":
                out.append(f"tool/result for call {cid} at seq {seq} has no tool/call before it")
    if not live:
        if open_turn is not None:
            out.append(f"turn {open_turn} is still open at the end of a log at rest")
        elif open_step is not None:
            out.append(f"step {open_step} is still open at the end of a log at rest")
    return out


def open_compaction(events: Sequence[Event | Mapping[str, Any]]) -> str | None:
    """The ``compactionId`` of a compaction still open at the end of the log (an
    unmatched ``compaction/start`` not followed by a ``session/end-seed``), else None."""
    for item in reversed(events):
        t, _, data, _ = _fields(item)
        if t in ("compaction/end", "session/end-seed"):
            return None
        if t == "compaction/start":
            d = data if type(data) is dict else {}
            return str(d.get("compactionId"))
    return None


def check_preparations(stats: Mapping[str, int]) -> list[str]:
    """``AgentLoop.stats``: every preparation was published or disposed, exactly once
    (check it once the loop has exited: only then is a late preparation settled)."""
    prepared, published, disposed = stats.get("prepared", 0), stats.get("published", 0), stats.get("disposed", 0)
    if prepared != published + disposed:
        return [f"preparations: prepared {prepared} != published {published} + disposed {disposed}"]
    return []


def check_writer_locks(
    store_sessions: Iterable[Any],
    backend: LockProbe,
    disposed_headers: Iterable[Mapping[str, Any]] = (),
) -> list[str]:
    """No live session without its writer lock; no lock held by a disposed session.

    ``store_sessions``: the live handles (``await store.list()``); a session that was
    never written has no lock yet (it is taken at the first write), so only sessions
    stored on disk are checked. ``disposed_headers``: header records of sessions that
    were disposed *and retired* (``await persistence.wait_retired(id)``). Blocking (it
    asks the backend): call it where a short blocking file check is acceptable.
    """
    out: list[str] = []
    for handle in store_sessions:
        header = handle.header.to_record()
        if backend.revision(handle.id) is not None and not backend.lock_held(header):
            out.append(f'live session "{handle.id}" is stored but its writer lock is not held')
    for header in disposed_headers:
        if backend.lock_held(dict(header)):
            out.append(f'disposed session "{header.get("id")}" still holds its writer lock')
    return out


def check_no_tasks_left(tasks: Iterable[object]) -> list[str]:
    """Every task in ``tasks`` (e.g. ``probe.live_tasks()`` once the runtime's block has
    exited) is one left running."""
    return [f"task left running after the runtime exited: {t}" for t in tasks]


def _canonical(record: Any) -> Any:
    # Stored records come back as plain JSON; live ones may hold tuples and frozen views.
    return orjson.loads(orjson.dumps(record))


def check_durable(
    stored: Sequence[Mapping[str, Any]], acknowledged: int, expected: Sequence[Any] | None = None
) -> list[str]:
    """Every acknowledged event (seqs ``0..acknowledged``) is in ``stored``, unchanged
    when ``expected`` (their records at acknowledgement time) is given."""
    if acknowledged < 0:
        return []
    if len(stored) <= acknowledged:
        return [f"acknowledged event {acknowledged} lost: only {len(stored)} event(s) stored"]
    if expected is not None:
        for i, (have, want) in enumerate(zip(stored, expected, strict=False)):
            if i > acknowledged:
                break
            if _canonical(have) != _canonical(want):
                return [f"acknowledged event {i} changed on disk: {have.get('type')} != {want.get('type')}"]
    return []


def check_stored(
    backend: Loader, session_id: str, *, acknowledged: int = -1, expected: Sequence[Any] | None = None
) -> list[str]:
    """Reload ``session_id`` from ``backend`` (a fresh one, without faults) the way
    ``prepare`` would: the log loads under the reading rules, crash repair closes any
    open turn, the repaired log restores and is at rest (``check_log(live=False)``),
    and every acknowledged event is there. A session never written is fine only if nothing of it
    was acknowledged. Blocking."""
    try:
        stored = backend.load(session_id)
    except PersistedSessionNotFoundError:
        if acknowledged >= 0:
            return [f'session "{session_id}" not found on disk, but event {acknowledged} was acknowledged']
        return []
    except HarnessError as exc:
        return [f'session "{session_id}" no longer loads: {type(exc).__name__}: {exc}']
    records = list(stored.records)
    out = check_durable(records, acknowledged, expected)
    try:
        closers = [event_to_record(e) for e in closers_for_records(records)]
    except Exception as exc:
        return [*out, f'session "{session_id}": crash repair failed: {type(exc).__name__}: {exc}']
    out.extend(f'session "{session_id}" after repair: {m}' for m in check_log(records + closers, live=False))
    try:
        # What prepare() builds: restore mode over the repaired records.
        build_session(session_id, stored.header, records + closers)
    except HarnessError as exc:
        out.append(f'session "{session_id}" does not restore after repair: {type(exc).__name__}: {exc}')
    return out
