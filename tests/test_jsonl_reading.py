"""JSONL layout and the reading rules of reference §1.5, on hand-made files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from harness.errors import SessionCorruptionError, SessionFormatUnsupportedError
from harness.persistence import JsonlBackend, encode_segment, project_key
from harness.persistence._backend import header_line
from tests.helpers import rec, user


def test_encode_segment() -> None:
    assert encode_segment("abc-1.2_x") == "abc-1.2_x"
    assert encode_segment("a/b~c") == "a~002Fb~007Ec"
    assert encode_segment(".") == "~002E" and encode_segment("..") == "~002E~002E"
    assert encode_segment("😀") == "~D83D~DE00"
    with pytest.raises(ValueError, match="empty path segment"):
        encode_segment("")


def test_project_key() -> None:
    assert project_key("/home/me/proj") == "--home-me-proj--"
    assert project_key("C:\\\\work//x") == "--C-work-x--"
    assert project_key("/") == "--root--"
    assert project_key("/a/b-c") == project_key("/a-b/c")  # lossy by design
    with pytest.raises(ValueError):
        project_key("")


HEADER = {"version": 0, "id": "s", "createdAt": 1, "cwd": "/w"}


def write(tmp: Path, body: bytes, header: dict[str, Any] | None = None) -> JsonlBackend:
    b = JsonlBackend(tmp)
    h = header or HEADER
    d = b.session_dir(h)
    d.mkdir(parents=True)
    (d / "session.jsonl").write_bytes(header_line(h) + body)
    return b


def line(r: dict[str, Any]) -> bytes:
    return orjson.dumps(r) + b"\n"


def ev(seq: int, type_: str = "note") -> dict[str, Any]:
    if type_ == "user":
        return rec("user/message", seq, user(f"u{seq}"), surfaceOp="append")
    if type_ == "turn/end":
        return rec("turn/end", seq, {"turn": 1, "reason": {"kind": "completed"}})
    return rec(type_, seq, {})


def test_torn_last_line_is_cut(tmp_path: Path) -> None:
    body = line(ev(0)) + line(ev(1)) + b'{"type":"note","se'
    b = write(tmp_path, body)
    stored = b.load("s")
    assert [r["seq"] for r in stored.records] == [0, 1]
    assert stored.truncate_to == len(header_line(HEADER)) + len(line(ev(0)) + line(ev(1)))


def test_bad_line_then_turn_end_is_corruption(tmp_path: Path) -> None:
    body = line(ev(0)) + b"garbage\n" + line(ev(2, "turn/end"))
    with pytest.raises(SessionCorruptionError, match="unparsable committed event at line 2"):
        write(tmp_path, body).load("s")


def test_bad_line_without_later_turn_end_is_a_torn_tail(tmp_path: Path) -> None:
    body = line(ev(0)) + b"garbage\n" + line(ev(2)) + b"\n"
    stored = write(tmp_path, body).load("s")
    assert [r["seq"] for r in stored.records] == [0]
    assert stored.truncate_to is not None


def test_seq_gap(tmp_path: Path) -> None:
    body = line(ev(0)) + line(ev(2)) + line(ev(3, "turn/end"))
    with pytest.raises(SessionCorruptionError, match=r"seq gap in committed region at line 2 \(expected 1, got 2\)"):
        write(tmp_path, body).load("s")
    body = line(ev(0)) + line(ev(5))
    stored = write(tmp_path / "b", body).load("s")
    assert len(stored.records) == 1 and stored.truncate_to is not None


def test_offending_row_with_turn_end_is_corruption(tmp_path: Path) -> None:
    body = line(ev(0)) + line(ev(4, "turn/end"))
    with pytest.raises(SessionCorruptionError, match="seq gap"):
        write(tmp_path, body).load("s")


def test_header_only_file_and_empty_file(tmp_path: Path) -> None:
    stored = write(tmp_path, b"").load("s")
    assert stored.records == [] and stored.truncate_to is None
    b = JsonlBackend(tmp_path / "e")
    d = b.session_dir(HEADER)
    d.mkdir(parents=True)
    (d / "session.jsonl").write_bytes(b'{"type":"session"')
    with pytest.raises(SessionCorruptionError, match="empty or header-less session log"):
        b.load("s")


@pytest.mark.parametrize(
    ("header", "error", "message"),
    [
        ({**HEADER, "version": 3}, SessionFormatUnsupportedError, 'session "s" uses log format v3, but this harness reads only v0'),
        ({**HEADER, "version": -1}, SessionFormatUnsupportedError, "older than the supported v0"),
        ({"version": 7, "junk": True, "id": "s", "cwd": "/w"}, SessionFormatUnsupportedError, "log format v7"),
        ({**HEADER, "createdAt": -5}, SessionCorruptionError, "first line is not a session header"),
        ({**HEADER, "delegationDepth": 0, "sandboxMode": "x"}, SessionCorruptionError, "retired policy baseline fields"),
    ],
)
def test_header_refusals(tmp_path: Path, header: dict[str, Any], error: type[Exception], message: str) -> None:
    b = JsonlBackend(tmp_path)
    d = b.session_dir({"id": "s", "cwd": "/w"})
    d.mkdir(parents=True)
    raw = {"type": "session", **header}
    if "createdAt" in raw and raw["createdAt"] == -5:
        raw["delegationDepth"] = 0
    (d / "session.jsonl").write_bytes(orjson.dumps(raw) + b"\n")
    with pytest.raises(error, match=message):
        b.load("s")


def test_misplaced_file(tmp_path: Path) -> None:
    b = JsonlBackend(tmp_path)
    wrong = b.session_dir({"id": "s", "cwd": "/elsewhere"})
    wrong.mkdir(parents=True)
    (wrong / "session.jsonl").write_bytes(header_line(HEADER))
    with pytest.raises(SessionCorruptionError, match='header id "s" and cwd identify'):
        b.load("s")
    with pytest.raises(SessionCorruptionError):
        b.list_headers()


def test_requested_id_mismatch(tmp_path: Path) -> None:
    b = JsonlBackend(tmp_path)
    d = b.session_dir({"id": "t", "cwd": "/w"})
    d.mkdir(parents=True)
    (d / "session.jsonl").write_bytes(header_line(HEADER))  # header says "s"
    with pytest.raises(SessionCorruptionError, match='requested id "t" does not match header id "s"'):
        b.load("t")


def test_list_skips_incomplete_and_invalid(tmp_path: Path) -> None:
    b = write(tmp_path, line(ev(0)))
    (tmp_path / "--w--" / "empty").mkdir()
    broken = tmp_path / "--w--" / "broken"
    broken.mkdir()
    (broken / "session.jsonl").write_bytes(b'{"type":"sess')
    assert [h["id"] for h in b.list_headers()] == ["s"]


def test_chunk_rows_are_written_packed_and_read_back(tmp_path: Path) -> None:
    b = JsonlBackend(tmp_path)
    chunks = [
        {"type": "assistant/chunk", "seq": i, "time": 10 + i, "data": {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": f"t{i}"}}}
        for i in range(5)
    ]
    b.materialize(HEADER, chunks)
    text = (b.session_dir(HEADER) / "session.jsonl").read_bytes().decode()
    assert text.count("\n") == 2 and '"text-chunks"' in text
    assert b.load("s").records == chunks


# -- values in the reading rules' messages, as the reference's String() (audit-pers) ----------


@pytest.mark.parametrize(
    ("raw_id", "shown"),
    [(123, "123"), (True, "true"), (None, "null"), ([1, 2], "1,2"), ({"a": 1}, "[object Object]"), (..., "undefined")],
)
def test_format_refusal_names_the_records_own_id_as_string_does(tmp_path: Path, raw_id: Any, shown: str) -> None:
    b = JsonlBackend(tmp_path)
    d = b.session_dir(HEADER)
    d.mkdir(parents=True)
    raw: dict[str, Any] = {"type": "session", "version": 42}
    if raw_id is not ...:
        raw["id"] = raw_id
    (d / "session.jsonl").write_bytes(orjson.dumps(raw) + b"\n")
    with pytest.raises(SessionFormatUnsupportedError) as info:
        b.load("s")
    assert str(info.value).startswith(f'session "{shown}" uses log format v42, but this harness reads only v0')


def test_format_refusal_shows_the_version_as_string_does(tmp_path: Path) -> None:
    b = JsonlBackend(tmp_path)
    d = b.session_dir(HEADER)
    d.mkdir(parents=True)
    (d / "session.jsonl").write_bytes(b'{"type":"session","version":1e21,"id":"s"}\n')
    with pytest.raises(SessionFormatUnsupportedError, match=r'session "s" uses log format v1e\+21, but'):
        b.load("s")


def test_a_non_header_with_a_retired_field_is_not_a_header(tmp_path: Path) -> None:
    # The shape check comes before the retired-field check (reference §1.2).
    b = JsonlBackend(tmp_path)
    d = b.session_dir(HEADER)
    d.mkdir(parents=True)
    raw = {"type": "session", "version": "0", "id": "s", "createdAt": 1, "delegationDepth": 0, "sandboxMode": "x"}
    (d / "session.jsonl").write_bytes(orjson.dumps(raw) + b"\n")
    with pytest.raises(SessionCorruptionError, match=r"^corrupt session log: first line is not a session header$"):
        b.load("s")


@pytest.mark.parametrize(
    ("seq", "shown"), [(None, "null"), (..., "undefined"), (True, "true"), ([1, 2], "1,2"), ({"a": 1}, "[object Object]")]
)
def test_seq_gap_message_shows_the_seq_as_string_does(tmp_path: Path, seq: Any, shown: str) -> None:
    bad = ev(1)
    if seq is ...:
        del bad["seq"]
    else:
        bad["seq"] = seq
    body = line(ev(0)) + line(bad) + line(ev(2, "turn/end"))
    with pytest.raises(SessionCorruptionError) as info:
        write(tmp_path, body).load("s")
    assert str(info.value) == f"corrupt session log: seq gap in committed region at line 2 (expected 1, got {shown})"


@pytest.mark.parametrize(("at", "seq"), [(0, False), (1, True)])
def test_a_boolean_seq_continues_nothing(tmp_path: Path, at: int, seq: bool) -> None:
    # JavaScript's `true !== 1`: the line opens an issue; with no later turn/end it and
    # everything after it are a torn tail.
    events = [ev(0), ev(1), ev(2)]
    events[at]["seq"] = seq
    body = b"".join(line(e) for e in events)
    stored = write(tmp_path, body).load("s")
    assert [r["seq"] for r in stored.records] == list(range(at))
    assert stored.truncate_to == len(header_line(HEADER)) + sum(len(line(e)) for e in events[:at])
