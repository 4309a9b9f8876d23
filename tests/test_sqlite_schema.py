"""SQLite on-disk interop (issue 11 §2): the reference's schema 17, byte for byte where
the reference fixes the encoding; identity checks before any write; the lease file."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from harness.errors import (
    RecordEncodingError,
    SessionCorruptionError,
    SqliteSchemaError,
    StorageIOError,
)
from harness.faults import SqliteFaults
from harness.persistence import JsonlBackend, SqliteBackend
from harness.persistence._sqlite import migrate_legacy_sqlite
from harness.persistence._sqlite_rows import _Malformed, decode_row, scan_rows
from harness.persistence._sqlite_schema import lease_path
from harness.persistence._varint import VarintError, decode_seqs, encode_seqs
from harness.session import decode_storage_record, pack_chunk_runs
from harness.session._chunks import ROW_TAGS
from tests.helpers import rec, user

zstandard = pytest.importorskip("zstandard")

DSHP = 0x44534850
H: dict[str, Any] = {"version": 0, "id": "s", "createdAt": 5, "cwd": "/w/p"}

# The reference's schema objects, as its validateRequiredSchema compares them: rows of
# `SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name NOT GLOB 'sqlite_*'
# ORDER BY type, name`, whitespace runs collapsed. Written out by hand from
# resources/sql/schema.sql of the reference, not derived from harness code.
REFERENCE_OBJECTS = [
    (
        "table",
        "events",
        "events",
        "CREATE TABLE events ( session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, "
        "seq INTEGER NOT NULL, type TEXT NOT NULL, time INTEGER NOT NULL, data ANY NOT NULL, "
        "source_event_seqs ANY, surface_op TEXT, ignorable INTEGER CHECK (ignorable IS NULL OR ignorable IN (0, 1)), "
        "PRIMARY KEY (session_id, seq) ) STRICT",
    ),
    (
        "table",
        "persistence_state",
        "persistence_state",
        "CREATE TABLE persistence_state ( singleton INTEGER PRIMARY KEY CHECK (singleton = 1), "
        "store_id TEXT NOT NULL ) STRICT",
    ),
    (
        "table",
        "sessions",
        "sessions",
        "CREATE TABLE sessions ( id TEXT PRIMARY KEY, version INTEGER NOT NULL, created_at INTEGER NOT NULL, "
        "cwd TEXT, parent_session TEXT, seed_length INTEGER, origin TEXT, delegation_depth INTEGER, "
        "agent_preset TEXT, incarnation TEXT NOT NULL, revision INTEGER NOT NULL ) STRICT",
    ),
]

# The reference's golden-fixture layout of the same schema (other whitespace).
REFERENCE_DDL = """
PRAGMA application_id = 1146308688;
PRAGMA user_version = 17;
CREATE TABLE persistence_state (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    store_id  TEXT NOT NULL
) STRICT;
CREATE TABLE sessions (
    id               TEXT PRIMARY KEY,
    version          INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    cwd              TEXT,
    parent_session   TEXT,
    seed_length      INTEGER,
    origin           TEXT,
    delegation_depth INTEGER,
    agent_preset     TEXT,
    incarnation      TEXT NOT NULL,
    revision         INTEGER NOT NULL
) STRICT;
CREATE TABLE events (
    session_id        TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq               INTEGER NOT NULL,
    type              TEXT NOT NULL,
    time              INTEGER NOT NULL,
    data              ANY NOT NULL,
    source_event_seqs ANY,
    surface_op        TEXT,
    ignorable         INTEGER CHECK (ignorable IS NULL OR ignorable IN (0, 1)),
    PRIMARY KEY (session_id, seq)
) STRICT;
"""


def reference_objects(path: Path) -> list[tuple[str, str, str, str]]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name NOT GLOB 'sqlite_*' ORDER BY type, name"
        ).fetchall()
    finally:
        db.close()
    return [(t, n, tb, " ".join(s.split())) for t, n, tb, s in rows]


def raw(path: Path, sql: str, params: Any = ()) -> list[Any]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def chunk(seq: int, text: str, kind: str = "text-delta", time: int | None = None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"type": kind, "index": 0}
    if kind == "tool-call-delta":
        c["id"] = extra.get("id", "c1")
        if "name" in extra:
            c["name"] = extra["name"]
        c["argumentsDelta"] = text
    else:
        c["text"] = text
    return {"type": "assistant/chunk", "seq": seq, "time": 1000 + seq if time is None else time, "data": {"turn": 1, "step": 1, "chunk": c}}


def zstd_raw_frame(payload: bytes) -> bytes:
    """A Zstandard frame built by hand (the reference fixture's helper): magic, a
    single-segment header with a 1-byte content size, one raw last block."""
    assert len(payload) < 256
    block = (len(payload) << 3) | 1
    return bytes([0x28, 0xB5, 0x2F, 0xFD, 0x20, len(payload)]) + block.to_bytes(3, "little") + payload


@pytest.fixture
def backend(tmp_path: Path) -> Any:
    b = SqliteBackend(tmp_path / "sessions.db")
    yield b
    b.close()


# -- the schema ------------------------------------------------------------------------------


def test_a_new_database_has_the_reference_schema(backend: SqliteBackend) -> None:
    backend.materialize(H, [rec("user/message", 0, user(), surfaceOp="append")])
    path = backend.path
    assert raw(path, "PRAGMA application_id") == [(DSHP,)]
    assert raw(path, "PRAGMA user_version") == [(17,)]
    assert raw(path, "PRAGMA journal_mode") == [("wal",)]
    assert reference_objects(path) == REFERENCE_OBJECTS  # nothing else: the reference would refuse it
    tables = {name: strict for _, name, kind, _, _, strict in raw(path, "PRAGMA table_list") if kind == "table" and not name.startswith("sqlite_")}
    assert tables == {"persistence_state": 1, "sessions": 1, "events": 1}
    columns = {t: [(name, decl, notnull, pk) for _, name, decl, notnull, _, pk in raw(path, f"PRAGMA table_info({t})")] for t in tables}
    assert columns["events"] == [
        ("session_id", "TEXT", 1, 1),
        ("seq", "INTEGER", 1, 2),
        ("type", "TEXT", 1, 0),
        ("time", "INTEGER", 1, 0),
        ("data", "ANY", 1, 0),
        ("source_event_seqs", "ANY", 0, 0),
        ("surface_op", "TEXT", 0, 0),
        ("ignorable", "INTEGER", 0, 0),
    ]
    assert [c[0] for c in columns["sessions"]] == [
        "id", "version", "created_at", "cwd", "parent_session", "seed_length", "origin",
        "delegation_depth", "agent_preset", "incarnation", "revision",
    ]
    assert columns["persistence_state"] == [("singleton", "INTEGER", 0, 1), ("store_id", "TEXT", 1, 0)]
    ((singleton, store_id),) = raw(path, "SELECT singleton, store_id FROM persistence_state")
    assert singleton == 1 and len(store_id) == 36 and store_id[14] == "4"  # a UUID v4
    ((inc, rev),) = raw(path, "SELECT incarnation, revision FROM sessions")
    assert rev == 1 and len(inc) == 36
    assert backend.revision("s") == backend.load("s").revision
    assert f":store:{store_id}:incarnation:{inc}:revision:1" in str(backend.revision("s"))


def test_the_lease_lives_beside_the_database(backend: SqliteBackend) -> None:
    backend.materialize(H, [rec("feedback/record", 0, {})])
    lease = backend.acquire_writer(H)
    assert reference_objects(backend.path) == REFERENCE_OBJECTS  # no leases table in the database
    side = lease_path(backend.path)
    assert side == backend.path.with_name("sessions.db-leases")
    assert (side.stat().st_mode & 0o777) == 0o600 and (backend.path.stat().st_mode & 0o777) == 0o600
    assert raw(side, "PRAGMA application_id") == [(0x54484E4C,)]
    assert raw(side, "SELECT fence, token FROM leases WHERE session_id = 's'") == [(1, lease.token)]  # type: ignore[attr-defined]
    store = raw(backend.path, "SELECT store_id FROM persistence_state")
    assert raw(side, "SELECT store_id FROM lease_store") == store
    lease.release()


def test_a_lease_file_of_another_store_is_reset(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    b = SqliteBackend(path)
    b.materialize(H, [rec("feedback/record", 0, {})])
    b.acquire_writer(H)  # never released: a live lease of this process
    b.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)  # the database is deleted; the lease file stays
    fresh = SqliteBackend(path)
    fresh.materialize(H, [rec("feedback/record", 0, {})])
    assert not fresh.lock_held(H)  # the old store's leases were forgotten
    fresh.acquire_writer(H).release()
    fresh.close()


# -- rows --------------------------------------------------------------------------------------


def test_scalar_rows_hold_the_reference_encoding(backend: SqliteBackend) -> None:
    records = [
        rec("user/message", 0, user("u1", "é ☃"), surfaceOp="append"),
        rec("assistant/message", 1, {"x": [1, 2.5, None, True]}, sourceEventSeqs=[5, 3, 300], surfaceOp={"op": "replace", "start": 0, "end": 0}),
        rec("future/thing", 2, None, ignorable=True),
        rec("tool/result", 3, {}, sourceEventSeqs=[]),
    ]
    backend.materialize(H, records)
    rows = raw(backend.path, "SELECT seq, type, time, data, typeof(data), source_event_seqs, surface_op, ignorable FROM events ORDER BY seq")
    assert rows == [
        (0, "user/message", 1000, orjson.dumps(user("u1", "é ☃")).decode(), "text", None, '"append"', None),
        (1, "assistant/message", 1001, '{"x":[1,2.5,null,true]}', "text", bytes([0x05, 0x03, 0xD2, 0x04]), '{"op":"replace","start":0,"end":0}', None),
        (2, "future/thing", 1002, "null", "text", None, None, 1),
        (3, "tool/result", 1003, "{}", "text", b"", None, None),
    ]
    assert backend.load("s").records == records


def mixed_batch(n: int) -> list[dict[str, Any]]:
    """Every row shape, in runs longer and shorter than a segment: plain scalar events,
    ``surfaceOp: "append"`` ones, ``ignorable`` ones (with and without the op, small and
    large data), optional fields, a non-append op, large (zstd) data, packed chunk runs
    and runs of two chunks."""
    out: list[dict[str, Any]] = []
    while len(out) < n:
        i = len(out)
        k = (i // 7) % 9
        if k == 0:
            out.append(rec("user/message", i, user(f"m{i}"), surfaceOp="append"))
        elif k == 1:
            out.append(rec("turn/start", i, {"turn": i}))
        elif k == 2:
            out.append(rec("tool/result", i, {"i": i}, surfaceOp="append", sourceEventSeqs=[max(0, i - 3), i - 1]))
        elif k == 3 and i % 3 == 0:
            out.append(rec("future/x", i, None, ignorable=True))
        elif k == 3 and i % 3 == 1:
            out.append(rec("user/message", i, user(f"i{i}"), surfaceOp="append", ignorable=True))
        elif k == 3:
            out.append(rec("openai-agents/item", i, {"item": {"text": "big " * 2000}}, ignorable=True))
        elif k == 4:
            out.append(rec("assistant/chunk", i, {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "ab"}}))
        elif k == 5:
            out.append(rec("compaction/replace", i, {"i": i}, surfaceOp={"op": "replace", "start": 0, "end": 0}))
        elif k == 6:
            out.append(rec("user/message", i, user("big " * 2000), surfaceOp="append"))
        elif k == 7 and i % 7 < 2:
            out.append(rec("assistant/chunk", i, {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}}))
        else:
            out.append(rec("feedback/record", i, {"i": i, "s": "é"}))
    return out


def test_segmented_five_parameter_inserts_store_what_eight_parameters_would(backend: SqliteBackend, tmp_path: Path) -> None:
    """The write path binds the common rows to statements with constant columns, in
    segments; the table is exactly what one eight-parameter INSERT per row stores."""
    from harness.persistence._sqlite_rows import INSERT, bind_records

    records = mixed_batch(1500)
    backend.materialize(H, records[:700])
    backend.append("s", records[700:])
    assert backend.load("s").records == records
    other = SqliteBackend(tmp_path / "wide.db")
    other.list_headers()
    other.close()
    db = sqlite3.connect(tmp_path / "wide.db")
    db.execute("INSERT INTO sessions (id, version, created_at, incarnation, revision) VALUES ('s', 0, 5, 'i', 0)")
    db.executemany(INSERT, bind_records("s", records[:700], pack=True))
    db.executemany(INSERT, bind_records("s", records[700:], pack=True))
    db.commit()
    db.close()
    dump = "SELECT seq, type, time, data, typeof(data), source_event_seqs, typeof(source_event_seqs), surface_op, typeof(surface_op), ignorable, typeof(ignorable) FROM events ORDER BY seq"
    mine = raw(backend.path, dump)
    assert mine == raw(tmp_path / "wide.db", dump)
    kinds = {(r[8], r[9]) for r in mine}
    assert ("text", None) in kinds and ("null", None) in kinds and ("null", 0) in kinds and ("null", 1) in kinds
    assert ("text", 1) in kinds  # an ignorable append
    assert any(r[4] == "blob" for r in mine) and any(r[1] == "text-chunks" for r in mine)


def test_a_record_that_cannot_be_stored_late_in_a_big_batch_rolls_it_all_back(backend: SqliteBackend) -> None:
    backend.materialize(H, [rec("feedback/record", 0, {})])
    revision = backend.revision("s")
    batch = [rec("feedback/record", i, {"i": i}) for i in range(1, 3001)]
    batch[2500] = rec("feedback/record", 2501, {"n": 2**70})  # in a later segment
    with pytest.raises(RecordEncodingError, match='session "s": event seq 2501 cannot be stored'):
        backend.append("s", batch)
    assert raw(backend.path, "SELECT count(*) FROM events") == [(1,)]
    assert backend.revision("s") == revision
    batch[2500] = rec("feedback/record", 2501, {"n": 1})
    backend.append("s", batch)
    assert len(backend.load("s").records) == 3001


def test_packed_rows_hold_the_reference_encoding(backend: SqliteBackend) -> None:
    texts = [chunk(0, "a", time=90), chunk(1, "b", time=92), chunk(2, "c", time=91)]
    tools = [chunk(3 + i, f"{{{i}", "tool-call-delta", name="read") for i in range(3)]
    two = [chunk(6, "x"), chunk(7, "y")]  # a run of two stays scalar
    records = [*texts, *tools, *two, rec("turn/end", 8, {"turn": 1})]
    backend.materialize(H, records)
    rows = raw(backend.path, "SELECT seq, type, time, data, source_event_seqs, surface_op, ignorable FROM events ORDER BY seq")
    assert rows[:2] == [
        (0, "text-chunks", 90, '{"turn":1,"step":1,"index":0,"dt":[2,-1],"texts":["a","b","c"]}', None, None, 0),
        (3, "tool-call-chunks", 1003, '{"turn":1,"step":1,"index":0,"dt":[1,1],"id":"c1","name":"read","args":["{0","{1","{2"]}', None, None, 0),
    ]
    assert [(r[0], r[1], r[6]) for r in rows[2:]] == [(6, "assistant/chunk", None), (7, "assistant/chunk", None), (8, "turn/end", None)]
    assert backend.load("s").records == records
    backend.append("s", [chunk(9, "p"), chunk(10, "q"), chunk(11, "r")])  # the next seq is read through the packed tail
    assert [r["seq"] for r in backend.load("s").records] == list(range(12))
    assert [r["seq"] for r in backend.load_from("s", 10).records] == [10, 11]  # a seek into a packed row
    assert [r["seq"] for r in backend.load_from("s", 4).records] == list(range(4, 12))


def test_the_reference_fixture_row_decodes() -> None:
    # The reference's own fixture (compression.spec.ts): a text-chunks row at seq 7.
    row = (7, "text-chunks", 90, '{"turn":2,"step":3,"index":1,"dt":[2,-1],"texts":["a","b","c"]}', None, None, 0)
    assert decode_row(row) == [
        {"type": "assistant/chunk", "seq": 7, "time": 90, "data": {"turn": 2, "step": 3, "chunk": {"type": "text-delta", "index": 1, "text": "a"}}},
        {"type": "assistant/chunk", "seq": 8, "time": 92, "data": {"turn": 2, "step": 3, "chunk": {"type": "text-delta", "index": 1, "text": "b"}}},
        {"type": "assistant/chunk", "seq": 9, "time": 91, "data": {"turn": 2, "step": 3, "chunk": {"type": "text-delta", "index": 1, "text": "c"}}},
    ]


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ((0, "text-chunks", 1, '{"turn":1,"step":1,"index":0,"dt":[0],"texts":["a","b"]}', None, None, 0), "3..1024"),
        ((0, "text-chunks", 1, orjson.dumps({"turn": 1, "step": 1, "index": 0, "dt": [0] * 1024, "texts": ["a"] * 1025}).decode(), None, None, 0), "3..1024"),
        ((0, "turn/start", 1, "{}", None, None, 0), "packed discriminator requires a chunk tag"),
        ((0, "text-chunks", 1, '{"turn":1,"step":1,"index":0,"dt":[0,0],"texts":["a","b","c"]}', b"", None, 0), "surface fields must be null"),
        ((0, "text-chunks", 1, '{"turn":1,"step":1,"index":0,"dt":[0,0],"texts":["a","b","c"]}', None, '"append"', 0), "surface fields must be null"),
        ((0, "text-chunks", 1, " " * (2**20 + 1), None, None, 0), "data exceeds"),
        ((0, "turn/start", 1, b"not zstd", None, None, None), "decompress"),
        ((0, "turn/start", 1, "{}", bytes([0x80]), None, None), "truncated varint"),
        ((0, "turn/start", 1, "{not json", None, None, None), "."),
    ],
)
def test_malformed_rows(row: Any, why: str) -> None:
    with pytest.raises(_Malformed, match=why):
        decode_row(row)


def test_large_data_is_a_zstd_blob_and_a_hand_made_frame_decodes(backend: SqliteBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    big = {"text": "x" * 8192}
    small = {"text": "x" * 4000}  # under 4096 bytes: text, however well it compresses
    backend.materialize(H, [rec("user/message", 0, big), rec("user/message", 1, small), rec("feedback/record", 2, {})])
    rows = raw(backend.path, "SELECT typeof(data), data FROM events ORDER BY seq")
    assert rows[0][0] == "blob" and rows[0][1][:4] == b"\x28\xb5\x2f\xfd"
    assert zstandard.ZstdDecompressor().decompress(rows[0][1]) == orjson.dumps(big)
    assert rows[1] == ("text", orjson.dumps(small).decode()) and rows[2] == ("text", "{}")
    # A frame that is not smaller is not kept: the text is.
    monkeypatch.setattr("harness.persistence._sqlite_rows._compress", lambda raw: raw + b"!")
    backend.append("s", [rec("user/message", 3, big)])
    monkeypatch.undo()
    assert raw(backend.path, "SELECT typeof(data) FROM events WHERE seq = 3") == [("text",)]
    # A frame built by hand, as the reference fixture stores one: it must decode.
    payload = b'{"message":{"source":{"model":"deepseek-reasoner"}},"usage":{"inputTokens":40,"outputTokens":15}}'
    frame = zstd_raw_frame(payload)
    assert frame[:9] == bytes([0x28, 0xB5, 0x2F, 0xFD, 0x20, len(payload)]) + ((len(payload) << 3) | 1).to_bytes(3, "little")
    db = sqlite3.connect(backend.path)
    with db:
        db.execute("INSERT INTO events VALUES ('s', 4, 'assistant/message', 7, ?, NULL, NULL, NULL)", (frame,))
    db.close()
    assert backend.load("s").records[4] == {"type": "assistant/message", "seq": 4, "time": 7, "data": orjson.loads(payload)}


def test_runs_are_bounded_by_members_and_bytes(backend: SqliteBackend) -> None:
    long = [chunk(i, "t") for i in range(1027)]
    backend.materialize(H, long)
    assert raw(backend.path, "SELECT seq, type FROM events ORDER BY seq") == [(0, "text-chunks"), (1024, "text-chunks")]
    assert backend.load("s").records == long
    large = [chunk(i, "x" * 300_000) for i in range(4)]
    packed = pack_chunk_runs(large, max_members=1024, max_data_bytes=2**20)
    assert [r["type"] for r in packed] == ["text-chunks", "assistant/chunk"]  # 3 fit in 1 MiB, 4 do not
    alone = [chunk(i, "x" * 400_000) for i in range(3)]
    assert pack_chunk_runs(alone, max_members=1024, max_data_bytes=2**20) == alone


# -- varints ---------------------------------------------------------------------------------


def test_varints_match_hand_computed_bytes() -> None:
    assert encode_seqs([5, 3, 300]) == bytes([0x05, 0x03, 0xD2, 0x04])  # 5; -2 -> 3; +297 -> 594
    assert encode_seqs([]) == b""
    assert encode_seqs([0, 127, 128]) == bytes([0x00, 0xFE, 0x01, 0x02])  # +127 -> 254; +1 -> 2
    top = 2**53 - 1
    for seqs in ([], [5, 3, 300], [top - 1, 0, top - 2], list(range(10, 2010))):
        assert decode_seqs(encode_seqs(seqs)) == seqs
    for bad in ([-1], [0.5], [2**53], [True]):
        with pytest.raises(TypeError, match="non-negative safe integers"):
            encode_seqs(bad)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (bytes([0x80]), "truncated varint"),
        (bytes([0x80, 0x00]), "non-canonical varint"),
        (bytes([0x00, 0x01]), "decoded seq is out of range"),
        (bytes([0xFF] * 7 + [0x0F, 0x02]), "decoded seq is out of range"),
        (bytes([0x80] * 7 + [0x10]), "varint is out of range"),
        (bytes([0x80] * 9), "varint is out of range"),
    ],
)
def test_varints_refuse_what_the_reference_refuses(data: bytes, why: str) -> None:
    with pytest.raises(VarintError, match=f"^malformed source_event_seqs storage value: {why}$"):
        decode_seqs(data)


# -- the chunk codec and records the schema cannot hold ---------------------------------------


def test_a_non_string_type_passes_through_the_chunk_codec(tmp_path: Path) -> None:
    odd = [{"type": ["x"], "seq": 0, "time": 0, "data": None}, {"type": {"a": 1}, "seq": 1, "time": 0, "data": None}]
    assert all(decode_storage_record(r) == [r] for r in odd)
    assert ["x"] not in ROW_TAGS and "text-chunks" in ROW_TAGS
    weird_chunk = chunk(2, "a")
    weird_chunk["data"]["chunk"]["type"] = ["text-delta"]
    records = [*odd, weird_chunk, chunk(3, "b"), chunk(4, "c")]
    assert pack_chunk_runs(records) == records
    jsonl = JsonlBackend(tmp_path / "j")
    jsonl.materialize(dict(H), odd)
    assert jsonl.load("s").records == odd  # the JSONL reader's row check does not raise either


def test_records_the_schema_cannot_hold_are_refused_up_front(backend: SqliteBackend) -> None:
    backend.materialize(H, [rec("feedback/record", 0, {})])
    for bad in (
        {"type": ["x"], "seq": 1, "time": 0, "data": None},
        {"type": "", "seq": 1, "time": 0, "data": None},
        {"type": "x", "seq": 1, "time": 1.5, "data": None},
        {"type": "x", "seq": 1, "time": 0, "data": None, "extra": 1},
        {"type": "x", "seq": 1, "time": 0},
        {"type": "x", "seq": 1, "time": 0, "data": None, "ignorable": False},
        {"type": "x", "seq": 1, "time": 0, "data": None, "sourceEventSeqs": [-1]},
        {"type": "x", "seq": 1, "time": 0, "data": {1: 2}},
    ):
        with pytest.raises(RecordEncodingError, match="event seq 1 cannot be stored"):
            backend.append("s", [bad])
    assert len(backend.load("s").records) == 1


# -- identity checks before any write ------------------------------------------------------------


def foreign(path: Path, script: str) -> bytes:
    """Another program's database, owner-only (as the path checks require: so what
    refuses it is its identity)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(script)
    db.close()
    path.chmod(0o600)
    return path.read_bytes()


