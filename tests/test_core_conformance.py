"""Session-core conformance (issue 11 §4): the observable rules of reference
``session-core.md`` that the rest of the suite did not pin down."""

from __future__ import annotations

import functools
import logging
from typing import Any

import pytest

from harness.errors import (
    AsyncListenerError,
    EventError,
    ForkSourceNotFoundError,
    ForkSourceNotLiveError,
    HeaderError,
    InvariantError,
    PreparationDisposedError,
    SessionArgumentError,
    SessionAttachedError,
    SessionError,
    SessionNotLiveError,
    SurfaceError,
)
from harness.runtime import SessionHandle, open_store
from harness.session import (
    Event,
    EventDraft,
    FrozenDict,
    RelationalInvariants,
    ReplaceOp,
    Session,
    canonical_header,
    decode_storage_record,
    fold_surface,
    freeze,
    header_equals,
    is_storage_row,
    pack_chunk_runs,
)
from tests.helpers import header, rec, tool_result, user

PREFIX = 'invariant violated by "@deepseek-ai/dsh-session": '


def clock() -> int:
    return 1_000


# -- 1. snapshot-mode header: the JSON walk comes before the shape check -----------------


class Custom:
    pass


class SubDict(dict[str, Any]):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {1, 2},
        ("a",),
        Custom(),
        SubDict(version=0, id="s", createdAt=1),
        {"version": 0, "id": "s", "createdAt": 1, "extra": {1}},
        {1: "non-string key"},
        {"version": 0, "id": "s", "createdAt": float("nan")},
    ],
    ids=["set", "tuple", "instance", "dict-subclass", "nested-set", "int-key", "nan"],
)
def test_a_non_json_header_is_not_losslessly_serializable(value: object) -> None:
    with pytest.raises(HeaderError) as info:
        Session.create("s", header=value)  # type: ignore[arg-type]
    assert info.value.code == "INVALID_HEADER"
    assert str(info.value) == "session header is not losslessly JSON-serializable"
    assert info.value.session_id == "s"


@pytest.mark.parametrize("value", [[], ["version"], "header", 0, True], ids=repr)
def test_json_that_is_not_an_object_is_not_a_plain_record(value: object) -> None:
    with pytest.raises(HeaderError) as info:
        Session.create("s", header=value)  # type: ignore[arg-type]
    assert str(info.value) == "session header is not a plain JSON record"


def test_restore_mode_does_not_json_walk_the_header() -> None:
    with pytest.raises(HeaderError) as info:
        Session.restore("s", [], ("a",))  # type: ignore[arg-type]
    assert str(info.value) == "session header is not a plain JSON record"


async def test_store_metadata_that_is_not_json_fails_the_walk_first() -> None:
    async with open_store(clock=clock) as store:
        with pytest.raises(HeaderError) as info:
            await store.create("s", cwd={"/tmp"})
        assert str(info.value) == "session header is not losslessly JSON-serializable"
        assert await store.list() == []


# -- 2. one store at a time per Session object, process-wide ---------------------------


async def test_a_session_object_is_attached_to_one_store_at_a_time() -> None:
    session = Session.create("s", clock=clock)
    async with open_store(clock=clock) as a, open_store(clock=clock) as b:
        in_a = await a.adopt(session)
        handle_a = await a.enter(in_a)
        in_b = await b.adopt(session)  # a second wrapper of the same object
        with pytest.raises(SessionAttachedError) as info:
            await b.enter(in_b)
        assert info.value.code == "SESSION_ALREADY_ATTACHED"
        assert str(info.value) == 'session "s" is already attached to a store'
        assert await b.list() == []

        await a.detach(handle_a)
        handle_b = await b.enter(in_b)  # detached: it may go elsewhere
        await handle_b.append("turn/start", {"turn": 1})
        with pytest.raises(SessionAttachedError):
            await a.enter(in_a)
        await b.detach(handle_b)

        # A detached prepared session can be entered again, in its first store too.
        seen: list[int] = []
        a.on_event(lambda h, ev: seen.append(ev.seq))
        again = await a.enter(in_a)
        assert again is not handle_a and again.alive and not handle_a.alive
        await again.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        assert seen == [1] and session.seq == 2


