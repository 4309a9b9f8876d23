"""The resume's fast read (decision 0010) against the general reader.

Differential tests: the same bytes on disk are prepared once with the default
``JsonlBackend`` (fast path first) and once with a backend that has no ``load_lines``
(the general reader only, the reference). Session, cursor, repair count, exception and
the bytes left on disk must agree.
"""

from __future__ import annotations

import copy
import fcntl
import os
import pickle
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from harness.compaction._pairing import pairing_state
from harness.errors import SessionCorruptionError, SessionLockedError, StorageIOError
from harness.persistence import JsonlBackend, open_persistence
from harness.persistence._files import OsFiles
from harness.persistence._service import Fingerprint, _canonical, reproduces
from harness.runtime import open_store
from harness.session import KNOWN_EVENT_TYPES, Session, event_to_record, thaw
from tests.helpers import CountingJsonl, assistant, header, rec, tool_call_block, tool_result, user

SID = "lines"


class _General(JsonlBackend):
    """The reference: the coordinator finds no ``load_lines`` and reads generally."""

    load_lines = None  # type: ignore[assignment]


_Counting = CountingJsonl


def _state(s: Session) -> tuple[Any, ...]:
    return (
        [
            (
                e.type,
                e.seq,
                None if e.type == "session/end-seed" else e.time,
                thaw(e.data),
                e.surface_op,
                e.source_event_seqs,
                e.ignorable,
            )
            for e in s.events
        ],
        tuple(s.surface_snapshot()),
        [thaw(m) for m in s.derive_messages()],
        s.first_live_seq,
        s.header,
        s.compaction_marks(),
        s.last_turn(),
    )


def _write(root: Path, body: bytes) -> Path:
    """A log with a valid header line (written by the backend) and ``body`` after it."""
    b = JsonlBackend(root)
    b.materialize(header(SID), [rec("todo/write", 0, {"todos": []})])
    path = b.locate(SID)
    assert path is not None
    first = path.read_bytes().split(b"\n")[0] + b"\n"
    path.write_bytes(first + body)
    return path


async def _outcome(root: Path, backend: JsonlBackend) -> tuple[Any, ...]:
    async with open_store() as store, open_persistence(store, backend) as p:
        try:
            prep = await p.prepare(SID)
        except Exception as exc:
            return ("raise", type(exc).__name__, str(exc).replace(str(root), "ROOT"))
        try:
            return ("ok", _state(prep.session), prep.cursor, prep.repaired)
        finally:
            await prep.dispose()


async def _both(tmp_path: Path, body: bytes) -> tuple[Any, Any, list[str]]:
    fast_root, gen_root = tmp_path / "fast", tmp_path / "general"
    fast_path, gen_path = _write(fast_root, body), _write(gen_root, body)
    counting = _Counting(fast_root)
    fast = await _outcome(fast_root, counting)
    general = await _outcome(gen_root, _General(gen_root))
    return (fast, fast_path.read_bytes()), (general, gen_path.read_bytes()), counting.calls


def L(r: dict[str, Any]) -> bytes:
    return orjson.dumps(r)


TS = L(rec("turn/start", 0, {"turn": 1}))
TE = L(rec("turn/end", 1, {"turn": 1, "reason": {"kind": "completed"}}))


def _u(i: int) -> bytes:
    return L(rec("user/message", i, user(f"u{i}"), surfaceOp="append"))


