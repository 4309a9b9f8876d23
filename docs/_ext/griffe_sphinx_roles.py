"""A griffe extension for the API reference (mkdocs.yml): the docstrings use Sphinx roles
(``:class:`~harness.agent.AgentLoopError```), which Markdown would show verbatim. Each
becomes inline code naming the target (the last component with ``~``, the text before
``<...>`` when one is given; ``()`` after a function or method).

A target that Trio documents (``docs/_ext/trio-objects.txt``) becomes a cross-reference
into Trio's docs (the inventory docs/_ext/hooks.py builds). Any other target stays plain
code on purpose: many are private or relative, and an unresolved reference fails the
strict build.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|mod|data|exc|obj|const|term):`(~?)([^`]+)`")


TRIO_NAMES = frozenset(
    line.split()[0]
    for line in Path(__file__).with_name("trio-objects.txt").read_text(encoding="utf-8").splitlines()
    if line.strip() and not line.startswith("#")
)


def plain(m: re.Match[str]) -> str:
    role, tilde, target = m[1], m[2], m[3].strip()
    if "<" in target and target.endswith(">"):
        text = target[: target.index("<")].strip()
    else:
        text = target.rsplit(".", 1)[-1] if tilde else target
    if role in ("func", "meth") and not text.endswith(")"):
        text += "()"
    name = target.split("<")[-1].rstrip(">").strip() if "<" in target else target
    if name in TRIO_NAMES:
        return f"[`{text}`][{name}]"
    return f"`{text}`"


# A literal (``trio.Cancelled``, ``trio.run()``) that names a documented Trio object.
TRIO_LITERAL = re.compile(r"(?<!`)``(trio\.[\w.]+?)(\(\))?``(?!`)")


def trio_literal(m: re.Match[str]) -> str:
    if m[1] in TRIO_NAMES:
        return f"[`{m[1]}{m[2] or ''}`][{m[1]}]"
    return m[0]


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            value = ROLE.sub(plain, obj.docstring.value)
            obj.docstring.value = TRIO_LITERAL.sub(trio_literal, value)