async def test_a_disposed_preparation_is_not_entered() -> None:
    async with open_store(clock=clock) as store:
        prepared = await store.prepare("p")
        prepared.dispose()
        with pytest.raises(PreparationDisposedError) as info:
            await store.enter(prepared)
        assert (info.value.code, str(info.value)) == (
            "PREPARATION_DISPOSED",
            'cannot enter session "p": its preparation was disposed',
        )
        assert await store.list() == []


async def test_an_error_exit_releases_the_stores_sessions() -> None:
    session = Session.create("s", clock=clock)

    class Boom(Exception):
        pass

    with pytest.raises(ExceptionGroup) as info:  # the runtime's nursery groups it
        async with open_store(clock=clock) as store:
            await store.enter(await store.adopt(session))
            raise Boom
    assert info.group_contains(Boom)
    async with open_store(clock=clock) as other:
        handle = await other.enter(await other.adopt(session))
        assert handle.alive


# -- 3. store operations given something that is not a live handle ----------------------


async def test_handle_operations_refuse_what_is_not_a_live_handle_of_this_store() -> None:
    async with open_store(clock=clock) as store, open_store(clock=clock) as other:
        live = await store.create("s")
        prepared = await store.prepare("p")
        stranger = await other.create("s")
        cases: list[tuple[object, str, str | None]] = [
            (live._entry.session, 'session "s" is not live in this store: a Session is not its SessionHandle', "s"),
            (prepared, 'session "p" is not live in this store: a PreparedSession is not its SessionHandle', "p"),
            (stranger, 'session "s" is not live in this store', "s"),
            (42, "expected a SessionHandle of this store, got 42", None),
            ("s", "expected a SessionHandle of this store, got 's'", None),
            (None, "expected a SessionHandle of this store, got None", None),
        ]
        for value, message, sid in cases:
            for op in (store.announce, store.detach, store.flush):
                with pytest.raises(SessionNotLiveError) as info:
                    await op(value)  # type: ignore[arg-type]
                assert (info.value.code, str(info.value), info.value.session_id) == (
                    "SESSION_NOT_LIVE",
                    message,
                    sid,
                ), op
        # Nothing was detached or crashed: both stores go on.
        assert [h.id for h in await store.list()] == ["s"] and live.alive and stranger.alive
        await live.append("turn/start", {"turn": 1})
        assert [h.id for h in await other.list()] == ["s"]


async def test_a_stale_handle_is_not_live_and_its_detach_is_idempotent() -> None:
    async with open_store(clock=clock) as store:
        old = await store.create("s")
        await store.detach(old)
        await store.create("s")
        with pytest.raises(SessionNotLiveError) as info:
            await store.announce(old)
        assert str(info.value) == 'session "s" is not live in this store'
        with pytest.raises(SessionNotLiveError):
            await store.flush(old)
        await store.detach(old)  # no-op
        assert len(await store.list()) == 1


async def test_fork_resolves_sources_without_coercion() -> None:
    async with open_store(clock=clock) as store:
        live = await store.create("s")
        await store.create("42")
        with pytest.raises(ForkSourceNotFoundError) as nf:
            await store.fork(42)  # type: ignore[arg-type]
        assert (nf.value.code, str(nf.value)) == (
            "SESSION_NOT_FOUND",
            "fork source must be a SessionHandle or a session id, got 42",
        )
        with pytest.raises(ForkSourceNotLiveError) as nl:
            await store.fork(live._entry.session)  # type: ignore[arg-type]
        assert (nl.value.code, str(nl.value)) == ("SESSION_NOT_LIVE", 'session "s" is not the live store instance')
        with pytest.raises(ForkSourceNotFoundError) as gone:
            await store.fork(Session.create("nobody"))  # type: ignore[arg-type]
        assert str(gone.value) == 'session "nobody" not found'
        prepared = await store.prepare("p")
        with pytest.raises(ForkSourceNotFoundError):
            await store.fork(prepared)  # type: ignore[arg-type]
        with pytest.raises(SessionError) as bad_child:
            await store.fork(live, None, ["c"])  # type: ignore[arg-type]
        assert str(bad_child.value) == "session id must be a non-empty string, got ['c']"
        assert sorted(h.id for h in await store.list()) == ["42", "s"]
        child = await store.fork("s", None, "c")  # a string id is the documented form
        assert child.header.parent_session == "s"


