"""Path checks shared by the runtime's front door and the CLI (no heavy imports: the
CLI's start-up reads this)."""

from __future__ import annotations

from pathlib import Path


def blocking_file(path: Path) -> Path | None:
    """What keeps ``path`` from being (or becoming) a directory: ``path`` itself, or its
    nearest existing ancestor, when that is not a directory; ``None`` when ``path`` is a
    directory or can be created as one. Blocking (it stats the path)."""
    p = path
    while not p.exists() and not p.is_symlink():  # a dangling symlink blocks too
        if p.parent == p:
            return None
        p = p.parent
    return None if p.is_dir() else p
