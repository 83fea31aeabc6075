"""``goald eval run SUITE.toml`` and ``goald eval report SUITE.toml``: comparing models on your own goals.

A suite is a TOML file: a ``name``, the ``models`` to compare, ``runs`` (N) of each task per model,
a ``concurrency`` limit, and ``[[tasks]]``, each an objective with its start (``repo`` and ``base``:
a git repository and ref; or ``directory``, inside the daemon's work-directory roots, each run
starting from a copy of it; relative paths from the suite's directory), ``verify`` commands,
``budgets`` and ``stall_rounds``. An evaluation is goals like any other: each run is a goal on its
own worktree from the task's base (or its own copy of the task's directory), keyed
``eval:<suite>:<task>:<model>:<n>``, so it is durable, resumable, visible on the status page and
charged to its budgets. ``eval run`` creates the runs no
goal exists for yet, at most ``concurrency`` unfinished at once, and waits for them; run again
after anything stopped it (the CLI, the daemon, the machine), it finds the goals that exist by
their keys and repeats none. A run is finished when its goal ended or stopped for a person (paused,
waiting): an evaluation waits for nobody.

The report (``eval report``, and at the end of ``eval run``) is one table per suite: per model,
verified completions out of the runs, the median and spread of rounds, tokens, cost and wall time
to a verified completion, stalls and exhaustions, and each run's goal id; printed as markdown and
written as ``<suite>.report.md`` and ``<suite>.report.json`` beside the suite (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from daemon.cli.parser import EXIT_OK, UsageError
from daemon.client import Connection
from daemon.rpc.protocol import ErrorCode, RpcError
from daemon.rpc.views import GoalView

#: How often ``eval run`` looks at its unfinished runs, in seconds.
POLL_SECONDS = 0.5
#: A run's goal is finished in these statuses (paused and waiting: an evaluation waits for nobody).
FINISHED = {"completed", "failed", "cancelled", "exhausted", "paused", "waiting"}


class EvalTask(BaseModel):
    """One task of a suite."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=60, pattern=r"^[A-Za-z0-9_.-]+$")
    objective: str = Field(min_length=1)
    #: The start: a git repository and its ``base``, or a ``directory`` (inside the daemon's
    #: work-directory roots) each run starts from a copy of.
    repo: str | None = None
    base: str = "HEAD"
    directory: str | None = None
    verify: list[str] = []
    budgets: dict[str, Any] = {}
    stall_rounds: int | None = Field(default=None, ge=1)


class Suite(BaseModel):
    """A suite file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=60, pattern=r"^[A-Za-z0-9_.-]+$")
    models: list[str] = Field(min_length=1)
    runs: int = Field(default=1, ge=1, le=1000)
    concurrency: int = Field(default=2, ge=1, le=1000)
    tasks: list[EvalTask] = Field(min_length=1)


def load_suite(path: Path) -> Suite:
    """The suite at ``path``, its repositories made absolute from its directory.

    Raises:
        UsageError: unreadable, not TOML, or not a suite (naming the field).
    """
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: {exc}") from None
    try:
        suite = Suite.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"{path}: {where}: {first['msg']}") from None
    names = [t.name for t in suite.tasks]
    if len(set(names)) != len(names):
        raise UsageError(f"{path}: task names must be unique")
    for t in suite.tasks:
        if (t.repo is None) == (t.directory is None):
            raise UsageError(f"{path}: task {t.name}: give repo or directory (its start), one of them")
    tasks = [
        t.model_copy(
            update={
                "repo": str((path.parent / t.repo).resolve()) if t.repo else None,
                "directory": str((path.parent / t.directory).resolve()) if t.directory else None,
            }
        )
        for t in suite.tasks
    ]
    return suite.model_copy(update={"tasks": tasks})


def run_key(suite: Suite, task: EvalTask, model: str, n: int) -> str:
    """The key of one run's goal."""
    return f"eval:{suite.name}:{task.name}:{model}:{n}"


def _runs(suite: Suite) -> list[tuple[EvalTask, str, int]]:
    return [(t, m, n) for n in range(1, suite.runs + 1) for t in suite.tasks for m in suite.models]


async def _get(client: Connection, key: str) -> GoalView | None:
    try:
        return GoalView.model_validate(await client.call("goal/get", {"goalId": key}))
    except RpcError as exc:
        if exc.code == ErrorCode.NOT_FOUND:
            return None
        raise


async def _create(client: Connection, suite: Suite, task: EvalTask, model: str, n: int) -> str:
    params: dict[str, Any] = {
        "objective": task.objective,
        "title": f"eval {suite.name}: {task.name} on {model} #{n}",
        "key": run_key(suite, task, model, n),
        "idempotencyKey": run_key(suite, task, model, n),
        "model": model,
        "repo": task.repo,
        "base": task.base if task.repo else None,
        "branch": f"goald/eval/{suite.name}/{task.name}/{model.replace(':', '-')}/{n}" if task.repo else None,
        "startFrom": task.directory,
        "verify": [{"cmd": c} for c in task.verify],
        "budgets": task.budgets or None,
        "stallRounds": task.stall_rounds,
    }
    created = await client.call("goal/create", {k: v for k, v in params.items() if v is not None})
    return str(created["goalId"])


