"""A goal on a repository (``repo`` in its spec): its worktree at ``goal/create``, ``goal/diff`` and ``goal/commit``.

The worktree is made before the goal exists (:func:`daemon.worktrees.make_worktree`), in a new
directory inside the work-directory roots, and undone if the goal cannot be created. ``goal/diff``
compares two of the goal's recorded checkpoints (:mod:`goals.snapshots`): its start and its latest
round, or one round and the one before. ``goal/commit`` writes the latest checkpoint as a commit
on the goal's branch (:func:`daemon.worktrees.commit_checkpoint`). No git reads the work directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypedDict

from loguru import logger
from pydantic import Field

from daemon.checks import check_goal_input, one_call_warning
from daemon.ports import HostPort
from daemon.rpc.context import engine, runtime, taking_work
from daemon.rpc.params import GoalRef
from daemon.rpc.protocol import Dispatcher, InvalidField, Peer
from daemon.rpc.views import JsonObject
from daemon.worktrees import (
    GitFailed,
    commit_checkpoint,
    default_branch,
    drop_orphan,
    git,
    make_worktree,
    remove_worktree,
)
from goals import Budgets, Decision, DecisionKind, Goal, GoalEngine, GoalSpec, PolicyInput
from goals.model import GoalId
from goals.payloads import Caller
from goals.snapshots import Snapshots
from goals.store import goal_by_idempotency_key, goal_on_branch


class GoalDiff(GoalRef):
    """``goal/diff``: since the goal's start (its latest round against its start), or ``round`` N
    against the round before; ``stat``: the files' counts only, no text."""

    round: int | None = Field(default=None, ge=1)
    stat: bool = False


class GoalCommit(GoalRef):
    """``goal/commit``: the latest recorded tree as a commit on the goal's branch."""

    message: str | None = Field(default=None, min_length=1, max_length=10_000)


class GoalReplay(GoalRef):
    """``goal/replay``: a new goal with the goal's objective, verification, progress command, rules,
    tools, sandbox and budgets (``budgets``: instead), from the same start (its base commit), on
    ``model`` (default: the same), keyed ``key``; linked back (``replayOf``)."""

    model: str | None = Field(default=None, min_length=1, max_length=200)
    key: str | None = Field(default=None, min_length=1, max_length=200)
    budgets: Budgets | None = None


#: ``goal/diff``'s answer: the two checkpoints compared (``from``, ``to``: ``base``, ``round-N``),
#: the files that differ (path, status, lines added and removed), the diff's text, and notes.
Diffed = TypedDict(
    "Diffed",
    {"goalId": str, "from": str, "to": str, "files": list[JsonObject], "text": str, "notes": list[str]},
)


class Committed(TypedDict):
    """``goal/commit``'s answer."""

    commit: str
    branch: str
    repo: str
    checkpoint: str


def _is_dir(path: Path) -> bool:
    return path.is_dir()


async def create_on_repo(
    host: HostPort, spec: GoalSpec, goal_id: GoalId, caller: Caller | None = None
) -> dict[str, object]:
    """``goal/create`` of a goal with ``repo``: its worktree on its new branch, then the goal."""
    if spec.workdir is not None:
        raise InvalidField(
            "give repo or workdir, not both: a goal on a repository works in a worktree of it", field="workdir"
        )
    repo = Path(str(spec.repo))
    if not _is_dir(repo):
        raise InvalidField(f"repo {spec.repo!r} is not a directory", field="repo")
    store = runtime(host).store
    if spec.idempotency_key is not None:
        earlier = await store.read(lambda conn: goal_by_idempotency_key(conn, str(spec.idempotency_key)))
        if earlier is not None:  # made already: no second worktree
            return _created(host, earlier)
    branch = spec.branch or default_branch(spec.key, goal_id)
    workdir = host.workdirs.resolve(None, goal_id)
    try:
        try:
            base_commit = await make_worktree(repo, spec.base or "HEAD", branch, workdir)
        except GitFailed as exc:
            held = await store.read(lambda conn: goal_on_branch(conn, str(repo), branch))
            if "already exists" not in str(exc) or held is not None:
                raise
            # A creation cut short before its goal committed left this branch: nobody's, so gone.
            if not await drop_orphan(repo, branch, host.settings.roots):
                raise
            base_commit = await make_worktree(repo, spec.base or "HEAD", branch, workdir)
    except GitFailed as exc:
        with contextlib.suppress(OSError):
            os.rmdir(workdir)
        raise InvalidField(f"repo: {exc}", field="repo") from None
    host.workdirs.hand_tree(workdir)  # the checked-out files are the goal's commands' to change
    spec = spec.model_copy(update={"workdir": str(workdir), "branch": branch})
    try:
        goal = await engine(host).create(spec, goal_id=goal_id, caller=caller, base_commit=base_commit)
    except BaseException:
        with contextlib.suppress(GitFailed):
            await remove_worktree(repo, branch, workdir)
        raise
    return _created(host, goal)