CORPUS: dict[str, bytes] = {
    "plain": TS + b"\n" + TE + b"\n",
    "crlf": TS + b"\r\n" + TE + b"\r\n",
    "cr-separated": TS + b"\r" + TE + b"\n",
    "final-line-complete-json-no-newline": TS + b"\n" + TE,
    "torn-fragment": TS + b"\n" + TE + b"\n" + b'{"type":"tu',
    "cr-only-fragment": TS + b"\n" + TE + b"\n\r",
    "blank-line-middle": TS + b"\n\n" + TE + b"\n",
    "blank-line-end": TS + b"\n" + TE + b"\n\n",
    "whitespace-line": b"   \n",
    "bom": b"\xef\xbb\xbf" + TS + b"\n",
    "leading-tab": b"\t" + TS + b"\n",
    "nul-byte": TS + b"\x00\n",
    "dup-key-type": TS[:-1] + b',"type":"turn/end"}\n',
    "dup-key-data": b'{"type":"todo/write","seq":0,"time":1,"data":{"a":1},"data":{"b":2}}\n',
    "neg-zero-data": b'{"type":"todo/write","seq":0,"time":1,"data":{"x":-0,"y":-0.0}}\n',
    "neg-zero-time": b'{"type":"todo/write","seq":0,"time":-0,"data":{}}\n',
    "neg-zero-seq": b'{"type":"todo/write","seq":-0,"time":1,"data":{}}\n',
    "u64-int": b'{"type":"todo/write","seq":0,"time":1,"data":{"x":18446744073709551615}}\n',
    "huge-int": b'{"type":"todo/write","seq":0,"time":1,"data":{"x":123456789012345678901234567890}}\n',
    "non-ascii-escapes": '{"type":"todo/write","seq":0,"time":1,"data":{"x":"h\u00e9 \\u00e9 \\ud83d\\ude00 \\u0000"}}\n'.encode(),
    "lone-surrogate": b'{"type":"todo/write","seq":0,"time":1,"data":{"x":"\\ud800"}}\n',
    "ignorable-true": b'{"type":"todo/write","seq":0,"time":1,"data":{},"ignorable":true}\n',
    "ignorable-false": b'{"type":"todo/write","seq":0,"time":1,"data":{},"ignorable":false}\n',
    "ignorable-unknown": b'{"type":"x/y","seq":0,"time":1,"data":{},"ignorable":true}\n',
    "unknown": b'{"type":"x/y","seq":0,"time":1,"data":{}}\n',
    "legacy": b'{"type":"mode/set","seq":0,"time":1,"data":{}}\n',
    "request-header": L(
        rec("request/header", 0, {"header": {"config": {"provider": "p", "model": "m"}}})
    )
    + b"\n",
    "request-header-fallback": L(
        rec(
            "request/header",
            0,
            {"reason": "fallback", "header": {"config": {"provider": "p", "model": "m"}}},
        )
    )
    + b"\n",
    "request-context": L(rec("request/context", 0, {"k": [1, 2]})) + b"\n",
    "end-seed-last": _u(0) + b"\n" + L(rec("session/end-seed", 1, {})) + b"\n",
    "end-seed-middle": _u(0) + b"\n" + L(rec("session/end-seed", 1, {})) + b"\n" + _u(2) + b"\n",
    "zero-events": b"",
    "zero-events-torn": b'{"ty',
    "open-turn": TS + b"\n",
    "open-turn-null": L(rec("turn/start", 0, {"turn": None})) + b"\n",
    "open-turn-no-turn-key": L(rec("turn/start", 0, {})) + b"\n",
    "open-turn-torn": TS + b"\n" + b'{"type":"turn/end"',
    "step-after-turn-end": TS
    + b"\n"
    + TE
    + b"\n"
    + L(rec("step/start", 2, {"turn": 1, "step": 1}))
    + b"\n",
    "time-float": b'{"type":"todo/write","seq":0,"time":1.0,"data":{}}\n',
    "time-unsafe": b'{"type":"todo/write","seq":0,"time":9007199254740993,"data":{}}\n',
    "data-null": b'{"type":"todo/write","seq":0,"time":1,"data":null}\n',
    "message-without-surface-op": L(rec("user/message", 0, user("u0"))) + b"\n",
    "chunk-row": b'{"type":"text-chunks","seq0":0,"time0":1,"data":{"turn":1,"step":1,"index":0,"dt":[0,0],"texts":["a","b","c"]}}\n',
    "seq-gap-no-turn-end": _u(0) + b"\n" + _u(2) + b"\n",
    "seq-gap-before-turn-end": _u(0)
    + b"\n"
    + _u(2)
    + b"\n"
    + L(rec("turn/end", 3, {"turn": 1, "reason": {"kind": "completed"}}))
    + b"\n",
    "unparsable-before-turn-end": b"{bad\n" + TE + b"\n",
    "replace-and-sources": _u(0)
    + b"\n"
    + L(
        rec(
            "compaction/summary",
            1,
            {"summary": "s"},
            surfaceOp={"op": "replace", "start": 0, "end": 0},
            sourceEventSeqs=[0],
        )
    )
    + b"\n",
    "tool-round": b"\n".join(
        [
            TS,
            L(rec("step/start", 1, {"turn": 1, "step": 1})),
            L(
                rec(
                    "assistant/message",
                    2,
                    assistant(blocks=[tool_call_block("c1")]),
                    surfaceOp="append",
                )
            ),
            L(
                rec(
                    "tool/call",
                    3,
                    {"turn": 1, "step": 1, "callId": "c1", "name": "read", "args": {}},
                )
            ),
            L(rec("tool/result", 4, tool_result("c1"), surfaceOp="append", sourceEventSeqs=[3])),
            L(rec("step/end", 5, {"turn": 1, "step": 1})),
            L(rec("turn/end", 6, {"turn": 1, "reason": {"kind": "completed"}})),
        ]
    )
    + b"\n",
}


