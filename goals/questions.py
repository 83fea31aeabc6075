"""Questions a goal asks its operator: the ``goal_questions`` rows and the one transaction that closes one.

A question is asked by the model's ``ask_operator`` tool (:mod:`goals.tools`), which only records
a ``goal/question`` event; at the turn's idle the engine's decision (:func:`goals.policy.decide`,
kind ``ask``) makes the goal ``waiting`` and its fenced commit writes the row here
(:func:`insert_question`), or neither. The goal row keeps the open question's id and deadline
(``memory.question``): a question is open exactly while its goal waits on it.

A question closes once, in one transaction (:func:`close_question`): a conditional ``UPDATE … WHERE
answered_at IS NULL`` (a second answer finds no row to change and is refused with who answered
first and when), the goal made active again, and the message that carries the answer to the goal
enqueued as its continuation, its ``MessageId`` stored on the row. A ``kill -9`` before that commit
leaves the question open; after it, answered with its message queued: never answered twice, never
lost. How it closes (``how``):

* ``answer``: a person answered (``by`` names who: ``uid 1000 pid 4242`` on the control socket, the
  status page's token name, ``link``);
* ``default``: its deadline passed and it had a default answer;
* ``withdrawn``: the operator withdrew it with a reason (the goal hears the reason), or the goal
  was paused or cancelled while it waited;
* ``unanswered``: its deadline passed without a default: the goal pauses ``question_unanswered``.

The wait counts no round and charges nothing: the goal's wall time stops while it waits
(:func:`goals.budgets.with_status`), and the answer's turn is the next round.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agent import Tx
from agent.db import Conn
from goals.approvals import approval_message, granted
from goals.budgets import with_status
from goals.continuation import quote, render
from goals.decision import AskedQuestion
from goals.errors import GoalConflict, GoalNotFound, InvalidGoal
from goals.model import Goal, GoalStatus, OpenQuestion, QuestionId, StopReason
from goals.notices import notify_answered, notify_question
from goals.rows import conn_of
from goals.store import GOAL_ANSWERED, emit_changed, issue_continuation, load_goal, resolve_goal_id, save_goal
from goals.timers import Reminders, next_reminder

How = Literal["answer", "default", "withdrawn", "unanswered"]
#: How much of a question a goal's status reason carries.
REASON_CHARS = 200


class Question(BaseModel):
    """One row of ``goal_questions``."""

    model_config = ConfigDict(frozen=True)

    id: str
    goal_id: str
    session_id: str
    kind: str = "question"
    text: str
    options: list[str] = []
    default_answer: str | None = None
    asked_at: datetime
    deadline: datetime
    answer: str | None = None
    answered_at: datetime | None = None
    answered_by: str | None = None
    how: str | None = None
    message_id: str | None = None
    #: An approval's subject: the call it is about (:attr:`agent.tools.policy.Ask.key`).
    subject: str | None = None

    @property
    def open(self) -> bool:
        """Whether nobody has answered it yet (nor did its deadline close it)."""
        return self.answered_at is None

    def public(self) -> dict[str, Any]:
        """The question as the control protocol shows it (camelCase)."""
        return {
            "id": self.id,
            "goalId": self.goal_id,
            "kind": self.kind,
            "text": self.text,
            "options": list(self.options),
            "default": self.default_answer,
            "askedAt": self.asked_at.isoformat(),
            "deadline": self.deadline.isoformat(),
            "open": self.open,
            "answer": self.answer,
            "answeredAt": self.answered_at.isoformat() if self.answered_at else None,
            "answeredBy": self.answered_by,
            "how": self.how,
            "messageId": self.message_id,
            "subject": self.subject,
        }


class QuestionClosed(GoalConflict):
    """The question was answered (or closed) already: the first answer won; this one changed nothing."""


class QuestionNotFound(GoalNotFound):
    """No such question (of that goal)."""


def _row(r: Mapping[str, Any]) -> Question:
    return Question(
        id=r["id"],
        goal_id=r["goal_id"],
        session_id=r["session_id"],
        kind=r["kind"],
        text=r["text"],
        options=json.loads(r["options"]),
        default_answer=r["default_answer"],
        asked_at=datetime.fromisoformat(r["asked_at"]),
        deadline=datetime.fromisoformat(r["deadline"]),
        answer=r["answer"],
        answered_at=datetime.fromisoformat(r["answered_at"]) if r["answered_at"] else None,
        answered_by=r["answered_by"],
        how=r["how"],
        message_id=r["message_id"],
        subject=r["subject"],
    )


def deadline_of(goal: Goal, asked: AskedQuestion, now: datetime) -> datetime:
    """When ``asked`` stops waiting: its own timeout, else the goal's ``rules.question_timeout_seconds``."""
    seconds = asked.timeout_seconds if asked.timeout_seconds is not None else goal.rules.question_timeout_seconds
    return now + timedelta(seconds=seconds)


