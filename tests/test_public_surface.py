"""The public surface is what ``docs/api.md`` lists: one source of truth for ``__all__``.

The rules are stated at the top of ``docs/api.md``; this test enforces them.
"""

from __future__ import annotations

import importlib
import re
import types
from pathlib import Path

import pytest

API_PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"
# A package heading, then its fenced list of names (one per line).
SECTION = re.compile(r"^## `(?P<package>[\w.]+)`\n(?:(?!^## ).*\n)*?^```text\n(?P<names>(?:.*\n)*?)^```$", re.M)
# Bound by `from __future__ import annotations` and `from typing import TYPE_CHECKING`:
# values without a __module__ that are never the package's own.
NOT_OWN = frozenset({"annotations", "TYPE_CHECKING"})
PUBLIC_PACKAGES = (
    "harness",
    "harness.bridge",
    "harness.session",
    "harness.runtime",
    "harness.persistence",
    "harness.agent",
    "harness.providers",
    "harness.compaction",
    "harness.faults",
    "harness.errors",
    "actors",
)


def documented() -> dict[str, list[str]]:
    text = API_PAGE.read_text(encoding="utf-8")
    out: dict[str, list[str]] = {}
    for match in SECTION.finditer(text):
        package = match["package"]
        assert package not in out, f"docs/api.md lists {package} twice"
        out[package] = [line.strip() for line in match["names"].splitlines() if line.strip()]
    return out


DOCUMENTED = documented()


def own_public_names(module: types.ModuleType) -> set[str]:
    """The module-level names without an underscore that ``module`` defines itself."""
    name = module.__name__
    own = set()
    for attr, value in vars(module).items():
        if attr.startswith("_") or attr in NOT_OWN or isinstance(value, types.ModuleType):
            continue
        owner = getattr(value, "__module__", None)
        if isinstance(owner, str) and owner != name and not owner.startswith(name + "._"):
            continue  # imported from elsewhere (stdlib, another public package)
        own.add(attr)
    return own


def test_the_page_lists_every_public_package() -> None:
    assert set(PUBLIC_PACKAGES) <= set(DOCUMENTED), sorted(set(PUBLIC_PACKAGES) - set(DOCUMENTED))


@pytest.mark.parametrize("package", sorted(DOCUMENTED))
def test_the_documented_names_are_all(package: str) -> None:
    module = importlib.import_module(package)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{package} has no __all__"
    listed = DOCUMENTED[package]
    assert len(listed) == len(set(listed)), f"docs/api.md lists a name of {package} twice"
    assert len(exported) == len(set(exported)), f"{package}.__all__ names something twice"
    assert set(listed) == set(exported), (
        f"{package}: only in docs/api.md {sorted(set(listed) - set(exported))}, "
        f"only in __all__ {sorted(set(exported) - set(listed))}"
    )


@pytest.mark.parametrize("package", sorted(DOCUMENTED))
def test_every_name_in_all_exists(package: str) -> None:
    module = importlib.import_module(package)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == [], f"{package}.__all__ names what it does not have: {missing}"


@pytest.mark.parametrize("package", sorted(DOCUMENTED))
def test_no_public_name_is_missing_from_all(package: str) -> None:
    module = importlib.import_module(package)
    unlisted = sorted(own_public_names(module) - set(module.__all__))
    assert unlisted == [], f"{package} defines public names not in __all__: {unlisted}"


@pytest.mark.parametrize("package", ["harness", "actors"])
def test_each_distribution_package_is_typed(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__file__ is not None
    assert (Path(module.__file__).parent / "py.typed").is_file()


def test_the_rule_catches_an_unlisted_name() -> None:
    """The checker itself: a package-private class left out of __all__ is found, and a
    name imported from the standard library is not."""
    fake = types.ModuleType("harness.fake")
    exec(
        "from typing import Any\n"
        "from pathlib import Path\n"
        "class Listed: pass\n"
        "class Forgotten: pass\n"
        "LIMIT = 3\n"
        "_private = 1\n",
        fake.__dict__,
    )
    fake.__all__ = ["Listed"]  # type: ignore[attr-defined]
    assert own_public_names(fake) - {"Listed"} == {"Forgotten", "LIMIT"}
