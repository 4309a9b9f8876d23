"""Helpers shared by the SQL backends' group commit (``write_group``, issue 26)."""

from __future__ import annotations

from harness.errors import HarnessError


def copy_error(exc: BaseException, session_id: str) -> BaseException:
    """A copy of ``exc`` for one batch of a group that a shared step failed (the
    commit, ``BEGIN``): each batch's waiter raises its own exception object (one
    object raised by several tasks would collect all their tracebacks), of the type
    and with the message and attributes the batch alone would have got, its cause
    kept. A :class:`HarnessError` that names no session names this batch's."""
    cls = type(exc)
    try:
        new = cls.__new__(cls, *exc.args)
    except Exception:  # an exception type with an unusual constructor: share it
        return exc
    new.__dict__.update(vars(exc))
    if isinstance(new, HarnessError) and new.session_id is None:
        new.session_id = session_id
    new.__cause__ = exc.__cause__
    new.__context__ = exc.__context__
    new.__suppress_context__ = exc.__suppress_context__
    return new
