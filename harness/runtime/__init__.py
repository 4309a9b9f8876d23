"""The actor runtime of sessions: session actors, the store actor, handles and fork.

    async with open_store() as store:
        session = await store.create()
        await session.append("user/message", {...}, surface_op="append")
        child = await store.fork(session)
        snapshot = session.snapshot()      # no round trip; never changes
"""

from harness.runtime._handles import SessionHandle
from harness.runtime._listeners import (
    CreatedListener,
    DisposedListener,
    EventBatchListener,
    EventListener,
    FlushListener,
    Listeners,
    PreCommitHook,
)
from harness.runtime._session_actor import SessionActor, check_fork_boundary
from harness.runtime._snapshot import SessionSnapshot
from harness.runtime._store import PreparedSession, Store, StoreActor, open_store
from harness.runtime._warnings import WarningKind, WarningListener, WarningReport, Warnings

__all__ = [
    "CreatedListener",
    "DisposedListener",
    "EventBatchListener",
    "EventListener",
    "FlushListener",
    "Listeners",
    "PreCommitHook",
    "PreparedSession",
    "SessionActor",
    "SessionHandle",
    "SessionSnapshot",
    "Store",
    "StoreActor",
    "WarningKind",
    "WarningListener",
    "WarningReport",
    "Warnings",
    "check_fork_boundary",
    "open_store",
]
