"""A test's own view of the store it runs on, SQLite or PostgreSQL, beside the store's connection.

The store contract tests (``pytest.mark.both_stores``) get ``db_path`` as a SQLite file or as a
PostgreSQL DSN, and look at the database through a second, independent connection: what is durable
is what another connection can read. :func:`connect` opens that connection for either store with
one surface, the one the transaction functions use (:class:`agent.db.Conn`): ``execute`` with
SQLite's ``?`` placeholders, rows that answer ``row[0]`` and ``row["name"]``, and ``close``. On
PostgreSQL it is autocommit, so a test's reads never hold a snapshot or a lock the store waits on.

Tests about SQLite itself (WAL, ``PRAGMA``, file modes, ``VACUUM``) call :func:`skip_unless_sqlite`;
:func:`tables` and :func:`schema` list what a migration made, from either store's catalogue.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent.db import PgConn, is_dsn

#: Where a test's store is: a SQLite file or a PostgreSQL DSN (the ``db_path`` fixture).
Location = Path | str


def is_postgres(location: Location) -> bool:
    """Whether ``location`` is a PostgreSQL DSN (else a SQLite file)."""
    return is_dsn(location)


def connect(location: Location) -> Any:
    """A new connection of its own to the store at ``location``; close it (``with closing(...)``)."""
    if is_dsn(location):
        return PgConn(psycopg.connect(str(location), autocommit=True))
    conn = sqlite3.connect(location)
    conn.row_factory = sqlite3.Row
    return conn


def skip_unless_sqlite(location: Location, why: str = "this is about SQLite itself") -> None:
    """Skip the running test on PostgreSQL, saying why."""
    if is_dsn(location):
        pytest.skip(f"SQLite only: {why}")


def scalar(location: Location, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row of ``sql`` on a fresh connection."""
    with contextlib.closing(connect(location)) as conn:
        return conn.execute(sql, params).fetchone()[0]


def schema(location: Location) -> dict[tuple[str, str], str]:
    """Every table, index and trigger (``(kind, name) -> definition``) of the store.

    SQLite: its ``sqlite_master`` (not the planner's statistics tables, which ``PRAGMA optimize``
    at close may create). PostgreSQL: the public schema's tables (each with its columns), indexes
    and triggers from the catalogue, so that two databases with the same schema compare equal."""
    with contextlib.closing(connect(location)) as conn:
        if not is_dsn(location):
            rows = conn.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_stat%'"
            ).fetchall()
            return {(r["type"], r["name"]): r["sql"] for r in rows}
        out: dict[tuple[str, str], str] = {}
        for r in conn.execute(
            "SELECT table_name, string_agg(column_name || ' ' || data_type || ' ' || is_nullable, ', '"
            " ORDER BY ordinal_position) AS cols FROM information_schema.columns"
            " WHERE table_schema = 'public' GROUP BY table_name"
        ):
            out[("table", r["table_name"])] = r["cols"]
        for r in conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"):
            out[("index", r["indexname"])] = r["indexdef"]
        for r in conn.execute(
            "SELECT t.tgname, pg_get_triggerdef(t.oid) AS def FROM pg_trigger t"
            " JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND NOT t.tgisinternal"
        ):
            out[("trigger", r["tgname"])] = r["def"]
        return out
