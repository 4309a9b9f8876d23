"""``harness sessions show`` (the timeline, or the surface) and ``inspect`` (the stored
records of one session)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.cli.sessions._common import EXIT_CORRUPT, EXIT_OK, CliError, Ctx
from harness.cli.sessions._out import _clip, _json_default
from harness.cli.sessions._view import (
    Timeline,
    View,
    _checkpoint_summary,
    _fmt_time,
    _is_checkpoint,
    _lineage,
    _message_text,
    _short,
    load_view,
)

if TYPE_CHECKING:
    pass



async def cmd_show(ctx: Ctx) -> int:
    view = await load_view(ctx, ctx.args.id)
    session = view.session
    restore_error = (
        None if view.restore_error is None else {"code": view.restore_error.code, "message": view.restore_error.message}
    )
    if ctx.args.surface:
        if session is None:
            assert restore_error is not None
            raise CliError(
                f'session "{view.id}" does not restore: {restore_error["message"]}',
                code=restore_error["code"],
                exit_code=EXIT_CORRUPT,
            )
        return _show_surface(ctx, view, session)
    surface = set(session.surface) if session is not None else None
    timeline = Timeline(view, surface)
    out = ctx.out
    kind = ctx.root.kind
    if out.json:
        out.emit(
            {
                "meta": view.meta,
                "path": view.path,
                "storedEvents": view.stored,
                "closers": len(view.closers),
                "tornTail": view.torn_json(kind),
                "restoreError": restore_error,
                "events": [{k: v for k, v in e.items() if k != "style"} for e in timeline.entries],
                "turns": timeline.turns,
                "compactions": timeline.compactions,
                "surface": None
                if session is None
                else {"nodes": list(session.surface), "generation": session.generation},
            }
        )
        return EXIT_OK
    _show_header(ctx, view)
    if restore_error is not None:
        out.line(out.c("red", f"  does not restore: {restore_error['code']}: {restore_error['message']}"))
    out.line(out.c("dim", "  legend: * on the surface, ~ shadowed (replaced), + closer a load would append"))
    out.line()
    times = ctx.args.times
    folded = 0
    closers_announced = False

    def flush_chunks() -> None:
        nonlocal folded
        if folded:
            out.line(out.c("dim", f"   {'':>6}  {'':>{12 if times else 0}}      … {folded} assistant/chunk"))
            folded = 0

    for e in timeline.entries:
        if e["type"] == "assistant/chunk" and not ctx.args.chunks and not e["closer"]:
            folded += 1
            continue
        flush_chunks()
        if e["closer"] and not closers_announced:
            if view.torn_at is not None:
                out.line(out.c("yellow", f"   ~~ {view.torn_text(kind)}: cut by the next repair"))
            out.line(out.c("yellow", f"   -- crash repair: a load would append these {len(view.closers)} closers --"))
            closers_announced = True
        mark = "+" if e["closer"] else " "
        surf = {"on": "*", "shadowed": "~"}.get(e["surface"] or "", " ")
        when = f"{_fmt_time(e['time'], full=False)} " if times else ""
        nested = "  " * int(e["depth"]) + str(e["type"])
        head = f"{mark}{surf}{e['seq']:>6}  {when}{nested:<23} "
        text = _clip(e["text"], max(out.width - len(head), 20))
        style = "yellow" if e["closer"] else ("dim" if e["surface"] == "shadowed" else e["style"])
        out.line(out.c("yellow" if e["closer"] else "", head) + out.c(style, text))
    flush_chunks()
    if view.torn_at is not None and not closers_announced:
        out.line(out.c("yellow", f"   ~~ {view.torn_text(kind)}: cut by the next repair"))
    out.line()
    _show_footer(ctx, view, timeline, session)
    return EXIT_OK


def _show_header(ctx: Ctx, view: View) -> None:
    out = ctx.out
    meta = view.meta
    out.line(out.c("bold", f"session {view.id}"))
    out.line(f"  created  {_fmt_time(meta.get('createdAt'))}")
    if meta.get("cwd") is not None:
        out.line(f"  cwd      {meta.get('cwd')}")
    if meta.get("parentSession") is not None:
        out.line(f"  lineage  {_lineage(meta)}")
    if meta.get("agentPreset") is not None:
        out.line(f"  preset   {meta.get('agentPreset')}")
    if view.path:
        out.line(f"  stored   {view.path}")


def _show_footer(ctx: Ctx, view: View, timeline: Timeline, session: Any) -> None:
    out = ctx.out
    events = f"{len(view.records)} events"
    if view.closers:
        events += f" ({view.stored} stored + {len(view.closers)} closers)"
    outcomes: dict[str, int] = {}
    for t in timeline.turns:
        key = t["outcome"] or "open"
        outcomes[key] = outcomes.get(key, 0) + 1
    turns = f"{len(timeline.turns)} turns" + (
        " (" + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())) + ")" if outcomes else ""
    )
    out.line(f"  {events}; {turns}")
    if timeline.compactions:
        status: dict[str, int] = {}
        for b in timeline.compactions:
            status[b["status"]] = status.get(b["status"], 0) + 1
        out.line(
            f"  {len(timeline.compactions)} compactions ("
            + ", ".join(f"{n} {k}" for k, n in sorted(status.items()))
            + ")"
        )
        for b in timeline.compactions:
            r = b["shadowedRange"]
            span = f"shadowed {r.get('start')}..{r.get('end')}" if isinstance(r, dict) else "nothing shadowed"
            cp = f", checkpoint at {b['checkpoint']}" if b["checkpoint"] is not None else ""
            err = f": {b['error']}" if b["error"] else ""
            out.line(
                f"    {_short(b['compactionId'])} seq {b['start']}..{b['end'] if b['end'] is not None else '?'} "
                f"{b['status']}, {span}{cp}{err}"
            )
    if session is not None:
        out.line(f"  surface: {len(session.surface)} nodes (generation {session.generation})")
    if view.torn_at is not None or view.closers:
        out.line(out.c("yellow", f"  needs repair: harness sessions repair {view.id}"))


def _show_surface(ctx: Ctx, view: View, session: Any) -> int:
    from harness.session import thaw

    out = ctx.out
    header = session.request_header()
    header_raw: dict[str, Any] = thaw(header) if header is not None else {}
    system = header_raw.get("system")
    tools = header_raw.get("tools")
    tool_names = [str(t.get("name")) for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
    messages = []
    for seq in session.surface:
        message = session.derive_message(seq)
        if message is None:
            continue
        raw = thaw(message)
        event = session.event(seq)
        op = event.surface_op
        entry: dict[str, Any] = {"seq": seq, "checkpoint": _is_checkpoint(raw), "message": raw}
        if entry["checkpoint"] and op is not None and not isinstance(op, str):
            entry["replaces"] = {"start": op.start, "end": op.end}
        messages.append(entry)
    if out.json:
        out.emit(
            {
                "id": view.id,
                "generation": session.generation,
                "nodes": list(session.surface),
                "system": system,
                "tools": tool_names,
                "config": header_raw.get("config"),
                "messages": messages,
            }
        )
        return EXIT_OK
    out.line(out.c("bold", f"what the model sees in {view.id}: {len(messages)} messages (generation {session.generation})"))
    if header is not None:
        config = header_raw.get("config")
        if isinstance(config, dict):
            out.line(out.c("dim", f"  target   {config.get('provider')}/{config.get('model')}"))
        if system:
            text = system if isinstance(system, str) else _message_text({"content": system})
            out.line(out.c("dim", "  system   " + _clip(text, out.width - 11)))
        if tool_names:
            out.line(out.c("dim", "  tools    " + _clip(", ".join(tool_names), out.width - 11)))
    for m in messages:
        raw = m["message"]
        role = str(raw.get("role"))
        head = f"  {m['seq']:>6}  {role:>9}: "
        if m["checkpoint"]:
            r = m.get("replaces", {})
            text = f"[checkpoint replaces {r.get('start')}..{r.get('end')}] {_checkpoint_summary(raw)}"
            out.line(head + out.c("cyan", _clip(text, max(out.width - len(head), 20))))
            continue
        source = raw.get("source")
        if role == "user" and isinstance(source, dict) and source.get("kind") == "tool":
            head = f"  {m['seq']:>6}  {'tool':>9}: "
        out.line(head + _clip(_message_text(raw), max(out.width - len(head), 20)))
    return EXIT_OK


async def cmd_inspect(ctx: Ctx) -> int:
    import orjson

    view = await load_view(ctx, ctx.args.id)
    out = ctx.out
    if out.json:
        out.emit(
            {
                "meta": view.meta,
                "path": view.path,
                "storedEvents": view.stored,
                "closers": len(view.closers),
                "tornTail": view.torn_json(ctx.root.kind),
                "events": view.records,
            }
        )
        return EXIT_OK
    out.line(out.c("bold", orjson.dumps(view.meta, default=_json_default).decode()))
    if view.path:
        out.line(out.c("dim", f"# stored at {view.path}"))
    for i, rec in enumerate(view.records):
        if i == view.stored:
            if view.torn_at is not None:
                out.line(out.c("yellow", f"# {view.torn_text(ctx.root.kind)} (cut by the next repair)"))
            out.line(out.c("yellow", f"# {len(view.closers)} closers a load would append (not stored):"))
        body = orjson.dumps(rec, default=_json_default).decode()
        if not ctx.args.full:
            body = _clip(body, max(out.width - 2, 40))
        out.line(out.c("yellow", "+ " + body) if i >= view.stored else "  " + body)
    if view.torn_at is not None and not view.closers:
        out.line(out.c("yellow", f"# {view.torn_text(ctx.root.kind)} (cut by the next repair)"))
    return EXIT_OK
