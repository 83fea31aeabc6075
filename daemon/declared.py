"""Declared goals and schedules: a TOML file whose entries carry a unique ``key``.

Loading it (at start and on SIGHUP) creates what is new and updates what exists, by key, so a
reload never duplicates anything. A goal created from the file uses the idempotency key
``declared:<key>``; an existing one gets its objective, title, budgets and verification edited
(and is left alone when none of them changed).

An invalid file changes nothing, so loading is two steps. :func:`check_declared` reads the file
and checks every entry against what needs no store — its fields, its model, its work directory
against the allowed roots, its schedule trigger and template — and raises one
:class:`GoalsFileError` whose single line names the file, the entry (by key) and the field. The
daemon runs it before it opens the store and refuses to start on an error (exit 78, as for an
invalid settings file). :func:`apply_declared` checks again, then what depends on the store (a
work directory held by another live goal, a one-shot time already past), and only then writes.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent import InvalidInput, NotFound
from agent.db import Conn
from daemon.ports import HostPort
from daemon.rpc.branches import create_on_repo
from daemon.schedule.model import DateTrigger, ScheduleSpec
from daemon.settings import ConfigError
from goals import Budgets, GoalSpec, VerifyCommand, goal_by_key, live_goals
from goals.model import GoalId, field_loc

#: The discriminator tags pydantic puts in an error's location (not fields anyone wrote).
_TAGS = ("cron", "interval", "date")


class GoalsFileError(InvalidInput, ConfigError):
    """The goals file is invalid; the one-line message names the file, the entry and the field.

    An :class:`~agent.InvalidInput` for the control protocol (``daemon/reload`` answers invalid
    params) and a :class:`~daemon.settings.ConfigError` for ``goald serve`` (exit 78).
    """


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
    #: A command whose changed output is the goal's observable progress (run in its sandbox).
    progress: VerifyCommand | None = None
    #: A git repository to work in a worktree of, from ``base``, on ``branch`` (README "A goal's
    #: work as a branch"); not with ``workdir``.
    repo: str | None = None
    base: str | None = None
    branch: str | None = None


@dataclass(frozen=True)
class Declared:
    """A checked goals file: what :func:`apply_declared` writes."""

    path: Path
    goals: list[DeclaredGoal]
    #: Each goal's explicit work directory, resolved and checked (``None``: goald makes one).
    workdirs: dict[str, Path | None]
    schedules: list[ScheduleSpec]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _problem(path: Path, where: str, field: str | None, message: str) -> GoalsFileError:
    message = _one_line(message)
    if field and message.startswith(f"{field} "):  # "workdir: '/x' is outside", not "workdir: workdir '/x' ..."
        message = message[len(field) + 1 :]
    parts = [f"goals file {path}", where, *([field] if field else []), message]
    return GoalsFileError(": ".join(p for p in parts if p))


def _entry_name(kind: str, index: int, raw: Any) -> str:
    key = raw.get("key") if isinstance(raw, dict) else None
    return f"{kind} {key!r}" if isinstance(key, str) and key else f"{kind} #{index + 1}"


def _validation(path: Path, where: str, exc: ValidationError) -> GoalsFileError:
    first = exc.errors()[0]
    field = field_loc(tuple(p for p in first["loc"] if p not in _TAGS))
    msg = "unknown key" if first["type"] == "extra_forbidden" else str(first["msg"]).removeprefix("Value error, ")
    return _problem(path, where, field or None, msg)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise _problem(path, "", None, f"cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise _problem(path, "", None, f"not valid TOML: {exc}") from None


def _entries(path: Path, raw: dict[str, Any], kind: str) -> list[Any]:
    value = raw.get(kind, [])
    if not isinstance(value, list):
        raise _problem(path, kind, None, f"must be an array of tables, written [[{kind}]]")
    return value


def _check_goal(path: Path, host: HostPort, index: int, raw: Any) -> tuple[DeclaredGoal, Path | None]:
    where = _entry_name("goal", index, raw)
    if not isinstance(raw, dict):
        raise _problem(path, where, None, "must be a table")
    try:
        entry = DeclaredGoal.model_validate(raw)
        # The rules a goal spec adds (a non-empty objective, a title that is not blank).
        GoalSpec(
            objective=entry.objective,
            title=entry.title,
            budgets=entry.budgets,
            verify=entry.verify,
            progress=entry.progress,
            repo=entry.repo,
            base=entry.base,
            branch=entry.branch,
        )
    except ValidationError as exc:
        raise _validation(path, where, exc) from None
    if entry.repo is not None and entry.workdir is not None:
        raise _problem(
            path, where, "workdir", "give repo or workdir, not both: a goal on a repository works in a worktree"
        )
    try:
        host.models.get(entry.model or host.settings.default_model)
    except (InvalidInput, LookupError) as exc:
        raise _problem(path, where, "model", str(exc)) from None
    workdir = None
    if entry.workdir is not None:
        try:
            workdir = host.workdirs.resolve(entry.workdir, f"declared-{entry.key}")
        except InvalidInput as exc:
            raise _problem(path, where, "workdir", str(exc)) from None
    return entry, workdir


def _check_schedule(path: Path, host: HostPort, index: int, raw: Any) -> ScheduleSpec:
    where = _entry_name("schedule", index, raw)
    if not isinstance(raw, dict):
        raise _problem(path, where, None, "must be a table")
    if "key" not in raw:
        raise _problem(path, where, "key", "a declared schedule needs a key (a reload updates it by key)")
    try:
        spec = ScheduleSpec.model_validate(raw)
    except ValidationError as exc:
        raise _validation(path, where, exc) from None
    # What a fire would refuse: check it now rather than record an error at every fire.
    try:
        host.models.get(spec.goal.get("model") or host.settings.default_model)
    except (InvalidInput, LookupError) as exc:
        raise _problem(path, where, "goal.model", str(exc)) from None
    if spec.goal.get("workdir") is not None:
        try:
            host.workdirs.resolve(spec.goal["workdir"], "unused")
        except InvalidInput as exc:
            raise _problem(path, where, "goal.workdir", str(exc)) from None
    return spec


def _unique(path: Path, kind: str, keys: Sequence[str | None]) -> None:
    seen: set[str] = set()
    for key in keys:
        if key is not None and key in seen:
            raise _problem(path, f"{kind} {key!r}", "key", "declared twice (keys must be unique)")
        if key is not None:
            seen.add(key)


def check_declared(path: Path, host: HostPort) -> Declared:
    """Read the goals file and check every entry, without the store.

    Raises:
        GoalsFileError: naming the file, the entry and the field; nothing was changed.
    """
    raw = _read_toml(path)
    for name in raw:
        if name not in ("goal", "schedule"):
            raise _problem(path, repr(name), None, "unknown key (the file holds [[goal]] and [[schedule]] entries)")
    checked = [_check_goal(path, host, i, g) for i, g in enumerate(_entries(path, raw, "goal"))]
    schedules = [_check_schedule(path, host, i, s) for i, s in enumerate(_entries(path, raw, "schedule"))]
    _unique(path, "goal", [g.key for g, _ in checked])
    _unique(path, "schedule", [s.key for s in schedules])
    return Declared(
        path=path,
        goals=[g for g, _ in checked],
        workdirs={g.key: w for g, w in checked},
        schedules=schedules,
    )


def _existing(conn: Conn, keys: list[str]) -> tuple[dict[str, str], list[tuple[str, Path]]]:
    """Goal ids by declared key, and every live goal's (id, resolved workdir)."""
    ids = {}
    for key in keys:
        goal = goal_by_key(conn, key)
        if goal is not None:
            ids[key] = str(goal.id)
    return ids, [(str(g.id), Path(g.workdir).resolve()) for g in live_goals(conn) if g.workdir is not None]


