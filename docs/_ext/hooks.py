"""MkDocs hooks (mkdocs.yml ``hooks:``).

``on_config`` fills the "Decisions" section of the nav with every ``docs/decisions/*.md``,
in file-name order, so a new decision record is in the site without editing mkdocs.yml
(any other page missing from the nav still fails the strict build).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def on_config(config: Any) -> Any:
    decisions = sorted(Path(config["docs_dir"], "decisions").glob("*.md"))
    pages = [f"decisions/{p.name}" for p in decisions]
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and "Decisions" in entry:
            entry["Decisions"] = pages
    return config
