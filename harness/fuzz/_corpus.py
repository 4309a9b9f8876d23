"""Regenerate the seed corpus of the coverage-guided targets (``tests/fuzz_corpus``):
``python -m harness.fuzz._corpus DIR``.

The seeds are real logs: a scripted agent session (a turn with a tool call, streamed
chunk deltas, so packed chunk rows), a compaction-free second turn, an open turn (what a
crash leaves), a forked child, and a few hand-made edge cases (a header-only log, a torn
tail, a seq gap). The JSONL seeds are the transcripts as written; the SQLite seeds are
the rows of the ``events`` table in the form :func:`~harness.fuzz._targets.parse_rows`
reads.
"""

from __future__ import annotations

import hashlib
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
import trio

from harness.fuzz._targets import HEADER, SID, row_line


async def _sessions(target: Path, backend: str, compression: str = "none") -> None:
    import harness
    from harness.agent import Call, Say, ScriptedProvider, ToolSet, tool
    from harness.persistence import JsonlBackend

    @tool("add", "Add two numbers", {"type": "object", "properties": {"a": {"type": "number"}}})
    async def add(args: Any) -> str:
        return str(args["a"])

    provider = ScriptedProvider(
        [[Call("add", {"a": 2})], [Say("the sum, streamed in several pieces for chunk rows")], [Say("bye")]]
    )
    store: Any = target
    if backend == "jsonl":
        store = JsonlBackend(target, compression=compression)  # type: ignore[arg-type]
        backend_arg: Any = store
        root: Any = None
    else:
        backend_arg, root = "sqlite", target
    async with harness.open_runtime(root, backend=backend_arg, provider=provider, tools=ToolSet([add])) as rt:
        agent = await rt.create(SID)
        await agent.run_turn("add 2")
        await agent.run_turn("again")


def _name(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _write(directory: Path, data: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / _name(data)).write_bytes(data)


def generate(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for compression, sub in (("none", "jsonl"), ("zstd", "jsonl_zstd")):
            tree = base / sub
            trio.run(_sessions, tree, "jsonl", compression)
            [log] = list(tree.rglob("session.jsonl*"))
            data = log.read_bytes()
            _write(out / sub, data)
            if compression == "none":
                lines = data.split(b"\n")
                _write(out / sub, lines[0] + b"\n")  # header only
                _write(out / sub, b"\n".join(lines[:6]) + b"\n" + lines[6][:10])  # torn tail
                _write(out / sub, b"\n".join([lines[0], *lines[3:]]))  # seq gap
                header = orjson.dumps({"type": "session", **HEADER}) + b"\n"
                _write(out / sub, header + b'{"type":"text-chunks","seq0":0,"time0":1,"data":{"turn":1,"step":1,'
                       b'"index":0,"dt":[0,1],"texts":["a","b","c"]}}\n')
        db = base / "db.sqlite"
        trio.run(_sessions, db, "sqlite")
        con = sqlite3.connect(db)
        rows = con.execute(
            "SELECT seq, type, time, data, source_event_seqs, surface_op, ignorable FROM events "
            "WHERE session_id = ? ORDER BY seq",
            (SID,),
        ).fetchall()
        con.close()
        lines = [row_line(tuple(r)) for r in rows]
        _write(out / "sqlite_rows", b"\n".join(lines) + b"\n")
        _write(out / "sqlite_rows", b"\n".join(lines[:5]) + b"\n")
        packed = [x for x in lines if b'"text-chunks"' in x or b'"reasoning-chunks"' in x]
        if packed:
            _write(out / "sqlite_rows", b"\n".join(packed) + b"\n")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tests/fuzz_corpus"))