def waiting_on(goal: Goal, asked: AskedQuestion, now: datetime) -> Goal:
    """``goal`` made to wait on ``asked`` (pure: the decision's new goal; :func:`insert_question` writes the row)."""
    text = " ".join(asked.text.split())
    if len(text) > REASON_CHARS:
        text = text[: REASON_CHARS - 1] + "…"
    g = with_status(goal, GoalStatus.WAITING, f"{StopReason.QUESTION}: {text}", now)
    q = OpenQuestion(
        id=asked.id, deadline=deadline_of(goal, asked, now), has_default=asked.default is not None, asked_at=now
    )
    return g.model_copy(update={"not_before": None, "memory": g.memory.model_copy(update={"question": q})})


def insert_question(tx: Tx, goal: Goal, asked: AskedQuestion, now: datetime) -> None:
    """Write the row of ``asked`` (in the decision's transaction)."""
    deadline = goal.memory.question.deadline if goal.memory.question is not None else deadline_of(goal, asked, now)
    tx.execute(
        "INSERT INTO goal_questions(id, goal_id, session_id, kind, text, options, default_answer, asked_at, deadline,"
        " subject) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            asked.id,
            goal.id,
            goal.session_id,
            asked.kind,
            asked.text,
            json.dumps(asked.options),
            asked.default,
            now.isoformat(),
            deadline.isoformat(),
            asked.subject,
        ),
    )


def load_question(tx_or_conn: Tx | Conn, question_id: str) -> Question:
    """One question by id.

    Raises:
        QuestionNotFound: no question has that id.
    """
    r = conn_of(tx_or_conn).execute("SELECT * FROM goal_questions WHERE id=?", (question_id,)).fetchone()
    if r is None:
        raise QuestionNotFound(f"no question {question_id!r}: `goald goal questions` lists them")
    return _row(r)


def questions_of(
    tx_or_conn: Tx | Conn, goal_id: str | None = None, *, open_only: bool = False, limit: int = 100
) -> list[Question]:
    """Questions, newest first: of one goal (or of every goal), only the open ones if asked."""
    where, args = [], []
    if goal_id is not None:
        where.append("goal_id=?")
        args.append(goal_id)
    if open_only:
        where.append("answered_at IS NULL")
    sql = "SELECT * FROM goal_questions" + (f" WHERE {' AND '.join(where)}" if where else "")
    rows = conn_of(tx_or_conn).execute(f"{sql} ORDER BY asked_at DESC, id DESC LIMIT ?", (*args, limit)).fetchall()
    return [_row(r) for r in rows]


def open_question(tx_or_conn: Tx | Conn, goal: Goal, question_id: str | None) -> Question:
    """The question of ``goal`` to answer: ``question_id`` (which must be the goal's), else the one it waits on.

    Raises:
        QuestionNotFound: no such question of this goal. QuestionClosed: it was closed already.
        InvalidGoal: no id given and the goal waits on none.
    """
    if question_id is None:
        if goal.memory.question is None:
            latest = questions_of(tx_or_conn, goal.id, limit=1)
            if latest:  # e.g. another answer was first: say whose
                raise QuestionClosed(f"goal {goal.key or goal.id} has no open question: {closed_text(latest[0])}")
            raise InvalidGoal(f"goal {goal.key or goal.id} has asked no question ({goal.status.value})")
        question_id = goal.memory.question.id
    q = load_question(tx_or_conn, question_id)
    if q.goal_id != goal.id:
        raise QuestionNotFound(f"question {question_id} is not goal {goal.key or goal.id}'s")
    if not q.open:
        raise QuestionClosed(closed_text(q))
    return q


