"""A subclass of ``RelationalInvariants`` that adds its rules by overriding ``_core``
(the session-core rules, which ``check`` calls for every event) rather than ``check``
itself: ``check_batch`` is still ``check`` over the events in turn, and ``check`` still
hands the subclass every event's data, as it did before the invariants stopped reading
the data of the types no rule of theirs concerns (decision 0026)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from harness.errors import HarnessError, InvariantError
from harness.runtime import open_store
from harness.session import Event, EventDraft, RelationalInvariants, Trace


class _CustomInsideATurn(RelationalInvariants):
    """A rule of its own, in ``_core``, on a type the base class never looks at."""

    def _core(self, s: Trace, event: Event, t: str, d: dict[str, Any]) -> Trace:
        if t == "custom/kind" and s.open_turn is None:
            raise InvariantError("custom/kind outside a turn")
        return super()._core(s, event, t, d)


def _verdict(run: Any) -> tuple[Any, ...]:
    try:
        state = run()
    except HarnessError as exc:
        return ("veto", type(exc), str(exc))
    return ("state", attrs.asdict(state))


def _one_by_one(v: RelationalInvariants, state: Trace, events: list[Event]) -> Trace:
    for e in events:
        state = v.check(state, e)
    return state


def test_check_batch_runs_an_overridden_core_on_every_event_as_check_does() -> None:
    v = _CustomInsideATurn()
    events = [Event("user/message", 0, 1, {}, "append", None), Event("custom/kind", 1, 1, {}, None, None)]
    one = _verdict(lambda: _one_by_one(v, v.initial(), events))
    assert one[0] == "veto"
    assert _verdict(lambda: v.check_batch(v.initial(), events)) == one


def test_an_installed_subclass_with_its_own_core_vetoes_under_the_store() -> None:
    # The store's installed validators call check_batch: the subclass's rule holds there.
    async def main() -> None:
        async with open_store(validator_factory=_CustomInsideATurn) as store:
            h = await store.create("s")
            with pytest.raises(InvariantError, match="custom/kind outside a turn"):
                await h.append_batch([EventDraft("custom/kind", {}), EventDraft("custom/other", {})])
            assert len(h.events) == 0

    trio.run(main)


class _CustomNeedsAnOwner(RelationalInvariants):
    """A rule of its own, in ``_core``, that reads the data of a type of its own."""

    def _core(self, s: Trace, event: Event, t: str, d: dict[str, Any]) -> Trace:
        if t == "custom/kind" and "owner" not in d:
            raise InvariantError("custom/kind needs an owner")
        return super()._core(s, event, t, d)


def test_an_overridden_core_is_handed_the_data_of_every_type() -> None:
    v = _CustomNeedsAnOwner()
    owned = Event("custom/kind", 0, 1, {"owner": "me"}, None, None)
    assert v.check(v.initial(), owned).last_seq == 0
    assert v.check_batch(v.initial(), [owned]).last_seq == 0
    with pytest.raises(InvariantError, match="needs an owner"):
        v.check(v.initial(), Event("custom/kind", 0, 1, {}, None, None))


def test_a_session_under_a_subclass_reading_its_own_type_accepts_what_it_accepted() -> None:
    # The appended event keeps its JSON (the type is not in reads_data); check decodes it.
    from harness.session import Session

    s = Session.create("owned", clock=lambda: 1, validator=_CustomNeedsAnOwner())
    s.append("custom/kind", {"owner": "me"})
    with pytest.raises(InvariantError, match="needs an owner"):
        s.append("custom/kind", {"someone": "else"})
    assert len(s.events) == 1
