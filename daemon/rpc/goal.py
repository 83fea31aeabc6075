"""The ``goal/*`` methods: create, list, get, describe, pause, resume (one or all), cancel, update
and delete goals.

A goal is addressed by its key, its id or a unique prefix of its id (``goals.store.resolve_goal_id``).
``goal/describe`` is the operator's view: the goal with what it is doing now (:mod:`daemon.rpc.activity`),
why it stands where it stands (:func:`goals.why.why`, as every goal view carries it), the refused
verification, the schedule that started it and its latest events, so that ``goald goal show`` needs
one call and every reason arrives as the daemon knows it. ``goal/list`` gives each goal its activity.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from datetime import UTC, datetime
from typing import TypedDict, cast

from loguru import logger

from daemon.checks import check_goal_input, one_call_warning
from daemon.rpc.activity import activities, describe, nodes
from daemon.rpc.branches import create_on_repo
from daemon.rpc.context import HostPort, checked_sandbox, engine, runtime, scheduler, taking_work
from daemon.rpc.params import (
    GoalAnswer,
    GoalCreate,
    GoalDescribe,
    GoalList,
    GoalQuestions,
    GoalRef,
    GoalResume,
    GoalResumeAll,
    GoalRevoke,
    GoalUpdate,
)
from daemon.rpc.protocol import Dispatcher, InvalidField, Peer
from daemon.rpc.views import JsonObject, goal_view
from daemon.workdirs import copy_tree
from goals import Budgets, Goal, GoalId
from goals.why import operator_reason


class GoalCreated(TypedDict):
    """``goal/create``'s answer: with ``warnings``, what the goal as given cannot do (the CLI prints them)."""

    goalId: str
    sessionId: str
    workdir: str | None
    warnings: list[str]


class GoalPause(GoalRef):
    """``goal/pause``: ``reason``, the operator's words, kept with the pause (its status reason and
    event: ``paused (by operator: TEXT)``); without it the pause is ``by request``."""

    reason: str | None = None


class GoalListing(TypedDict):
    """``goal/list``'s answer."""

    goals: list[JsonObject]


class GoalDeleted(TypedDict):
    """``goal/delete``'s answer: the goal as it was, and how many sessions went with it."""

    goal: JsonObject
    sessionsDeleted: int


class ResumeOutcome(TypedDict):
    """One goal of ``goal/resumeAll``: resumed (``goal``) or not (``error``)."""

    goalId: str
    goal: JsonObject | None
    error: str | None


class Answered(TypedDict):
    """``goal/answer``'s answer: the goal after the answer, the question as it now stands, and the
    message that carries the answer to the goal (``None`` when the goal no longer waited on it)."""

    goal: JsonObject
    question: JsonObject
    messageId: str | None


class QuestionListing(TypedDict):
    """``goal/questions``' answer."""

    questions: list[JsonObject]


class ResumedAll(TypedDict):
    """``goal/resumeAll``'s answer."""

    results: list[ResumeOutcome]


def refuse_past_deadline(budgets: Budgets | None, current: Budgets | None = None) -> None:
    """A deadline already past is refused, naming the field: the goal would exhaust at once. The
    deadline a goal already has is kept as it is (an edit resends the budgets as a whole)."""
    if budgets is None or budgets.deadline is None:
        return
    if current is not None and current.deadline == budgets.deadline:
        return
    now = datetime.now(UTC)
    if budgets.deadline <= now:
        raise InvalidField(
            f"budgets.deadline: {budgets.deadline.isoformat()} is already past"
            f" (now {now.isoformat(timespec='seconds')}): give an instant in the future",
            field="budgets.deadline",
        )