def _created(host: HostPort, goal: Goal) -> dict[str, object]:
    """``goal/create``'s answer for a goal on a repository."""
    warning = one_call_warning(host.models, goal.model or host.settings.default_model, goal.objective, goal.budgets)
    return {
        "goalId": goal.id,
        "sessionId": goal.session_id,
        "workdir": goal.workdir,
        "warnings": [warning] if warning is not None else [],
        "branch": goal.branch,
        "baseCommit": goal.base_commit,
    }


async def replay(host: HostPort, p: GoalReplay, peer: Peer) -> dict[str, object]:
    """``goal/replay``: see :class:`GoalReplay`."""
    original = await engine(host).get(p.goal_id)
    goal_id = GoalId.new()
    fields = {name: getattr(original, name) for name in GoalSpec.model_fields}
    fields.update(
        key=p.key,
        idempotency_key=None,
        session_id=None,
        workdir=None,
        base=original.base_commit,
        branch=None,
        replay_of=original.id,
        model=p.model or original.model,
        budgets=p.budgets or original.budgets,
    )
    spec = GoalSpec.model_validate(fields)
    check_goal_input(
        host.settings,
        host.models,
        model=spec.model or host.settings.default_model,
        commands=[(f"verify[{i}].cmd", v.cmd) for i, v in enumerate(spec.verify)],
        max_cost=spec.budgets.max_cost,
    )
    if original.repo is not None and original.base_commit is not None:
        return await create_on_repo(host, spec, goal_id, peer.caller)
    return await _replay_from_copy(host, original, spec, goal_id, peer)


async def _replay_from_copy(
    host: HostPort, original: Goal, spec: GoalSpec, goal_id: GoalId, peer: Peer
) -> dict[str, object]:
    """A replay of a goal not on a repository: a new work directory holding the original's start,
    as goald recorded it when the original was created."""
    ref = original.key or original.id
    if original.workdir is None:
        raise InvalidField(f"goal {ref} has no work directory: there is no start to replay from", field="goalId")
    snaps = _snapshots(host)
    start = snaps.manifest(original.id, "base")
    if start is None:
        raise InvalidField(f"goal {ref}'s start was not recorded (made before goald recorded starts)", field="goalId")
    if start.truncated:
        raise InvalidField(f"goal {ref}'s start was recorded only in part ({start.truncated})", field="goalId")
    workdir = host.workdirs.resolve(None, goal_id)
    await asyncio.to_thread(snaps.restore, original.id, start, workdir)
    host.workdirs.hand_tree(workdir)
    goal = await engine(host).create(
        spec.model_copy(update={"workdir": str(workdir)}), goal_id=goal_id, caller=peer.caller
    )
    return {**_created(host, goal), "startFiles": len(start.files)}


def _snapshots(host: HostPort) -> Snapshots:
    snaps = engine(host).snapshots
    if snaps is None:
        raise InvalidField("this daemon records no checkpoints", field="goalId")
    return snaps