async def test_enter_adopt_get_prepare_refuse_wrong_kinds_without_crashing() -> None:
    async with open_store(clock=clock) as store:
        session = Session.create("s")
        with pytest.raises(SessionArgumentError) as entered:
            await store.enter(session)  # type: ignore[arg-type]
        assert entered.value.code == "INVALID_SESSION_ARGUMENT"
        assert str(entered.value) == (
            'session "s" cannot be entered as a Session: enter takes its PreparedSession '
            "(from store.prepare or store.adopt)"
        )
        with pytest.raises(SessionArgumentError) as number:
            await store.enter(7)  # type: ignore[arg-type]
        assert str(number.value) == "enter takes a PreparedSession, got 7"
        with pytest.raises(SessionArgumentError) as adopted:
            await store.adopt("s")  # type: ignore[arg-type]
        assert str(adopted.value) == "adopt takes a Session, got 's'"
        assert await store.get(["s"]) is None  # type: ignore[arg-type]
        with pytest.raises(SessionError) as prepared:
            await store.prepare(["s"])  # type: ignore[arg-type]
        assert str(prepared.value) == "session id must be a non-empty string, got ['s']"
        handle = await store.create("s")  # the store actor is alive
        assert await store.get("s") is handle


# -- 4. listeners: async ones are refused at registration ------------------------------


class AsyncCall:
    async def __call__(self, *args: Any) -> None:
        pass


async def test_async_listeners_are_refused_at_registration() -> None:
    async def listener(*args: Any) -> None:
        pass

    async with open_store(clock=clock) as store:
        for register, kind in (
            (store.on_created, "session/created"),
            (store.on_event, "session/event"),
            (store.on_disposed, "session/disposed"),
            (store.add_pre_commit_hook, "pre-commit"),
        ):
            with pytest.raises(AsyncListenerError) as info:
                register(listener)
            assert info.value.code == "ASYNC_LISTENER"
            assert str(info.value) == (
                f"{kind} listener {listener.__qualname__} is async; store listeners must be "
                "synchronous (start async work from it instead)"
            )
            with pytest.raises(AsyncListenerError):
                register(functools.partial(listener))
            with pytest.raises(AsyncListenerError):
                register(AsyncCall())
        listeners = store.listeners
        assert (listeners.created, listeners.event, listeners.disposed, listeners.pre_commit) == ([], [], [], [])


async def test_a_listener_returning_an_awaitable_fails_like_a_raise(caplog: pytest.LogCaptureFixture) -> None:
    async def work(*args: Any) -> None:
        raise AssertionError("never runs")

    def sneaky(h: SessionHandle, ev: Event) -> Any:
        return work()

    seen: list[int] = []
    async with open_store(clock=clock) as store:
        store.on_event(sneaky)
        store.on_event(lambda h, ev: seen.append(ev.seq))
        s = await store.create("s")
        with caplog.at_level(logging.WARNING, logger="harness.store"):
            ev = await s.append("turn/start", {"turn": 1})
        assert ev.seq == 0 and seen == [0]  # contained: the append and later listeners go on
        assert [r.getMessage() for r in caplog.records] == [
            'session "s": session/event listener threw: AsyncListenerError: session/event listener '
            "test_a_listener_returning_an_awaitable_fails_like_a_raise.<locals>.sneaky returned an "
            "awaitable; store listeners must be synchronous (it was closed, not awaited)"
        ]
        store.on_created(lambda h: work())
        with pytest.raises(AsyncListenerError):  # a created listener's failure vetoes
            await store.create("t")
        assert await store.get("t") is None


async def test_flush_listeners_may_be_plain_functions() -> None:
    calls: list[str] = []
    async with open_store(clock=clock) as store:
        store.on_flush(lambda h: calls.append(h.id))  # type: ignore[arg-type, func-returns-value]
        s = await store.create("s")
        assert await store.flush(s) is True
        assert calls == ["s"]


# -- 5. the invariant companion on a running store ---------------------------------------

BAD_SEED = [rec("turn/end", 0, {"turn": 1, "reason": {"kind": "completed"}})]


async def test_installing_replays_live_sessions_and_a_violation_installs_nothing() -> None:
    async with open_store(clock=clock) as store:
        good = await store.create("good")
        await good.append("turn/start", {"turn": 1})
        bad = await store.create("bad", seed=BAD_SEED)
        with pytest.raises(InvariantError) as info:
            store.install_validator(RelationalInvariants)
        assert str(info.value) == PREFIX + "turn/end 1 does not match open turn null"
        assert info.value.session_id == "bad"
        assert store.validator_factory is None and store.listeners.pre_commit == []
        await good.append("turn/start", {"turn": 7})  # still unchecked
        await bad.append("turn/start", {"turn": 3})
        assert good.seq == 2 and bad.seq == 3


