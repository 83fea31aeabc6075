"""The store on a real SQLite file and a real PostgreSQL database: the connection's settings,
schema versions and forward migrations.

SQLite's settings are read back with ``PRAGMA`` on the very connection the store works with
(through ``Store.read``), and the file's journal mode through a second, independent connection
(SQLite only: PostgreSQL has no such settings of ours). Every migration test runs on both stores:
versions, tables, indexes and triggers are read from each store's own catalogue. Migrations
are checked with a small package of this test's own (a column added to a table that holds rows, a
failing step that must leave nothing behind, a database newer than the code) and with the real
``goals`` schema: a database left at goals version 1 by an older goald is brought to the current
version on open, its rows kept, and it ends with exactly the schema of a fresh database.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
import storekit
from storekit import Location

from agent import Conflict, Limits, Migration, Runtime, SchemaTooNew, Store, Tx, create_guard, create_session
from agent.db import is_postgres
from agent.schema import MIGRATIONS as AGENT_MIGRATIONS
from goals import Budgets, Goal, GoalId, GoalStatus, StopRules
from goals.store import MIGRATIONS as GOAL_MIGRATIONS
from goals.store import goal_from_row, insert_goal

#: The store contract: every test here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.both_stores

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


async def pragma(store: Store, name: str) -> Any:
    """``PRAGMA name`` on the store's own connection."""
    return await store.read(lambda conn: conn.execute(f"PRAGMA {name}").fetchone()[0])


def second_connection(db: Location) -> contextlib.closing[Any]:
    return contextlib.closing(storekit.connect(db))


def versions(db: Location) -> list[tuple[str, int, str]]:
    with second_connection(db) as conn:
        rows = conn.execute("SELECT package, version, summary FROM schema_versions ORDER BY package, version")
        return [(r["package"], r["version"], r["summary"]) for r in rows]


schema = storekit.schema


@pytest.fixture
def other_db(db_path: Location, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Location]:
    """A second fresh store of the same kind as ``db_path`` (another file, or another database)."""
    if not storekit.is_postgres(db_path):
        yield tmp_path / "other.db"
        return
    server = request.getfixturevalue("pg_server")
    dsn: str = server.create_database()
    try:
        yield dsn
    finally:
        server.drop_database(dsn.rsplit("/", 1)[1])


# -- the connection's settings ---------------------------------------------------------------------


