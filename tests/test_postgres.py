"""The PostgreSQL backend beyond the shared contract (tests/test_backends.py): schema
identity, packed rows and seeks, leases with fencing, in-doubt retries, connection
hygiene under cancellation, and the coordinator on top. Needs tests/pg_cluster.py."""

from __future__ import annotations

import pytest

# psycopg is in the "test" extra; without it these tests skip instead of failing to import.
pytest.importorskip("psycopg", reason="psycopg not installed: PostgreSQL tests skipped")

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import trio

from harness.errors import (
    FlushError,
    LeaseLostError,
    SessionCorruptionError,
    SessionLockedError,
    StorageIOError,
)
from harness.persistence import PostgresBackend, PostgresSchemaError, open_persistence
from harness.persistence._postgres_schema import SCHEMA_VERSION
from harness.runtime import open_store
from tests.helpers import rec, user
from tests.pg_cluster import pass_expiry

H: dict[str, Any] = {"version": 0, "id": "s", "createdAt": 1, "cwd": "/w"}


def events(start: int, n: int) -> list[dict[str, Any]]:
    return [rec("user/message", i, user(f"m{i}"), surfaceOp="append") for i in range(start, start + n)]


def chunks(start: int, n: int, text: str = "x") -> list[dict[str, Any]]:
    return [
        {
            "type": "assistant/chunk",
            "seq": i,
            "time": 1000 + i,
            "data": {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": f"{text}{i}"}},
        }
        for i in range(start, start + n)
    ]


def sql(url: str, stmt: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(stmt, params)
        return cur.fetchall() if cur.description is not None else []


@pytest.fixture
def make(pg_url: str, pg_schema: str) -> Iterator[Any]:
    """``make(**kw)``: a backend on this test's schema; all closed at the end."""
    made: list[PostgresBackend] = []

    def build(**kw: Any) -> PostgresBackend:
        b = PostgresBackend(pg_url, schema=pg_schema, **kw)
        made.append(b)
        return b

    yield build
    for b in made:
        b.close()


# -- schema identity ------------------------------------------------------------------------


def tables(url: str, schema: str) -> list[str]:
    return [
        r[0]
        for r in sql(
            url,
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY 1",
            (schema,),
        )
    ]


def test_schema_is_created_once_with_an_identity_row(make: Any, pg_url: str, pg_schema: str) -> None:
    backends = [make() for _ in range(4)]
    errors: list[BaseException] = []

    def first_use(b: PostgresBackend) -> None:
        try:
            b.list_headers()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(b,)) for b in backends]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []  # concurrent first opens: one creates, the others find it
    assert tables(pg_url, pg_schema) == ["events", "leases", "meta", "sessions"]
    [(app, version, store)] = sql(pg_url, f"SELECT application, schema_version, store_id FROM {pg_schema}.meta")
    assert (app, version) == ("trio-harness", SCHEMA_VERSION)
    backends[0].materialize(H, events(0, 1))
    assert str(store) in (backends[1].revision("s") or "")


def test_a_foreign_schema_is_refused_untouched(make: Any, pg_url: str, pg_schema: str) -> None:
    sql(pg_url, f"CREATE SCHEMA {pg_schema}")
    sql(pg_url, f"CREATE TABLE {pg_schema}.orders (id int)")
    with pytest.raises(PostgresSchemaError) as info:
        make().list_headers()
    assert info.value.code == "POSTGRES_SCHEMA_INCOMPATIBLE" and info.value.schema == pg_schema
    assert f'schema "{pg_schema}" holds tables (orders)' in str(info.value)
    assert tables(pg_url, pg_schema) == ["orders"]


@pytest.mark.parametrize(
    ("app", "version", "words"),
    [("other-app", SCHEMA_VERSION, "belongs to application 'other-app'"), ("trio-harness", SCHEMA_VERSION + 1, "newer")],
)
def test_another_application_or_a_newer_version_is_refused(
    make: Any, pg_url: str, pg_schema: str, app: str, version: int, words: str
) -> None:
    make().list_headers()
    sql(pg_url, f"UPDATE {pg_schema}.meta SET application = %s, schema_version = %s", (app, version))
    with pytest.raises(PostgresSchemaError, match=words) as info:
        make().materialize(H, events(0, 1))
    assert info.value.schema_version == version
    assert sql(pg_url, f"SELECT count(*) FROM {pg_schema}.sessions") == [(0,)]


