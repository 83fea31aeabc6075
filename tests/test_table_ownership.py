"""Each package owns its tables: no SQL in one package names a table another package owns.

A table belongs to the package whose migrations create it (``CREATE TABLE`` in its source):
``agent`` owns sessions, the inbox, turns, events, spend guards, model calls, the outbox and the
schema versions; ``goals`` owns goals; ``daemon`` owns schedules and their runs. Another package reads
or changes them only through the owner's functions, so an invariant enforced by the owner (the
inbox's fate transitions, the goal's revision check) cannot be bypassed by a copy elsewhere.

The scan reads every ``.py`` file of ``agent/``, ``goals/`` and ``daemon/`` with :mod:`ast` and
looks at string literals only (docstrings skipped): a literal is SQL when it holds an upper-case
SQL statement keyword (``SELECT``, ``INSERT INTO``, ``UPDATE … SET``, ``DELETE FROM``, ``CREATE``,
``ALTER TABLE``, ``WITH RECURSIVE``); an f-string counts by its literal parts, and adjacent
literals are one literal to the parser already. In a SQL literal every whole word that is a known
table name is a use of that table. Strings built at run time from pieces that are not SQL on their
own are beyond the scan and left to review.

The self-tests below feed the checker offending and clean snippets, so it cannot silently pass
everything, and check that the production scan sees each package's own SQL.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "goals", "daemon")

SQL_KEYWORDS = re.compile(
    r"\bSELECT\b|\bINSERT\s+INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b|\bCREATE\s+(?:TABLE|(?:UNIQUE\s+)?INDEX|TRIGGER)\b"
    r"|\bALTER\s+TABLE\b|\bWITH\s+RECURSIVE\b|\bDROP\s+(?:TABLE|INDEX|TRIGGER)\b"
)
CREATE_TABLE = re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: What the design says each package owns (the scan checks the migrations agree).
EXPECTED_OWNERS = {
    "sessions": "agent",
    "inbox": "agent",
    "turns": "agent",
    "events": "agent",
    "guards": "agent",
    "model_calls": "agent",
    "usage_totals": "agent",
    "schema_versions": "agent",
    "outbox": "agent",
    "outbox_deliveries": "agent",
    "outbox_attempts": "agent",
    "goals": "goals",
    "goal_questions": "goals",
    "schedules": "daemon",
    "schedule_runs": "daemon",
    "nodes": "daemon",
    "leases": "daemon",
}


@dataclass(frozen=True)
class Use:
    """One table named in one SQL literal."""

    module: str
    line: int
    table: str
    owner: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: SQL names table {self.table!r}, owned by {self.owner!r}"


def _docstrings(nodes: list[ast.AST]) -> set[int]:
    ids: set[int] = set()
    for node in nodes:
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def sql_literals(source: str) -> Iterator[tuple[str, int]]:
    """Every SQL-looking string literal of ``source`` with its line (docstrings skipped)."""
    return iter(_sql_literals(source))


@functools.cache
def _sql_literals(source: str) -> tuple[tuple[str, int], ...]:
    """:func:`sql_literals`, kept per source: the tests read each file more than once, and the tree
    is walked once (the walks, not the parse, were most of this module's time)."""
    return tuple(_find_sql_literals(source))


def _find_sql_literals(source: str) -> Iterator[tuple[str, int]]:
    nodes = list(ast.walk(ast.parse(source)))
    skip = _docstrings(nodes)
    inside_fstring: set[int] = set()
    for node in nodes:
        if isinstance(node, ast.JoinedStr):
            inside_fstring.update(id(v) for v in node.values)
            text = " ".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            if SQL_KEYWORDS.search(text):
                yield text, node.lineno
    for node in nodes:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip
            and id(node) not in inside_fstring
            and SQL_KEYWORDS.search(node.value)
        ):
            yield node.value, node.lineno


def production_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def owners_from_migrations(files: list[Path]) -> dict[str, str]:
    """Table → the package whose source creates it."""
    owners: dict[str, str] = {}
    for path in files:
        package = path.relative_to(ROOT).parts[0]
        for text, _ in sql_literals(path.read_text()):
            for table in CREATE_TABLE.findall(text):
                assert owners.get(table, package) == package, f"{table} is created by {owners[table]} and {package}"
                owners[table] = package
    return owners


