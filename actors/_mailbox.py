"""An actor's bounded mailbox: a queue, the parked actor, the parked senders.

Why not ``trio.open_memory_channel``: a request/reply round trip is the hot path of
every session append (issue 26: W1-actor). The channel's general machinery (clones,
any number of receivers, a ``WouldBlock`` raised and caught on every receive that
finds it empty, KI protection) cost a good part of each round trip; this mailbox has
one receiver (the actor task) and keeps only what the kernel uses. It keeps the
channel's scheduling: a message put while the actor waits is handed to it directly;
the actor's take of a queued message is a schedule point (other tasks run between
two messages); a put on a full mailbox waits, first come first served.

A caller that runs a message on its own task while the actor waits (decision 0013)
*borrows* the parked receiver (:meth:`Mailbox.borrow`): the mailbox then looks busy,
puts queue instead of waking the receiver, and :meth:`Mailbox.end_borrow` hands the
receiver what queued meanwhile.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

import outcome
import trio
from trio.lowlevel import (
    Abort,
    RaiseCancelT,
    Task,
    cancel_shielded_checkpoint,
    checkpoint_if_cancelled,
    current_task,
    reschedule,
    wait_task_rescheduled,
)

T = TypeVar("T")


class Mailbox(Generic[T]):
    """Single-receiver, bounded (``capacity`` >= 0; 0: a put waits for the take).

    ``close`` (the senders' side: the actor is stopping) refuses new puts, fails the
    waiting ones with ``ClosedResourceError`` and lets the receiver drain what is
    queued, then ``EndOfChannel``. ``close_receive`` (the actor ended) refuses puts
    with ``BrokenResourceError``.
    """

    __slots__ = ("_borrowed", "_capacity", "_closed", "_queue", "_receiver", "_senders", "broken")

    def __init__(self, capacity: float) -> None:
        self._capacity = capacity
        self._queue: deque[T] = deque()
        self._receiver: Task | None = None  # the receiver, while it waits
        self._senders: dict[Task, T] = {}  # waiting for space, in arrival order
        self._closed = False
        # A borrower is handling a message for the parked receiver (see borrow).
        self._borrowed = False
        self.broken = False

    @property
    def idle(self) -> bool:
        """The receiver waits, nothing is queued and nobody borrowed it."""
        return self._receiver is not None and not self._queue and not self._borrowed

    # -- borrowing the parked receiver ----------------------------------------------------

    def borrow(self) -> bool:
        """If :attr:`idle` (and not closed): mark the receiver borrowed and return True.

        Until :meth:`end_borrow` the mailbox is not idle, a put queues (it does not wake
        the receiver) and the receiver stays parked: whoever borrowed it handles a
        message in its place, synchronously. Never a checkpoint.
        """
        if self._receiver is None or self._borrowed or self._queue or self._closed:
            return False
        self._borrowed = True
        return True

    def end_borrow(self, error: BaseException | None = None) -> None:
        """End a :meth:`borrow`. ``error``: wake the receiver with it (it must stop).
        Otherwise it gets the oldest item queued meanwhile (``EndOfChannel`` if the
        mailbox was closed meanwhile), or keeps waiting. If its wait was cancelled
        meanwhile it is unwinding and takes what is queued on its own."""
        self._borrowed = False
        receiver = self._receiver
        if receiver is None:
            return
        if error is not None:
            self._receiver = None
            reschedule(receiver, outcome.Error(error))
        elif self._queue or self._senders:
            self._receiver = None
            reschedule(receiver, outcome.Value(self.take_nowait()))
        elif self._closed:
            self._receiver = None
            reschedule(receiver, outcome.Error(trio.EndOfChannel()))

    # -- the senders' side --------------------------------------------------------------

    def put_nowait(self, item: T) -> None:
        """Queue ``item`` (or hand it to the waiting receiver); never a checkpoint.

        Raises ``trio.WouldBlock`` when full, ``ClosedResourceError`` once closed,
        ``BrokenResourceError`` once the receiver is gone.
        """
        if self._closed:
            raise trio.ClosedResourceError
        if self.broken:
            raise trio.BrokenResourceError
        receiver = self._receiver
        if receiver is not None and not self._borrowed:
            self._receiver = None
            reschedule(receiver, outcome.Value(item))
        elif len(self._queue) < self._capacity:
            self._queue.append(item)
        else:
            raise trio.WouldBlock

    async def put(self, item: T) -> None:
        """:meth:`put_nowait`, waiting while full. Cancelled: ``item`` was not put."""
        await checkpoint_if_cancelled()
        try:
            self.put_nowait(item)
        except trio.WouldBlock:
            pass
        else:
            await cancel_shielded_checkpoint()
            return
        task = current_task()
        self._senders[task] = item

        def abort(_: RaiseCancelT) -> Abort:
            del self._senders[task]
            return Abort.SUCCEEDED

        await wait_task_rescheduled(abort)

    def close(self) -> None:
        """No more puts; waiting senders fail (nothing of theirs was put); the
        receiver gets ``EndOfChannel`` once the queue is empty. Idempotent."""
        if self._closed:
            return
        self._closed = True
        senders = list(self._senders)
        self._senders.clear()
        for task in senders:
            reschedule(task, outcome.Error(trio.ClosedResourceError()))
        receiver = self._receiver
        if receiver is not None and not self._borrowed:  # (borrowed: end_borrow tells it)
            self._receiver = None
            reschedule(receiver, outcome.Error(trio.EndOfChannel()))

    # -- the receiver's side (the actor task) -------------------------------------------

    def take_nowait(self) -> T:
        """The oldest item; ``WouldBlock`` if none, ``EndOfChannel`` once closed and empty."""
        queue = self._queue
        senders = self._senders
        if queue:
            item = queue.popleft()
            if senders:  # space freed: the longest-waiting sender's item goes in
                task = next(iter(senders))
                queue.append(senders.pop(task))
                reschedule(task)
            return item
        if senders:  # capacity 0: take straight from the first waiting sender
            task = next(iter(senders))
            item = senders.pop(task)
            reschedule(task)
            return item
        if self._closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    async def take(self) -> T:
        """The next item, waiting for one. A checkpoint either way."""
        await checkpoint_if_cancelled()
        if self._queue or self._senders or self._closed:
            item = self.take_nowait()  # EndOfChannel when closed and drained
            await cancel_shielded_checkpoint()
            return item
        self._receiver = current_task()

        def abort(_: RaiseCancelT) -> Abort:
            self._receiver = None
            return Abort.SUCCEEDED

        taken: T = await wait_task_rescheduled(abort)
        return taken

    def close_receive(self) -> None:
        """The receiver is gone: later puts fail with ``BrokenResourceError``, and so do
        the senders still waiting. Idempotent."""
        self.broken = True
        senders = list(self._senders)
        self._senders.clear()
        for task in senders:
            reschedule(task, outcome.Error(trio.BrokenResourceError()))
