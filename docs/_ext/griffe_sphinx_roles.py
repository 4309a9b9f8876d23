"""A griffe extension for the API reference (mkdocs.yml): the docstrings use Sphinx roles
(``:class:`~harness.agent.AgentLoopError```), which Markdown would show verbatim. Each
becomes inline code naming the target (the last component with ``~``, the text before
``<...>`` when one is given; ``()`` after a function or method).

Not a cross-reference on purpose: many targets are private or relative, and an
unresolved reference fails the strict build.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|mod|data|exc|obj|const|term):`(~?)([^`]+)`")


def plain(m: re.Match[str]) -> str:
    role, tilde, target = m[1], m[2], m[3].strip()
    if "<" in target and target.endswith(">"):
        text = target[: target.index("<")].strip()
    else:
        text = target.rsplit(".", 1)[-1] if tilde else target
    if role in ("func", "meth") and not text.endswith(")"):
        text += "()"
    return f"`{text}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(plain, obj.docstring.value)
