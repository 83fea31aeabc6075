"""The suite's PostgreSQL (``tests/pgkit.py``) and its fixtures: a real server starts, each test's
database is its own, LISTEN/NOTIFY crosses connections, a drop removes a database, and
``both_stores`` runs a test once per store."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest
from pgkit import PgServer, dbname_of


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {row[0] for row in rows}


def _databases(server: PgServer) -> set[str]:
    with psycopg.connect(server.dsn()) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database").fetchall()}


def test_server_runs_the_installed_version_with_the_test_settings(pg_server: PgServer) -> None:
    with psycopg.connect(pg_server.dsn()) as conn:
        version = conn.execute("SHOW server_version_num").fetchone()
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'synchronous_commit', 'full_page_writes', 'max_connections', 'listen_addresses')"
            ).fetchall()
        )
        user = conn.execute("SELECT current_user").fetchone()
    assert version is not None and int(version[0]) // 10000 == int(pg_server.bin_dir.parent.name)
    assert settings == {
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "max_connections": "200",
        "listen_addresses": "127.0.0.1",
    }
    assert user == ("goald",)
    assert pg_server.dsn("x") == f"postgresql://goald@127.0.0.1:{pg_server.port}/x"
    if os.geteuid() == 0:
        # initdb refuses root: the cluster belongs to the postgres user.
        assert pg_server.data_dir.stat().st_uid != 0
    # The unix socket is in the server's own directory.
    with psycopg.connect(host=str(pg_server.socket_dir), port=pg_server.port, user="goald", dbname="postgres") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_two_databases_are_independent(pg_server: PgServer) -> None:
    first, second = pg_server.create_database(), pg_server.create_database()
    try:
        assert first != second
        with psycopg.connect(first) as conn:
            conn.execute("CREATE TABLE only_here (id INTEGER PRIMARY KEY)")
        assert _tables(first) == {"only_here"}
        assert _tables(second) == set()
    finally:
        pg_server.drop_database(dbname_of(first))
        pg_server.drop_database(dbname_of(second))


def test_listen_notify_crosses_connections(pg_dsn: str) -> None:
    with (
        psycopg.connect(pg_dsn, autocommit=True) as listener,
        psycopg.connect(pg_dsn, autocommit=True) as sender,
    ):
        listener.execute("LISTEN wake")
        with sender.transaction():
            sender.execute("SELECT pg_notify('wake', 'session-7')")
        got = list(listener.notifies(timeout=10, stop_after=1))
        assert [(n.channel, n.payload, n.pid) for n in got] == [("wake", "session-7", sender.info.backend_pid)]


def test_drop_database_removes_it_with_its_connections(pg_server: PgServer) -> None:
    dsn = pg_server.create_database()
    name = dbname_of(dsn)
    assert name in _databases(pg_server)
    with psycopg.connect(dsn) as left_open:
        pg_server.drop_database(name)
        assert name not in _databases(pg_server)
        with pytest.raises(psycopg.OperationalError):
            left_open.execute("SELECT 1")
    pg_server.drop_database(name)  # already gone: nothing to do


@pytest.mark.parametrize("name", ["postgres", "template1", "Robert'); DROP", ""])
def test_drop_database_refuses_what_is_not_a_test_database(pg_server: PgServer, name: str) -> None:
    before = _databases(pg_server)
    with pytest.raises(ValueError, match="not a test database name"):
        pg_server.drop_database(name)
    assert _databases(pg_server) == before


@pytest.mark.both_stores
def test_both_stores_gives_db_path_per_store(request: pytest.FixtureRequest, db_path: Path | str) -> None:
    store = request.node.callspec.params["db_path"]
    if store == "sqlite":
        assert isinstance(db_path, Path) and db_path.name == "goald.db" and not db_path.exists()
    else:
        assert store == "postgresql"
        assert isinstance(db_path, str) and db_path.startswith("postgresql://goald@127.0.0.1:")
        assert _tables(db_path) == set()


def test_unmarked_tests_keep_a_sqlite_path(request: pytest.FixtureRequest, db_path: Path | str) -> None:
    assert not hasattr(request.node, "callspec")
    assert isinstance(db_path, Path) and db_path.name == "goald.db"
