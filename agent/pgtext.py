"""A SQLite-dialect statement as psycopg takes it, and PostgreSQL's rows as SQLite's.

goald writes its SQL once, with SQLite's placeholders and rows that answer both ``row[0]`` and
``row["name"]`` (:mod:`agent.db` says why). On PostgreSQL :func:`pg_sql` rewrites the placeholders
(``?``, ``:name``), a literal ``%`` and ``json_extract``; :func:`configure` gives a psycopg
connection goald's row type (:class:`Row`) and its loader of ``numeric`` and dumper of ``bool``;
:func:`quoted` writes a literal into a text of statements sent without parameters.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    from agent.db import PgConn

_JSON = re.compile(r"json_extract\(\s*([\w.]+)\s*,\s*'\$\.([\w.]+)'\s*\)")
_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@functools.lru_cache(maxsize=1024)
def pg_sql(sql: str) -> str:
    """A SQLite-placeholder statement as psycopg takes it (see the module docstring).

    Placeholders and ``%`` are rewritten outside string literals only."""
    sql = _JSON.sub(lambda m: "(" + m.group(1) + "::jsonb #>> '{" + m.group(2).replace(".", ",") + "}')", sql)
    out: list[str] = []
    for i, part in enumerate(sql.split("'")):
        if i % 2:  # inside a literal: only '%' needs escaping
            out.append(part.replace("%", "%%"))
            continue
        part = part.replace("%", "%%").replace("?", "%s")
        part = _NAMED.sub(lambda m: "%(" + m.group(1) + ")s", part)
        out.append(part)
    return "'".join(out)


class Row(tuple[Any, ...]):
    """A result row answering ``row[0]``, ``row["name"]`` and ``keys()``, as :class:`sqlite3.Row`."""

    _names: dict[str, int]

    def __new__(cls, values: Sequence[Any], names: dict[str, int]) -> Row:
        row = super().__new__(cls, values)
        row._names = names
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        """The columns' names, in order."""
        return list(self._names)


#: A result's column names as their positions, by the names' raw bytes: a daemon's statements have
#: few shapes, and building psycopg's ``description`` (an object per column) for each result set was
#: a few per cent of the daemon's CPU under load. Bounded: cleared when it grows past this.
_SHAPES: dict[tuple[bytes, ...], dict[str, int]] = {}
_SHAPES_MAX = 4096


def _row_factory(cursor: Any) -> Any:
    res = cursor.pgresult
    if res is None or not res.nfields:  # no result set, or one without columns (an UPDATE's, say)
        return tuple
    raw = tuple(res.fname(i) for i in range(res.nfields))
    names = _SHAPES.get(raw)
    if names is None:
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        names = _SHAPES[raw] = {name.decode(): i for i, name in enumerate(raw)}

    def make(values: Sequence[Any]) -> Row:
        return Row(values, names)

    return make


@functools.cache
def _adapters() -> tuple[type[Any], type[Any]]:
    """The loader of ``numeric`` and the dumper of ``bool`` (built once psycopg is imported)."""
    from psycopg.adapt import Dumper, Loader

    class NumericLoader(Loader):
        def load(self, data: Any) -> int | float:
            text = bytes(data).decode()
            try:
                return int(text)
            except ValueError:
                return float(text)

    class BoolAsInt(Dumper):
        oid = 20  # int8

        def dump(self, obj: Any) -> bytes:
            return b"1" if obj else b"0"

    return NumericLoader, BoolAsInt


def configure(raw: psycopg.Connection[Any]) -> None:
    """Give a new psycopg connection goald's row type and value adapters."""
    numeric, boolean = _adapters()
    raw.row_factory = _row_factory
    raw.adapters.register_loader("numeric", numeric)
    raw.adapters.register_dumper(bool, boolean)


#: Text that cannot leave a quoted SQL literal: no quote, backslash or control character (goald's own
#: ids, event types, times and notification payloads); :func:`quoted` quotes it by hand, cheaply.
_PLAIN = re.compile(r'[A-Za-z0-9_.:,+\-\[\]{}"]*')


def quoted(conn: PgConn, text: str) -> str:
    """``text`` as a SQL string literal: by hand when it is :data:`_PLAIN` (the ids and payloads a
    write's ``BEGIN`` and ``COMMIT`` carry, thousands a second), else by psycopg."""
    if _PLAIN.fullmatch(text):
        return "'" + text + "'"
    from psycopg import sql

    return sql.Literal(text).as_string(conn.raw)


__all__ = ["Row", "configure", "pg_sql", "quoted"]
