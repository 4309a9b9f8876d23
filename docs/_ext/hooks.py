"""MkDocs hooks (mkdocs.yml ``hooks:``).

``on_config`` runs before the plugins' own (priority 100) and

* fills the "Decisions" section of the nav with every ``docs/decisions/*.md``, in
  file-name order, so a new decision record is in the site without editing mkdocs.yml
  (any other page missing from the nav still fails the strict build);
* gives mkdocstrings a Sphinx inventory of Trio's documentation, written from
  ``docs/_ext/trio-objects.txt``, so names such as ``trio.Nursery`` in signatures and
  docstrings link to https://trio.readthedocs.io. The build is offline: nothing is
  downloaded; the inventory is a local ``file:`` URL whose name carries its content's
  hash (mkdocstrings caches inventories by URL for a day).
"""

from __future__ import annotations

import hashlib
import tempfile
import zlib
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

TRIO_DOCS = "https://trio.readthedocs.io/en/stable/"
TRIO_OBJECTS = Path(__file__).with_name("trio-objects.txt")


def trio_inventory() -> bytes:
    """The Sphinx (version 2) inventory of the objects listed in trio-objects.txt."""
    entries = []
    for line in TRIO_OBJECTS.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, role, page = line.split()
        anchor = f"module-{name}" if role == "py:module" else name
        entries.append(f"{name} {role} 1 {page}#{anchor} -\n")
    header = (
        "# Sphinx inventory version 2\n# Project: Trio\n# Version: stable\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    return header.encode() + zlib.compress("".join(entries).encode())


def _write_inventory() -> str:
    data = trio_inventory()
    digest = hashlib.sha256(data).hexdigest()[:16]
    path = Path(tempfile.gettempdir(), "trio-harness-docs", f"trio-{digest}.inv")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path.as_uri()


@event_priority(100)
def on_config(config: Any) -> Any:
    decisions = sorted(Path(config["docs_dir"], "decisions").glob("*.md"))
    pages = [f"decisions/{p.name}" for p in decisions]
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and "Decisions" in entry:
            entry["Decisions"] = pages
    plugin = config["plugins"].get("mkdocstrings")
    if plugin is not None:
        python = plugin.config["handlers"].setdefault("python", {})
        python["inventories"] = [{"url": _write_inventory(), "base_url": TRIO_DOCS, "domains": ["py"]}]
    return config
