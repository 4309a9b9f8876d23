"""The group-commit contract (issue 26): ``write_group(writes)`` makes several sessions'
batches durable together, and every backend keeps :func:`write_each`'s contract —
results aligned with the writes, ``None`` for a durable batch, the exception the batch
alone would have raised otherwise, one batch's refusal never failing another's, a
failure of the shared step failing every batch, one session's batches landing in the
order given. SQLite and PostgreSQL: one transaction (one commit) per group."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.errors import (
    LeaseLostError,
    PersistedSessionNotFoundError,
    PersistenceError,
    RecordEncodingError,
    SessionCorruptionError,
    SessionLogExistsError,
    StorageIOError,
)
from harness.faults import SqliteFaults
from harness.persistence import Backend, JsonlBackend, SqliteBackend
from harness.persistence._backend import GroupWrite, WriterLease, write_each
from tests.helpers import rec, user


def header(sid: str) -> dict[str, Any]:
    return {"version": 0, "id": sid, "createdAt": 5, "cwd": "/w"}


def events(start: int, n: int, tag: str = "m") -> list[dict[str, Any]]:
    return [rec("user/message", i, user(f"{tag}{i}"), surfaceOp="append") for i in range(start, start + n)]


def first(sid: str, records: list[dict[str, Any]], lease: WriterLease | None = None) -> GroupWrite:
    return GroupWrite(sid, header(sid), records, False, lease)


def more(sid: str, records: list[dict[str, Any]], lease: WriterLease | None = None) -> GroupWrite:
    return GroupWrite(sid, header(sid), records, True, lease)


def group(backend: Backend, writes: Sequence[GroupWrite]) -> list[BaseException | None]:
    """The backend's own group write; ``write_each`` for one that has none (JSONL
    until its round-of-fsyncs lands)."""
    own = getattr(backend, "write_group", None)
    results: list[BaseException | None] = write_each(backend, writes) if own is None else own(writes)
    assert len(results) == len(writes)
    return results


class Hook:
    """A statement hook that records every statement (and can fail some through a
    :class:`SqliteFaults`)."""

    def __init__(self, counter: SqliteFaults | None = None) -> None:
        self.counter = counter or SqliteFaults()

    @property
    def statements(self) -> list[str]:
        return self.counter.statements

    def before(self, sql: str) -> None:
        self.counter.before(sql)

    def commits(self) -> int:
        return self.statements.count("COMMIT")


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """``make(hook=None)``: a backend of ``kind`` on one store (each call a new
    instance, as another process would be)."""
    made: list[Any] = []

    def build(hook: Hook | None = None) -> Any:
        b: Any
        if kind == "jsonl":
            b = JsonlBackend(tmp_path / "root")
        elif kind == "postgres":
            from harness.faults._backends import PgStatementFaults
            from harness.persistence import PostgresBackend

            faults = None if hook is None else PgStatementFaults(hook.counter)
            b = PostgresBackend(
                request.getfixturevalue("pg_url"), schema=request.getfixturevalue("pg_schema"), faults=faults
            )
        else:
            b = SqliteBackend(tmp_path / "s.db", faults=hook)
        made.append(b)
        return b

    yield build
    for b in made:
        close = getattr(b, "close", None)
        if close is not None:
            close()


def seqs(backend: Backend, sid: str) -> list[int]:
    return [r["seq"] for r in backend.load(sid).records]


def test_several_sessions_in_one_call_all_land(make: Any) -> None:
    b = make()
    b.materialize(header("a"), events(0, 2))
    b.materialize(header("b"), events(0, 1))
    results = group(b, [more("a", events(2, 3)), first("c", events(0, 2)), more("b", events(1, 1))])
    assert results == [None, None, None]
    assert b.load("a").records == events(0, 5)
    assert b.load("b").records == events(0, 2)
    assert b.load("c").records == events(0, 2) and b.load("c").header["cwd"] == "/w"


def test_a_refused_first_write_or_a_stale_seq_fails_only_that_batch(make: Any, kind: str) -> None:
    b = make()
    b.materialize(header("a"), events(0, 1))
    b.materialize(header("x"), events(0, 3))
    results = group(
        b,
        [
            more("a", events(1, 2)),
            first("x", events(0, 1)),  # exists: refused, as materialize would
            first("n", events(0, 1)),
            more("x", events(1, 1)),  # does not continue the stored log (next seq is 3)
        ],
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], SessionLogExistsError) and results[1].session_id == "x"
    assert seqs(b, "a") == [0, 1, 2]
    assert seqs(b, "n") == [0]
    if kind == "jsonl":
        return  # JSONL has no storage-level seq check (the session core's is the one)
    assert isinstance(results[3], SessionCorruptionError) and results[3].session_id == "x"
    assert b.load("x").records == events(0, 3)  # untouched by either refused batch


def test_two_batches_of_one_session_land_in_the_order_given(make: Any, kind: str) -> None:
    b = make()
    b.materialize(header("a"), events(0, 1))
    results = group(b, [more("a", events(1, 2)), first("b", events(0, 1)), more("a", events(3, 1))])
    assert results == [None, None, None]
    assert b.load("a").records == events(0, 4)
    # The first write and an append of the same new session in one group.
    assert group(b, [first("c", events(0, 2)), more("c", events(2, 2))]) == [None, None]
    assert b.load("c").records == events(0, 4)
    if kind == "jsonl":
        return  # no storage-level seq check
    # Out of order: the second batch is checked against the log the first one left.
    results = group(b, [more("a", events(5, 1)), more("a", events(4, 1))])
    assert isinstance(results[0], SessionCorruptionError) and results[1] is None
    assert seqs(b, "a") == [0, 1, 2, 3, 4]


def test_a_lost_lease_fails_only_that_session(make: Any, kind: str) -> None:
    if kind == "jsonl":
        pytest.skip("JSONL leases are flocks: they cannot be taken over from a live holder")
    b = make()
    la = b.acquire_writer(header("a"))
    b.materialize(header("a"), events(0, 1), lease=la)
    stale = b.acquire_writer(header("s"))
    b.materialize(header("s"), events(0, 1), lease=stale)
    stale.release()
    taker = make()
    fresh = taker.acquire_writer(header("s"))  # a new writer (fence 2) took the session over
    try:
        results = group(b, [more("a", events(1, 1), la), more("s", events(1, 2), stale), more("a", events(2, 1), la)])
        assert results[0] is None and results[2] is None
        err = results[1]
        assert isinstance(err, LeaseLostError) and err.session_id == "s" and "2 event(s) were not written" in str(err)
        assert seqs(b, "a") == [0, 1, 2] and seqs(b, "s") == [0]
        assert group(taker, [more("s", events(1, 1), fresh)]) == [None]
    finally:
        fresh.release()
        la.release()


def test_a_record_the_store_cannot_hold_fails_only_its_batch(make: Any, kind: str) -> None:
    b = make()
    b.materialize(header("a"), events(0, 1))
    b.materialize(header("z"), events(0, 1))
    bad = events(1, 3)
    bad[2]["data"] = {"n": 2**70}  # past what JSON (and so every backend) can encode
    results = group(b, [more("z", bad), more("a", events(1, 1))])
    assert isinstance(results[0], RecordEncodingError) and results[1] is None
    assert seqs(b, "z") == [0]  # none of the batch, not its first rows either
    assert seqs(b, "a") == [0, 1]


def test_a_batch_behind_a_failed_batch_of_its_session_never_lands(make: Any) -> None:
    """Found by the group-write scenario: write_each wrote a session's later batch after
    its earlier one failed, leaving a gap in a JSONL log (no storage seq check there)."""
    b = make()
    b.materialize(header("a"), events(0, 1))
    b.materialize(header("o"), events(0, 1))
    bad = events(1, 2)
    bad[1]["data"] = {"n": 2**70}
    results = group(b, [more("a", bad), more("o", events(1, 1)), more("a", events(3, 1))])
    assert isinstance(results[0], RecordEncodingError) and results[1] is None
    assert isinstance(results[2], PersistenceError) and results[2].session_id == "a"
    assert seqs(b, "a") == [0]
    assert seqs(b, "o") == [0, 1]


class FailCommit(SqliteFaults):
    """The faults layer failing the next ``COMMIT`` once :attr:`armed` (SQLite: an I/O
    error; PostgreSQL through ``PgStatementFaults``: the commit runs, its answer is lost)."""

    armed = False

    def before(self, sql: str) -> None:
        if self.armed and sql == "COMMIT" and not self.injected:
            self.fail_at = self.count + 1
        super().before(sql)


def test_a_failed_commit_reports_every_batch(make: Any, kind: str) -> None:
    if kind == "jsonl":
        pytest.skip("JSONL has no commit (its round of fsyncs is tested with its write_group)")
    counter = FailCommit(error="ioerr")
    hook = Hook(counter)
    b = make(hook)
    b.materialize(header("a"), events(0, 1))
    b.materialize(header("b"), events(0, 1))
    start = len(hook.statements)
    plan = [
        more("a", events(1, 1)),
        first("c", events(0, 1)),
        more("b", events(1, 2)),
        more("a", events(2, 1)),
        more("c", events(1, 1)),
    ]
    counter.armed = True
    results = group(b, plan)
    assert [sql for _n, sql in counter.injected] == ["COMMIT"]
    assert hook.statements[start:].count("COMMIT") == 1  # one commit for the group, and it failed
    assert [type(r) for r in results] == [StorageIOError] * 5
    assert [getattr(r, "session_id", None) for r in results] == ["a", "c", "b", "a", "c"]
    assert len({id(r) for r in results}) == 5  # each waiter raises its own object
    if kind == "sqlite":
        assert all("commit failed" in str(r) for r in results)
        assert seqs(b, "a") == [0] and seqs(b, "b") == [0]  # none landed
        assert b.revision("c") is None
    else:
        # The COMMIT landed, its answer was lost: the outcome is unknown to the caller.
        assert all("outcome is unknown" in str(r) for r in results)
    # Retried, the same group lands (PostgreSQL: it recognises its own writes, also a
    # batch that a later one of the same group now follows in the log), once.
    assert group(b, plan) == [None] * 5
    assert seqs(b, "a") == [0, 1, 2] and seqs(b, "b") == [0, 1, 2] and seqs(b, "c") == [0, 1]


def test_one_commit_for_a_group_of_several_sessions(make: Any, kind: str) -> None:
    if kind == "jsonl":
        pytest.skip("JSONL commits nothing: its round of fsyncs is the group engineer's to count")
    hook = Hook()
    b = make(hook)
    for sid in "abcd":
        b.materialize(header(sid), events(0, 1))
    before = hook.commits()
    results = b.write_group([more(sid, events(1, 1)) for sid in "dcba"] + [first("e", events(0, 1))])
    assert results == [None] * 5
    assert hook.commits() - before == 1  # write_each: five
    assert hook.statements[-1] == "COMMIT"
    assert [seqs(b, sid) for sid in "abcde"] == [[0, 1]] * 4 + [[0]]


def test_sqlite_a_failed_statement_of_one_batch_fails_only_that_batch(tmp_path: Path) -> None:
    """An I/O error at one batch's insert (the transaction still open) rolls back that
    batch's savepoint: the others commit."""
    counter = SqliteFaults()
    b = SqliteBackend(tmp_path / "s.db", faults=counter)
    try:
        b.materialize(header("a"), events(0, 1))
        b.materialize(header("b"), events(0, 1))
        plan = [more("a", events(1, 1)), more("b", events(1, 1))]
        start = counter.count
        probe = SqliteBackend(tmp_path / "probe.db", faults=(dry := SqliteFaults()))
        probe.materialize(header("a"), events(0, 1))
        probe.materialize(header("b"), events(0, 1))
        mark = dry.count
        assert probe.write_group(plan) == [None, None]
        probe.close()
        group_statements = dry.statements[mark:]
        inserts = [i for i, s in enumerate(group_statements) if s.startswith("INSERT INTO events")]
        assert len(inserts) == 2
        counter.fail_at = start + inserts[1] + 1  # b's insert
        results = b.write_group(plan)
        assert counter.injected and counter.injected[0][1].startswith("INSERT INTO events")
        assert results[0] is None
        assert isinstance(results[1], StorageIOError) and results[1].session_id == "b"
        assert "database or disk is full" in str(results[1])
        assert seqs(b, "a") == [0, 1] and seqs(b, "b") == [0]
    finally:
        b.close()


