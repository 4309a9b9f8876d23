"""Every ```python block of docs/**/*.md and README.md runs, so the docs cannot rot.

The convention (documented in docs/contributing.md, "Writing these docs"):

* a block runs as a module of its own (``__name__ == "__main__"``), in a fresh temporary
  working directory; if it defines ``async def main()`` taking no arguments and does not
  call ``trio.run`` itself, it is then run with ``trio.run(main)``;
* ``<!-- continues -->`` on the line before a block runs it in the namespace the previous
  block of the page left (a page told in steps);
* a block that defines top-level ``test_*`` functions is a pytest test file: the page's
  test blocks run, one file each, in a pytest subprocess (``trio_mode = true``, the
  harness plugin loaded) and must all pass;
* ``<!-- not-run: reason -->`` on the line before a block skips it, visibly (a skipped
  test naming the reason). The getting-started page and the tutorials never use it.

Shell (```sh), text and other blocks are not run.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([*ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md"])
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"^\s*<!--\s*(not-run|continues)\s*(?::\s*(.*?))?\s*-->\s*$")
NEVER_SKIPPED = ("getting-started.md", "tutorials/")


@attrs.frozen
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence
    code: str
    marker: str | None  # "not-run", "continues" or None
    reason: str

    def defines(self) -> set[str]:
        """The names of the functions the block defines at top level."""
        try:
            tree = ast.parse(self.code)
        except SyntaxError:
            return set()  # running it reports the error
        return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}

    @property
    def is_test_file(self) -> bool:
        return any(name.startswith("test_") for name in self.defines())


def blocks_of(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        found.append(
            Block(
                page=path.relative_to(ROOT).as_posix(),
                line=text.count("\n", 0, m.start()) + 1,
                code=m.group(1),
                marker=marker[1] if marker else None,
                reason=(marker[2] or "") if marker else "",
            )
        )
    return found


ALL = [b for page in PAGES for b in blocks_of(page)]


def _runs() -> Iterator[Any]:
    """Each block with the blocks that continue it, as one test (test files excluded)."""
    run: list[Block] = []
    for block in [*ALL, None]:
        if block is not None and block.marker == "continues" and run and run[0].page == block.page:
            run.append(block)
            continue
        if run:
            first = run[0]
            marks = [pytest.mark.skip(reason=f"not-run: {first.reason}")] if first.marker == "not-run" else []
            yield pytest.param(run, id=f"{first.page}:{first.line}", marks=marks)
        run = [] if block is None or block.is_test_file else [block]


def _exec(block: Block, namespace: dict[str, Any]) -> None:
    # Padded so that tracebacks name the page and the line in it.
    exec(compile("\n" * block.line + block.code, block.page, "exec"), namespace)
    main = namespace.get("main")
    if (
        "main" in block.defines()
        and "trio.run(" not in block.code
        and inspect.iscoroutinefunction(main)
        and not any(p.default is p.empty for p in inspect.signature(main).parameters.values())
    ):
        trio.run(main)


@pytest.mark.parametrize("run", list(_runs()))
def test_block_runs(run: list[Block], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)  # no block talks to a real model
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for block in run:
        _exec(block, namespace)


FIRST_PAGES = ("README.md", "docs/getting-started.md")


@pytest.mark.parametrize(
    "run", [r for r in _runs() if r.values[0][0].page in FIRST_PAGES and not r.marks]  # type: ignore[index]
)
def test_a_first_pages_block_runs_again_in_the_same_directory(
    run: list[Block], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a new user does next: run the example again. Its relative store root is
    still there (the README's program once failed its second run: ``rt.create`` of
    the id it had stored the first time)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    for _ in range(2):
        namespace: dict[str, Any] = {"__name__": "__main__"}
        for block in run:
            _exec(block, namespace)


TEST_PAGES = sorted({b.page for b in ALL if b.marker != "not-run" and b.is_test_file})


@pytest.mark.parametrize("page", TEST_PAGES)
def test_test_blocks_pass_under_pytest(page: str, pytester: pytest.Pytester) -> None:
    blocks = [b for b in ALL if b.page == page and b.marker != "not-run" and b.is_test_file]
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    for b in blocks:
        pytester.makepyfile(**{f"test_block_{b.line}": b.code})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    outcomes = result.parseoutcomes()
    assert result.ret == 0, "\n".join(result.outlines)
    assert outcomes.get("passed", 0) >= len(blocks) and not outcomes.get("skipped")


def test_the_convention_holds() -> None:
    """Markers are known and sit right before a block; getting started and the tutorials
    skip nothing; a continuation has a block to continue."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^<!--\s*(not-run|continues)\b.*?-->[ \t]*$", text, re.MULTILINE):
            after = text[m.end() :].lstrip("\n")
            assert after.startswith("```python"), f"{page}: {m[0]} is not right before a python block"
    for b in ALL:
        if b.marker == "not-run":
            assert b.reason, f"{b.page}:{b.line}: not-run needs a reason"
            assert not any(s in b.page for s in NEVER_SKIPPED), f"{b.page}:{b.line} may not be skipped"
    pages = {b.page for b in ALL}
    assert {"docs/getting-started.md", "README.md"} <= pages
    assert os.path.isdir(ROOT / "docs" / "tutorials")
