"""The resume's fast read (decision 0010): undecoded lines restored in one pass, each
plain event keeping its line; anything else falls back to the general reader.

The property: whenever ``Session.restore_stored_lines`` returns a session, the general
reader (decode every line, then ``Session.restore``) returns an equal one; whenever the
coordinator takes the fast path, the log on disk, the resumed session and the stats are
what the general path gives.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import PersistenceError, SessionCorruptionError, SessionFormatUnsupportedError
from harness.faults import Probe, explore, explore_io
from harness.faults._backends import check_at_rest, make_backend, plain_backend
from harness.persistence import JsonlBackend, open_persistence
from harness.runtime import open_store
from harness.session import KNOWN_EVENT_TYPES, Session, thaw
from tests.helpers import CountingJsonl, assistant, header, rec, tool_call_block, tool_result, user

SID = "lines"


def _clock() -> int:
    return 1_700_000_000_000


def _session_state(s: Session) -> tuple[Any, ...]:
    return (
        [(e.type, e.seq, e.time, thaw(e.data), e.surface_op, e.source_event_seqs, e.ignorable) for e in s.events],
        tuple(s.surface_snapshot()),
        [thaw(m) for m in s.derive_messages()],
        s.first_live_seq,
    )


def _general(lines: list[bytes]) -> Session | None:
    try:
        records = [orjson.loads(line) for line in lines]
        return Session.restore(SID, records, header(SID), clock=_clock)
    except Exception:
        return None


# -- building blocks: plain events, odd-but-valid events, and faults ------------------

_PLAIN = st.sampled_from(
    [
        ("user/message", lambda i: user(f"u{i}")),
        ("assistant/message", lambda i: assistant(mid=f"a{i}")),
        ("assistant/chunk", lambda i: {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}}),
        ("step/start", lambda i: {"turn": 1, "step": 1}),
        ("step/end", lambda i: {"turn": 1, "step": 1}),
        ("turn/start", lambda i: {"turn": 1}),
        ("turn/end", lambda i: {"turn": 1, "reason": {"kind": "completed"}}),
        ("todo/write", lambda i: {"todos": []}),
    ]
)

_FAULTS = st.sampled_from(
    [
        "bad-json",
        "seq+1",
        "unknown-type",
        "ignorable-unknown",
        "row",
        "extra-key",
        "dup-key",
        "bad-message",
        "tool-result",
        "array",
        "seq-float",
        "type-list",
        "replace",
        "legacy",
    ]
)


def _line(i: int, kind: Any, fault: str | None) -> bytes:
    type_, make = kind
    data = make(i)
    record: dict[str, Any] = rec(type_, i, data)
    if type_ in ("user/message", "assistant/message"):
        record["surfaceOp"] = "append"
    if fault is None:
        return orjson.dumps(record)
    if fault == "bad-json":
        return orjson.dumps(record)[:-3]
    if fault == "seq+1":
        record["seq"] = i + 1
    elif fault == "unknown-type":
        record["type"] = "future/thing"
    elif fault == "ignorable-unknown":
        record["type"] = "future/thing"
        record["ignorable"] = True
    elif fault == "row":
        return orjson.dumps({"type": "text-chunks", "seq0": i, "time0": 1, "data": {"turn": 1, "step": 1, "index": 0, "text": ["a", "b", "c"]}})
    elif fault == "extra-key":
        record["extra"] = 1
    elif fault == "dup-key":
        return orjson.dumps(record)[:-1] + b',"type":"todo/write"}'
    elif fault == "bad-message":
        record = rec("user/message", i, {"id": "", "role": "user", "content": []}, surfaceOp="append")
    elif fault == "tool-result":
        record = rec("tool/result", i, tool_result(f"c{i}"), surfaceOp="append")
    elif fault == "array":
        return orjson.dumps([record])
    elif fault == "seq-float":
        record["seq"] = float(i)
    elif fault == "type-list":
        record["type"] = ["user/message"]
    elif fault == "replace":
        record = rec("compaction/summary", i, {"summary": "s"}, surfaceOp={"op": "replace", "start": 0, "end": max(0, i - 1)})
    elif fault == "legacy":
        record["type"] = "request/header-delta"
    return orjson.dumps(record)


@st.composite
def _logs(draw: st.DrawFn) -> list[bytes]:
    kinds = draw(st.lists(_PLAIN, max_size=25))
    faults = draw(st.lists(st.tuples(st.integers(0, 30), _FAULTS), max_size=3))
    at = dict(faults)
    return [_line(i, kind, at.get(i)) for i, kind in enumerate(kinds)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_logs())
def test_fast_restore_equals_the_general_reader(lines: list[bytes]) -> None:
    general = _general(lines)
    try:
        fast = Session.restore_stored_lines(SID, list(lines), header(SID), KNOWN_EVENT_TYPES, clock=_clock)
    except Exception:
        assert general is None  # a fast-path refusal is a general-path refusal too
        return
    if fast is None:
        return  # the coordinator reads the log again with the exact rules
    assert general is not None
    assert _session_state(fast) == _session_state(general)
    records = [orjson.loads(line) for line in lines]
    assert all(r["seq"] == i and r["type"] in KNOWN_EVENT_TYPES for i, r in enumerate(records))
    assert general.open_turn_at(len(lines) - 1) is general.open_turn_at(-1)  # no open turn


def test_plain_lines_keep_their_bytes_and_odd_ones_their_trees() -> None:
    lines = [
        orjson.dumps(rec("user/message", 0, user("u0"), surfaceOp="append")),
        orjson.dumps(rec("tool/call", 1, {"turn": 1, "step": 1, "callId": "c", "name": "read", "args": {}})),
        orjson.dumps(rec("tool/result", 2, tool_result("c"), surfaceOp="append")),
    ]
    s = Session.restore_stored_lines(SID, lines, header(SID), KNOWN_EVENT_TYPES)
    assert s is not None
    datas = s._events.own.datas
    assert datas[0] == lines[0] and datas[1] == lines[1]  # kept encoded
    assert type(datas[2]) is dict  # the general seed path adopted the tree
    assert s.events[0].data == user("u0") and s.raw_data_at(2) == tool_result("c")


@pytest.mark.parametrize(
    "last",
    [
        rec("turn/start", 2, {"turn": 1}),
        b"not json",
        rec("future/thing", 2, {}),
        rec("user/message", 3, user("u9"), surfaceOp="append"),
    ],
)
def test_strict_mode_declines(last: Any) -> None:
    lines = [orjson.dumps(rec("turn/start", 0, {"turn": 1})), orjson.dumps(rec("turn/end", 1, {"turn": 1, "reason": {"kind": "completed"}}))]
    lines.append(last if isinstance(last, bytes) else orjson.dumps(last))
    assert Session.restore_stored_lines(SID, lines, header(SID), KNOWN_EVENT_TYPES) is None


# -- the coordinator: fast path, fallbacks, repairs -------------------------------------


def _write(root: Path, records: list[dict[str, Any]], tail: bytes = b"") -> Path:
    backend = JsonlBackend(root)
    backend.materialize(header(SID), records)
    path = backend.locate(SID)
    assert path is not None
    if tail:
        with path.open("ab") as f:
            f.write(tail)
    return path


def _plain(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        if i % 2 == 0:
            out.append(rec("user/message", i, user(f"u{i}"), surfaceOp="append"))
        else:
            out.append(rec("assistant/message", i, assistant(mid=f"a{i}"), surfaceOp="append"))
    return out


async def _prepare(root: Path, backend: JsonlBackend | None = None) -> tuple[Session, int]:
    async with open_store() as store, open_persistence(store, backend or JsonlBackend(root)) as p:
        prep = await p.prepare(SID)
        try:
            return prep.session, prep.cursor  # type: ignore[attr-defined]
        finally:
            await prep.dispose()


_Counting = CountingJsonl


async def test_prepare_takes_the_fast_path_and_equals_the_general_one(tmp_path: Path) -> None:
    records = _plain(40)
    _write(tmp_path, records)
    backend = _Counting(tmp_path)
    session, cursor = await _prepare(tmp_path, backend)
    assert backend.calls == ["load_lines"] and cursor == 40
    general = Session.restore(SID, [orjson.loads(orjson.dumps(r)) for r in records], header(SID))
    assert _session_state(session)[1:] == _session_state(general)[1:]
    assert _session_state(session)[0][:-1] == _session_state(general)[0][:-1]  # but the end-seed's time


async def test_a_torn_fragment_is_cut_on_the_fast_path(tmp_path: Path) -> None:
    path = _write(tmp_path, _plain(6), tail=b'{"type":"user/mess')
    size = path.stat().st_size
    backend = _Counting(tmp_path)
    session, cursor = await _prepare(tmp_path, backend)
    assert backend.calls == ["load_lines"] and cursor == 6 and session.seq == 7
    assert path.stat().st_size == size - len(b'{"type":"user/mess')
    assert path.read_bytes().endswith(b"}\n")


async def test_an_open_turn_falls_back_and_is_closed(tmp_path: Path) -> None:
    records = [
        rec("turn/start", 0, {"turn": 1}),
        rec("step/start", 1, {"turn": 1, "step": 1}),
        rec("assistant/message", 2, assistant(blocks=[tool_call_block("c1")]), surfaceOp="append"),
    ]
    path = _write(tmp_path, records)
    backend = _Counting(tmp_path)
    session, cursor = await _prepare(tmp_path, backend)
    # The general reader, then (reference §2.7) the re-read after the repair commit.
    assert backend.calls == ["load_lines", "load", "load"]
    types = [orjson.loads(line)["type"] for line in path.read_bytes().splitlines()[1:]]
    assert types[3:] == ["tool/result", "step/end", "turn/end"] and cursor == 6
    assert [e.type for e in session.events][3:] == ["tool/result", "step/end", "turn/end", "session/end-seed"]


@pytest.mark.parametrize(
    ("line", "error", "message"),
    [
        (orjson.dumps(rec("future/thing", 1, {})), SessionFormatUnsupportedError, 'event type "future/thing" (seq 1)'),
        (orjson.dumps(rec("user/message", 1, {"id": "x"}, surfaceOp="append")), SessionCorruptionError, "failed validation"),
    ],
)
async def test_refusals_come_from_the_general_reader(tmp_path: Path, line: bytes, error: type[Exception], message: str) -> None:
    path = _write(tmp_path, _plain(1))
    with path.open("ab") as f:
        f.write(line + b"\n" + orjson.dumps(rec("user/message", 2, user("u2"), surfaceOp="append")) + b"\n")
    backend = _Counting(tmp_path)
    async with open_store() as store, open_persistence(store, backend) as p:
        with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
            await p.prepare(SID)
    assert backend.calls == ["load_lines", "load"]


async def test_an_unparsable_line_is_left_to_the_reading_rules(tmp_path: Path) -> None:
    # Reference §1.5: an unparsable line with no turn/end after it ends the readable
    # log; the repair cuts it and what follows.
    path = _write(tmp_path, _plain(1))
    with path.open("ab") as f:
        f.write(b"{broken\n" + orjson.dumps(rec("user/message", 2, user("u2"), surfaceOp="append")) + b"\n")
    backend = _Counting(tmp_path)
    session, cursor = await _prepare(tmp_path, backend)
    assert backend.calls == ["load_lines", "load", "load"] and cursor == 1 and session.seq == 2
    assert len(path.read_bytes().splitlines()) == 2


async def test_a_log_moved_between_read_and_lease_is_read_again(tmp_path: Path) -> None:
    path = _write(tmp_path, _plain(4))

    class Moving(_Counting):
        def acquire_writer(self, header: dict[str, Any]) -> Any:
            lease = super().acquire_writer(header)
            if self.calls == ["load_lines"]:  # another process appends meanwhile
                with path.open("ab") as f:
                    f.write(orjson.dumps(rec("user/message", 4, user("u4"), surfaceOp="append")) + b"\n")
            return lease

    backend = Moving(tmp_path)
    session, cursor = await _prepare(tmp_path, backend)
    assert backend.calls == ["load_lines", "load"] and cursor == 5 and session.seq == 6


def _fast_path_template(root: Path) -> list[dict[str, Any]]:
    records = _plain(8)
    backend = plain_backend(root, "jsonl")
    backend.materialize(header(SID), records)
    path = backend.locate(SID)
    assert path is not None
    with path.open("ab") as f:
        f.write(b'{"type":"user/mess')  # a torn final write: the fast path cuts it
    return [orjson.loads(orjson.dumps(r)) for r in records]


async def _fast_path_scenario(probe: Probe, template: Path, records: list[dict[str, Any]]) -> None:
    """Prepare (the fast path, with its repair) and publish or dispose, under a
    cancellation or a failing file step. Afterwards the stored events are exactly the
    records (the repair cut only the torn bytes), and the id resumes."""
    shutil.copytree(template, probe.tmp_path, dirs_exist_ok=True)
    probe.data["sessions"] = {SID: header(SID)}
    probe.acknowledge(SID, len(records) - 1, records)
    backend = make_backend(probe, "jsonl")
    try:
        async with open_store() as store, open_persistence(store, backend) as p:
            with trio.CancelScope() as caller:
                probe.canceller("caller", caller.cancel)
                probe.arm()
                try:
                    prep = await p.prepare(SID)
                    try:
                        handle = await p.publish(prep)
                        await store.detach(handle)
                    finally:
                        await prep.dispose()
                except PersistenceError as exc:
                    probe.check(probe.faults is not None, f"prepare failed without a fault: {exc!r}")
            probe.disarm()
    except PersistenceError as exc:
        probe.check(probe.faults is not None, f"closing failed without a fault: {exc!r}")
    after = plain_backend(probe.tmp_path, "jsonl").load(SID).records
    probe.check(after[: len(records)] == records, "a stored event changed or was lost")
    probe.check([r["type"] for r in after[len(records) :]] in ([], ["session/end-seed"]), f"unexpected tail {after[len(records):]}")
    check_at_rest(probe, "jsonl")


def test_resume_fast_path_cancelled_at_every_checkpoint(tmp_path: Path) -> None:
    records = _fast_path_template(tmp_path)

    async def scenario(probe: Probe) -> None:
        await _fast_path_scenario(probe, tmp_path, records)

    report = explore(scenario, name="resume-fast-path")
    assert report.ok, report.distinct()
    assert report.steps["caller"] > 3


def test_resume_fast_path_with_a_failing_file_step(tmp_path: Path) -> None:
    records = _fast_path_template(tmp_path)

    async def scenario(probe: Probe) -> None:
        await _fast_path_scenario(probe, tmp_path, records)

    report = explore_io(scenario, backend="jsonl")
    assert report.ok, report.distinct()
    assert all(n > 0 for n in report.steps.values()), report.steps


def _counting_zstd(root: Path) -> CountingJsonl:
    return CountingJsonl(root, compression="zstd")


async def test_a_zstd_log_takes_the_fast_path_and_a_torn_frame_falls_back(tmp_path: Path) -> None:
    records = _plain(30)
    JsonlBackend(tmp_path, compression="zstd").materialize(header(SID), records)
    backend = _counting_zstd(tmp_path)
    session, cursor = await _prepare(tmp_path, backend)
    assert backend.calls == ["load_lines"] and cursor == 30
    general = Session.restore(SID, [orjson.loads(orjson.dumps(r)) for r in records], header(SID))
    assert _session_state(session)[0][:-1] == _session_state(general)[0][:-1]
    # A torn final frame: the general reader's rules (it keeps the frame's whole lines).
    path = backend.locate(SID)
    assert path is not None
    with path.open("ab") as f:
        f.write(b"\x28\xb5\x2f\xfd\x00")  # a frame's magic and no more
    backend = _counting_zstd(tmp_path)
    session, cursor = await _prepare(tmp_path, backend)
    assert backend.calls == ["load_lines", "load", "load"] and cursor == 30


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 40))
def test_chunked_read_splits_like_the_whole_buffer(data: bytes, chunk: int) -> None:
    import tempfile

    from harness.persistence._jsonl import _read_lines

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "log"
        path.write_bytes(data)
        lines, size = _read_lines(path, chunk)
    assert lines == data.split(b"\n") and size == len(data)
