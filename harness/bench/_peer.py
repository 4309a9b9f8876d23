"""W20: side by side with a peer, the OpenAI Agents SDK's ``SQLiteSession`` (issue 26:
"the goal is ahead of every peer on every workload").

The same conversation (Responses-API input items, a user message and an assistant
message in turn, each ~300 bytes of JSON) is stored durably through the SDK's
``Session`` protocol, ``add_items``, by:

* ``W20-sdk-<b>``: the SDK's own ``SQLiteSession`` (asyncio; WAL, ``synchronous``
  FULL, one ``asyncio.to_thread`` and one commit per call), the reference row;
* ``W20-trio-<backend>-<b>``: :class:`~harness.bridge.TrioAgentsSession` over
  :func:`harness.open_runtime` (the defaults: the relational invariants on), for a Trio
  program, on SQLite and on JSONL;
* ``W20-asyncio-<backend>-<b>``: :class:`~harness.bridge.AgentsSession` over
  :func:`harness.open_runtime_in_thread`, what an asyncio program swaps in for
  ``SQLiteSession``: each call crosses to the runtime's thread and back.

``<b>`` is the items per call: ``1`` (``min(n, 1000)`` calls) and ``50`` (``min(n,
20000)`` items). Every call returns once its items are durable, in all forms. The
forms take turns run by run (forwards, then backwards), on fresh files, because the
disk's latency swings between minutes by more than the differences; each reports its
minimum and median over the runs (``min_ms``, ``median_ms``) and ``vs_sdk``, its
minimum over the SDK's (the issue's figures were interleaved minimums). The ratio
column is the median over the SDK's median.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

from harness.bench._events import bench_text
from harness.bench._runner import Result

if TYPE_CHECKING:
    from harness._runtime_api import BackendName

Calls = list[list[Any]]
"""The items of each ``add_items`` call, in order (SDK input items: plain dicts)."""

SHAPES: Final = (1, 50)
FORMS: Final = ("sdk", "trio-sqlite", "trio-jsonl", "asyncio-sqlite", "asyncio-jsonl")

_NOTES: Final = {
    "sdk": "the Agents SDK's SQLiteSession.add_items (asyncio)",
    "trio": "TrioAgentsSession.add_items over open_runtime",
    "asyncio": "AgentsSession.add_items over open_runtime_in_thread (asyncio)",
}


def items(count: int) -> list[dict[str, Any]]:
    """A conversation of ``count`` SDK input items: user and assistant messages in turn."""
    out: list[dict[str, Any]] = []
    for i in range(count):
        if i % 2 == 0:
            out.append({"role": "user", "content": bench_text(i)})
        else:
            out.append(
                {
                    "id": f"msg_{i:08d}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": bench_text(i), "annotations": []}],
                }
            )
    return out


def unavailable() -> str | None:
    """Why W20 cannot run here (the SDK is the ``agents`` extra), or ``None``."""
    try:
        import agents  # noqa: F401
    except ImportError as exc:
        return f"the OpenAI Agents SDK is not installed (pip install 'trio-harness[agents]'): {exc}"
    return None


def _calls(conversation: list[dict[str, Any]], batch: int) -> Calls:
    return [conversation[i : i + batch] for i in range(0, len(conversation), batch)]


async def _store(session: Any, calls: Calls) -> float:
    """Seconds to store ``calls`` through ``session`` (any SDK ``Session``, on the event
    loop running it). A first call creates or opens the session's rows, untimed."""
    await session.add_items([{"role": "user", "content": "first"}])
    t0 = time.perf_counter()
    for call in calls:
        await session.add_items(call)
    return time.perf_counter() - t0


def _sdk(where: Path, calls: Calls) -> tuple[float, int]:
    from agents import SQLiteSession

    async def main() -> tuple[float, int]:
        session = SQLiteSession("w20", str(where / "sdk.db"))
        try:
            dt = await _store(session, calls)
            return dt, len(await session.get_items())  # read from its database
        finally:
            session.close()

    return asyncio.run(main())


