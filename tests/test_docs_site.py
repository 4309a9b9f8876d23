"""The docs site's build helpers (docs/_ext/): Trio's inventory, the API page order."""

from __future__ import annotations

import importlib
import importlib.util
import io
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXT = Path(__file__).resolve().parent.parent / "docs" / "_ext"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_docs_ext_{name}", EXT / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_trio_inventory_links_trio_names_to_their_pages() -> None:
    pytest.importorskip("mkdocstrings")
    from mkdocstrings import Inventory

    hooks = _load("hooks")
    inventory = Inventory.parse_sphinx(io.BytesIO(hooks.trio_inventory()))
    assert inventory["trio.run"].uri == "reference-core.html#trio.run"
    assert inventory["trio.lowlevel.current_task"].uri.startswith("reference-lowlevel.html#")
    assert inventory["trio.testing.MockClock"].uri.startswith("reference-testing.html#")
    assert inventory["trio.lowlevel"].uri == "reference-lowlevel.html#module-trio.lowlevel"
    assert inventory["trio.Cancelled"].role == "exception"


def test_every_listed_trio_name_exists_or_is_platform_only() -> None:
    # The list was compiled from Trio's docs; a rename in a new trio shows up here.
    platform_only = ("WaitForSingleObject", "iocp", "overlapped", "completion_key", "kevent",
                     "kqueue", "fromshare")
    missing = []
    for line in (EXT / "trio-objects.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name = line.split()[0]
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            if not any(marker in name for marker in platform_only):
                missing.append(name)
    assert missing == []


def test_docstring_roles_link_trio_and_keep_the_rest_plain() -> None:
    pytest.importorskip("griffe")
    roles = _load("griffe_sphinx_roles")
    text = (":class:`trio.Cancelled` and :func:`~harness.open_runtime` and "
            "``trio.run()`` and ``trio.not_a_name``")
    value = roles.TRIO_LITERAL.sub(roles.trio_literal, roles.ROLE.sub(roles.plain, text))
    assert value == ("[`trio.Cancelled`][trio.Cancelled] and `open_runtime()` and "
                     "[`trio.run()`][trio.run] and ``trio.not_a_name``")


def test_api_pages_put_classes_first_and_constants_last() -> None:
    griffe = pytest.importorskip("griffe")
    order = _load("griffe_public_order")
    root = Path(__file__).resolve().parent.parent
    pkg = griffe.load("harness", search_paths=[str(root)], resolve_aliases=True,
                      extensions=griffe.load_extensions(order.PublicOrder))
    exports = [str(name) for name in pkg["agent"].exports]
    ranks = [order._rank(pkg["agent"].members[name]) for name in exports]
    assert ranks == sorted(ranks)
    assert exports[0] == "Agent"
    assert exports.index("COMPACT_TEXTS") > exports.index("AgentLoopError")