def test_bad_schema_names_are_refused(pg_url: str) -> None:
    for bad in ("Public", "a;drop", "", "x" * 64):
        with pytest.raises(ValueError, match="schema name"):
            PostgresBackend(pg_url, schema=bad)


# -- rows -----------------------------------------------------------------------------------


def test_chunk_runs_are_packed_and_suffix_reads_seek(make: Any, pg_url: str, pg_schema: str) -> None:
    b = make()
    big = rec("user/message", 103, user("big", "lorem ipsum " * 2000))  # compressed: data_z
    b.materialize(H, chunks(0, 100) + events(100, 3) + [big])
    b.append("s", chunks(104, 50))
    rows = sql(pg_url, f"SELECT seq, type, data IS NULL FROM {pg_schema}.events ORDER BY seq")
    assert [r[:2] for r in rows] == [(0, "text-chunks"), (100, "user/message"), (101, "user/message"),
                                     (102, "user/message"), (103, "user/message"), (104, "text-chunks")]
    assert [r[2] for r in rows] == [False, False, False, False, True, False]
    full = b.load("s").records
    assert full == [*chunks(0, 100), *events(100, 3), big, *chunks(104, 50)]
    tail = b.load_from("s", 120)  # inside the second packed row
    assert tail.records == full[120:] and tail.revision == b.revision("s")
    assert b.load_from("s", 50).records == full[50:]


def test_a_torn_tail_is_reported_and_repaired(make: Any, pg_url: str, pg_schema: str) -> None:
    b = make()
    b.materialize(H, events(0, 2))
    sql(pg_url, f"INSERT INTO {pg_schema}.events (session_id, seq, type, time, data) VALUES ('s', 2, 'x', 1, '{{bad')")
    stored = b.load("s")
    assert stored.truncate_to == 2 and len(stored.records) == 2
    with pytest.raises(SessionCorruptionError, match="invalid physical tail at seq 2"):
        b.append("s", events(2, 1))
    b.commit_repair("s", 2, events(2, 1))
    assert b.load("s").records == events(0, 3) and b.load("s").truncate_to is None


def test_appends_must_continue_the_log_but_an_exact_retry_is_absorbed(make: Any) -> None:
    b = make()
    b.materialize(H, events(0, 2))
    with pytest.raises(SessionCorruptionError, match="stored next seq is 2"):
        b.append("s", events(5, 1))
    b.append("s", events(2, 3))
    rev = b.revision("s")
    b.append("s", events(2, 3))  # the same batch again (its commit's outcome was unknown)
    assert b.revision("s") == rev
    b.append("s", events(3, 4))  # a retry merged with newer events: only 5 and 6 land
    assert b.load("s").records == events(0, 7)
    b.append("s", chunks(7, 10))  # one packed row, 7..16
    b.append("s", chunks(12, 8))  # a retry whose stored head ends inside that row
    assert b.load("s").records == [*events(0, 7), *chunks(7, 13)]
    changed = events(5, 3)
    changed[0]["data"]["id"] = "other"
    with pytest.raises(SessionCorruptionError, match="starts at seq 5, stored next seq is 20"):
        b.append("s", changed)  # not what is stored: refused, not overwritten
    assert b.load("s").records == [*events(0, 7), *chunks(7, 13)]


# -- leases and fencing -----------------------------------------------------------------------


def lease_row(url: str, schema: str) -> tuple[Any, ...]:
    [row] = sql(url, f"SELECT fence, token, host, pid FROM {schema}.leases WHERE session_id = 's'")
    return row


def lease_remaining_ms(url: str, schema: str, sid: str = "s") -> int:
    [(ms,)] = sql(url, f"SELECT (extract(epoch FROM expires - clock_timestamp()) * 1000)::bigint FROM {schema}.leases WHERE session_id = %s", (sid,))
    return int(ms)