async def create_goal(host: HostPort, p: GoalCreate, peer: Peer) -> GoalCreated:
    """``goal/create``: check the spec (model, commands, cost cap, sandbox) before anything is
    written, resolve the work directory, and create the goal."""
    taking_work(host)
    eng = engine(host)
    goal_id = GoalId.new()
    # Its work directory is resolved apart, below.
    spec = p.spec(host.settings.default_model).model_copy(update={"workdir": None})
    refuse_past_deadline(spec.budgets)
    # Refused now, naming the field, rather than at the first call or the first claim.
    check_goal_input(
        host.settings,
        host.models,
        model=spec.model or host.settings.default_model,
        commands=[(f"verify[{i}].cmd", v.cmd) for i, v in enumerate(spec.verify)]
        + ([("progress.cmd", spec.progress.cmd)] if spec.progress is not None else []),
        max_cost=spec.budgets.max_cost,
    )
    checked_sandbox(host, spec.sandbox, p.session_id is not None)
    if spec.repo is not None:
        if p.start_from is not None:
            raise InvalidField("give repo or startFrom, not both", field="startFrom")
        return cast(GoalCreated, await create_on_repo(host, spec, goal_id, peer.caller))
    if p.start_from is not None:
        if p.workdir is not None or p.session_id is not None:
            raise InvalidField(
                "startFrom makes the goal a work directory of its own: not with workdir or sessionId", field="startFrom"
            )
        source = host.workdirs.inside_roots(p.start_from, "startFrom")
        workdir = host.workdirs.resolve(None, goal_id)
        try:
            copied = await asyncio.to_thread(copy_tree, source, workdir)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, workdir, True)  # the copy cut short goes with it
            raise
        host.workdirs.hand_tree(workdir)
        logger.info("goal {}: starts from a copy of {} ({} entries)", goal_id, source, copied)
        spec = spec.model_copy(update={"workdir": str(workdir)})
    elif p.workdir is not None or p.session_id is None:
        workdir = host.workdirs.resolve(p.workdir, goal_id)
        spec = spec.model_copy(update={"workdir": str(workdir)})
    elif (row := await runtime(host).session(p.session_id)).workdir is not None:
        # A goal on an existing session works, and is verified, in that session's directory
        # (without one, its verification commands would have nowhere to run).
        spec = spec.model_copy(update={"workdir": str(host.workdirs.resolve(row.workdir, goal_id))})
    try:
        goal = await eng.create(spec, goal_id=goal_id, caller=peer.caller)
    except BaseException:
        if p.workdir is None and p.session_id is None and spec.workdir is not None:
            # The directory made above for this goal id: a refused goal (e.g. a key that is
            # taken) leaves nothing behind. rmdir removes it only while it is still empty.
            with contextlib.suppress(OSError):
                os.rmdir(spec.workdir)
        raise
    warning = one_call_warning(host.models, goal.model or host.settings.default_model, goal.objective, goal.budgets)
    warnings = [warning] if warning is not None else []
    return {"goalId": goal.id, "sessionId": goal.session_id, "workdir": goal.workdir, "warnings": warnings}


def _resumed_all(done: list[tuple[str, Goal | Exception]]) -> ResumedAll:
    """``goal/resumeAll``'s answer: each goal resumed, or the error that kept it paused."""
    return {
        "results": [
            {"goalId": gid, "goal": None, "error": str(got)}
            if isinstance(got, Exception)
            else {"goalId": gid, "goal": goal_view(got), "error": None}
            for gid, got in done
        ]
    }