@pytest.mark.parametrize(("durability", "synchronous"), [("normal", 1), ("full", 2)])
async def test_the_store_opens_in_wal_with_a_busy_timeout_and_the_chosen_durability(
    db_path: Location, durability: Any, synchronous: int
) -> None:
    storekit.skip_unless_sqlite(db_path, "WAL, busy timeout and synchronous are SQLite's settings")
    async with await Store.open(db_path, durability=durability) as store:
        assert str(await pragma(store, "journal_mode")).lower() == "wal"
        assert await pragma(store, "busy_timeout") == 5000
        # synchronous: 1 is NORMAL (survives a process crash), 2 is FULL (also a power loss).
        assert await pragma(store, "synchronous") == synchronous
        assert store.durability == durability
    # WAL is a property of the file: an independent connection finds it too.
    with second_connection(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_durability_defaults_to_normal_and_the_runtime_passes_full_through(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "default.db") as store:
        assert await pragma(store, "synchronous") == 1
    async with Runtime.open(tmp_path / "full.db", durability="full") as rt:
        assert await pragma(rt.store, "synchronous") == 2
        assert str(await pragma(rt.store, "journal_mode")).lower() == "wal"


# -- schema versions --------------------------------------------------------------------------------


async def test_schema_versions_are_recorded_per_package_with_their_summaries(db_path: Location) -> None:
    async with await Store.open(db_path) as store:
        assert await store.migrate("goals", GOAL_MIGRATIONS) == max(m.version for m in GOAL_MIGRATIONS)
    expected = [("agent", m.version, m.summary) for m in AGENT_MIGRATIONS] + [
        ("goals", m.version, m.summary) for m in GOAL_MIGRATIONS
    ]
    assert versions(db_path) == expected
    before = schema(db_path)

    # Opening again applies nothing twice.
    async with await Store.open(db_path) as store:
        assert await store.migrate("goals", GOAL_MIGRATIONS) == len(GOAL_MIGRATIONS)
    assert versions(db_path) == expected
    assert schema(db_path) == before


DEMO = [
    Migration(
        version=1,
        summary="notes",
        sql="CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);",
        # SQLite's INTEGER PRIMARY KEY numbers new rows by itself; PostgreSQL's needs an identity.
        postgres="CREATE TABLE notes (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, body TEXT NOT NULL);",
    ),
    Migration(
        version=2,
        summary="notes get a tag; old notes are tagged 'old'",
        sql="ALTER TABLE notes ADD COLUMN tag TEXT; UPDATE notes SET tag='old'; CREATE INDEX notes_tag ON notes(tag);",
    ),
]
#: A step that fails half way: its first statement must not survive.
BROKEN = Migration(
    version=3, summary="broken", sql="CREATE TABLE half (x INTEGER); INSERT INTO no_such_table VALUES (1);"
)


async def test_a_forward_migration_keeps_the_data_and_a_failed_step_leaves_nothing(db_path: Location) -> None:
    async with await Store.open(db_path) as store:
        assert await store.migrate("demo", DEMO[:1]) == 1
        await store.transact(lambda tx: tx.execute("INSERT INTO notes(body) VALUES ('first'), ('second')"))
    assert ("demo", 1, "notes") in versions(db_path)

    # A newer goald: version 2 is applied on open, the rows are kept and brought along.
    async with await Store.open(db_path) as store:
        assert await store.migrate("demo", DEMO) == 2
        rows = await store.read(lambda conn: [tuple(r) for r in conn.execute("SELECT id, body, tag FROM notes")])
    assert rows == [(1, "first", "old"), (2, "second", "old")]
    assert [v for v in versions(db_path) if v[0] == "demo"] == [("demo", 1, "notes"), ("demo", 2, DEMO[1].summary)]
    assert ("index", "notes_tag") in schema(db_path)

    # A step that fails rolls back whole: no version row, no table, the earlier data untouched.
    before = schema(db_path)
    async with await Store.open(db_path) as store:
        with pytest.raises((sqlite3.OperationalError, psycopg.errors.UndefinedTable), match="no_such_table"):
            await store.migrate("demo", [*DEMO, BROKEN])
        assert await store.read(lambda conn: conn.execute("SELECT count(*) FROM notes").fetchone()[0]) == 2
    assert schema(db_path) == before
    assert max(v for p, v, _ in versions(db_path) if p == "demo") == 2

    # An older goald refuses a database a newer one has migrated, and changes nothing.
    async with await Store.open(db_path) as store:
        with pytest.raises(SchemaTooNew, match="demo schema version 2; this goald knows up to 1"):
            await store.migrate("demo", DEMO[:1])
    assert schema(db_path) == before


def _goal(session_id: str, guard_id: str, workdir: Path, title: str) -> Goal:
    return Goal(
        id=GoalId.new(),
        title=title,
        objective=f"{title}.",
        status=GoalStatus.ACTIVE,
        session_id=session_id,
        guard_id=guard_id,
        workdir=str(workdir),
        budgets=Budgets(max_rounds=5),
        verify=[],
        rules=StopRules(),
        active_since=T0,
        created_at=T0,
        updated_at=T0,
    )


def _add_goal(tx: Tx, workdir: Path, title: str) -> Goal:
    guard = create_guard(tx, Limits())
    sid = create_session(tx, workdir=str(workdir), guard_id=guard, config={"goal": True})
    goal = _goal(sid, guard, workdir, title)
    insert_goal(tx, goal)
    return goal


class _OldSchemaTx:
    """A transaction as an older goald wrote it: its goal rows have only the columns its schema had."""

    def __init__(self, tx: Tx) -> None:
        self._tx = tx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def _old(self, sql: str, params: Any) -> tuple[str, Any]:
        if sql.startswith("INSERT INTO goals("):
            sql_have = (
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'goals'"
                if is_postgres(self._tx.conn)
                else "SELECT name FROM pragma_table_info('goals')"
            )
            have = {r[0] for r in self._tx.conn.execute(sql_have)}
            cols = sql[len("INSERT INTO goals(") : sql.index(")")].split(", ")
            kept = [(c, p) for c, p in zip(cols, params, strict=True) if c in have]
            sql = f"INSERT INTO goals({', '.join(c for c, _ in kept)}) VALUES ({', '.join('?' for _ in kept)})"
            params = [p for _, p in kept]
        return sql, params

    def execute(self, sql: str, params: Any = ()) -> Any:
        return self._tx.execute(*self._old(sql, params))

    def write(self, sql: str, params: Any = (), **checks: Any) -> None:
        self._tx.write(*self._old(sql, params), **checks)


def _add_old_goal(tx: Tx, workdir: Path, title: str) -> Goal:
    return _add_goal(cast(Tx, _OldSchemaTx(tx)), workdir, title)


async def test_a_goals_schema_of_version_1_is_migrated_on_open_and_keeps_its_goals(
    tmp_path: Path, db_path: Location, other_db: Location
) -> None:
    fresh, old = other_db, db_path
    shared = tmp_path / "shared"
    shared.mkdir()
    async with await Store.open(fresh) as store:
        await store.migrate("goals", GOAL_MIGRATIONS)

    # An older goald (goals schema 1, before work-directory locks) let two live goals share a directory.
    async with await Store.open(old) as store:
        assert await store.migrate("goals", GOAL_MIGRATIONS[:1]) == 1
        first = await store.transact(lambda tx: _add_old_goal(tx, shared, "First"))
        second = await store.transact(lambda tx: _add_old_goal(tx, shared, "Second"))
    assert [v[1] for v in versions(old) if v[0] == "goals"] == [1]
    assert not [name for kind, name in schema(old) if kind == "trigger"]
    with second_connection(old) as conn:
        kept = {r["id"]: dict(r) for r in conn.execute("SELECT * FROM goals")}
    assert set(kept) == {first.id, second.id}

    # This goald opens it: migrated to the current version, every row as it was, the schema now
    # exactly that of a fresh database.
    async with await Store.open(old) as store:
        assert await store.migrate("goals", GOAL_MIGRATIONS) == len(GOAL_MIGRATIONS)
        stored = await store.read(lambda conn: {r["id"]: dict(r) for r in conn.execute("SELECT * FROM goals")})
        assert {gid: {k: row[k] for k in kept[gid]} for gid, row in stored.items()} == kept
        assert {gid: goal_from_row(row) for gid, row in stored.items()} == {first.id: first, second.id: second}

        # Migration 2's rule holds from now on (for new goals; the two it found are left alone).
        with pytest.raises(Conflict, match="held by another active or paused goal"):
            await store.transact(lambda tx: _add_goal(tx, shared, "Third"))
        inside = shared / "inside"
        inside.mkdir()
        with pytest.raises(Conflict, match="held by another active or paused goal"):
            await store.transact(lambda tx: _add_goal(tx, inside, "Nested"))
    assert versions(old) == versions(fresh)
    assert schema(old) == schema(fresh)
    with second_connection(old) as conn:
        assert conn.execute("SELECT count(*) FROM goals").fetchone()[0] == 2
        if not storekit.is_postgres(old):
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
