"""A griffe extension for the API reference (mkdocs.yml): a package page shows what a
reader came for first.

mkdocstrings renders a package's members in ``__all__`` order (``members_order``) with
no grouping; ``__all__`` is sorted for the linters, which puts constants and type
aliases before the main classes. This extension reorders each package's exports, for
the docs only, into: classes, functions, exception classes, then constants and type
aliases, keeping the package's order within each group.
"""

from __future__ import annotations

from typing import Any

import griffe

_EXCEPTION_SUFFIXES = ("Error", "Exception", "Warning", "Exit")


def _rank(obj: griffe.Object | griffe.Alias) -> int:
    try:
        target = obj.final_target if isinstance(obj, griffe.Alias) else obj
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return 3
    if target.kind is griffe.Kind.CLASS:
        return 2 if target.name.endswith(_EXCEPTION_SUFFIXES) else 0
    if target.kind is griffe.Kind.FUNCTION:
        return 1
    if target.kind is griffe.Kind.MODULE:
        return 4
    return 3


def _reorder(module: griffe.Module) -> None:
    exports = module.exports
    if exports:
        ranked = []
        for position, name in enumerate(exports):
            member = module.members.get(str(name))
            ranked.append((3 if member is None else _rank(member), position, name))
        module.exports = [name for _, _, name in sorted(ranked, key=lambda r: (r[0], r[1]))]
    for member in module.modules.values():
        if not member.is_alias:
            _reorder(member)


class PublicOrder(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        _reorder(pkg)
