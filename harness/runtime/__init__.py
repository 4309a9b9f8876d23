"""The actor runtime of sessions: session actors, the store actor, handles and fork.

    async with open_store() as store:
        session = await store.create()
        await session.append("user/message", {...}, surface_op="append")
        child = await store.fork(session)
"""

from harness.runtime._handles import SessionHandle
from harness.runtime._listeners import Listeners
from harness.runtime._session_actor import SessionActor, check_fork_boundary
from harness.runtime._store import PreparedSession, Store, StoreActor, open_store

__all__ = [
    "Listeners",
    "PreparedSession",
    "SessionActor",
    "SessionHandle",
    "Store",
    "StoreActor",
    "check_fork_boundary",
    "open_store",
]