def register(d: Dispatcher, host: HostPort) -> None:
    """Add ``goal/diff``, ``goal/replay`` and ``goal/commit`` to ``d``."""

    @d.method("goal/diff", GoalDiff)
    async def goal_diff(p: GoalDiff, peer: Peer) -> Diffed:
        goal = await engine(host).get(p.goal_id)
        if goal.repo is None:
            raise InvalidField(
                f"goal {goal.key or goal.id} is not on a repository: it has no recorded rounds to diff", field="goalId"
            )
        snaps = _snapshots(host)
        names = snaps.names(goal.id)
        if p.round is None:
            old_name, new_name = "base", (names[-1] if names else "base")
        else:
            new_name = f"round-{p.round}"
            if new_name not in names:
                recorded = ", ".join(names) or "none"
                raise InvalidField(
                    f"round {p.round} of goal {goal.key or goal.id} was not recorded (recorded: {recorded})",
                    field="round",
                )
            earlier = [n for n in names if n != "base" and int(n.split("-")[1]) < p.round]
            old_name = earlier[-1] if earlier else "base"
        old, new = snaps.manifest(goal.id, old_name), snaps.manifest(goal.id, new_name)
        if old is None or new is None:
            raise InvalidField(f"goal {goal.key or goal.id} has no recorded start", field="goalId")
        files = snaps.diff(goal.id, old, new)
        notes = [f"{n}: {m.truncated}" for n, m in ((old_name, old), (new_name, new)) if m.truncated]
        return {
            "goalId": goal.id,
            "from": old_name,
            "to": new_name,
            "files": [f.public() for f in files],
            "text": "" if p.stat else "".join(f.text for f in files),
            "notes": notes,
        }

    @d.method("goal/replay", GoalReplay)
    async def goal_replay(p: GoalReplay, peer: Peer) -> dict[str, object]:
        taking_work(host)
        return await replay(host, p, peer)

    @d.method("goal/commit", GoalCommit)
    async def goal_commit(p: GoalCommit, peer: Peer) -> Committed:
        return await commit_latest(_snapshots(host), await engine(host).get(p.goal_id), p.message)


def commit_on_completion(eng: GoalEngine, spawn: Callable[[Coroutine[Any, Any, None]], object]) -> None:
    """Commit the last recorded tree of a goal with ``commit_on_complete`` onto its branch as it
    completes (after the decision committed; a failure is logged, the goal stays completed)."""

    async def commit(goal: Goal) -> None:
        if eng.snapshots is None:
            return
        try:
            done = await commit_latest(eng.snapshots, goal)
        except InvalidField as exc:
            logger.warning("goal {}: its final state was not committed: {}", goal.id, exc)
            return
        logger.info("goal {}: committed its final state {} on {}", goal.id, done["commit"], done["branch"])

    def listen(_inp: PolicyInput, decision: Decision) -> None:
        goal = decision.goal
        if decision.kind is DecisionKind.COMPLETE and goal.repo is not None and goal.commit_on_complete:
            spawn(commit(goal))

    eng.add_decision_listener(listen)


async def commit_latest(snaps: Snapshots, goal: Goal, message: str | None = None) -> Committed:
    """Write the goal's latest recorded tree as a commit on its branch (``goal/commit``, and a goal
    with ``commit_on_complete`` when it completes).

    Raises:
        InvalidField: not on a repository, nothing recorded, or git refused (its words).
    """
    if goal.repo is None or goal.branch is None or goal.base_commit is None:
        raise InvalidField(f"goal {goal.key or goal.id} is not on a repository", field="goalId")
    names = snaps.names(goal.id)
    name = names[-1] if names else None
    manifest = snaps.manifest(goal.id, name) if name else None
    if manifest is None or name is None:
        raise InvalidField(f"goal {goal.key or goal.id} has no recorded tree", field="goalId")
    repo = Path(goal.repo)
    try:
        tip = (await git(repo, "rev-parse", "--verify", f"refs/heads/{goal.branch}^{{commit}}")).strip()
        text = message or f"{goal.title}\n\ngoald goal {goal.id}, {name}"
        commit = await commit_checkpoint(repo, goal.branch, tip, snaps, goal.id, manifest, text)
    except GitFailed as exc:
        raise InvalidField(f"commit: {exc}", field="goalId") from None
    return {"commit": commit, "branch": goal.branch, "repo": goal.repo, "checkpoint": name}