def test_a_live_lease_is_respected_and_names_its_holder(make: Any) -> None:
    a, b = make(host="host-a"), make(host="host-b")
    lease = a.acquire_writer(H)
    with pytest.raises(SessionLockedError) as info:
        b.acquire_writer(H)
    assert info.value.code == "SESSION_LOCKED" and f"process {os.getpid()} on host-a" in str(info.value)
    assert info.value.holder["fence"] == 1  # type: ignore[index]
    with pytest.raises(SessionLockedError, match="without its lease"):
        b.materialize(H, events(0, 1))
    assert b.lock_held(H)
    lease.release()
    assert not b.lock_held(H)
    b.acquire_writer(H).release()


def test_fencing_refuses_a_writer_whose_lease_was_taken_over(make: Any, pg_url: str, pg_schema: str) -> None:
    first = make(host="host-a", lease_ttl=3600)
    old = first.acquire_writer(H)
    first.materialize(H, events(0, 2), lease=old)
    first._keeper.stop()  # a frozen process renews nothing
    pass_expiry(pg_url, pg_schema, "s")  # the lease expires; its holder is "alive" on another host
    second = make(host="host-b")
    new = second.acquire_writer(H)
    assert lease_row(pg_url, pg_schema)[0] == 2  # the fence grew
    with pytest.raises(LeaseLostError) as info:
        first.append("s", events(2, 3), lease=old)
    err = info.value
    assert err.code == "LEASE_LOST" and isinstance(err, SessionLockedError) and err.session_id == "s"
    assert "fence 1" in str(err) and "(fence 2)" in str(err) and "3 event(s) were not written" in str(err)
    with pytest.raises(LeaseLostError):
        first.commit_repair("s", None, events(2, 1), lease=old)
    with pytest.raises(LeaseLostError):
        old.renew()
    assert len(second.load("s").records) == 2  # none of its events landed
    old.release()  # releasing a lost lease leaves the new holder alone
    second.append("s", events(2, 1), lease=new)
    assert second.lock_held(H)
    new.release()


def test_the_keeper_renews_an_idle_lease_and_a_dead_holder_is_taken_over(make: Any) -> None:
    a = make(host="host-a", lease_ttl=60)  # no real expiry or timed round during the test
    keeper = a._leases.keeper
    # The keeper's rounds pass through a gate: the test, not a timer, decides when the
    # server's clock passes the TTL (before the round renews) and waits for the round.
    gate, rounds = threading.Event(), threading.Semaphore(0)
    renew_all = keeper._renew_all

    def gated(leases: list[Any]) -> set[str]:
        gate.wait()
        try:
            return renew_all(leases)
        finally:
            rounds.release()

    keeper._renew_all = gated
    lease = a.acquire_writer(H)
    pass_expiry(a.url, a.schema, "s")  # idle past its TTL: only the keeper's renewal keeps it
    assert lease_remaining_ms(a.url, a.schema) <= 0
    gate.set()
    with keeper._wake:
        keeper._wake.notify_all()  # the round now (missed if the thread is not waiting yet: then at 20 s)
    assert rounds.acquire(timeout=120)  # a bound on a broken run, not the verdict
    assert lease_remaining_ms(a.url, a.schema) > 0
    with pytest.raises(SessionLockedError):
        make(host="host-b").acquire_writer(H)
    lease.release()
    # A holder on this host whose process is gone is provably dead: no wait for expiry.
    c = make(lease_ttl=3600)
    mine = c.acquire_writer(H)
    sql(c.url, f"UPDATE {c.schema}.leases SET pid = %s, host = %s", (2**22 + 12345, socket.gethostname()))
    taken = make().acquire_writer(H)
    with pytest.raises(LeaseLostError):
        c.append("s", events(0, 1), lease=mine)
    taken.release()


def test_fences_never_repeat_even_across_delete(make: Any, pg_url: str, pg_schema: str) -> None:
    b = make()
    for expected in (1, 2, 3):
        lease = b.acquire_writer(H)
        assert lease_row(pg_url, pg_schema)[0] == expected
        b.materialize(H, events(0, 1), lease=lease)
        b.delete("s")
        lease.release()