_BACKEND: Final[dict[str, BackendName]] = {"sqlite": "sqlite", "jsonl": "jsonl"}


def _store_path(where: Path, backend: str) -> str:
    return str(where / ("sessions.db" if backend == "sqlite" else "sessions"))


def _stored(where: Path, backend: str) -> int:
    """The items the store at ``where`` holds, read back from its files by a fresh
    runtime (a harness session's ``get_items`` reads its in-memory log, which would
    count items that never reached the disk). Not timed."""
    import harness
    from harness.bridge import TrioAgentsSession

    async def main() -> int:
        async with harness.open_runtime(_store_path(where, backend), _BACKEND[backend]) as rt:
            return len(await TrioAgentsSession(rt, "w20", cwd="/bench").get_items())

    return trio.run(main)


def _trio(where: Path, backend: str, calls: Calls) -> tuple[float, int]:
    import harness
    from harness.bridge import TrioAgentsSession

    async def main() -> float:
        # The backend named, not inferred: open_runtime(root) alone is JSONL.
        async with harness.open_runtime(_store_path(where, backend), _BACKEND[backend]) as rt:
            return await _store(TrioAgentsSession(rt, "w20", cwd="/bench"), calls)

    return trio.run(main), _stored(where, backend)


def _asyncio(where: Path, backend: str, calls: Calls) -> tuple[float, int]:
    import harness
    from harness.bridge import AgentsSession

    async def main() -> float:
        async with harness.open_runtime_in_thread(_store_path(where, backend), _BACKEND[backend]) as portal:
            return await _store(AgentsSession(portal, "w20", cwd="/bench"), calls)

    return asyncio.run(main()), _stored(where, backend)


def _run(form: str, where: Path, calls: Calls) -> tuple[float, int]:
    if form == "sdk":
        return _sdk(where, calls)
    api, backend = form.split("-")
    run: Callable[[Path, str, Calls], tuple[float, int]] = _trio if api == "trio" else _asyncio
    return run(where, backend, calls)


def measure(batch: int, count: int, runs: int, forms: tuple[str, ...] = FORMS) -> dict[str, list[float]]:
    """Seconds per run of each form storing ``count`` items ``batch`` per call, the
    forms taking turns (forwards, then backwards). Raises if a form did not store
    every item, as read back from its files (a benchmark of a broken path measures
    nothing)."""
    calls = _calls(items(count), batch)
    times: dict[str, list[float]] = {form: [] for form in forms}
    for r in range(runs):
        for form in forms if r % 2 == 0 else forms[::-1]:
            where = Path(tempfile.mkdtemp(prefix="harness-bench-w20-"))
            try:
                dt, stored = _run(form, where, calls)
            finally:
                shutil.rmtree(where, ignore_errors=True)
            if stored != count + 1:
                raise AssertionError(f"W20 {form}: {stored} items stored, expected {count + 1}")
            times[form].append(dt)
    return times


def w20(n: int, runs: int) -> list[Result]:
    """The SDK's ``SQLiteSession`` and the harness's two SDK sessions, side by side."""
    missing = unavailable()
    if missing is not None:
        return [Result(f"W20-{form}-{b}", 0.0, None, {"unavailable": missing}) for b in SHAPES for form in FORMS]
    results: list[Result] = []
    for batch in SHAPES:
        count = min(n, 1000) if batch == 1 else min(n, 20_000)
        times = measure(batch, count, max(runs, 2))
        sdk_min, sdk_median = min(times["sdk"]), statistics.median(times["sdk"])
        for form in FORMS:
            samples = times[form]
            best, median = min(samples), statistics.median(samples)
            extra = {
                "items": count,
                "per_call": batch,
                "min_ms": round(best * 1000.0, 3),
                "per_item_us": round(best * 1e6 / count, 2),
                "vs_sdk": round(best / sdk_min, 3),
                "runs": len(samples),
            }
            note = _NOTES[form.split("-")[0]]
            results.append(Result(f"W20-{form}-{batch}", median * 1000.0, sdk_median * 1000.0, extra, note))
    return results
