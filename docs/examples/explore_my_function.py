"""Explore your own Trio function under cancellation at every checkpoint.

    python docs/examples/explore_my_function.py

`transfer` moves money between two accounts through a slow "ledger" call. The invariant
is ours, not the library's: money is never created or lost, and a transfer either happened
(with a receipt) or did not. `harness.faults.explore` runs the scenario once to count its
scheduler steps, then once per step with a cancellation injected right before it, by each
of two cancellers (the caller's scope and a shutdown of the whole bank). A naive version
that checkpoints between debit and credit is explored too: exploration finds its bug.
See docs/tutorials/faults.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from harness.faults import ExploreReport, Probe, Settings, explore

Accounts = dict[str, int]


async def ledger_call() -> None:
    await trio.sleep(0.01)  # the request to the ledger (mock time under explore)


async def transfer(accounts: Accounts, receipts: list[int], src: str, dst: str, amount: int) -> None:
    await ledger_call()  # a cancellation before this point: nothing happened
    with trio.CancelScope(shield=True):  # debit, credit and receipt happen together or not at all
        accounts[src] -= amount
        await ledger_call()
        accounts[dst] += amount
        receipts.append(amount)


async def naive_transfer(accounts: Accounts, receipts: list[int], src: str, dst: str, amount: int) -> None:
    await ledger_call()
    accounts[src] -= amount
    await ledger_call()  # a cancellation here loses the money in flight
    accounts[dst] += amount
    receipts.append(amount)


MOCK_TIME = Settings(autojump_threshold=0.0)  # sleeps cost no real time
TransferFn = Callable[[Accounts, list[int], str, str, int], Awaitable[None]]


def scenario(fn: TransferFn) -> Callable[[Probe], Awaitable[None]]:
    async def bank(probe: Probe) -> None:
        accounts, receipts = {"alice": 100, "bob": 0}, list[int]()
        async with trio.open_nursery() as bank_nursery:
            probe.canceller("shutdown", bank_nursery.cancel_scope.cancel)
            with trio.CancelScope() as caller:
                probe.canceller("caller", caller.cancel)
                probe.arm()
                await fn(accounts, receipts, "alice", "bob", 30)
                await fn(accounts, receipts, "bob", "alice", 10)
        probe.disarm()
        total, moved = sum(accounts.values()), 100 - accounts["alice"]
        probe.check(total == 100, f"money not conserved: {accounts}")
        probe.check(moved == sum(receipts[:1]) - sum(receipts[1:]), f"{accounts} but receipts {receipts}")

    return bank


def summary(report: ExploreReport) -> str:
    steps = ", ".join(f"{c}: {n}" for c, n in sorted(report.steps.items()))
    return f"{report.scenario}: {report.attempts} attempts, steps explored per canceller ({steps})"


if __name__ == "__main__":
    good = explore(scenario(transfer), name="transfer", seeds=2, settings=MOCK_TIME)
    print(summary(good), "->", "ok" if good.ok else good.distinct())
    assert good.ok, good.distinct()
    bad = explore(scenario(naive_transfer), name="naive_transfer", seeds=2, settings=MOCK_TIME)
    print(summary(bad), "->", f"{len(bad.distinct())} distinct violation(s)")
    for violation, count in bad.distinct():
        print(f"  {violation.key} (x{count}): {violation.message}")
    assert not bad.ok, "exploration should have found the naive transfer's bug"
