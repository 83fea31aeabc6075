"""Moving a goal between daemons: ``goald goal export ID [-o FILE]`` and ``goald goal import FILE``.

The document is one JSON object, versioned so that a later goald can read an earlier one::

    {"format": "goald-goal", "version": 1, "exportedAt": "…", "goaldVersion": "…",
     "schema": {"agent": 4, "goals": 4},
     "goal": {column: value, …},
     "tables": {"sessions": [...], "guards": [...], "inbox": [...], "turns": [...],
                "events": [...], "model_calls": [...]}}

``goal`` is the goal's row (:mod:`goals.transfer`), ``tables`` the rows of the session it ran on
and of its subagents' sessions (:mod:`agent.transfer`); each package reads and writes its own
rows. Only an ended goal moves. Import is one transaction: a bad document (wrong format, a newer
version or schema, a column this goald does not know, rows that do not belong together) or an id
already present (the goal, a session, a guard) is refused with the reason and changes nothing.
The goal keeps its ids, so an export imported twice is refused the second time. The work
directory is not moved: the goal names it as it was on the exporting machine.

The document travels inline over the control socket: an import larger than the importing daemon's
``max_frame_bytes`` is refused by it (raise that setting for very long histories).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent import InvalidInput, Store
from agent.migrate import stored_versions
from agent.transfer import export_session_tree, import_session_tree
from daemon import __version__
from goals.transfer import export_goal_row, import_goal_row

FORMAT = "goald-goal"
VERSION = 1


class GoalDocument(BaseModel):
    """The exported goal (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    format: str
    version: int
    exported_at: str = Field(alias="exportedAt")
    goald_version: str = Field(default="", alias="goaldVersion")
    schema_versions: dict[str, int] = Field(alias="schema")
    goal: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]]


async def export_goal(store: Store, goal_id: str) -> dict[str, Any]:
    """The goal's document, read in one snapshot."""

    def read(conn: Any) -> dict[str, Any]:
        goal = export_goal_row(conn, goal_id)
        versions = stored_versions(conn)
        return {
            "format": FORMAT,
            "version": VERSION,
            "exportedAt": datetime.now(UTC).isoformat(),
            "goaldVersion": __version__,
            "schema": {p: versions[p] for p in ("agent", "goals") if p in versions},
            "goal": goal,
            "tables": export_session_tree(conn, goal["session_id"]),
        }

    return await store.read(read)


def parse_document(data: object) -> GoalDocument:
    """Validate a document's shape and version.

    Raises:
        InvalidInput: naming what is wrong.
    """
    if not isinstance(data, dict):
        raise InvalidInput("not a goald goal export: expected a JSON object")
    if data.get("format") != FORMAT:
        raise InvalidInput(f"not a goald goal export: format is {data.get('format')!r}, expected {FORMAT!r}")
    if not isinstance(data.get("version"), int) or data["version"] > VERSION:
        raise InvalidInput(f"export version {data.get('version')!r} is newer than this goald reads ({VERSION})")
    try:
        return GoalDocument.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"invalid goal export at {where!r}: {first['msg']}") from None


async def import_goal(store: Store, data: object) -> dict[str, Any]:
    """Write an exported goal with its sessions and events, in one transaction; what was imported.

    Raises:
        InvalidInput: a bad document (nothing was written).
        Conflict: the goal or one of its sessions or guards is already here (nothing was written).
    """
    doc = parse_document(data)
    if doc.goal.get("session_id") not in {s.get("id") for s in doc.tables.get("sessions", [])}:
        raise InvalidInput("the goal's session is not among the document's sessions")

    def write(tx: Any) -> dict[str, Any]:
        here = stored_versions(tx.conn)
        for package, version in doc.schema_versions.items():
            if version > here.get(package, 0):
                raise InvalidInput(
                    f"the export has {package} schema version {version}; this goald's store has {here.get(package, 0)}"
                )
        sessions = import_session_tree(tx, doc.tables)
        goal_id = import_goal_row(tx, doc.goal)
        return {
            "goalId": goal_id,
            "status": doc.goal.get("status"),
            "sessions": sessions,
            "events": len(doc.tables.get("events", [])),
        }

    return await store.transact(write)