def foreign_uses(source: str, package: str, module: str, owners: dict[str, str]) -> list[Use]:
    """Tables named in ``source``'s SQL that a package other than ``package`` owns."""
    uses = []
    for text, line in sql_literals(source):
        for word in sorted(set(WORD.findall(text))):
            owner = owners.get(word)
            if owner is not None and owner != package:
                uses.append(Use(module, line, word, owner))
    return uses


def test_each_table_has_the_owner_the_design_names() -> None:
    assert owners_from_migrations(production_files()) == EXPECTED_OWNERS


def test_no_sql_names_a_table_another_package_owns() -> None:
    owners = owners_from_migrations(production_files())
    found = []
    for path in production_files():
        package = path.relative_to(ROOT).parts[0]
        found += foreign_uses(path.read_text(), package, _module(path), owners)
    assert not found, "SQL outside the owning package (use the owner's functions):\n" + "\n".join(map(str, found))


def test_the_scan_sees_each_package_s_own_sql() -> None:
    tables_seen: dict[str, set[str]] = {pkg: set() for pkg in PACKAGES}
    for path in production_files():
        package = path.relative_to(ROOT).parts[0]
        for text, _ in sql_literals(path.read_text()):
            tables_seen[package] |= set(WORD.findall(text)) & set(EXPECTED_OWNERS)
    assert {"sessions", "inbox", "turns", "events", "guards", "model_calls"} <= tables_seen["agent"]
    assert "goals" in tables_seen["goals"]
    assert {"schedules", "schedule_runs"} <= tables_seen["daemon"]


OWNERS = {"inbox": "agent", "sessions": "agent", "events": "agent", "goals": "goals"}

OFFENDING = {
    "update_other": """
        def cancel(tx, key):
            tx.execute("UPDATE inbox SET fate='cancelled' WHERE pending_key=?", (key,))
        """,
    "select_other_in_implicit_concat": """
        def f(conn):
            return conn.execute(
                "SELECT id, model FROM sessions"
                " WHERE id >= ? ORDER BY id"
            )
        """,
    "join_other": """
        SQL = "SELECT g.* FROM chain JOIN goals g ON g.session_id = chain.id"
        """,
    "fstring": """
        def f(conn, marks):
            conn.execute(f"SELECT seq FROM events WHERE type IN ({marks})")
        """,
    "recursive_cte": """
        Q = "WITH RECURSIVE chain(id) AS (SELECT 1) SELECT * FROM chain, sessions"
        """,
    "delete_other": """
        Q = "DELETE FROM goals WHERE id=?"
        """,
}

CLEAN = {
    "own_table": """
        Q = "SELECT * FROM schedules WHERE id=?"
        """,
    "prose_naming_a_table": """
        def f():
            raise ValueError("no goals match; the sessions list is empty")
        """,
    "docstring": '''
        def f():
            """Reads goals: SELECT * FROM goals is what the owner does."""
        ''',
    "column_names_only": """
        Q = "SELECT session_id, goal_id FROM schedule_runs WHERE id=?"
        """,
}


@pytest.mark.parametrize("name", sorted(OFFENDING))
def test_checker_flags_foreign_tables(name: str) -> None:
    uses = foreign_uses(textwrap.dedent(OFFENDING[name]), "daemon", name, OWNERS)
    assert uses, f"{name} should be flagged"


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_checker_passes_own_tables_and_prose(name: str) -> None:
    assert foreign_uses(textwrap.dedent(CLEAN[name]), "daemon", name, OWNERS) == []


def test_checker_finds_the_creating_package(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    f = tmp_path / "pkg" / "m.py"
    f.write_text('DDL = """\nCREATE TABLE IF NOT EXISTS things (id TEXT);\nCREATE TABLE other (x INT);\n"""\n')
    tables: dict[str, str] = {}
    for text, _ in sql_literals(f.read_text()):
        for t in CREATE_TABLE.findall(text):
            tables[t] = "pkg"
    assert tables == {"things": "pkg", "other": "pkg"}