def test_sqlite_a_group_of_one_is_exactly_an_append(tmp_path: Path) -> None:
    """No savepoint for a lone batch: the statements are those of ``append``."""
    solo, grouped = Hook(), Hook()
    b1 = SqliteBackend(tmp_path / "1.db", faults=solo)
    b2 = SqliteBackend(tmp_path / "2.db", faults=grouped)
    try:
        for b in (b1, b2):
            b.materialize(header("a"), events(0, 1))
        m1, m2 = len(solo.statements), len(grouped.statements)
        b1.append("a", events(1, 2))
        assert b2.write_group([more("a", events(1, 2))]) == [None]
        assert grouped.statements[m2:] == solo.statements[m1:]
        with pytest.raises(SessionCorruptionError) as alone:
            b1.append("a", events(9, 1))
        (err,) = b2.write_group([more("a", events(9, 1))])
        assert type(err) is type(alone.value) and str(err) == str(alone.value)
    finally:
        b1.close()
        b2.close()


def test_sqlite_an_io_error_that_ends_the_transaction_fails_the_whole_group(tmp_path: Path) -> None:
    """SQLite rolls a whole transaction back on some I/O errors: then no batch of the
    group landed, and every one is reported, even those written before it."""
    b = SqliteBackend(tmp_path / "s.db")
    try:
        b.materialize(header("a"), events(0, 1))
        b.materialize(header("b"), events(0, 1))
        real = b._append_in

        def append_in(db: sqlite3.Connection, sid: str, records: Any, lease: Any) -> None:
            if sid == "b":
                db.execute("ROLLBACK")  # what SQLite's automatic rollback leaves behind
                raise sqlite3.OperationalError("disk I/O error")
            real(db, sid, records, lease)

        b._append_in = append_in  # type: ignore[method-assign]
        results = b.write_group([more("a", events(1, 1)), more("b", events(1, 1))])
        assert [type(r) for r in results] == [StorageIOError, StorageIOError]
        assert [getattr(r, "session_id", None) for r in results] == ["a", "b"]
        del b._append_in
        assert seqs(b, "a") == [0] and seqs(b, "b") == [0]
        assert b.write_group([more("a", events(1, 1)), more("b", events(1, 1))]) == [None, None]
    finally:
        b.close()


