"""The commands that write: ``harness sessions fork``, ``export`` and ``rm``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli.sessions._common import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_STORAGE,
    EXIT_USAGE,
    CliError,
    Ctx,
    _fail,
)
from harness.cli.sessions._view import _check_id, load_view

if TYPE_CHECKING:
    from harness.persistence import Persistence



def _parse_fork_spec(spec: str) -> tuple[str, int | None]:
    sid, at, seq = spec.rpartition("@")
    if not at:
        return _check_id(spec), None
    try:
        boundary = int(seq, 10)
    except ValueError:
        raise CliError(f"bad fork source {spec!r}: expected ID@SEQ with SEQ a non-negative integer", code="USAGE", exit_code=EXIT_USAGE) from None
    if boundary < 0:
        raise CliError(f"bad fork source {spec!r}: SEQ must be non-negative", code="USAGE", exit_code=EXIT_USAGE)
    return _check_id(sid), boundary


async def stored_fork_boundary(p: Persistence, sid: str, boundary: int | None) -> int:
    """``boundary`` checked against the *stored* log of ``sid`` (``None``: its last stored
    seq). A load also holds in-memory closers and a ``session/end-seed`` that are never
    written: a prefix must end in what is stored (``harness sessions fork`` and
    ``harness chat --fork`` share this bound and its message)."""
    from harness.errors import InvalidBoundaryError

    stored = len(await p.read_from(sid, 0))
    if boundary is None:
        if stored == 0:
            raise InvalidBoundaryError(f'session "{sid}" has no stored events to fork', session_id=sid)
        return stored - 1
    if boundary >= stored:
        raise InvalidBoundaryError(
            f'fork boundary {boundary} does not exist in session "{sid}" (last stored seq: '
            f"{stored - 1 if stored else 'none'})",
            session_id=sid,
        )
    return boundary


async def cmd_fork(ctx: Ctx) -> int:
    from harness.errors import (
        ForkChildExistsError,
        HarnessError,
        PersistedSessionNotFoundError,
    )

    sid, boundary = _parse_fork_spec(ctx.args.source)
    child_id = ctx.args.child
    if child_id is not None:
        _check_id(child_id, "child id")
        if child_id == sid:
            raise CliError(f'the child id "{child_id}" is the source\'s', code="SESSION_ALREADY_EXISTS", exit_code=EXIT_REFUSED)
    p = ctx.p
    store = ctx.store
    try:
        async with ctx.progress.step(f"forking {sid}"):
            boundary = await stored_fork_boundary(p, sid, boundary)
            if child_id is not None:
                try:
                    await p.read_from(child_id, 0)
                except PersistedSessionNotFoundError:
                    pass
                except HarnessError as exc:
                    raise ForkChildExistsError(f'session "{child_id}" already exists ({exc.code})', session_id=child_id) from exc
                else:
                    raise ForkChildExistsError(f'session "{child_id}" already exists', session_id=child_id)
            # The source, loaded without its lock (it may be live elsewhere), is entered
            # in this store but not announced: nothing of it is written.
            source = await p.read_session(sid)
            handle = await store.enter(await store.adopt(source))
            try:
                child = await store.fork(handle, boundary, child_id)
                await child.flush()
                meta = child.header.to_record()
                events = child.seq
                path = p.locate(meta)
                await store.detach(child)
            finally:
                await store.detach(handle)
            await p.wait_retired(str(meta["id"]))
    except HarnessError as exc:
        _fail(exc)
    from harness.persistence import header_record

    record = header_record(meta)
    if ctx.out.json:
        ctx.out.emit(
            {
                "id": meta["id"],
                "parentSession": sid,
                "boundary": boundary,
                "seedLength": meta.get("seedLength"),
                "events": events,
                "meta": record,
                "path": path,
            }
        )
        return EXIT_OK
    seed = "" if events == boundary + 1 else " and a session/end-seed"
    ctx.out.line(
        ctx.out.c("green", f"forked {sid}@{boundary} -> {meta['id']}")
        + f" ({events} events: the prefix 0..{boundary}{seed}; stored at {path})"
    )
    return EXIT_OK


async def cmd_export(ctx: Ctx) -> int:
    import orjson
    import trio

    args = ctx.args
    sid = _check_id(args.id)
    target = None if args.output is None else Path(args.output)
    if target is not None and target.is_dir():
        # Not "exists (pass --force ...)": --force overwrites a file, never a directory.
        raise _not_a_file(target)
    view = await load_view(ctx, sid)
    meta = view.meta
    records = view.records if args.closers else view.records[: view.stored]
    dumps = orjson.dumps
    if args.format == "json":
        payload = dumps({"meta": meta, "events": records}, option=orjson.OPT_INDENT_2) + b"\n"
    else:
        payload = b"".join(dumps(r) + b"\n" for r in [meta, *records])
    if target is None:
        ctx.out.stdout.write(payload.decode())
        ctx.out.stdout.flush()
        return EXIT_OK

    def write() -> None:
        with open(target, "wb" if args.force else "xb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())

    try:
        await trio.to_thread.run_sync(write)
    except IsADirectoryError:
        raise _not_a_file(target) from None
    except FileExistsError:
        if target.is_dir():  # made meanwhile
            raise _not_a_file(target) from None
        raise CliError(f'"{target}" exists (pass --force to overwrite it)', code="FILE_EXISTS", exit_code=EXIT_REFUSED) from None
    except OSError as exc:
        raise CliError(f'writing "{target}" failed: {exc.strerror or exc}', code="STORAGE_IO", exit_code=EXIT_STORAGE) from exc
    if ctx.out.json:
        ctx.out.emit({"id": sid, "format": args.format, "events": len(records), "output": str(target), "bytes": len(payload)})
    else:
        ctx.out.line(f"exported {sid}: {len(records)} events to {target} ({len(payload)} bytes, {args.format})")
    return EXIT_OK


def _not_a_file(target: Path) -> CliError:
    return CliError(f'"{target}" is a directory, not a file: -o names the file to write', code="NOT_A_FILE", exit_code=EXIT_USAGE)


async def cmd_rm(ctx: Ctx) -> int:
    from harness.errors import HarnessError

    sid = _check_id(ctx.args.id)
    try:
        headers = await ctx.p.list()
        meta = next((h for h in headers if h.get("id") == sid), None)
        path = ctx.p.locate(meta) if meta is not None else None
        if meta is not None and not getattr(ctx.args, "yes", False):
            await _confirm_rm(ctx, sid, path)
        await ctx.p.delete(sid)
    except HarnessError as exc:
        _fail(exc)
    children = sorted(str(h["id"]) for h in headers if h.get("parentSession") == sid)
    if ctx.out.json:
        ctx.out.emit({"deleted": sid, "path": path, "children": children})
        return EXIT_OK
    ctx.out.line(f"deleted {sid}" + (f" ({path})" if path else ""))
    if children:
        ctx.out.line(ctx.out.c("dim", f"  its forks keep their own copy of the prefix: {', '.join(children)}"))
    return EXIT_OK


async def _confirm_rm(ctx: Ctx, sid: str, path: object) -> None:
    """Ask on the terminal before deleting; without one, refuse unless ``--yes``."""
    import click
    import trio

    from harness.cli._output import is_terminal

    if not is_terminal(sys.stdin):
        raise CliError(
            f'refusing to delete session "{sid}" without confirmation: pass --yes (stdin is not a terminal)',
            code="CONFIRMATION_REQUIRED",
            exit_code=EXIT_USAGE,
        )
    where = f" ({path})" if path else ""
    # The prompt blocks on the terminal: a worker thread, abandoned if cancelled (Ctrl-C).
    ok = await trio.to_thread.run_sync(
        lambda: click.confirm(f'delete session "{sid}"{where}?', default=False, err=True), abandon_on_cancel=True
    )
    if not ok:
        raise CliError(f'session "{sid}" kept: not confirmed', code="NOT_CONFIRMED", exit_code=EXIT_REFUSED)
