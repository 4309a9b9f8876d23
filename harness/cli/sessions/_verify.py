"""``harness sessions verify`` (logs, lineage, what needs repair) and ``repair``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.cli.sessions._common import (
    EXIT_NEEDS_REPAIR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_VERIFY_FAILED,
    CliError,
    Ctx,
    _fail,
)
from harness.cli.sessions._list import _unlisted
from harness.cli.sessions._out import _clip
from harness.cli.sessions._view import View, _check_id, describe, load_view

if TYPE_CHECKING:
    pass



async def cmd_verify(ctx: Ctx) -> int:
    from harness.errors import HarnessError

    out = ctx.out
    ids: list[str] = [_check_id(i) for i in ctx.args.ids]
    everything = not ids
    unreadable: list[dict[str, Any]] = []
    parents: set[str] = set()
    headers: list[dict[str, Any]] = []
    if everything:
        try:
            headers = await ctx.p.list()
        except HarnessError as exc:
            _fail(exc)
        headers.sort(key=lambda h: (h.get("createdAt") or 0, str(h.get("id"))))
        ids = [str(h["id"]) for h in headers]
        parents = {str(h["parentSession"]) for h in headers if h.get("parentSession") is not None}
        unreadable = await _unlisted(ctx, headers)
    cache: dict[str, View | CliError] = {}
    results: list[dict[str, Any]] = []
    strict = bool(ctx.args.strict)
    with ctx.progress.walk("verify", len(ids)) as advance:
        for sid in ids:
            result = await _verify_one(ctx, sid, cache)
            advance()
            if not everything and result["problems"] and result["problems"][0]["code"] == "SESSION_NOT_FOUND":
                raise CliError(result["problems"][0]["message"], code="SESSION_NOT_FOUND", exit_code=EXIT_NOT_FOUND)
            if strict and result["warnings"] and not result["problems"]:
                result["status"] = "failed"
            result["ok"] = result["status"] != "failed"
            results.append(result)
            # Keep only what a later child may still compare against.
            for key in list(cache):
                if key not in parents:
                    del cache[key]
    for bad in unreadable:
        results.append(
            {
                "id": bad["id"],
                "path": bad["path"],
                "ok": False,
                "status": "failed",
                "problems": [{"code": bad["code"], "message": bad["message"]}],
                "warnings": [],
            }
        )
    failed = sum(1 for r in results if not r["ok"])
    if out.json:
        out.emit({**ctx.root.describe(), "ok": failed == 0, "strict": strict, "sessions": results})
    else:
        pad = max((len(str(r["id"] if r["id"] is not None else r.get("path"))) for r in results), default=0)
        for r in results:
            _print_verify(ctx, r, pad)
        counts: dict[str, int] = {}
        for r in results:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing to verify"
        out.line(out.c("bold", f"{len(results)} sessions: {summary}"))
    if failed:
        return EXIT_VERIFY_FAILED
    return EXIT_NEEDS_REPAIR if any(r["status"] == "needs-repair" for r in results) else EXIT_OK


def _print_verify(ctx: Ctx, r: dict[str, Any], pad: int) -> None:
    out = ctx.out
    label = {"ok": ("green", "ok"), "needs-repair": ("yellow", "repair"), "failed": ("red", "FAILED")}[r["status"]]
    name = str(r["id"] if r["id"] is not None else r.get("path"))
    count = f"{r['events']} events" if r.get("events") is not None else ""
    out.line(f"{out.c(label[0], label[1].ljust(7))} {name.ljust(pad)}  {count}".rstrip())
    for p in r["problems"]:
        out.line("        " + out.c("red", _clip(f"{p['code']}: {p['message']}", out.width - 8)))
    for w in r["warnings"]:
        out.line("        " + out.c("yellow", _clip(f"{w['code']}: {w['message']}", out.width - 8)))


async def _verify_one(ctx: Ctx, sid: str, cache: dict[str, View | CliError]) -> dict[str, Any]:
    import trio

    from harness.errors import HarnessError
    from harness.session import RelationalInvariants

    result: dict[str, Any] = {"id": sid, "status": "ok", "problems": [], "warnings": []}
    problems: list[dict[str, str]] = result["problems"]
    warnings: list[dict[str, str]] = result["warnings"]
    view = await _cached_view(ctx, sid, cache)
    if isinstance(view, CliError):
        problems.append({"code": view.code, "message": view.message})
        result["status"] = "failed"
        return result
    result.update(
        path=view.path,
        events=len(view.records),
        storedEvents=view.stored,
        closers=len(view.closers),
        tornTail=view.torn_json(ctx.root.kind),
    )
    if view.torn_at is not None:
        warnings.append({"code": "TORN_TAIL", "message": f"{view.torn_text(ctx.root.kind)}: the next repair cuts it"})
    if view.closers:
        kinds = ", ".join(f"{c['seq']} {c['type']}" for c in view.closers)
        warnings.append(
            {"code": "PENDING_REPAIR", "message": f"the last turn is open: a load appends {len(view.closers)} closers ({kinds})"}
        )
    if view.restore_error is not None:
        problems.append({"code": view.restore_error.code, "message": view.restore_error.message})
    else:
        session = view.session
        try:
            await trio.to_thread.run_sync(lambda: session.replay(RelationalInvariants()))
        except HarnessError as exc:
            problems.append({"code": exc.code, "message": exc.message})
    parent = view.meta.get("parentSession")
    if isinstance(parent, str):
        await _verify_lineage(ctx, view, parent, cache, problems, warnings)
    result["status"] = "failed" if problems else "needs-repair" if warnings and (view.torn_at is not None or view.closers) else "ok"
    return result


async def _cached_view(ctx: Ctx, sid: str, cache: dict[str, View | CliError]) -> View | CliError:
    hit = cache.get(sid)
    if hit is not None:
        return hit
    try:
        view: View | CliError = await load_view(ctx, sid)
    except CliError as exc:
        view = exc
    cache[sid] = view
    return view


async def _verify_lineage(
    ctx: Ctx,
    view: View,
    parent: str,
    cache: dict[str, View | CliError],
    problems: list[dict[str, str]],
    warnings: list[dict[str, str]],
) -> None:
    from orjson import OPT_SORT_KEYS, dumps

    seed = view.meta.get("seedLength")
    other = await _cached_view(ctx, parent, cache)
    if isinstance(other, CliError):
        if other.code == "SESSION_NOT_FOUND":
            warnings.append({"code": "PARENT_NOT_FOUND", "message": f'parent session "{parent}" is not in this store'})
        else:
            warnings.append(
                {"code": "PARENT_UNREADABLE", "message": f'parent session "{parent}" does not read: {other.code}: {other.message}'}
            )
        return
    if not isinstance(seed, int) or seed <= 0:
        return  # no prefix to compare (a subagent, or an empty fork)
    if len(view.records) < seed:
        problems.append(
            {"code": "LINEAGE_MISMATCH", "message": f"seedLength is {seed} but the log holds only {len(view.records)} events"}
        )
        return
    if other.stored < seed:
        problems.append(
            {
                "code": "LINEAGE_MISMATCH",
                "message": f'the prefix 0..{seed - 1} is longer than parent "{parent}"\'s stored log ({other.stored} events)',
            }
        )
        return
    for mine, theirs in zip(view.records[:seed], other.records[:seed], strict=True):
        if dumps(mine, option=OPT_SORT_KEYS) != dumps(theirs, option=OPT_SORT_KEYS):
            problems.append(
                {
                    "code": "LINEAGE_MISMATCH",
                    "message": f'event {mine.get("seq")} differs from parent "{parent}"\'s event {theirs.get("seq")}',
                }
            )
            return


async def cmd_repair(ctx: Ctx) -> int:
    from harness.errors import HarnessError
    from harness.session import event_to_record, thaw

    sid = _check_id(ctx.args.id)
    out = ctx.out
    before = await load_view(ctx, sid)  # what a repair will cut and append (reported)
    try:
        async with ctx.progress.step(f"repairing {sid}"):
            prep = await ctx.p.prepare(sid)
            try:
                written = prep.session.events[prep.cursor - prep.repaired : prep.cursor]
                closers = [thaw(event_to_record(e)) for e in written]
                events = prep.cursor
            finally:
                await prep.dispose()
    except HarnessError as exc:
        _fail(exc)
    torn = before.torn_json(ctx.root.kind)
    repaired = bool(closers) or torn is not None
    if out.json:
        out.emit({"id": sid, "repaired": repaired, "tornTail": torn, "closers": closers, "events": events, "path": before.path})
        return EXIT_OK
    if not repaired:
        out.line(f"{sid}: nothing to repair ({events} events)")
        return EXIT_OK
    parts = []
    if torn is not None:
        parts.append(f"cut the {before.torn_text(ctx.root.kind)}")
    if closers:
        parts.append(f"appended {len(closers)} closers")
    out.line(out.c("green", f"repaired {sid}: " + " and ".join(parts)) + f" ({events} events, durable)")
    for c in closers:
        _, text = describe(c)
        out.line(f"  {c['seq']:>6}  {c['type']:<18} {_clip(text, max(out.width - 30, 20))}")
    return EXIT_OK