LEGACY_V2 = """
CREATE TABLE sessions (id TEXT PRIMARY KEY, header TEXT NOT NULL, incarnation TEXT NOT NULL, revision INTEGER NOT NULL) STRICT;
CREATE TABLE events (session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, seq INTEGER NOT NULL,
    type TEXT NOT NULL, record TEXT NOT NULL, PRIMARY KEY (session_id, seq)) STRICT, WITHOUT ROWID;
CREATE TABLE leases (session_id TEXT PRIMARY KEY, fence INTEGER NOT NULL, token TEXT, host TEXT, pid INTEGER,
    start_time INTEGER, since INTEGER, expires INTEGER) STRICT;
INSERT INTO sessions VALUES ('s', '{"type":"session","version":0,"id":"s","createdAt":1,"delegationDepth":0,"x":1}', 'inc', 3);
INSERT INTO events VALUES ('s', 0, 'user/message', '{"type":"user/message","seq":0,"time":1,"data":{"id":"u"},"surfaceOp":"append"}');
INSERT INTO events VALUES ('s', 1, 'assistant/chunk', '{"type":"assistant/chunk","seq":1,"time":2,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"a"}}}');
PRAGMA application_id = 1414024787;
PRAGMA user_version = 2;
"""


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("CREATE TABLE t (x); PRAGMA application_id = 12345; PRAGMA user_version = 17;", "has application id 12345, expected 1146308688"),
        (REFERENCE_DDL.replace("user_version = 17", "user_version = 16"), "has schema version 16, incompatible with this build (17)"),
        ("CREATE TABLE t (x); PRAGMA user_version = 3;", "has schema version 3, incompatible with this build (17)"),
        ("CREATE TABLE t (x);", "has an unversioned schema or application identity"),
        ("PRAGMA application_id = 7;", "has an unversioned schema or application identity"),
        (REFERENCE_DDL + "CREATE TABLE leases (x);", "does not contain the required schema objects"),
        (REFERENCE_DDL, "has no valid store identity"),
        (LEGACY_V2, "has schema version 2, incompatible with this build (17): it holds trio-harness's own schema v2"),
    ],
)
def test_a_foreign_database_is_refused_unchanged(tmp_path: Path, script: str, message: str) -> None:
    path = tmp_path / "foreign.db"
    before = foreign(path, script)
    faults = SqliteFaults()
    backend = SqliteBackend(path, faults=faults)
    for op in (lambda: backend.load("s"), lambda: backend.materialize(H, [rec("feedback/record", 0, {})]), backend.list_headers):
        with pytest.raises(SqliteSchemaError) as info:
            op()
        assert info.value.code == "SQLITE_SCHEMA_INCOMPATIBLE" and isinstance(info.value, StorageIOError)
        assert str(info.value).startswith(f'session database at "{path}" ') and message in str(info.value)
        assert info.value.path == path
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign.db"]  # no journal, WAL or lease file left
    # Nothing that writes ran before the refusal: connection settings, BEGIN, reads, ROLLBACK.
    writes = [s for s in faults.statements if s.split()[0] in ("CREATE", "INSERT", "UPDATE", "DELETE", "ATTACH")]
    assert writes == [] and not any("journal_mode" in s or "= 17" in s for s in faults.statements)
    if "v2" in message:
        assert info.value.user_version == 2 and info.value.application_id == 0x54484E53