async def test_an_installed_validator_checks_live_and_later_sessions_until_removed() -> None:
    async with open_store(clock=clock) as store:
        s = await store.create("s")
        await s.append("turn/start", {"turn": 1})
        remove = store.install_validator(RelationalInvariants)
        assert store.validator_factory is RelationalInvariants
        # The replayed state continues: turn 1 is open.
        with pytest.raises(InvariantError) as info:
            await s.append("turn/start", {"turn": 2})
        assert str(info.value) == PREFIX + "turn/start 2 while turn 1 is still open"
        assert info.value.session_id == "s" and s.seq == 1
        await s.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        # Later sessions are replayed at enter: created, adopted, forked.
        with pytest.raises(InvariantError):
            await store.create("t", seed=BAD_SEED)
        assert await store.get("t") is None
        restored = Session.restore("r", [dict(r) for r in BAD_SEED], header("r"))
        with pytest.raises(InvariantError):
            await store.enter(await store.adopt(restored))
        child = await store.fork(s)
        with pytest.raises(InvariantError):
            await child.append("turn/start", {"turn": 5})
        # Removed: nothing is checked any more, on live sessions or later ones.
        remove()
        remove()  # idempotent
        assert store.validator_factory is None and store.listeners.pre_commit == []
        await s.append("turn/start", {"turn": 9})
        await child.append("turn/start", {"turn": 5})
        await store.create("t", seed=BAD_SEED)
        await store.enter(await store.adopt(restored))


