"""``harness sessions list``: the sessions of a store root, with their status."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cli.sessions._common import EXIT_OK, CliError, Ctx, _fail
from harness.cli.sessions._out import Out, _ignore, _isatty, _one_line
from harness.cli.sessions._view import _fmt_time, _lineage, load_view

if TYPE_CHECKING:
    pass



async def cmd_list(ctx: Ctx) -> int:
    from harness.errors import HarnessError

    out = ctx.out
    try:
        async with ctx.progress.step("listing sessions"):
            headers = await ctx.p.list()
    except HarnessError as exc:
        _fail(exc)
    headers.sort(key=lambda h: (h.get("createdAt") or 0, str(h.get("id"))))
    rows: list[dict[str, Any]] = []
    walk = ctx.progress.walk("list", len(headers)) if ctx.args.events else contextlib.nullcontext(_ignore)
    with walk as advance:
        for header in headers:
            meta = {k: v for k, v in header.items() if k != "type"}
            row: dict[str, Any] = {**meta, "lineage": _lineage(meta)}
            if ctx.args.events:
                status, events, detail = await _status(ctx, str(meta["id"]))
                row.update(status=status, events=events)
                if detail:
                    row["detail"] = detail
                advance()
            rows.append(row)
    unreadable = await _unlisted(ctx, headers)
    if out.json:
        out.emit({**ctx.root.describe(), "sessions": rows, "unreadable": unreadable})
        return EXIT_OK
    if not rows and not unreadable:
        out.line(out.c("dim", f"no sessions in {ctx.root.display}"))
        return EXIT_OK
    columns = ["ID", "CREATED", "CWD", *(["EVENTS", "STATUS"] if ctx.args.events else []), "LINEAGE"]
    table: list[list[str]] = []
    for row in rows:
        cells = [str(row["id"]), _fmt_time(row.get("createdAt")), str(row.get("cwd") or "-")]
        if ctx.args.events:
            cells += [str(row.get("events", "?")), str(row.get("status"))]
        cells.append(str(row["lineage"]))
        table.append(cells)
    if _isatty(out.stdout):
        _rich_table(out, columns, table, status_column=4 if ctx.args.events else None)
        table = []  # shown
    widths = [max(len(c), *(len(r[i]) for r in table)) if table else len(c) for i, c in enumerate(columns)]
    if table:
        out.line(out.c("bold", "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()))
    for cells in table:
        shown = []
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True)):
            text = cell.ljust(w)
            if ctx.args.events and i == 4:
                text = out.c("green" if cell == "ok" else "yellow" if cell == "needs-repair" else "red", text)
            shown.append(text)
        out.line("  ".join(shown).rstrip())
    for bad in unreadable:
        out.line(out.c("red", f"unreadable: {bad['path']}: {bad['code']}: {_one_line(bad['message'])}"))
    return EXIT_OK


def _rich_table(out: Out, columns: list[str], rows: list[list[str]], *, status_column: int | None) -> None:
    """The listing as a Rich table, on a terminal (a pipe gets plain aligned columns,
    stable for scripts): folded to the terminal's width, colour per the rules."""
    from rich.table import Table

    from harness.cli._output import console

    table = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    for name in columns:
        table.add_column(name, overflow="fold")
    styles = {"ok": "green", "needs-repair": "yellow"}
    for cells in rows:
        shown = [f"[{styles.get(c, 'red')}]{c}[/]" if i == status_column else c for i, c in enumerate(cells)]
        table.add_row(*(x if i == status_column else _escape(x) for i, x in enumerate(shown)))
    console(out.stdout, "always" if out.color else "never").print(table)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


async def _status(ctx: Ctx, session_id: str) -> tuple[str, int | None, str]:
    """(status, events as a load would see them, detail) of one session."""
    try:
        view = await load_view(ctx, session_id)
    except CliError as exc:
        return exc.code, None, exc.message
    if view.torn_at is not None or view.closers:
        parts = [p for p in (view.torn_text(ctx.root.kind), f"{len(view.closers)} closers" if view.closers else "") if p]
        return "needs-repair", len(view.records), "; ".join(parts)
    return "ok", len(view.records), ""


async def _unlisted(ctx: Ctx, headers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """JSONL: transcripts the listing skipped (a header that does not read, a format this
    build refuses), each with the typed error a read of it raises."""
    import trio

    if ctx.root.kind != "jsonl":
        return []
    from harness.errors import HarnessError

    located: list[str] = []
    for h in headers:
        try:
            located.append(str(ctx.p.locate(h)))
        except HarnessError:
            continue
    name = "session.jsonl.zstd" if ctx.root.compression == "zstd" else "session.jsonl"

    def scan() -> list[tuple[Path, Any]]:
        listed = {Path(p).resolve() for p in located}
        found = []
        for path in sorted(ctx.root.path.glob(f"*/*/{name}")):
            if path.resolve() in listed or not path.is_file():
                continue
            sid: Any = None
            if name == "session.jsonl":
                try:
                    import orjson

                    with open(path, "rb") as f:
                        first = f.readline()
                    if not first.endswith(b"\n"):
                        continue  # no complete header line yet: skipped by the listing as well
                    value = orjson.loads(first)
                    sid = value.get("id") if isinstance(value, dict) else None
                except (OSError, ValueError):
                    sid = None
            found.append((path, sid))
        return found

    out: list[dict[str, Any]] = []
    for path, sid in await trio.to_thread.run_sync(scan):
        entry: dict[str, Any] = {"path": str(path), "id": sid if isinstance(sid, str) else None}
        error: tuple[str, str] = ("SESSION_CORRUPT", "the transcript has no readable session header")
        if isinstance(sid, str) and sid:
            try:
                await ctx.p.inspect(sid)
            except HarnessError as exc:
                error = (exc.code, exc.message)
        entry["code"], entry["message"] = error
        out.append(entry)
    return out