def register(d: Dispatcher, host: HostPort) -> None:
    """Add the ``goal/*`` methods to ``d``."""

    @d.method("goal/create", GoalCreate)
    async def goal_create(p: GoalCreate, peer: Peer) -> GoalCreated:
        return await create_goal(host, p, peer)

    @d.method("goal/list", GoalList)
    async def goal_list(p: GoalList, peer: Peer) -> GoalListing:
        schedule_id = (await scheduler(host).get(p.schedule)).id if p.schedule is not None else None
        goals = await engine(host).list_goals(p.status, schedule_id=schedule_id, since=p.since)
        doing = await activities(host, goals)
        held = await nodes(host, goals)  # in a cluster: each goal's node
        return {
            "goals": [
                {**goal_view(g), "activity": doing[g.id], **({"node": held[g.id]} if held is not None else {})}
                for g in goals
            ]
        }

    @d.method("goal/get", GoalRef)
    async def goal_get(p: GoalRef, peer: Peer) -> JsonObject:
        return goal_view(await engine(host).get(p.goal_id))

    @d.method("goal/describe", GoalDescribe)
    async def goal_describe(p: GoalDescribe, peer: Peer) -> JsonObject:
        return await describe(host, await engine(host).get(p.goal_id), p.events)

    @d.method("goal/delete", GoalRef)
    async def goal_delete(p: GoalRef, peer: Peer) -> GoalDeleted:
        goal, sessions = await engine(host).delete(p.goal_id)
        return {"goal": goal_view(goal), "sessionsDeleted": sessions}

    @d.method("goal/resumeAll", GoalResumeAll)
    async def goal_resume_all(p: GoalResumeAll, peer: Peer) -> ResumedAll:
        taking_work(host)
        return _resumed_all(await engine(host).resume_all(p.reason, caller=peer.caller))

    @d.method("goal/pause", GoalPause)
    async def goal_pause(p: GoalPause, peer: Peer) -> JsonObject:
        try:
            reason = operator_reason(p.reason)
        except ValueError as exc:
            raise InvalidField(f"reason: {exc}", field="reason") from None
        return goal_view(await engine(host).pause(p.goal_id, reason, caller=peer.caller))

    @d.method("goal/resume", GoalResume)
    async def goal_resume(p: GoalResume, peer: Peer) -> JsonObject:
        taking_work(host)
        budgets = p.budgets
        if budgets is not None:
            refuse_past_deadline(budgets, (await engine(host).get(p.goal_id)).budgets)
        return goal_view(await engine(host).resume(p.goal_id, budgets, caller=peer.caller))

    @d.method("goal/answer", GoalAnswer)
    async def goal_answer(p: GoalAnswer, peer: Peer) -> Answered:
        if p.option is not None and p.text is not None:
            raise InvalidField("give text or option, not both", field="option")
        eng = engine(host)
        goal, asked = await eng.answer(
            p.goal_id, p.question_id, p.text, option=p.option, withdraw=p.withdraw, caller=peer.caller
        )
        now = await eng.question(asked.id)
        return {"goal": goal_view(goal), "question": now.public(), "messageId": now.message_id}

    @d.method("goal/revoke", GoalRevoke)
    async def goal_revoke(p: GoalRevoke, peer: Peer) -> JsonObject:
        if (p.subject is None) == (not p.all):
            raise InvalidField("give subject (an approval as goal show lists it) or all, not both", field="subject")
        return goal_view(await engine(host).revoke(p.goal_id, p.subject, caller=peer.caller))

    @d.method("goal/questions", GoalQuestions)
    async def goal_questions(p: GoalQuestions, peer: Peer) -> QuestionListing:
        found = await engine(host).questions(p.goal_id, open_only=p.open, limit=p.limit)
        return {"questions": [q.public() for q in found]}

    @d.method("goal/cancel", GoalRef)
    async def goal_cancel(p: GoalRef, peer: Peer) -> JsonObject:
        return goal_view(await engine(host).cancel(p.goal_id, caller=peer.caller))

    @d.method("goal/update", GoalUpdate)
    async def goal_update(p: GoalUpdate, peer: Peer) -> JsonObject:
        budgets = p.budgets
        if budgets is not None:
            refuse_past_deadline(budgets, (await engine(host).get(p.goal_id)).budgets)
        goal = await engine(host).update(
            p.goal_id,
            objective=p.objective,
            title=p.title,
            budgets=budgets,
            verify=p.verify,
            caller=peer.caller,
        )
        return goal_view(goal)
