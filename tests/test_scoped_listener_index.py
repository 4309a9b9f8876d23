"""Scoped listeners are indexed by scope (issue 24 §3): an append asks only the
listeners that can hear its session, and every kind still delivers in registration
order when scoped and unscoped listeners are mixed (reference §7)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import trio
import trio.lowlevel

from actors import Owner
from harness.runtime import SessionHandle, open_store


class CountingOwner(Owner):
    """Counts the scope checks made against the sessions it carries."""

    checks = 0

    def descends_from(self, other: Any) -> bool:
        CountingOwner.checks += 1
        return super().descends_from(other)


async def test_an_append_consults_only_the_listeners_of_its_scope() -> None:
    # 300 owners, one scoped event listener each (one agent per owner): an append to one
    # owner's session must not test the 299 others (on the old code every append made
    # one scope check per scoped listener of the store).
    heard: list[tuple[str, str]] = []
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store())
        owners = [await stack.enter_async_context(CountingOwner(f"agent-{i}")) for i in range(300)]
        for owner in owners:
            store.on_event(lambda h, e, name=owner.name: heard.append((name, e.type)), scope=owner)
        s = await store.create("s0", owner=owners[7])
        CountingOwner.checks = 0
        for i in range(10):
            await s.append("feedback/record", {"i": i})
        assert heard == [("agent-7", "feedback/record")] * 10
        assert CountingOwner.checks <= 10 * 2  # the heard listener's own check, not 300 per append


async def test_a_created_listener_scan_is_scoped_too() -> None:
    seen: list[str] = []
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store())
        owners = [await stack.enter_async_context(CountingOwner(f"agent-{i}")) for i in range(200)]
        for owner in owners:
            store.on_created(lambda h, name=owner.name: seen.append(name), scope=owner)
            store.on_disposed(lambda h, name=owner.name: seen.append("gone " + name), scope=owner)
        CountingOwner.checks = 0
        s = await store.create("s", owner=owners[3])
        await store.detach(s)
        assert seen == ["agent-3", "gone agent-3"]
        assert CountingOwner.checks <= 4


async def test_delivery_order_with_scoped_and_unscoped_listeners_mixed() -> None:
    # Listeners of every kind registered interleaved: unscoped, scoped to a parent, to a
    # child, to an unrelated owner, one callable twice. Each session hears exactly the
    # listeners of its scope chain plus the unscoped ones, in registration order; an
    # unsubscribe keeps the order of the rest.
    log: list[tuple[str, str, str]] = []

    def listener(name: str, kind: str) -> Any:
        if kind == "created":
            return lambda h: log.append((kind, h.id, name))
        if kind == "event":
            return lambda h, e: log.append((kind, h.id, name))
        if kind == "disposed":
            return lambda h: log.append((kind, h.id, name))

        async def flush(h: SessionHandle) -> None:
            await trio.lowlevel.checkpoint()
            log.append((kind, h.id, name))

        return flush

    async with Owner("parent") as parent, Owner("child", parent=parent) as child, Owner("other") as other:
        async with open_store() as store:
            register = {
                "created": store.on_created,
                "event": store.on_event,
                "disposed": store.on_disposed,
                "flush": store.on_flush,
            }
            plan: list[tuple[str, Owner | None]] = [
                ("u1", None),
                ("p1", parent),
                ("c1", child),
                ("o1", other),
                ("u2", None),
                ("c2", child),
                ("p2", parent),
                ("o2", other),
                ("u3", None),
            ]
            drops: dict[tuple[str, str], Any] = {}
            for kind, on in register.items():
                for name, scope in plan:
                    drops[(kind, name)] = on(listener(name, kind), scope=scope)
            twice = listener("twice", "event")
            store.on_event(twice, scope=child)
            store.on_event(twice)
            chain = {"in-child": ["u1", "p1", "c1", "u2", "c2", "p2", "u3"], "in-parent": ["u1", "p1", "u2", "p2", "u3"]}
            chain["in-other"] = ["u1", "o1", "u2", "o2", "u3"]
            chain["unscoped"] = ["u1", "u2", "u3"]
            owners = {"in-child": child, "in-parent": parent, "in-other": other, "unscoped": None}

            for sid, owner in owners.items():
                log.clear()
                s = await store.create(sid, owner=owner)
                await s.append("feedback/record", {"x": 1})
                await store.flush(s)
                await store.detach(s)
                extra = ["twice", "twice"] if sid == "in-child" else ["twice"]
                ordered = [entry for entry in log if entry[0] != "flush"]
                assert ordered == [
                    *(("created", sid, n) for n in chain[sid]),
                    *(("event", sid, n) for n in chain[sid] + extra),
                    *(("disposed", sid, n) for n in chain[sid]),
                ]
                assert sorted(e[2] for e in log if e[0] == "flush") == sorted(chain[sid])

            # Unsubscribing from the middle keeps the others' order; re-registering puts
            # a listener last.
            for kind in register:
                drops[(kind, "p1")]()
                drops[(kind, "u2")]()
            store.on_event(listener("p1", "event"), scope=parent)
            log.clear()
            s = await store.create("again", owner=child)
            await s.append("feedback/record", {"x": 2})
            events = [n for kind, _, n in log if kind == "event"]
            assert events == ["u1", "c1", "c2", "p2", "u3", "twice", "twice", "p1"]
            assert [n for kind, _, n in log if kind == "created"] == ["u1", "c1", "c2", "p2", "u3"]
