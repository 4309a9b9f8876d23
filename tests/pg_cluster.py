"""The throwaway PostgreSQL cluster of the test suite (a pytest plugin: fixtures).

``pg_cluster`` (session scope) starts one cluster with
:func:`harness.persistence._postgres_cluster.start_cluster` (a temporary directory, a
free loopback port, run as the ``postgres`` user when we are root) and destroys it at
the end of the run. Without the server binaries or psycopg, every test that uses it is
skipped, saying why.

``pg_schema`` gives each test its own PostgreSQL schema name in the one database:
creating a namespace is far cheaper than a database, and a backend owns exactly one.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from harness.persistence._postgres_cluster import PgCluster, missing, start_cluster

__all__ = ["PgCluster", "pass_expiry", "pg_cluster", "pg_schema", "pg_url"]


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    why = missing()
    if why is not None:
        pytest.skip(f"{why}: PostgreSQL tests skipped")
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def pg_schema() -> str:
    return f"t_{secrets.token_hex(6)}"


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    return pg_cluster.url


def pass_expiry(url: str, schema: str, sid: str) -> None:
    """The server's clock passes the lease of ``sid``'s expiry, without waiting for it.

    Every lease decision of the PostgreSQL backend compares the row's ``expires`` with
    the server's ``clock_timestamp()``, so moving ``expires`` back is moving the server's
    "now" forward for this lease: tests use it instead of sleeping through a TTL (a test
    hook, nothing the backend does). It waits on the row lock like any writer."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {schema}.leases SET expires = clock_timestamp() - interval '1 millisecond' WHERE session_id = %s",
            (sid,),
        )
