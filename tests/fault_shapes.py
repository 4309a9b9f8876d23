"""Five cancellation bug shapes, each with its fixed variant (issue 23; the tutorial in
docs/tutorials/faults.md tells the same ones). Every scenario runs under
``harness.faults.explore`` at its default settings."""

from __future__ import annotations

from collections import deque

import trio
import trio.lowlevel

from harness.faults import Probe

# -- 1. lost item in a channel hand-off --------------------------------------------------------


class Mailbox:
    def __init__(self, fixed: bool) -> None:
        self.items: deque[int] = deque()
        self.lot = trio.lowlevel.ParkingLot()
        self.fixed = fixed

    def put(self, item: int) -> None:
        self.items.append(item)
        self.lot.unpark()

    async def get(self) -> int:
        while not self.items:
            await self.lot.park()
        if self.fixed:
            await trio.lowlevel.checkpoint_if_cancelled()  # cancelled before taking it
            item = self.items.popleft()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return item
        item = self.items.popleft()
        await trio.lowlevel.checkpoint()  # BUG: cancelled here, the item is gone
        return item


def handoff(fixed: bool = False):  # type: ignore[no-untyped-def]
    async def channel_handoff(probe: Probe) -> None:
        box = Mailbox(fixed)
        got: list[int] = []

        async def consumer() -> None:
            with trio.CancelScope() as scope:
                probe.canceller("consumer", scope.cancel)
                while True:
                    got.append(await box.get())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)
            await trio.testing.wait_all_tasks_blocked()
            probe.arm()
            for i in range(3):
                box.put(i)
                await trio.lowlevel.checkpoint()
            await trio.testing.wait_all_tasks_blocked()
            probe.disarm()
            nursery.cancel_scope.cancel()
        probe.check(sorted(got + list(box.items)) == [0, 1, 2], f"item lost in the hand-off: got {got}, left {list(box.items)}")

    return channel_handoff


# -- 2. swallowed notification -----------------------------------------------------------------


class Signal:
    """A condition variable: ``notify`` wakes one waiter."""

    def __init__(self, fixed: bool) -> None:
        self.lot = trio.lowlevel.ParkingLot()
        self.fixed = fixed

    def notify(self) -> None:
        self.lot.unpark(count=1)

    async def wait(self) -> None:
        await self.lot.park()
        if not self.fixed:
            await trio.lowlevel.checkpoint()  # BUG: re-acquiring; a cancel here swallows the wakeup
            return
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled:
            self.notify()  # pass the wakeup on to the next waiter
            raise


def notification(fixed: bool = False):  # type: ignore[no-untyped-def]
    async def swallowed_notification(probe: Probe) -> None:
        signal = Signal(fixed)
        items: list[int] = []
        got: list[str] = []
        taken = trio.Event()

        async def waiter(name: str) -> None:
            with trio.CancelScope() as scope:
                probe.canceller(f"waiter-{name}", scope.cancel)
                while not items:
                    await signal.wait()
                items.pop()
                got.append(name)
                taken.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, "a")
            nursery.start_soon(waiter, "b")
            await trio.testing.wait_all_tasks_blocked()
            probe.arm()
            items.append(1)
            signal.notify()
            with trio.move_on_after(5):
                await taken.wait()
            probe.disarm()
            nursery.cancel_scope.cancel()
        probe.check(got, "notification swallowed: the item was never taken")

    return swallowed_notification


# -- 3. slot leaked on cancel during connect -----------------------------------------------------


class Pool:
    def __init__(self, fixed: bool) -> None:
        self.in_use = 0
        self.fixed = fixed

    async def request(self) -> None:
        self.in_use += 1  # take a slot
        if self.fixed:
            try:
                await trio.sleep(0.01)  # connect
                await trio.sleep(0.01)  # the request itself
            finally:
                self.in_use -= 1
            return
        await trio.sleep(0.01)  # connect; BUG: a cancel here leaks the slot
        try:
            await trio.sleep(0.01)  # the request itself
        finally:
            self.in_use -= 1


def pool_slot(fixed: bool = False):  # type: ignore[no-untyped-def]
    async def connect_slot(probe: Probe) -> None:
        pool = Pool(fixed)

        async def client(scope: trio.CancelScope) -> None:
            with scope:
                await pool.request()

        scopes = {name: trio.CancelScope() for name in ("a", "b")}
        for name, scope in scopes.items():
            probe.canceller(f"client-{name}", scope.cancel)
        probe.arm()
        async with trio.open_nursery() as nursery:
            for scope in scopes.values():
                nursery.start_soon(client, scope)
        probe.disarm()
        probe.check(pool.in_use == 0, f"slot leaked: {pool.in_use} in use after every request ended")

    return connect_slot


# -- 4. close-handshake hang ----------------------------------------------------------------


class WebSocket:
    def __init__(self, fixed: bool) -> None:
        self.send_frames, self.frames = trio.open_memory_channel[str](4)
        self.closing = False
        self.peer_closed = trio.Event()
        self.fixed = fixed

    async def reader(self) -> None:
        async for frame in self.frames:
            if frame == "close":
                self.closing = True
                await self.peer_closed.wait()  # BUG (with tcp_closed): the TCP close was already seen
                return

    def tcp_closed(self) -> None:
        if self.closing or self.fixed:
            self.peer_closed.set()
        # else: an abnormal close, which the buggy version only logs


def close_handshake(fixed: bool = False):  # type: ignore[no-untyped-def]
    async def close_hang(probe: Probe) -> None:
        ws = WebSocket(fixed)

        async def transport() -> None:
            await trio.sleep(0.01)
            ws.send_frames.send_nowait("close")
            await trio.lowlevel.checkpoint()  # the TCP close arrives right behind the close frame
            ws.tcp_closed()

        with trio.CancelScope() as scope:
            probe.canceller("caller", scope.cancel)
            probe.arm()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ws.reader)
                nursery.start_soon(transport)
        probe.disarm()

    return close_hang


# -- 5. counter not restored without finally -------------------------------------------------------


class Stats:
    def __init__(self) -> None:
        self.active = 0


async def tracked(stats: Stats, fixed: bool) -> None:
    stats.active += 1
    if fixed:
        try:
            await trio.sleep(0.01)  # the work
        finally:
            stats.active -= 1
        return
    await trio.sleep(0.01)  # the work; BUG: cancelled here, `active` stays raised
    stats.active -= 1


def counter(fixed: bool = False):  # type: ignore[no-untyped-def]
    async def counter_restore(probe: Probe) -> None:
        stats = Stats()
        with trio.CancelScope() as caller:
            probe.canceller("caller", caller.cancel)
            probe.arm()
            await tracked(stats, fixed)
            await tracked(stats, fixed)
        probe.disarm()
        probe.check(stats.active == 0, f"active = {stats.active} after every call returned")

    return counter_restore


COUNTER_BUGGY = counter(False)

SHAPES = {
    "handoff": (handoff, "get"),
    "notification": (notification, "wait"),
    "pool": (pool_slot, "request"),
    "close": (close_handshake, "reader"),
    "counter": (counter, "tracked"),
}