def _overlap(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


async def _check_against_store(host: HostPort, declared: Declared) -> dict[str, str]:
    """The checks that need the store; returns the ids of the declared goals that exist already."""
    assert host.rt is not None
    path = declared.path
    ids, live = await host.rt.store.read(lambda conn: _existing(conn, [g.key for g in declared.goals]))
    claimed: list[tuple[str, Path]] = list(live)
    for entry in declared.goals:
        workdir = declared.workdirs[entry.key]
        if entry.key in ids or workdir is None:
            continue
        holder = next((gid for gid, other in claimed if _overlap(workdir, other)), None)
        if holder is not None:
            why = f"{str(workdir)!r} overlaps the work directory of the live goal {holder} (one goal per directory)"
            raise _problem(path, f"goal {entry.key!r}", "workdir", why)
        claimed.append((f"the goal declared as {entry.key!r}", workdir))
    now = datetime.now(UTC) if host.scheduler is None else host.scheduler.clock()
    for spec in declared.schedules:
        if not isinstance(spec.trigger, DateTrigger) or spec.trigger.at > now:
            continue
        try:
            old = await host.scheduler.get(spec.key) if host.scheduler is not None and spec.key is not None else None
        except NotFound:
            old = None
        if old is None or (old.trigger, old.timezone) != (spec.trigger, spec.timezone):
            why = f"the one-shot time {spec.trigger.at.isoformat()} is already past"
            raise _problem(path, f"schedule {spec.key!r}", "trigger.at", why)
    return ids


async def apply_declared(host: HostPort, path: Path) -> dict[str, int]:
    """Create or update every declared goal and schedule; returns how many of each the file holds.

    Raises:
        GoalsFileError: the file is invalid; nothing was changed.
    """
    declared = check_declared(path, host)
    engine = host.engine
    assert engine is not None and host.rt is not None
    ids = await _check_against_store(host, declared)
    for entry in declared.goals:
        if entry.key in ids:
            goal = await engine.get(ids[entry.key])
            title = entry.title if entry.title is not None else goal.title
            if (goal.objective, goal.title, goal.budgets, goal.verify, goal.progress) != (
                entry.objective,
                title,
                entry.budgets,
                entry.verify,
                entry.progress,
            ):
                await engine.update(
                    goal.id,
                    objective=entry.objective,
                    title=title,
                    budgets=entry.budgets,
                    verify=entry.verify,
                    progress=entry.progress,
                )
            continue
        if entry.repo is not None:
            on_repo = GoalSpec(
                objective=entry.objective,
                title=entry.title,
                key=entry.key,
                model=entry.model or host.settings.default_model,
                budgets=entry.budgets,
                verify=entry.verify,
                progress=entry.progress,
                idempotency_key=f"declared:{entry.key}",
                repo=entry.repo,
                base=entry.base,
                branch=entry.branch,
            )
            await create_on_repo(host, on_repo, GoalId.new())
            continue
        workdir = declared.workdirs[entry.key] or host.workdirs.resolve(None, f"declared-{entry.key}")
        await engine.create(
            GoalSpec(
                objective=entry.objective,
                title=entry.title,
                key=entry.key,
                model=entry.model or host.settings.default_model,
                workdir=str(workdir),
                budgets=entry.budgets,
                verify=entry.verify,
                progress=entry.progress,
                idempotency_key=f"declared:{entry.key}",
            )
        )
    if host.scheduler is not None:
        for spec in declared.schedules:
            await host.scheduler.add(spec)
    return {"goals": len(declared.goals), "schedules": len(declared.schedules) if host.scheduler is not None else 0}
