"""A hypothesis state machine driving the store against a simple reference model."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from harness.errors import HarnessError, OpenTurnError, SessionNotLiveError
from harness.runtime import SessionHandle, Store, open_store
from harness.session import ReplaceOp
from tests.helpers import user


class TrioThread:
    """Runs a store in a Trio loop on a thread; rules call into it synchronously."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.token: trio.lowlevel.TrioToken | None = None
        self.store: Store | None = None
        self._stop: trio.Event | None = None
        self.thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self.thread.start()
        self.ready.wait()

    async def _main(self) -> None:
        async with open_store(clock=lambda: 1) as store:
            self.store = store
            self.token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self.ready.set()
            await self._stop.wait()

    def run(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self.token)

    def close(self) -> None:
        assert self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self.token)
        self.thread.join(10)


class Model:
    """What the store should contain: per live id, the event types and surface."""

    def __init__(self) -> None:
        self.sessions: dict[str, dict[str, Any]] = {}


class StoreMachine(RuleBasedStateMachine):
    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        self.loop = TrioThread()
        self.model = Model()
        self.counter = 0

    def teardown(self) -> None:
        self.loop.close()

    @property
    def store(self) -> Store:
        assert self.loop.store is not None
        return self.loop.store

    def _live(self, h: SessionHandle) -> bool:
        m = self.model.sessions.get(h.id)
        return m is not None and m["handle"] is h

    @rule(target=handles, name=st.sampled_from(["a", "b", "c", None]))
    def create(self, name: str | None) -> Any:
        try:
            h = self.loop.run(self.store.create, name)
        except HarnessError as exc:
            assert name in self.model.sessions and exc.code == "SESSION_ALREADY_EXISTS"
            return self.model.sessions[name]["handle"]  # type: ignore[index]
        assert h.id not in self.model.sessions
        self.model.sessions[h.id] = {"handle": h, "types": [], "surface": [], "open_turn": False}
        return h

    @rule(h=handles, kind=st.sampled_from(["user", "turn/start", "turn/end", "note"]))
    def append(self, h: SessionHandle, kind: str) -> None:
        self.counter += 1
        try:
            if kind == "user":
                ev = self.loop.run(lambda: h.append("user/message", user(f"m{self.counter}"), surface_op="append"))
            else:
                ev = self.loop.run(lambda: h.append(kind, {"turn": 1, "reason": {"kind": "completed"}}))
        except SessionNotLiveError:
            assert not self._live(h)
            return
        assert self._live(h)
        m = self.model.sessions[h.id]
        assert ev.seq == len(m["types"])
        m["types"].append(ev.type)
        if kind == "user":
            m["surface"].append(ev.seq)
        if kind == "turn/start":
            m["open_turn"] = True
        if kind == "turn/end":
            m["open_turn"] = False

    @rule(h=handles, data=st.data())
    def replace(self, h: SessionHandle, data: st.DataObject) -> None:
        m = self.model.sessions.get(h.id)
        if m is None or m["handle"] is not h or not m["surface"]:
            return
        surface = m["surface"]
        i = data.draw(st.integers(0, len(surface) - 1))
        j = data.draw(st.integers(i, len(surface) - 1))
        shadowed = surface[i : j + 1]
        ev = self.loop.run(
            lambda: h.append("user/message", user("sum"), surface_op=ReplaceOp(shadowed[0], shadowed[-1]), source_event_seqs=shadowed)
        )
        m["types"].append(ev.type)
        surface[i : j + 1] = [ev.seq]

    @rule(target=handles, h=handles, data=st.data())
    def fork(self, h: SessionHandle, data: st.DataObject) -> Any:
        m = self.model.sessions.get(h.id)
        live = m is not None and m["handle"] is h
        n = len(m["types"]) if live else 0  # type: ignore[index]
        boundary = data.draw(st.one_of(st.none(), st.integers(0, max(n, 1))))
        try:
            child = self.loop.run(self.store.fork, h, boundary)
        except OpenTurnError:
            assert live
            return h
        except HarnessError as exc:
            if not live:
                assert exc.code in ("SESSION_NOT_FOUND", "SESSION_NOT_LIVE")
            else:
                assert exc.code == "INVALID_BOUNDARY"
                assert (boundary is not None and boundary >= n) or (boundary is None and n == 0)
            return h
        assert live
        cut = n if boundary is None else boundary + 1
        prefix = m["types"][:cut]  # type: ignore[index]
        expected = prefix if prefix[-1:] == ["session/end-seed"] else [*prefix, "session/end-seed"]
        assert [e.type for e in child.events] == expected
        assert child.header.parent_session == h.id and child.header.seed_length == cut
        self.model.sessions[child.id] = {
            "handle": child,
            "types": expected,
            "surface": list(child.surface()),
            "open_turn": False,
        }
        return child

    @precondition(lambda self: bool(self.model.sessions))
    @rule(h=handles)
    def detach(self, h: SessionHandle) -> None:
        self.loop.run(self.store.detach, h)
        m = self.model.sessions.get(h.id)
        if m is not None and m["handle"] is h:
            del self.model.sessions[h.id]

    @invariant()
    def store_matches_model(self) -> None:
        live = self.loop.run(self.store.list)
        assert sorted(x.id for x in live) == sorted(self.model.sessions)
        for h in live:
            m = self.model.sessions[h.id]
            assert [e.type for e in h.events] == m["types"]
            assert list(h.surface()) == m["surface"]


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
pytestmark = pytest.mark.slow