async def test_a_writer_fenced_off_fails_its_flush_and_writes_nothing(make: Any, pg_url: str, pg_schema: str) -> None:
    backend = make()
    async with open_store() as store:
        with pytest.raises(Exception, match="closing failed"):
            async with open_persistence(store, backend):
                s = await store.create("s", cwd="/w")
                await s.append("feedback/record", 0)
                await s.flush()
                # Someone decided the lease was stale and took it over.
                sql(pg_url, f"UPDATE {pg_schema}.leases SET fence = 99, token = 'x', host = 'elsewhere', pid = 1")
                await s.append("feedback/record", 1)
                with pytest.raises(FlushError) as info:
                    await s.flush()
                assert isinstance(info.value.__cause__, LeaseLostError)
    assert len(make().load("s").records) == 1


# -- connections ----------------------------------------------------------------------------


def activity(url: str, app: str) -> list[str]:
    return [
        r[0]
        for r in sql(url, "SELECT state FROM pg_stat_activity WHERE application_name = %s ORDER BY 1", (app,))
    ]


async def test_a_cancelled_wait_leaves_no_open_transaction(make: Any, pg_url: str, pg_schema: str) -> None:
    """A Trio caller that stops waiting for a blocked write (abandoning its thread):
    the write finishes on its own once unblocked, and every pooled connection ends
    idle, outside any transaction, and usable."""
    b = make(application_name="cancel-test")
    b.materialize(H, events(0, 1))
    blocker = psycopg.connect(pg_url, autocommit=True)
    try:
        blocker.execute("BEGIN")
        blocker.execute(f"SELECT 1 FROM {pg_schema}.sessions WHERE id = 's' FOR UPDATE")  # the append waits on it
        with trio.move_on_after(0.5) as scope:
            await trio.to_thread.run_sync(b.append, "s", events(1, 1), abandon_on_cancel=True)
        assert scope.cancelled_caught
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()
    for _ in range(200):  # the abandoned thread completes its transaction
        if len(b.load("s").records) == 2:
            break
        await trio.sleep(0.05)
    assert b.load("s").records == events(0, 2)
    assert set(activity(pg_url, "cancel-test")) <= {"idle", "active"}  # "active": this probe's own kind
    assert "idle in transaction" not in activity(pg_url, "cancel-test")


def test_an_interrupted_call_closes_its_connection(make: Any, pg_url: str) -> None:
    """A BaseException inside a transaction (here, from the statement hook) drops the
    connection rather than returning it to the pool mid-transaction."""

    class Interrupt(BaseException):
        pass

    class Hook:
        armed = False

        def before(self, stmt: str) -> None:
            if self.armed and stmt.startswith("COPY"):
                self.armed = False
                raise Interrupt

    hook = Hook()
    b = make(faults=hook, application_name="interrupt-test", pool_size=1)
    b.materialize(H, events(0, 1))
    hook.armed = True
    with pytest.raises(Interrupt):
        b.append("s", events(1, 2))
    assert "idle in transaction" not in activity(pg_url, "interrupt-test")
    b.append("s", events(1, 2))  # the pool's one connection was replaced
    assert b.load("s").records == events(0, 3)


def test_a_terminated_connection_mid_transaction_is_a_typed_error_and_loses_nothing(make: Any, pg_url: str) -> None:
    """``pg_terminate_backend`` from another connection just before the batch's
    ``COPY`` and, separately, just before its ``COMMIT``: a typed error naming the
    session, no half batch, and the next call works on a fresh connection."""

    class Terminate:
        at: str | None = None

        def before(self, stmt: str) -> None:
            if self.at is not None and stmt.startswith(self.at):
                self.at = None
                sql(
                    pg_url,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'terminate-test' AND pid <> pg_backend_pid()",
                )

    hook = Terminate()
    b = make(faults=hook, application_name="terminate-test")
    b.materialize(H, events(0, 2))
    hook.at = "COPY"
    with pytest.raises(StorageIOError) as info:
        b.append("s", events(2, 3))
    assert info.value.code == "STORAGE_IO" and 'session "s"' in str(info.value)
    assert b.load("s").records == events(0, 2)  # nothing of the batch
    hook.at = "COMMIT"
    with pytest.raises(StorageIOError, match="COMMIT"):
        b.append("s", events(2, 3))
    assert b.load("s").records == events(0, 2)  # the commit never reached the server
    b.append("s", events(2, 3))  # the retry lands whole
    assert b.load("s").records == events(0, 5)


