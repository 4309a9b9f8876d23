"""What an exploration reports: each attempt (:class:`Attempt`, named by its
:class:`ReplayKey`), its violations with the task sites that caused them, grouped by
cause (:class:`Group`), and the :class:`ExploreReport` over all attempts."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs


@attrs.frozen
class ReplayKey:
    """Names one attempt: ``resume:seed=3:k=41:owner``.

    ``k == 0`` is the dry run (nothing injected). The scenario name may itself contain
    colons; canceller names may not.
    """

    scenario: str
    seed: int
    k: int
    canceller: str

    def __str__(self) -> str:
        return f"{self.scenario}:seed={self.seed}:k={self.k}:{self.canceller}"

    @classmethod
    def parse(cls, text: str) -> ReplayKey:
        """Parse the ``str`` form back; raises ``ValueError`` on anything else."""
        parts = text.rsplit(":", 3)
        if len(parts) != 4 or not parts[1].startswith("seed=") or not parts[2].startswith("k="):
            raise ValueError(f"not a replay key: {text!r} (expected SCENARIO:seed=S:k=K:CANCELLER)")
        scenario, seed, k, canceller = parts
        if not scenario or not canceller:
            raise ValueError(f"not a replay key: {text!r}")
        return cls(scenario, int(seed[5:]), int(k[2:]), canceller)


@attrs.frozen
class TaskSite:
    """A task at one moment: its stable ``path`` (position in the nursery tree and
    function, e.g. ``scenario/pool.request#1``: the second task running ``request``
    spawned by the scenario's main task) and its await stack (``module:line function``,
    innermost last). ``site`` is the innermost frame outside Trio, AnyIO and the
    explorer: the line of *your* code where the task was."""

    path: str
    stack: tuple[str, ...] = ()
    file: str | None = None  # ``filename:line`` of ``site``

    @property
    def site(self) -> str:
        for frame in reversed(self.stack):
            if not frame.startswith(_INTERNAL):
                return frame
        return self.stack[-1] if self.stack else "?"

    @property
    def waiting_on(self) -> str | None:
        """The innermost frame when it is inside Trio/AnyIO (what a blocked task waits in)."""
        if self.stack and self.stack[-1].startswith(_INTERNAL) and self.site != self.stack[-1]:
            inner = [f for f in self.stack if f.startswith(_INTERNAL)]
            after = self.stack[self.stack.index(self.site) + 1 :] if self.site in self.stack else inner
            return after[0] if after else None
        return None

    def __str__(self) -> str:
        return f"{self.path} at {self.site}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "site": self.site, "file": self.file, "stack": list(self.stack)}


_INTERNAL: Final = ("trio.", "trio:", "anyio.", "anyio:", "outcome", "sniffio", "contextlib:", "harness.faults._explore:", "harness.testing:")


@attrs.frozen
class Violation:
    """One broken invariant in one attempt.

    The cause: ``injection`` is the first task that received ``Cancelled`` after the
    canceller ran, at the checkpoint where it was delivered (``None``: the cancellation
    reached no task, or nothing was injected); ``cancelled`` lists every task that
    received ``Cancelled`` in the attempt, each where it first saw it. ``detected`` is
    the task (and stack) that recorded the violation (for an escaped exception: where it
    was raised); ``blocked``, for a hang, the tasks still waiting and where.
    ``kind``: ``check`` (recorded by the scenario), ``exception``, ``hang``, ``log``,
    ``post-run``, ``thread`` or ``canceller``. ``perturbations`` counts the priority
    changes of the attempt's schedule (0: Trio's seeded order).

    ``task`` and ``stack`` describe the task that was about to step when the canceller
    was called (where it resumed); ``traceback`` is set for an escaped exception.
    """

    scenario: str
    canceller: str
    k: int
    seed: int
    message: str
    task: str | None = None
    stack: tuple[str, ...] = ()
    traceback: str | None = None
    kind: str = "check"
    injection: TaskSite | None = None
    cancelled: tuple[TaskSite, ...] = ()
    detected: TaskSite | None = None
    blocked: tuple[TaskSite, ...] = ()
    perturbations: int = 0

    @property
    def key(self) -> ReplayKey:
        return ReplayKey(self.scenario, self.seed, self.k, self.canceller)

    @property
    def signature(self) -> str:
        """What groups violations of one cause: the kind, the injection site and the
        detection site (for a hang: where the blocked tasks wait), with numbers and
        addresses in messages normalised."""
        injected = self.injection.site if self.injection else "-"
        if self.kind == "hang":
            where = ", ".join(sorted({b.site for b in self.blocked})) or "?"
        else:
            where = self.detected.site if self.detected else normalise(self.message)[:120]
        return f"{self.kind} | {injected} | {where}"

    def to_json(self) -> dict[str, Any]:
        return {
            "key": str(self.key),
            "scenario": self.scenario,
            "canceller": self.canceller,
            "k": self.k,
            "seed": self.seed,
            "message": self.message,
            "kind": self.kind,
            "signature": self.signature,
            "task": self.task,
            "stack": list(self.stack),
            "injection": self.injection.to_json() if self.injection else None,
            "cancelled": [t.to_json() for t in self.cancelled],
            "detected": self.detected.to_json() if self.detected else None,
            "blocked": [t.to_json() for t in self.blocked],
            "perturbations": self.perturbations,
            "traceback": self.traceback,
        }

    def describe(self, indent: str = "  ") -> list[str]:
        """The causal report of this violation, as lines."""
        lines = [f"{indent}replay: {self.key}"]
        if self.injection is not None:
            lines.append(f"{indent}injected: {self.canceller} -> Cancelled delivered to {self.injection}")
            lines.extend(f"{indent}    {f}" for f in _user_frames(self.injection.stack))
        elif self.task is not None:
            lines.append(f"{indent}injected: {self.canceller} before a step of {self.task} (no task received Cancelled)")
        if self.cancelled:
            shown = "; ".join(str(t) for t in self.cancelled[:8])
            more = f"; and {len(self.cancelled) - 8} more" if len(self.cancelled) > 8 else ""
            lines.append(f"{indent}received Cancelled: {shown}{more}")
        if self.detected is not None:
            lines.append(f"{indent}detected: {self.detected}")
        for b in self.blocked:
            on = f" waiting in {b.waiting_on}" if b.waiting_on else ""
            lines.append(f"{indent}blocked: {b}{on}")
        return lines


def normalise(text: str) -> str:
    """``text`` with addresses, hex ids and numbers replaced (``0x…``, ``#``): what
    makes one cause's messages equal across attempts."""
    text = re.sub(r"0x[0-9a-fA-F]+", "0x…", text)
    text = re.sub(r"\b[0-9a-f]{8,}(?:-[0-9a-f]{4,})*\b", "…", text)
    return re.sub(r"\d+(?:\.\d+)?", "#", text)


def _user_frames(stack: tuple[str, ...]) -> list[str]:
    user = [f for f in stack if not f.startswith(_INTERNAL)]
    return user[-4:] or list(stack[-2:])


@attrs.frozen
class Group:
    """The violations of one cause signature (see :attr:`Violation.signature`).

    ``first`` is the first found, ``smallest`` the minimal replay (fewest schedule
    perturbations, then smallest ``k``); ``confirmed`` says whether replaying
    ``smallest`` reproduced the signature (``None``: not checked)."""

    signature: str
    violations: tuple[Violation, ...]
    confirmed: bool | None = None

    @property
    def count(self) -> int:
        return len(self.violations)

    @property
    def kind(self) -> str:
        return self.violations[0].kind

    @property
    def first(self) -> Violation:
        return self.violations[0]

    @property
    def smallest(self) -> Violation:
        return min(self.violations, key=lambda v: (v.perturbations, v.k, v.seed))

    @property
    def smallest_k(self) -> int:
        return min(v.k for v in self.violations)

    @property
    def keys(self) -> tuple[ReplayKey, ...]:
        return tuple(v.key for v in self.violations)

    def pytest_test(self, scenario_ref: str | None = None) -> str:
        """A ready-to-paste regression test replaying :attr:`smallest`; it fails until
        the cause is fixed. ``scenario_ref``: ``module:function`` of the scenario."""
        v = self.smallest
        module, _, fn = (scenario_ref or f"yourmodule:{v.scenario}").partition(":")
        safe = re.sub(r"\W+", "_", f"{v.scenario}_seed{v.seed}_k{v.k}_{v.canceller}").strip("_").lower()
        return (
            f"from harness.faults import replay\n"
            f"from {module} import {fn}\n\n\n"
            f"def test_{safe}() -> None:\n"
            f"    attempt = replay({fn}, {str(v.key)!r})\n"
            f"    assert attempt.violations == (), [x.message for x in attempt.violations]\n"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "signature": self.signature,
            "kind": self.kind,
            "count": self.count,
            "first": str(self.first.key),
            "smallest": str(self.smallest.key),
            "smallest_k": self.smallest_k,
            "confirmed": self.confirmed,
            "violation": self.first.to_json(),
        }


def group_violations(violations: Iterable[Violation]) -> list[Group]:
    """Group ``violations`` by :attr:`Violation.signature`, in order of first finding."""
    groups: dict[str, list[Violation]] = {}
    for v in violations:
        groups.setdefault(v.signature, []).append(v)
    return [Group(sig, tuple(vs)) for sig, vs in groups.items()]


@attrs.frozen
class Attempt:
    """The outcome of one run of a scenario (``k == 0``: the dry run).

    ``steps`` counts the scheduler steps taken while the probe was armed; ``fired``
    says whether the fault was injected (a run may end before step ``k``);
    ``outcome`` is ``"ok"``, ``"typed error"`` (a library error escaped, allowed),
    ``"expected"`` (e.g. a simulated crash), ``"violation"`` (something was recorded),
    ``"hang"`` or ``"raw exception"``.
    ``injection`` / ``cancelled``: the first receiver of ``Cancelled`` and every one
    (see :class:`Violation`); ``perturbations``: the schedule's priority changes.
    ``gate_timeouts`` counts worker threads the run stopped waiting for (each one makes
    the schedule depend on thread timing: see the determinism notes in docs/faults.md).
    ``chain_steps``: steps of group-commit chains the gate granted (decision 0015),
    ``chains``: the chains the run started.
    """

    scenario: str
    seed: int
    k: int
    canceller: str
    steps: int
    fired: bool
    task: str | None
    stack: tuple[str, ...]
    violations: tuple[Violation, ...]
    outcome: str
    wall_time: float
    gate_timeouts: int = 0
    cancellers: tuple[str, ...] = ()
    logs: tuple[str, ...] = ()
    injection: TaskSite | None = None
    cancelled: tuple[TaskSite, ...] = ()
    perturbations: int = 0
    chain_steps: int = 0
    chains: int = 0

    @property
    def key(self) -> ReplayKey:
        return ReplayKey(self.scenario, self.seed, self.k, self.canceller)


@attrs.frozen
class ExploreReport:
    """What a campaign over one scenario found.

    ``steps`` maps each canceller (or fault kind) to the number of injection points
    explored, summed over seeds; ``dry_steps`` maps each seed to the step count of its
    dry run. ``violations`` lists every violation of every attempt (see
    :meth:`distinct` to group them by message).
    """

    scenario: str
    mode: str
    steps: Mapping[str, int]
    attempts: int
    violations: tuple[Violation, ...]
    wall_time: float
    dry_steps: Mapping[int, int] = attrs.field(factory=dict)
    backend: str | None = None
    notes: tuple[str, ...] = ()
    confirmed: Mapping[str, bool] = attrs.field(factory=dict)
    scenario_ref: str | None = None

    @property
    def ok(self) -> bool:
        return not self.violations

    def distinct(self) -> list[tuple[Violation, int]]:
        """The first violation of each distinct message, with how many attempts hit it."""
        groups: dict[str, list[Violation]] = {}
        for v in self.violations:
            groups.setdefault(v.message, []).append(v)
        return [(vs[0], len(vs)) for vs in groups.values()]

    @property
    def groups(self) -> list[Group]:
        """The violations grouped by cause signature (:func:`group_violations`), each
        with whether its minimal replay was confirmed."""
        return [attrs.evolve(g, confirmed=self.confirmed.get(g.signature)) for g in group_violations(self.violations)]

    def __str__(self) -> str:
        steps = ", ".join(f"{c} {n}" for c, n in self.steps.items()) or "no injection points"
        groups = self.groups
        head = (
            f"{self.scenario} ({self.mode}): {self.attempts} attempts ({steps}; {len(self.dry_steps)} schedule(s)), "
            f"{len(self.violations)} violation(s) in {len(groups)} group(s), {self.wall_time:.1f}s"
        )
        lines = [head]
        for i, g in enumerate(groups, 1):
            first, small = g.first, g.smallest
            lines.append(f"group {i}: {g.kind} x{g.count}, smallest k={g.smallest_k}")
            lines.append(f"  {first.message.splitlines()[0] if first.message else ''}")
            lines.extend(first.describe("  "))
            if small.key != first.key:
                lines.append(f"  minimal replay: {small.key}")
            if g.confirmed is False:
                lines.append("  (the minimal replay did not reproduce it: the schedule depends on timing)")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "mode": self.mode,
            "backend": self.backend,
            "steps": dict(self.steps),
            "dry_steps": {str(k): v for k, v in self.dry_steps.items()},
            "attempts": self.attempts,
            "violations": [v.to_json() for v in self.violations],
            "distinct": [{"count": n, **v.to_json()} for v, n in self.distinct()],
            "groups": [g.to_json() for g in self.groups],
            "summary": str(self),
            "wall_time": round(self.wall_time, 3),
            "notes": list(self.notes),
        }
