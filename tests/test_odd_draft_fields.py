"""Caller-supplied draft fields whose own ``__repr__`` or ``__class__`` raise (the
reviewer of the surface_op fix): the refusal is typed and the session actor stays
live. Before, the type check, the ignorable check and the batch item check formatted
the argument with ``repr`` (its error escaped and, in the actor, crashed the session),
and ``isinstance(op, ReplaceOp)`` read the argument's ``__class__``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from harness.errors import EventError, NotJsonError
from harness.runtime import SessionHandle, open_store
from harness.session import EventDraft, thaw
from tests.helpers import user


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("__repr__ called")

    __str__ = __repr__


class BadClass:
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise RuntimeError("__class__ read")


async def _type(h: SessionHandle) -> Any:
    return await h.append(BadRepr(), user("u1"))  # type: ignore[arg-type]


async def _batch_type(h: SessionHandle) -> Any:
    return await h.append_batch([EventDraft(BadRepr(), user("u1"), "append")])  # type: ignore[arg-type]


async def _batch_ignorable(h: SessionHandle) -> Any:
    return await h.append_batch([EventDraft("user/message", user("u1"), "append", ignorable=BadRepr())])  # type: ignore[arg-type]


async def _batch_item(h: SessionHandle) -> Any:
    return await h.append_batch([BadRepr()])  # type: ignore[list-item]


async def _cast_type(h: SessionHandle) -> Any:
    h.append_nowait(BadRepr(), {"x": object()})  # type: ignore[arg-type]
    await h.barrier()


async def _cast_type_json(h: SessionHandle) -> Any:
    h.append_nowait(BadRepr(), user("u1"))  # type: ignore[arg-type]
    await h.barrier()


async def _op_class(h: SessionHandle) -> Any:
    return await h.append("user/message", user("u1"), surface_op=BadClass())  # type: ignore[arg-type]


async def _batch_op_class(h: SessionHandle) -> Any:
    return await h.append_batch([EventDraft("user/message", user("u1"), BadClass())])


@pytest.mark.parametrize(("call", "error"), [
    (_type, EventError), (_batch_type, EventError), (_batch_ignorable, EventError), (_batch_item, EventError),
    (_cast_type, EventError), (_cast_type_json, EventError), (_op_class, NotJsonError), (_batch_op_class, NotJsonError),
])
async def test_refused_typed_and_the_session_goes_on(call: Callable[[SessionHandle], Awaitable[Any]],
                                                     error: type[Exception]) -> None:
    async with open_store() as store:
        h = await store.create("s", cwd="/x")
        with pytest.raises(error):
            await call(h)
        event = await h.append("user/message", user("after"), surface_op="append")
        assert h.alive
        assert [(e.seq, thaw(e.data)["id"]) for e in h.events] == [(event.seq, "after")] == [(0, "after")]