# -- configuration by URL -------------------------------------------------------------------


async def test_open_runtime_and_the_sessions_cli_take_a_postgres_url(pg_url: str, pg_schema: str) -> None:
    import orjson

    from harness import open_runtime
    from harness._runtime_api import RuntimeConfigError
    from harness.cli.sessions import run

    url = f"{pg_url}#{pg_schema}"
    async with open_runtime(url) as rt:
        assert rt.persistence is not None and rt.persistence.backend.name == "postgres"
        built = rt.persistence.backend
        s = await rt.store.create("s", cwd="/w")
        await s.append("feedback/record", 0)
        await s.flush()
    with pytest.raises(StorageIOError, match="is closed"):  # the runtime closed the pool it made
        built.list_headers()
    with pytest.raises(RuntimeConfigError, match="postgresql://"):
        async with open_runtime("/tmp/x", backend="postgres"):
            pass

    def sessions(*args: str) -> tuple[int, Any]:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = run(["sessions", "--root", url, *args])
        return code, orjson.loads(out.getvalue()) if out.getvalue().strip() else None

    code, listed = await trio.to_thread.run_sync(sessions, "list", "--json")
    assert code == 0 and listed["backend"] == "postgres"
    assert [x["id"] for x in listed["sessions"]] == ["s"] and listed["sessions"][0]["cwd"] == "/w"
    # A reading command never creates a store: an absent schema is an error, left absent.
    absent = f"{pg_schema}_absent"
    url = f"{pg_url}#{absent}"
    code, _ = await trio.to_thread.run_sync(sessions, "list", "--json")
    assert code != 0
    assert tables(pg_url, absent) == []


def test_an_exact_retry_is_recognised_far_into_a_log_with_packed_rows(make: Any) -> None:
    b = make()
    b.materialize(H, chunks(0, 1024) + events(1024, 76))  # one packed row 0..1023, then scalars
    b.append("s", events(1050, 60))  # a retry of 1050..1099 merged with 1100..1109
    assert b.load("s").records == [*chunks(0, 1024), *events(1024, 86)]


