"""mypy's reveal_type of the calls issue 25 found untyped (tests/test_typing.py reads
the notes). Not in pyproject's mypy ``files``: the notes would clutter every run."""

from __future__ import annotations

from typing import reveal_type

import harness


async def revealed() -> None:
    async with harness.open_runtime() as rt:
        agent = await rt.open("a")
        reveal_type(agent)
        reveal_type(await agent.run_turn("hi"))
    async with harness.open_runtime_in_thread() as portal:
        reveal_type(await portal.arun(portal.runtime.open, "a"))
        reveal_type(portal.run_sync(portal.runtime.session_ids))
