"""How the demo shows stored things to a person: plain JSON instead of Python reprs,
sessions by id and working directory instead of the layout's encoded folder names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def plain(value: Any) -> str:
    """``value`` (frozen event data included) as compact JSON: ``{"turn":2,...}``, not
    ``FrozenDict({'turn': 2, ...})``."""
    from harness.session import thaw

    return orjson.dumps(thaw(value)).decode()


def stored_sessions(root: Path, indent: str = "    ") -> None:
    """Print each session stored under the JSONL ``root``: its id, size and working
    directory. The folder on disk is the reference's layout (one per working directory,
    its path encoded: ``/repo`` is ``--repo--``); the note says so once."""
    paths = sorted(root.rglob("session.jsonl"))
    rows: list[tuple[str, str, int]] = []
    for path in paths:
        header: dict[str, Any] = {}
        try:
            with open(path, "rb") as f:
                header = orjson.loads(f.readline())
        except (OSError, orjson.JSONDecodeError):
            pass
        rows.append((str(header.get("id", path.parent.name)), str(header.get("cwd") or "?"), path.stat().st_size))
    width = max((len(sid) for sid, _, _ in rows), default=0)
    for sid, cwd, size in rows:
        print(f"{indent}{sid.ljust(width)}  {size:>7,} bytes  working directory {cwd}")
    if paths:
        example = paths[0].relative_to(root)
        print(f"{indent}(files: one folder per working directory, e.g. {example}; `harness sessions list --root {root}` lists them)")