async def eval_run(client: Connection, args: argparse.Namespace) -> int:
    """``eval run SUITE.toml``: create the missing runs (at most ``concurrency`` unfinished) and wait."""
    path = Path(args.suite)
    suite = load_suite(path)
    todo = _runs(suite)
    live: set[str] = set()
    created = reused = 0
    while todo or live:
        for key in list(live):
            goal = await _get(client, key)
            if goal is None or goal.status.value in FINISHED:
                live.discard(key)
        while todo and len(live) < suite.concurrency:
            task, model, n = todo.pop(0)
            key = run_key(suite, task, model, n)
            goal = await _get(client, key)
            if goal is None:
                await _create(client, suite, task, model, n)
                created += 1
                live.add(key)
            else:
                reused += 1
                if goal.status.value not in FINISHED:
                    live.add(key)
        if live:
            await asyncio.sleep(POLL_SECONDS)  # the CLI looks again; the daemon runs the goals
    print(f"eval {suite.name}: {created} run(s) started, {reused} found already (not repeated)")
    return await eval_report(client, args)


def _spread(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{fmt.format(med)} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def summarize(suite: Suite, goals: dict[str, GoalView | None]) -> dict[str, Any]:
    """The report's figures, from the runs' goals (by key; ``None``: no goal yet)."""
    rows = []
    for model in suite.models:
        runs = [(t, n, goals.get(run_key(suite, t, model, n))) for n in range(1, suite.runs + 1) for t in suite.tasks]
        done = [g for _, _, g in runs if g is not None]
        verified = [g for g in done if g.status.value == "completed" and g.status_reason == "verified"]
        rows.append(
            {
                "model": model,
                "runs": len(runs),
                "started": len(done),
                "verified": len(verified),
                "stalled": sum(1 for g in done if g.status.value == "paused" and g.status_reason == "stalled"),
                "exhausted": sum(1 for g in done if g.status.value == "exhausted"),
                "rounds": [g.rounds for g in verified],
                "tokens": [g.tokens for g in verified],
                "cost": [g.cost for g in verified],
                "wallSeconds": [round(g.wall_used, 3) for g in verified],
                "goals": [
                    {"task": t.name, "run": n, "goalId": g.id if g else None, "status": g.status.value if g else None}
                    for t, n, g in runs
                ],
            }
        )
    return {"suite": suite.name, "tasks": [t.name for t in suite.tasks], "runsPerTask": suite.runs, "models": rows}


def markdown(report: dict[str, Any]) -> str:
    """The report as one markdown table (medians, with the spread in parentheses), then each run's goal."""
    lines = [
        f"# eval {report['suite']}: {len(report['tasks'])} task(s) × {report['runsPerTask']} run(s) per model",
        "",
        "| model | verified | rounds | tokens | cost | wall s to verified | stalled | exhausted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["models"]:
        lines.append(
            f"| {r['model']} | {r['verified']}/{r['runs']} | {_spread(r['rounds'], '{:.0f}')} | "
            f"{_spread(r['tokens'], '{:,.0f}')} | {_spread(r['cost'], '{:.4f}')} | "
            f"{_spread(r['wallSeconds'], '{:.1f}')} | {r['stalled']} | {r['exhausted']} |"
        )
    lines.append("")
    for r in report["models"]:
        for g in r["goals"]:
            lines.append(
                f"- {r['model']} {g['task']} #{g['run']}: {g['goalId'] or 'not started'} ({g['status'] or '-'})"
            )
    return "\n".join(lines) + "\n"


async def eval_report(client: Connection, args: argparse.Namespace) -> int:
    """``eval report SUITE.toml``: print the table and write it beside the suite (or in ``--out``)."""
    path = Path(args.suite)
    suite = load_suite(path)
    goals = {run_key(suite, t, m, n): await _get(client, run_key(suite, t, m, n)) for t, m, n in _runs(suite)}
    report = summarize(suite, goals)
    text = markdown(report)
    out = Path(args.out) if getattr(args, "out", None) else path.parent
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{suite.name}.report.md").write_text(text)
    (out / f"{suite.name}.report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(text, end="")
    return EXIT_OK


EVAL_ACTIONS = {"run": eval_run, "report": eval_report}


async def eval_command(client: Connection, args: argparse.Namespace) -> int:
    """``goald eval run|report``."""
    if args.eval_command is None:
        raise UsageError("usage: goald eval run|report SUITE.toml")
    return await EVAL_ACTIONS[args.eval_command](client, args)