@pytest.mark.parametrize("content", [b"hello", b"not a database at all\n" * 400])
def test_a_file_that_is_not_a_database_is_refused_unchanged(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(SqliteSchemaError, match="file is not a database"):
        SqliteBackend(path).load("s")
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_ownership_is_checked_again_before_every_mutation(backend: SqliteBackend) -> None:
    backend.materialize(H, [rec("feedback/record", 0, {})])
    db = sqlite3.connect(backend.path)
    db.execute("CREATE TABLE intruder (x)")
    db.commit()
    db.close()
    with pytest.raises(SqliteSchemaError, match="does not contain the required schema objects"):
        backend.append("s", [rec("feedback/record", 1, {})])
    db = sqlite3.connect(backend.path)
    db.execute("DROP TABLE intruder")
    db.execute("PRAGMA application_id = 5")
    db.commit()
    db.close()
    with pytest.raises(SqliteSchemaError, match=r"application id changed before mutation \(expected 1146308688, got 5\)"):
        backend.append("s", [rec("feedback/record", 1, {})])
    assert raw(backend.path, "SELECT count(*) FROM events") == [(1,)]


# -- interop: a database the reference wrote ----------------------------------------------------


def test_a_reference_written_database_opens_and_stays_reference_valid(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = "00000000-0000-4000-8000-000000000000"
    inc = "11111111-1111-4111-8111-111111111111"
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(REFERENCE_DDL)
    db.execute("INSERT INTO persistence_state VALUES (1, ?)", (store,))
    db.execute("INSERT INTO sessions VALUES ('ref', 0, 1754042400000, '/home/u/proj', NULL, NULL, NULL, NULL, NULL, ?, 3)", (inc,))
    payload = b'{"turn":1}'
    db.executemany(
        "INSERT INTO events VALUES ('ref', ?, ?, ?, ?, ?, ?, ?)",
        [
            (0, "turn/start", 10, zstd_raw_frame(payload), None, None, None),
            (1, "text-chunks", 11, '{"turn":1,"step":1,"index":0,"dt":[1,1],"texts":["a","b","c"]}', None, None, 0),
            (4, "user/message", 14, '{"id":"u"}', encode_seqs([1, 2]), '"append"', None),
        ],
    )
    db.close()
    path.chmod(0o600)  # the reference creates it so (wx, 0600)
    backend = SqliteBackend(path)
    stored = backend.load("ref")
    assert stored.header == {"version": 0, "id": "ref", "createdAt": 1754042400000, "cwd": "/home/u/proj"}  # NULL -> absent
    assert [r["seq"] for r in stored.records] == [0, 1, 2, 3, 4] and stored.truncate_to is None
    assert stored.records[0]["data"] == {"turn": 1}
    assert stored.records[4] == {"type": "user/message", "seq": 4, "time": 14, "data": {"id": "u"}, "sourceEventSeqs": [1, 2], "surfaceOp": "append"}
    assert stored.revision.endswith(f":store:{store}:incarnation:{inc}:revision:3")
    lease = backend.acquire_writer(stored.header)
    backend.append("ref", [rec("turn/end", 5, {"turn": 1})], lease=lease)
    lease.release()
    backend.close()
    assert reference_objects(path) == REFERENCE_OBJECTS and raw(path, "PRAGMA user_version") == [(17,)]
    assert raw(path, "SELECT revision FROM sessions") == [(4,)]


# -- torn tails and repair --------------------------------------------------------------------


def test_a_torn_physical_tail_is_repaired_in_one_transaction(backend: SqliteBackend) -> None:
    backend.materialize(H, [rec("turn/start", 0, {"turn": 1}), rec("turn/end", 1, {"turn": 1}), rec("turn/start", 2, {"turn": 2})])
    db = sqlite3.connect(backend.path)
    with db:
        db.execute("INSERT INTO events VALUES ('s', 3, 'x', 0, '{not json', NULL, NULL, NULL)")
        db.execute("INSERT INTO events VALUES ('s', 4, 'y', 0, '{}', NULL, NULL, NULL)")
    db.close()
    stored = backend.load("s")
    assert [r["seq"] for r in stored.records] == [0, 1, 2] and stored.truncate_to == 3
    with pytest.raises(SessionCorruptionError, match="invalid physical tail at seq 3"):
        backend.append("s", [rec("x", 3, {})])
    with pytest.raises(SessionCorruptionError, match="repair omitted current torn tail at seq 3"):
        backend.commit_repair("s", None, [rec("turn/end", 3, {"turn": 2})])
    with pytest.raises(SessionCorruptionError, match="repair is stale: physical tail no longer starts at seq 4"):
        backend.commit_repair("s", 4, [])
    with pytest.raises(SessionCorruptionError, match="closer starts at seq 5, stored next seq is 3"):
        backend.commit_repair("s", 3, [rec("turn/end", 5, {"turn": 2})])
    backend.commit_repair("s", 3, [rec("turn/end", 3, {"turn": 2})])
    assert [r["seq"] for r in backend.load("s").records] == [0, 1, 2, 3] and backend.load("s").truncate_to is None


def test_a_bad_row_before_the_last_turn_end_is_corruption() -> None:
    good = (0, "turn/start", 1, '{"turn":1}', None, None, None)
    skipped = (2, "step/start", 2, "{}", None, None, None)
    end = (3, "turn/end", 3, "{}", None, None, None)
    assert scan_rows("s", [good, skipped]) == ([{"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}], 2)
    with pytest.raises(SessionCorruptionError, match="invalid committed physical row at seq 2"):
        scan_rows("s", [good, skipped, end])
    bad_packed = (0, "text-chunks", 1, "{not json", None, None, 0)
    with pytest.raises(SessionCorruptionError, match="invalid committed physical row at seq 0"):
        scan_rows("s", [bad_packed, (1, "turn/end", 4, "{}", None, None, None)])
    with pytest.raises(SessionCorruptionError, match="stored data must be a string or blob"):
        scan_rows("s", [(0, "x", 1, 5, None, None, None)])


# -- our previous schema ----------------------------------------------------------------------


def test_a_legacy_database_is_refused_and_can_be_copied(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    before = foreign(path, LEGACY_V2)
    with pytest.raises(SqliteSchemaError) as info:
        SqliteBackend(path).list_headers()
    assert f'"{path}"' in str(info.value) and "schema version 2" in str(info.value) and "migrate_legacy_sqlite" in str(info.value)
    assert migrate_legacy_sqlite(path, tmp_path / "new.db") == 1
    assert path.read_bytes() == before
    stored = SqliteBackend(tmp_path / "new.db").load("s")
    assert stored.header == {"version": 0, "id": "s", "createdAt": 1, "delegationDepth": 0}  # "x" has no column
    assert [r["seq"] for r in stored.records] == [0, 1]
    with pytest.raises(StorageIOError, match="already exists"):
        migrate_legacy_sqlite(path, tmp_path / "new.db")
    with pytest.raises(SqliteSchemaError):
        migrate_legacy_sqlite(tmp_path / "new.db", tmp_path / "newer.db")
    assert not (tmp_path / "newer.db").exists() and not lease_path(tmp_path / "newer.db").exists()
