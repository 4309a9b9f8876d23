"""A ``surface_op`` whose own ``==``/``!=`` raise (stop 34's reviewer): planning never
calls them. It is refused as non-JSON surface metadata, typed, and the session actor
stays live; before, the single append raised the argument's own error out of the actor
and a batch crashed the session."""

from __future__ import annotations

import logging

import pytest
import trio

from harness.errors import NotJsonError
from harness.runtime import open_store
from harness.session import EventDraft, Session
from tests.helpers import user


class Hostile:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("__eq__ called")

    def __ne__(self, other: object) -> bool:
        raise RuntimeError("__ne__ called")

    __hash__ = object.__hash__


MESSAGE = 'session event "user/message" carries non-JSON-serializable surface metadata'


async def test_through_the_actor_the_op_is_refused_and_the_session_goes_on() -> None:
    async with open_store() as store:
        h = await store.create("s", cwd="/x")
        with pytest.raises(NotJsonError, match=MESSAGE):
            await h.append("user/message", user("u1"), surface_op=Hostile())  # type: ignore[arg-type]
        with pytest.raises(NotJsonError, match=MESSAGE):
            await h.append_batch([EventDraft("user/message", user("u2"), "append"),
                                  EventDraft("user/message", user("u3"), Hostile())])  # type: ignore[arg-type]
        assert h.alive
        event = await h.append("user/message", user("u4"), surface_op="append")
        # Nothing of the refused calls landed; the session is live and appends go on.
        assert [(e.seq, e.type, e.data["id"]) for e in h.events] == [(0, "user/message", "u4")]
        assert event.seq == 0


async def test_a_cast_with_the_op_is_refused_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async with open_store() as store:
        h = await store.create("s", cwd="/x")
        with caplog.at_level(logging.WARNING, logger="actors"):
            h.append_nowait("user/message", user("u1"), surface_op=Hostile())  # type: ignore[arg-type]
            await h.barrier()
        assert h.alive
        assert h.events == ()
        assert any(MESSAGE in r.getMessage() for r in caplog.records)
        await trio.lowlevel.checkpoint()


def test_the_core_refuses_it_too() -> None:
    s = Session.create("s", clock=lambda: 1)
    with pytest.raises(NotJsonError, match=MESSAGE):
        s.append("user/message", user("u1"), surface_op=Hostile())  # type: ignore[arg-type]
    with pytest.raises(NotJsonError, match=MESSAGE):
        s.append_batch([EventDraft("user/message", user("u2"), "append"),
                        EventDraft("user/message", user("u3"), Hostile())])  # type: ignore[arg-type]
    assert len(s.events) == 0