def test_bench_runs_w5_and_w7_on_postgres_beside_jsonl_and_sqlite(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import orjson

    from harness.bench import run_bench
    from harness.bench._backends import URL_ENV

    monkeypatch.setenv(URL_ENV, pg_url)
    assert run_bench(["W5", "W7"], n=300, runs=1, as_json=True, backend="postgres") == 0
    figures = orjson.loads(capsys.readouterr().out)
    for key in ("W5-write", "W5-load", "W7", "W5-write-sqlite", "W5-load-postgres", "W5-write-postgres", "W7-postgres"):
        assert figures[key]["median_ms"] > 0 and figures[key]["n"] == 300, key
    leftover = sql(pg_url, "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", ("bench_%",))
    assert leftover == []  # the bench drops the schemas it made


def test_a_version_1_schema_is_upgraded_and_its_holders_are_remote(make: Any, pg_url: str, pg_schema: str) -> None:
    """A schema from before the pid scope (issue 24): opened, it gains the column and
    version 2; its lease rows name no scope, so even a holder of this host whose pid is
    gone is waited out (the old rule took it over at once)."""
    make().materialize(H, events(0, 1))
    sql(pg_url, f"ALTER TABLE {pg_schema}.leases DROP COLUMN pid_scope")
    sql(pg_url, f"UPDATE {pg_schema}.meta SET schema_version = 1")
    sql(
        pg_url,
        f"INSERT INTO {pg_schema}.leases (session_id, fence, token, host, pid, start_time, since, expires) "
        "VALUES ('s', 7, 'old', %s, %s, NULL, clock_timestamp(), clock_timestamp() + interval '1 hour')",
        (socket.gethostname(), 2**22 + 12345),
    )
    b = make()
    with pytest.raises(SessionLockedError) as info:
        b.acquire_writer(H)
    assert info.value.holder["pidScope"] is None  # type: ignore[index]
    assert sql(pg_url, f"SELECT schema_version FROM {pg_schema}.meta") == [(SCHEMA_VERSION,)] == [(2,)]
    assert sql(pg_url, f"SELECT pid_scope FROM {pg_schema}.leases") == [(None,)]
    sql(pg_url, f"UPDATE {pg_schema}.leases SET expires = clock_timestamp() - interval '1 second'")
    lease = b.acquire_writer(H)  # expired: taken over
    assert lease_row(pg_url, pg_schema)[0] == 8
    lease.release()
    assert [r["seq"] for r in make().load("s").records] == [0]


def test_a_failure_at_any_statement_of_the_upgrade_leaves_a_consistent_schema(
    make: Any, pg_url: str, pg_schema: str
) -> None:
    """The upgrade runs in the opening transaction: a failure at any of its statements
    leaves version 1 (no column) or, past the commit, version 2; the old row intact
    and respected either way."""

    class FailAt:
        def __init__(self, k: int | None) -> None:
            self.k, self.seen = k, []  # type: ignore[var-annotated]

        def before(self, stmt: str) -> None:
            self.seen.append(stmt)
            if len(self.seen) == self.k:
                raise psycopg.OperationalError(f"injected at statement {self.k}")

    make().materialize(H, events(0, 1))

    def downgrade() -> None:
        sql(pg_url, f"ALTER TABLE {pg_schema}.leases DROP COLUMN IF EXISTS pid_scope")
        sql(pg_url, f"UPDATE {pg_schema}.meta SET schema_version = 1")
        sql(pg_url, f"DELETE FROM {pg_schema}.leases")
        sql(
            pg_url,
            f"INSERT INTO {pg_schema}.leases (session_id, fence, token, host, pid, since, expires) "
            "VALUES ('s', 7, 'old', %s, %s, clock_timestamp(), clock_timestamp() + interval '1 hour')",
            (socket.gethostname(), 2**22 + 12345),
        )

    downgrade()
    dry = FailAt(None)
    with pytest.raises(SessionLockedError):
        make(faults=dry).acquire_writer(H)
    n = dry.seen.index(next(s for s in dry.seen if "ADD COLUMN" in s)) + 3  # through its COMMIT
    for k in range(1, n + 1):
        downgrade()
        with pytest.raises((StorageIOError, SessionLockedError)):
            make(faults=FailAt(k)).acquire_writer(H)
        [(version,)] = sql(pg_url, f"SELECT schema_version FROM {pg_schema}.meta")
        columns = [r[0] for r in sql(
            pg_url,
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = 'leases'",
            (pg_schema,),
        )]
        assert (version, "pid_scope" in columns) in {(1, False), (2, True)}, k
        assert sql(pg_url, f"SELECT fence, token FROM {pg_schema}.leases") == [(7, "old")], k
        with pytest.raises(SessionLockedError):
            make().acquire_writer(H)


class _Statements:
    """A statement hook that records every statement the backend runs."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def before(self, stmt: str) -> None:
        self.ran.append(stmt)


def test_an_append_locks_the_session_and_reads_its_tail_in_one_statement(make: Any) -> None:
    hook = _Statements()
    b = make(lease_ttl=3600, faults=hook)
    lease = b.acquire_writer(H)
    b.materialize(H, events(0, 2), lease=lease)
    mark = len(hook.ran)
    b.append("s", events(2, 3), lease=lease)
    ran = hook.ran[mark:]
    # BEGIN, the lease check, the locking tail read, COPY, the revision bump, COMMIT.
    assert len(ran) == 6, ran
    assert not any(s.startswith("SELECT header") for s in ran)  # no lock of its own
    b.append("s", events(5, 1), lease=lease)
    assert [r["seq"] for r in b.load("s").records] == list(range(6))


def test_an_unreachable_server_is_refused_at_once_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    # A new user's wrong URL: the pool waited out its 30 s timeout, logging one warning
    # per background retry, and the error said only "no connection to the server".
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now: connections are refused
    backend = PostgresBackend.from_url(f"postgresql://nobody@127.0.0.1:{port}/nowhere#lost")
    try:
        with caplog.at_level("WARNING"), pytest.raises(StorageIOError) as caught:
            backend.list_headers()
        message = str(caught.value)
        assert 'PostgreSQL schema "lost": connecting to the server failed' in message
        assert "refused" in message.lower() and str(port) in message
        assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
        with pytest.raises(StorageIOError):  # not opened: the next call tries again
            backend.list_headers()
    finally:
        backend.close()