# -- the group-write chaos scenario ---------------------------------------------------------------


def test_the_group_write_scenario_finds_a_batch_not_rolled_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario's invariants bite: with a batch's savepoint released instead of
    rolled back (its rows kept), an I/O failure at its insert leaves rows of a batch
    reported failed; the real write_group passes at every statement."""
    from harness.faults import explore_io
    from harness.faults._scenarios import select_scenarios

    (scenario,) = select_scenarios(["group-write/sqlite"])
    assert not explore_io(scenario, errors=["full"], stride=2).violations

    def keep_the_batch(self: SqliteBackend, db: sqlite3.Connection, w: GroupWrite, params: Any, saved: bool) -> Any:
        self._exec(db, "SAVEPOINT harness_group_batch")
        try:
            self._group_write(db, w, params)
        except Exception as exc:
            return StorageIOError(str(exc), session_id=w.session_id)
        finally:
            self._exec(db, "RELEASE harness_group_batch")
        return None

    monkeypatch.setattr(SqliteBackend, "_group_batch", keep_the_batch)
    report = explore_io(scenario, errors=["full"], stride=2)
    assert any("were reported durable" in v.message for v in report.violations), report.distinct()


# -- JSONL: the remembered log is taken on trust (no stat per append) --------------------------


@pytest.mark.parametrize("through", ["append", "write_group"])
def test_jsonl_an_append_to_a_log_deleted_behind_its_back_is_not_found(tmp_path: Path, through: str) -> None:
    writer, other = JsonlBackend(tmp_path), JsonlBackend(tmp_path)
    writer.materialize(header("s"), events(0, 1))
    other.delete("s")  # another instance (process): ``writer`` still remembers the path
    if through == "append":
        with pytest.raises(PersistedSessionNotFoundError, match='session "s" not found'):
            writer.append("s", events(1, 1))
    else:
        (err,) = writer.write_group([more("s", events(1, 1))])
        assert isinstance(err, PersistedSessionNotFoundError)
    assert JsonlBackend(tmp_path).list_headers() == []


@pytest.mark.parametrize("through", ["append", "write_group"])
def test_jsonl_an_append_follows_a_log_re_created_in_another_project(tmp_path: Path, through: str) -> None:
    # The remembered path is gone; the id now lives under another cwd: the append goes
    # there, as ``locate`` finds it (what the stat before every append used to tell).
    writer, other = JsonlBackend(tmp_path), JsonlBackend(tmp_path)
    writer.materialize(header("s"), events(0, 1))
    other.delete("s")
    other.materialize({**header("s"), "cwd": "/elsewhere"}, events(0, 1))
    if through == "append":
        writer.append("s", events(1, 1))
    else:
        assert writer.write_group([more("s", events(1, 1))]) == [None]
    stored = JsonlBackend(tmp_path).load("s")
    assert stored.header["cwd"] == "/elsewhere" and seqs(JsonlBackend(tmp_path), "s") == [0, 1]