def closed_text(q: Question) -> str:
    """Why a second answer is refused: who closed the question, when and how."""
    at = q.answered_at.isoformat(timespec="seconds") if q.answered_at else "?"
    match q.how:
        case "default":
            what = f"its default answer {q.answer!r} was used at its deadline ({at})"
        case "withdrawn":
            what = f"it was withdrawn by {q.answered_by} at {at}: {q.answer}"
        case "unanswered":
            what = f"its deadline passed unanswered at {at} (the goal was paused)"
        case _:
            what = f"it was answered by {q.answered_by} at {at}: {q.answer!r}"
    return f"question {q.id} is closed: {what}"


def answer_message(q: Question, how: How, answer: str | None, by: str) -> str:
    """The text that brings a closed question to the goal's agent (quoted like the objective)."""
    asked = f"your question {q.id} (<question>{quote(q.text)}</question>)"
    match how:
        case "default":
            used = f"<answer>{quote(answer or '')}</answer>"
            return f"Nobody answered {asked} by its deadline; its default answer is used: {used}"
        case "withdrawn":
            return (
                f"The operator ({by}) withdrew {asked}: {quote(answer or 'no reason given')}. Go on without an answer."
            )
        case _:
            return f"The operator ({by}) answered {asked}: <answer>{quote(answer or '')}</answer>"


def close_question(
    tx: Tx,
    goal: Goal,
    q: Question,
    how: How,
    answer: str | None,
    by: str,
    now: datetime,
    *,
    caller: Mapping[str, int | str] | None = None,
    resume: bool = True,
) -> Goal:
    """Close ``q`` once (see the module docstring) and, when ``goal`` waits on it and ``resume``,
    make the goal active with the answer as its continuation; returns the goal to save (not saved:
    the caller saves it against the revision it read, and records the status change).

    Raises:
        QuestionClosed: it was closed already (by another answer that committed first).
    """
    cur = tx.execute(
        "UPDATE goal_questions SET answer=?, answered_at=?, answered_by=?, how=? WHERE id=? AND answered_at IS NULL",
        (answer, now.isoformat(), by, how, q.id),
    )
    if cur.rowcount != 1:
        raise QuestionClosed(closed_text(load_question(tx, q.id)))
    message_id = None
    waits = goal.memory.question is not None and goal.memory.question.id == q.id
    if waits:
        goal = goal.model_copy(update={"memory": goal.memory.model_copy(update={"question": None})})
    if q.kind == "approval" and how == "answer":
        goal = granted(goal, q.subject, answer)
    if waits and resume and goal.status is GoalStatus.WAITING:
        goal = with_status(goal, GoalStatus.ACTIVE, None, now)
        said = answer_message(q, how, answer, by)
        if q.kind == "approval" and how == "answer":
            said = approval_message(q.subject, answer, by)
        text = said + "\n\n" + render(goal, goal.rounds + 1, now)
        goal = issue_continuation(tx, goal, goal.rounds + 1, text)
        message_id = goal.continuation_id
        tx.execute("UPDATE goal_questions SET message_id=? WHERE id=?", (message_id, q.id))
    notify_answered(tx, goal, q.id, how, answer, by)
    tx.emit(
        goal.session_id,
        GOAL_ANSWERED,
        {
            "goalId": goal.id,
            "questionId": q.id,
            "answer": answer,
            "how": how,
            "by": by,
            "messageId": message_id,
            **(caller or {}),
        },
    )
    return goal


