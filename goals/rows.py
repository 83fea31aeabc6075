"""A goal as a ``goals`` row and back: one column per field of :class:`~goals.model.Goal`.

The columns are the model's fields, so a new field of the goal (of its :class:`~goals.model.GoalSpec`
or of :class:`~goals.model.Goal`) is added to the model and to a migration (:mod:`goals.schema`)
and nowhere else. How a field is stored follows from its type: a model as its JSON, a list or a
dict as JSON text, a status as its value, an instant in ISO 8601, a flag as 0 or 1, the rest as it
is. A column that is NULL where the field is not optional (a row older than the field's migration,
say) reads as the field's default. The queries and the writes build goals only through
:func:`goal_from_row` and store them only through :func:`row_values`.
"""

from __future__ import annotations

import enum
import json
import types
from datetime import datetime
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from agent import Tx
from agent.db import Conn
from goals.model import Goal

#: Model columns written without the values equal to their defaults: ``memory`` (most of it is
#: empty most of the time) and ``sandbox`` (``json_extract(sandbox, '$.secrets')`` finds the goals
#: that name secrets). Every other model column is written whole, so a goal keeps the settings it
#: was made with even if a default changes later.
_SPARSE = frozenset({"memory", "sandbox"})


def _types(annotation: Any) -> tuple[Any, ...]:
    """The types a field's annotation allows (``X | None`` gives ``X`` and ``NoneType``)."""
    if get_origin(annotation) in (Union, types.UnionType):
        return get_args(annotation)
    return (annotation,)


def _is_json(annotation: Any) -> bool:
    """Whether a field of this type is kept as JSON text: a model, a list or a dict."""
    for t in _types(annotation):
        origin = get_origin(t) or t
        if origin in (list, dict) or (isinstance(origin, type) and issubclass(origin, BaseModel)):
            return True
    return False


#: Every column of ``goals`` the model holds, in the model's order (the inserts name them).
COLUMNS = tuple(Goal.model_fields)
#: The columns kept as JSON text.
_JSON = frozenset(name for name, f in Goal.model_fields.items() if _is_json(f.annotation))
#: The columns whose field is not optional: NULL there reads as the field's default.
_DEFAULTED = frozenset(
    name for name, f in Goal.model_fields.items() if type(None) not in _types(f.annotation) and not f.is_required()
)


def goal_from_row(row: Any | dict[str, Any]) -> Goal:
    """Build a :class:`Goal` from a ``goals`` row (columns the model does not hold are left out)."""
    d = dict(row)
    values: dict[str, Any] = {}
    for name in COLUMNS:
        value = d.get(name)
        if value is None and name in _DEFAULTED:
            continue
        if name in _JSON and isinstance(value, str):
            value = json.loads(value) if value else None
        values[name] = value
    return Goal.model_validate(values)


def _column(name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, BaseModel):
        return value.model_dump_json(exclude_defaults=name in _SPARSE)
    if name in _JSON:
        return json.dumps(to_jsonable_python(value, by_alias=False))
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool):
        return int(value)
    return value


def row_values(goal: Goal) -> dict[str, Any]:
    """The column values of ``goal``, nested fields as JSON."""
    return {name: _column(name, getattr(goal, name)) for name in COLUMNS}


def conn_of(tx_or_conn: Tx | Conn) -> Conn:
    """The connection of a transaction, or the connection itself (the queries take either)."""
    return tx_or_conn.conn if isinstance(tx_or_conn, Tx) else tx_or_conn


__all__ = ["COLUMNS", "conn_of", "goal_from_row", "row_values"]
