"""Declared goals and schedules: a TOML file whose entries carry a unique ``key``.

Loading it (at start and on SIGHUP) creates what is new and updates what exists, by key, so a
reload never duplicates anything. A goal created from the file uses the idempotency key
``declared:<key>``; an existing one gets its objective, title, budgets and verification edited.
An invalid file changes nothing and names the entry and the field.
"""

from __future__ import annotations

import sqlite3
import tomllib
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent import InvalidInput
from goals import Budgets, GoalSpec, VerifyCommand

if TYPE_CHECKING:
    from daemon.host import Host


class DeclaredGoal(BaseModel):
    """One ``[[goal]]`` entry."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=200)
    objective: str
    title: str | None = None
    model: str | None = None
    workdir: str | None = None
    budgets: Budgets = Budgets()
    verify: list[VerifyCommand] = []


class DeclaredFile(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid")

    goal: list[DeclaredGoal] = []
    schedule: list[dict[str, Any]] = []


def read_declared(path: Path) -> DeclaredFile:
    """Parse and validate the file. Raises ``InvalidInput`` naming the entry and the field."""
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidInput(f"{path}: {exc}") from None
    try:
        declared = DeclaredFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"{path}: {where}: {first['msg']}") from None
    keys = [g.key for g in declared.goal]
    if len(keys) != len(set(keys)):
        raise InvalidInput(f"{path}: goal keys must be unique")
    return declared


def _goal_by_key(conn: sqlite3.Connection, key: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = conn.execute("SELECT id FROM goals WHERE key=?", (key,)).fetchone()
    return row


async def apply_declared(host: Host, path: Path) -> dict[str, int]:
    """Create or update every declared goal and schedule; returns how many of each were applied."""
    declared = read_declared(path)
    engine = host.engine
    assert engine is not None and host.rt is not None
    for entry in declared.goal:
        existing = await host.rt.store.read(partial(_goal_by_key, key=entry.key))
        if existing is not None:
            await engine.update(
                existing["id"], objective=entry.objective, title=entry.title, budgets=entry.budgets, verify=entry.verify
            )
            continue
        workdir = host.workdir_for(entry.workdir, f"declared-{entry.key}")
        await engine.create(
            GoalSpec(
                objective=entry.objective,
                title=entry.title,
                key=entry.key,
                model=entry.model or host.settings.default_model,
                workdir=str(workdir),
                budgets=entry.budgets,
                verify=entry.verify,
                idempotency_key=f"declared:{entry.key}",
            )
        )
    applied_schedules = 0
    if declared.schedule and host.scheduler is not None:
        from daemon.schedule_glue import add_declared_schedules

        applied_schedules = await add_declared_schedules(host, declared.schedule)
    return {"goals": len(declared.goal), "schedules": applied_schedules}