def answer_goal(
    tx: Tx,
    goal_ref: str,
    question_id: str | None,
    how: Literal["answer", "withdrawn"],
    text: str | None,
    option: int | None,
    now: datetime,
    caller: Mapping[str, int | str] | None = None,
) -> tuple[Goal, Question, GoalStatus]:
    """A person's answer (``option``: 1-based, else ``text``) or withdrawal (``text``: the reason) of
    the goal's question, in one transaction; returns the saved goal, the question as it was, and
    the goal's status before.

    Raises:
        InvalidGoal: no answer given, an option out of range, or no open question.
        QuestionNotFound, QuestionClosed: see :func:`open_question` and :func:`close_question`.
    """
    goal = load_goal(tx, resolve_goal_id(tx.conn, goal_ref))
    q = open_question(tx, goal, question_id)
    if option is not None:
        if how != "answer":
            raise InvalidGoal("option: only an answer picks an option (a withdrawal gives a reason)")
        if not q.options:
            raise InvalidGoal(f"option: question {q.id} has no options: answer it in words")
        if not 1 <= option <= len(q.options):
            raise InvalidGoal(f"option {option}: question {q.id} has options 1 to {len(q.options)}")
        text = q.options[option - 1]
    if how == "answer" and (text is None or not text.strip()):
        raise InvalidGoal("answer: give the answer's text, or --option N for one of the question's options")
    before = goal.status
    new = close_question(tx, goal, q, how, text, caller_name(caller), now, caller=caller)
    saved = save_goal(tx, new, goal.revision)
    emit_changed(tx, before, saved, caller)
    return saved, q, before


def question_due(tx: Tx, goal_id: str, now: datetime) -> tuple[Goal, GoalStatus] | None:
    """At a waiting goal's question's deadline: its default answer is used, or without one the goal
    pauses ``question_unanswered``; ``None`` when the goal no longer waits on a question that is due."""
    goal = load_goal(tx, goal_id)
    open_q = goal.memory.question
    if goal.status is not GoalStatus.WAITING or open_q is None or now < open_q.deadline:
        return None
    tx.fence(goal.session_id)  # only the node driving the goal's session decides for it
    q = load_question(tx, open_q.id)
    if q.default_answer is not None:
        new = close_question(tx, goal, q, "default", q.default_answer, "deadline", now)
    else:
        new = close_question(tx, goal, q, "unanswered", None, "deadline", now, resume=False)
        at = q.deadline.isoformat(timespec="seconds")
        reason = f"{StopReason.QUESTION_UNANSWERED}: nobody answered question {q.id} by its deadline ({at})"
        new = with_status(new, GoalStatus.PAUSED, reason, now)
    saved = save_goal(tx, new, goal.revision)
    emit_changed(tx, goal.status, saved)
    return saved, goal.status


def remind(tx: Tx, goal_id: str, now: datetime, reminders: Reminders | None) -> Goal | None:
    """Repeat a waiting goal's question to its operator when its next reminder is due (one more
    ``goal_question`` notification, its count on the goal); ``None`` when none is due."""
    goal = load_goal(tx, goal_id)
    due = next_reminder(goal, reminders) if goal.status is GoalStatus.WAITING else None
    if due is None or now < due or goal.memory.question is None:
        return None
    tx.fence(goal.session_id)
    q = goal.memory.question.model_copy(update={"reminders": goal.memory.question.reminders + 1})
    goal = goal.model_copy(update={"memory": goal.memory.model_copy(update={"question": q})})
    notify_question(tx, goal, reminder=q.reminders)
    return save_goal(tx, goal, goal.revision)


def withdraw_on_change(tx: Tx, goal: Goal, status: GoalStatus, now: datetime) -> Goal:
    """A waiting goal paused, cancelled or failed by a person: its question is withdrawn with it."""
    if goal.memory.question is None:
        return goal
    q = load_question(tx, goal.memory.question.id)
    if not q.open:
        return goal.model_copy(update={"memory": goal.memory.model_copy(update={"question": None})})
    return close_question(tx, goal, q, "withdrawn", f"the goal was {status.value}", "goald", now, resume=False)


def caller_name(caller: Mapping[str, int | str] | None) -> str:
    """Who answered, in words: ``uid 1000 pid 4242`` (control socket), ``web token NAME``, or ``operator``."""
    if caller is None:
        return "operator"
    if "web" in caller:
        return f"web token {caller['web']}"
    if "link" in caller:
        return "link"
    if "uid" in caller:
        return f"uid {caller['uid']} pid {caller.get('pid', '?')}"
    return "operator"


__all__ = [
    "How",
    "Question",
    "QuestionClosed",
    "QuestionId",
    "QuestionNotFound",
    "answer_goal",
    "answer_message",
    "caller_name",
    "close_question",
    "closed_text",
    "deadline_of",
    "insert_question",
    "load_question",
    "open_question",
    "question_due",
    "questions_of",
    "remind",
    "waiting_on",
    "withdraw_on_change",
]