@pytest.mark.parametrize("name", sorted(CORPUS))
async def test_fast_path_equals_the_general_reader(tmp_path: Path, name: str) -> None:
    (fast, fast_disk), (general, gen_disk), _ = await _both(tmp_path, CORPUS[name])
    assert fast == general
    assert fast_disk == gen_disk


async def test_the_corpus_exercises_the_fast_path(tmp_path: Path) -> None:
    # Guard for the differential test above: the fast path does accept some of it,
    # torn fragment included.
    for name in (
        "plain",
        "crlf",
        "torn-fragment",
        "dup-key-data",
        "zero-events-torn",
        "tool-round",
    ):
        (fast, _), _, calls = await _both(tmp_path / name, CORPUS[name])
        assert fast[0] == "ok" and calls == ["load_lines"], name


# -- confirmed divergence: the lease is taken before the body is read ------------------


def _hold_lock(path: Path) -> int:
    fd = os.open(path.parent / "writer.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file description: conflicts
    return fd


@pytest.mark.parametrize("name", ["unparsable-before-turn-end", "seq-gap-before-turn-end"])
async def test_a_corrupt_log_locked_elsewhere_is_reported_as_corrupt(
    tmp_path: Path, name: str
) -> None:
    """The general reader (and the code before 2b95467) reads and scans the log before
    taking the writer lock, so a log that is corrupt is refused as corrupt whoever holds
    it. The fast path takes the lock after reading only the header: the same log is now
    refused with SessionLockedError, and the corruption is never reported."""
    (fast_root, gen_root) = (tmp_path / "fast", tmp_path / "general")
    fds = [_hold_lock(_write(fast_root, CORPUS[name])), _hold_lock(_write(gen_root, CORPUS[name]))]
    try:
        general = await _outcome(gen_root, _General(gen_root))
        assert general[:2] == ("raise", "SessionCorruptionError")  # the reference
        fast = await _outcome(fast_root, JsonlBackend(fast_root))
        assert fast == general
    finally:
        for fd in fds:
            os.close(fd)


async def test_a_valid_log_locked_elsewhere_is_refused_as_locked(tmp_path: Path) -> None:
    path = _write(tmp_path, CORPUS["plain"])
    fd = _hold_lock(path)
    try:
        async with open_store() as store, open_persistence(store, JsonlBackend(tmp_path)) as p:
            with pytest.raises(SessionLockedError):
                await p.prepare(SID)
    finally:
        os.close(fd)


# -- the lease: released on every decline and failure ----------------------------------


async def test_lease_released_when_the_fast_path_declines_and_the_general_path_refuses(
    tmp_path: Path,
) -> None:
    _write(tmp_path, CORPUS["unparsable-before-turn-end"])
    backend = _Counting(tmp_path)
    async with open_store() as store, open_persistence(store, backend) as p:
        with pytest.raises(SessionCorruptionError):
            await p.prepare(SID)
    assert backend.calls == ["load_lines", "load"]
    assert not backend.lock_held(header(SID))


async def test_lease_released_when_the_fast_repair_fails(tmp_path: Path) -> None:
    path = _write(tmp_path, CORPUS["torn-fragment"])
    size = path.stat().st_size

    class FailingRepair(JsonlBackend):
        def commit_repair(self, *a: Any, **kw: Any) -> None:
            raise StorageIOError("disk says no", session_id=SID)

    backend = FailingRepair(tmp_path)
    async with open_store() as store, open_persistence(store, backend) as p:
        with pytest.raises(StorageIOError):
            await p.prepare(SID)
    assert not backend.lock_held(header(SID)) and path.stat().st_size == size


async def test_lease_released_on_a_non_harness_error_in_the_fast_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, CORPUS["plain"])

    def boom(*a: Any, **kw: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(Session, "restore_stored_lines", boom)
    backend = JsonlBackend(tmp_path)
    async with open_store() as store, open_persistence(store, backend) as p:
        with pytest.raises(RuntimeError):
            await p.prepare(SID)
    assert not backend.lock_held(header(SID))


# -- a failed rollback's torn bytes (``JsonlBackend._torn``) ---------------------------


class _FailAfterWrite(OsFiles):
    """write lands, then fsync and the rollback's ftruncate fail: a torn append."""

    armed = False

    def fsync(self, fd: int) -> None:
        if self.armed:
            raise OSError(5, "EIO")
        super().fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        if self.armed:
            raise OSError(5, "EIO")
        super().ftruncate(fd, size)


async def test_bytes_of_a_failed_rollback_are_cut_not_resumed(tmp_path: Path) -> None:
    files = _FailAfterWrite()
    backend = _Counting(tmp_path, files=files)
    backend.materialize(header(SID), [rec("user/message", 0, user("u0"), surfaceOp="append")])
    path = backend.locate(SID)
    assert path is not None
    good = path.stat().st_size
    files.armed = True
    with pytest.raises(StorageIOError):
        backend.append(SID, [rec("user/message", 1, user("u1"), surfaceOp="append")])
    files.armed = False
    assert path.stat().st_size > good and SID in backend._torn  # complete, unacknowledged lines
    backend.calls.clear()
    async with open_store() as store, open_persistence(store, backend) as p:
        prep = await p.prepare(SID)
        try:
            assert prep.cursor == 1 and prep.session.seq == 2
        finally:
            await prep.dispose()
    # load_lines answers None (the failed rollback is known): the general reader cuts.
    assert backend.calls == ["load_lines", "load", "load"] and path.stat().st_size == good


# -- readers of a column that holds lines -----------------------------------------------


def _seven() -> int:
    return 7


def _lines() -> list[bytes]:
    return [
        L(rec("turn/start", 0, {"turn": 3})),
        L(rec("step/start", 1, {"turn": 3, "step": 1})),
        L(rec("request/context", 2, {"ctx": "é\u0000", "n": -0.0})),
        L(
            rec(
                "assistant/message",
                3,
                assistant(turn=3, blocks=[tool_call_block("c1")]),
                surfaceOp="append",
            )
        ),
        L(rec("tool/call", 4, {"turn": 3, "step": 1, "callId": "c1", "name": "read", "args": {}})),
        L(
            rec(
                "tool/result", 5, tool_result("c1", turn=3), surfaceOp="append", sourceEventSeqs=[4]
            )
        ),
        L(rec("assistant/message", 6, assistant(turn=3, mid="a2"), surfaceOp="append")),
        L(rec("step/end", 7, {"turn": 3, "step": 1})),
        L(rec("turn/end", 8, {"turn": 3, "reason": {"kind": "completed"}})),
        L(rec("user/message", 9, user("u9"), surfaceOp="append")),
    ]


def _fast_and_general() -> tuple[Session, Session]:
    lines = _lines()
    fast = Session.restore_stored_lines(SID, lines, header(SID), KNOWN_EVENT_TYPES, clock=_seven)
    assert fast is not None
    assert sum(type(d) is bytes for d in fast._events.own.datas) >= 6  # the column holds lines
    general = Session.restore(SID, [orjson.loads(x) for x in lines], header(SID), clock=_seven)
    return fast, general


def test_views_equality_and_readers_agree() -> None:
    fast, general = _fast_and_general()
    assert _state(fast) == _state(general)
    assert list(fast.events) == list(general.events)
    assert fast.request_context() == general.request_context()
    assert [fast.open_turn_at(i) for i in range(fast.seq)] == [
        general.open_turn_at(i) for i in range(general.seq)
    ]
    assert [fast.derive_message(i) for i in range(fast.seq)] == [
        general.derive_message(i) for i in range(general.seq)
    ]
    assert fast.raw_data_at(3) == general.raw_data_at(3) and fast.raw_data_at(
        3
    ) is not fast.raw_data_at(3)
    # A reader that (wrongly) mutates what it read cannot change the log.
    fast.raw_data_at(9)["id"] = "mutated"
    assert fast.raw_data_at(9)["id"] == "u9"


def test_claims_digests_and_records_agree() -> None:
    fast, general = _fast_and_general()
    records = [orjson.loads(x) for x in _lines()]
    assert reproduces(fast.events, [_canonical(r) for r in records])
    fp = Fingerprint()
    fp.extend(records)
    assert fp.begins(fast.events) and fp.begins(general.events)
    assert [orjson.dumps(event_to_record(e)) for e in fast.events] == [
        orjson.dumps(event_to_record(e)) for e in general.events
    ]


def test_forks_replay_pickle_and_threads() -> None:
    fast, general = _fast_and_general()
    for boundary in (3, 8, fast.seq - 1):
        a = Session.fork_of(fast, boundary, "child", header("child"), clock=_seven)
        b = Session.fork_of(general, boundary, "child", header("child"), clock=_seven)
        assert _state(a) == _state(b)
        grand = Session.fork_of(a, boundary, "grand", header("grand"), clock=_seven)
        assert [thaw(e.data) for e in grand.events][: boundary + 1] == [
            thaw(e.data) for e in b.events
        ][: boundary + 1]

    class Counter:
        def initial(self) -> int:
            return 0

        def check(self, state: int, ev: Any) -> int:
            assert ev.data is not None
            return state + len(orjson.dumps(event_to_record(ev)))

    assert fast.replay(Counter()) == general.replay(Counter())
    for clone in (pickle.loads(pickle.dumps(fast)), copy.deepcopy(fast)):
        assert _state(clone) == _state(general)
    assert pairing_state(fast).after == pairing_state(general).after

    errors: list[BaseException] = []
    expected = [thaw(e.data) for e in general.events]

    def reader() -> None:
        try:
            for _ in range(200):
                assert [thaw(e.data) for e in fast.events] == expected
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


async def test_a_fork_of_a_resumed_session_persists_its_prefix_from_the_lines(
    tmp_path: Path,
) -> None:
    body = b"\n".join(_lines()) + b"\n"
    _write(tmp_path, body)
    backend = _Counting(tmp_path)
    async with open_store() as store, open_persistence(store, backend) as p:
        prep = await p.prepare(SID)
        handle = await p.publish(prep)
        assert backend.calls == ["load_lines"]
        child = await store.fork(handle, 8, "child")
        await child.flush()
    stored = JsonlBackend(tmp_path).load("child").records
    expected = [orjson.loads(x) for x in _lines()[:9]]
    assert stored[:9] == expected and stored[9]["type"] == "session/end-seed"