async def test_a_batch_vetoed_by_a_later_hook_does_not_advance_the_validator() -> None:
    async with open_store(clock=clock, validator_factory=RelationalInvariants) as store:
        vetoes = [RuntimeError("not now")]

        def later(h: SessionHandle, events: tuple[Event, ...]) -> None:
            if vetoes:
                raise vetoes.pop()

        store.add_pre_commit_hook(later)
        s = await store.create("s")
        with pytest.raises(RuntimeError, match="not now"):
            await s.append("turn/start", {"turn": 1})
        assert s.seq == 0
        await s.append("turn/start", {"turn": 1})  # turn 1 is still the expected one
        with pytest.raises(InvariantError, match="turn/start expected turn 2, got 3"):
            await s.append_batch([EventDraft("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
                                  EventDraft("turn/start", {"turn": 3})])
        assert s.seq == 1


async def test_open_store_validator_factory_is_an_install() -> None:
    async with open_store(clock=clock, validator_factory=RelationalInvariants) as store:
        assert store.validator_factory is RelationalInvariants
        with pytest.raises(InvariantError):
            await store.create("s", seed=BAD_SEED)
        prepared = await store.prepare("p", seed=BAD_SEED)  # prepare does not validate
        with pytest.raises(InvariantError):
            await store.enter(prepared)
        assert await store.list() == []


# -- 6. sourceEventSeqs that is not an array -------------------------------------------


def _events(sources: object = None, op: object = "append") -> list[Event]:
    return [
        Event("user/message", 0, 1, user("u0"), "append"),
        Event("user/message", 1, 1, user("u1"), op, sources),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize("sources", [5, "0", {"0": 0}, True, 1.5], ids=repr)
def test_source_event_seqs_that_is_not_an_array_is_refused_everywhere(sources: object) -> None:
    message = "sourceEventSeqs on event at seq 1 must be an array when present"
    s = Session.create("s")
    s.append("user/message", user("u0"), surface_op="append")
    with pytest.raises(SurfaceError) as appended:
        s.append("user/message", user("u1"), surface_op="append", source_event_seqs=sources)  # type: ignore[arg-type]
    assert (appended.value.code, str(appended.value), appended.value.session_id) == ("INVALID_SURFACE", message, "s")
    with pytest.raises(EventError) as seeded:
        Session.create("s", _events(sources))
    assert str(seeded.value) == f"invalid seed event at index 1: {message}"
    record = rec("user/message", 1, user("u1"), surfaceOp="append", sourceEventSeqs=sources)
    first = rec("user/message", 0, user("u0"), surfaceOp="append")
    with pytest.raises(EventError) as restored:
        Session.restore("s", [first, record], header("s"))
    assert str(restored.value) == f"invalid seed event at index 1: {message}"
    with pytest.raises(SurfaceError) as folded:
        fold_surface(_events(sources))
    assert str(folded.value) == message


def test_seed_event_objects_keep_their_metadata_canonical() -> None:
    s = Session.create("s", _events([0], {"op": "replace", "start": 0, "end": 0}))
    ev = s.events[1]
    assert ev.surface_op == ReplaceOp(0, 0) and ev.source_event_seqs == (0,)
    assert list(s.surface) == [1] and fold_surface(list(s.events)).nodes == (1,)
    with pytest.raises(EventError) as info:
        Session.create("s", _events((0,), 5))
    assert str(info.value) == 'invalid seed event at index 1: session event "user/message" carries an invalid surfaceOp'


# -- 7. events and surface: the same object between mutations, never changing ------------


def test_events_and_surface_are_stable_objects_between_mutations() -> None:
    s = Session.create("s")
    s.append("user/message", user("u0"), surface_op="append")
    events, surface = s.events, s.surface
    assert s.events is events and s.surface is surface
    s.append("turn/start", {"turn": 1})  # log-only: the surface did not change
    assert s.events is not events and len(events) == 1 and len(s.events) == 2
    assert s.surface is surface
    s.append("user/message", user("u1"), surface_op="append")
    grown = s.surface
    assert grown is not surface and list(surface) == [0] and list(grown) == [0, 2]
    replaced = s.append("user/message", user("u2"), surface_op={"op": "replace", "start": 0, "end": 2},
                        source_event_seqs=[0, 2])
    assert list(grown) == [0, 2] and grown.generation == 0  # a held view never changes
    assert list(s.surface) == [replaced.seq] and s.surface.generation == 1
    assert s.surface is s.surface and s.surface == (3,) and s.surface[:] == (3,)


def test_a_replace_with_no_view_outstanding_is_in_place_and_views_stay_correct() -> None:
    s = Session.create("s")
    for i in range(4):
        s.append("user/message", user(f"u{i}"), surface_op="append")
    early = s.surface  # covers positions 0..3
    s.append("user/message", user("u4"), surface_op="append")
    # A replace beyond every outstanding view's prefix may rewrite the list in place.
    s.append("user/message", user("u5"), surface_op={"op": "replace", "start": 4, "end": 4}, source_event_seqs=[4])
    assert list(early) == [0, 1, 2, 3] and list(s.surface) == [0, 1, 2, 3, 5]
    held = s.surface
    s.append("user/message", user("u6"), surface_op={"op": "replace", "start": 1, "end": 2}, source_event_seqs=[1, 2])
    assert list(held) == [0, 1, 2, 3, 5] and list(early) == [0, 1, 2, 3]
    assert list(s.surface) == [0, 6, 3, 5] == list(fold_surface(list(s.events)).nodes)
    assert list(s.derive_messages()) == [s.derive_message(n) for n in s.surface]


async def test_handle_surface_and_events_are_the_sessions_stable_views() -> None:
    async with open_store(clock=clock) as store:
        h = await store.create("s")
        await h.append("user/message", user("u0"), surface_op="append")
        await h.append("user/message", user("u1"), surface_op="append")
        surface, events = h.surface(), h.events
        assert h.surface() is surface and h.events is events
        assert surface is h._entry.session.surface
        await h.commit_replace(tuple(surface), "user/message", user("u2"), surface_op=ReplaceOp(0, 1),
                               source_event_seqs=[0, 1])
        assert surface == (0, 1) and len(events) == 2
        assert h.surface() == (2,) and h.surface() is not surface


# -- 8. type-strict JSON equality ------------------------------------------------------


def test_json_equality_is_type_strict() -> None:
    assert freeze({"a": False}) != {"a": 0}
    assert freeze([True]) != [1]
    assert freeze({"a": [0]}) != {"a": [False]}
    assert freeze({"a": 1.0}) == {"a": 1}  # one JSON number type
    assert freeze([1, [2]]) == [1, [2]]  # the frozen tuple equals the list it froze
    assert freeze({"a": 1, "b": 2}) == {"b": 2, "a": 1}  # key order is irrelevant
    assert freeze({"a": None}) != {"a": float("nan")}
    deep: Any = 0
    for _ in range(5_000):
        deep = [deep]
    assert freeze(deep) == deep
    assert Event("x", 0, 1, {"a": True}) != Event("x", 0, 1, {"a": 1})
    assert Event("x", 0, 1, {"a": 2}) == Event("x", 0, 1, {"a": 2.0})


def _pruned_pair(meta_before: object, meta_after: object) -> Session:
    s = Session.create("s")
    first = tool_result("c1")
    first["meta"] = meta_before
    s.append("tool/result", first, surface_op="append")
    second = tool_result("c1", text="(pruned)")
    second["meta"] = meta_after
    s.append("tool/result", second, surface_op=ReplaceOp(0, 0), source_event_seqs=[0])
    return s


def test_tool_result_replacement_compares_type_strictly() -> None:
    for before, after in (({"ok": 0}, {"ok": False}), ({"ok": True}, {"ok": 1}), ([1], [True])):
        with pytest.raises(SurfaceError) as info:
            _pruned_pair(before, after)
        assert str(info.value) == "tool/result surface replacement may change only content"
    assert list(_pruned_pair({"n": 1}, {"n": 1.0}).surface) == [1]
    assert list(_pruned_pair({"a": 1, "b": [2]}, {"b": [2], "a": 1}).surface) == [1]


def _epoch(**config: Any) -> dict[str, Any]:
    tools = config.pop("tools", None)
    h: dict[str, Any] = {"config": {"provider": "p", "model": "m", **config}}
    if tools is not None:
        h["tools"] = tools
    return h


def test_header_equals_is_type_strict() -> None:
    assert not header_equals(freeze(_epoch(temperature=1)), freeze(_epoch(temperature=True)))
    assert not header_equals(freeze(_epoch(maxTokens=0)), freeze(_epoch(maxTokens=False)))
    assert header_equals(freeze(_epoch(temperature=1)), freeze(_epoch(temperature=1.0)))
    assert not header_equals(freeze(_epoch(stop=[])), freeze(_epoch()))
    assert header_equals(freeze(_epoch(stop=["a"])), _epoch(stop=["a"]))  # type: ignore[arg-type]
    t1 = {"name": "t", "description": "d", "parameters": {"x": 1}}
    assert header_equals(freeze(_epoch(tools=[t1])), freeze(_epoch(tools=[{**t1, "parameters": {"x": 1.0}}])))
    assert not header_equals(freeze(_epoch(tools=[t1])), freeze(_epoch(tools=[{**t1, "parameters": {"x": True}}])))
    reordered = {"description": "d", "name": "t", "parameters": {"x": 1}}
    assert not header_equals(freeze(_epoch(tools=[t1])), freeze(_epoch(tools=[reordered])))  # serialized JSON
    assert header_equals(freeze(_epoch(tools=[])), freeze(_epoch()))


def test_canonical_header_freezes_deeply() -> None:
    borrowed = _epoch(tools=[{"name": "t", "parameters": {"x": [1]}}], stop=["a"])
    canonical = canonical_header(borrowed)
    borrowed["config"]["model"] = "changed"
    borrowed["config"]["stop"].append("b")
    borrowed["tools"][0]["parameters"]["x"].append(2)
    assert canonical == _epoch(tools=[{"name": "t", "parameters": {"x": [1]}}], stop=["a"])
    config = canonical["config"]
    assert type(config) is FrozenDict
    with pytest.raises(TypeError):
        config["model"] = "x"  # type: ignore[index]
    s = Session.create("s")
    s.append("request/header", {"header": {**_epoch(), "adapterDefaults": {}, "tools": []}, "reason": "initial"})
    assert s.request_header() == _epoch()


# -- 9. the chunk-row codec and records whose type is not a string ----------------------


@pytest.mark.parametrize("tag", [["text-chunks"], {"a": 1}, 5, None], ids=repr)
def test_records_whose_type_is_not_a_string_pass_through_the_codec(tag: object) -> None:
    record = {"type": tag, "seq": 0, "time": 0, "data": {}}
    assert decode_storage_record(record) == [record]
    assert pack_chunk_runs([record]) == [record]
    assert not is_storage_row(record)
    chunk = {"type": "assistant/chunk", "seq": 0, "time": 0,
             "data": {"turn": 1, "step": 1, "chunk": {"type": tag, "index": 0, "text": "a"}}}
    run = [{**chunk, "seq": i} for i in range(3)]
    assert pack_chunk_runs(run) == run
