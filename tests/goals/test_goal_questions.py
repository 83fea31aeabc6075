"""A goal asks its operator a question and waits; the answer (once) makes it go on (real SQLite, real files).

The agent calls ``ask_operator``; at the turn's idle the goal becomes ``waiting`` with the question
as its reason and a ``goal_questions`` row, written together. Nothing is called while it waits. An
answer (words or an option), the default at the deadline, or a withdrawal closes the question once
and the goal goes on with a message that names it; without a default the deadline pauses the goal
``question_unanswered``. A second answer is refused, naming the first. The only stand-in is the
scripted model.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from goalkit import goal_runtime, wait_status
from test_goal_people import call, latest_user

from agent import ModelRequest, Reply
from goals import GoalSpec, GoalStatus, StopRules
from goals.questions import QuestionClosed
from goals.timers import Reminders

pytestmark = pytest.mark.both_stores

QUESTION = "Which database should the report read: sqlite or postgres?"
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def asker(seen: list[str], *, options: list[str] | None = None, default: str | None = None) -> Any:
    """Round 1 asks; the turn after a closed question writes what it heard to heard.txt and claims completion."""

    def rule(request: ModelRequest) -> Reply:
        text, step = latest_user(request)
        if "your question q_" in text:
            if step == 0:
                seen.append(text)
                found = ANSWER.search(text)
                heard = found.group(1) if found else "withdrawn"
                return call("write_file", path="heard.txt", content=heard)
            if step == 1:
                return call("goal_complete", summary="done with the answer", evidence="heard.txt")
            return Reply.say("done")
        if step == 0:
            args: dict[str, Any] = {"question": QUESTION}
            if options is not None:
                args["options"] = options
            if default is not None:
                args["default"] = default
            return call("ask_operator", **args)
        return Reply.say("I asked; waiting for the operator.")

    return rule


async def _asked(rt: Any, engine: Any, workdir: Path, wait_for: float = 86_400.0) -> Any:
    sid = await rt.create_session(workdir=workdir)
    goal = await engine.create(
        GoalSpec(objective="Write the report.", session_id=sid, rules=StopRules(question_timeout_seconds=wait_for))
    )
    await wait_status(rt, goal, GoalStatus.WAITING)
    await engine.settled()
    return await engine.get(goal.id)


async def test_a_goal_asks_waits_without_calls_and_an_answer_resumes_it_once(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    seen: list[str] = []
    async with goal_runtime(db_path, asker(seen, options=["sqlite", "postgres"]), "asker") as (rt, engine, model):
        goal = await _asked(rt, engine, workdir)
        assert goal.status is GoalStatus.WAITING
        assert goal.status_reason == f"question: {QUESTION}"
        assert goal.rounds == 1
        [q] = await engine.questions(goal.id)
        assert (q.text, q.options, q.open) == (QUESTION, ["sqlite", "postgres"], True)
        assert goal.memory.question is not None and goal.memory.question.id == q.id
        calls = model.call_count
        # Nothing is due: the engine's timers and a fresh look change nothing and call nothing.
        engine.kick(goal.id)
        await engine.settled()
        assert model.call_count == calls
        assert (await engine.get(goal.id)).status is GoalStatus.WAITING

        answered, before = await engine.answer(
            goal.key or goal.id, None, None, option=2, caller={"uid": 1000, "pid": 7}
        )
        assert before.id == q.id
        assert answered.status is GoalStatus.ACTIVE
        await wait_status(rt, goal, GoalStatus.COMPLETED)
        assert (workdir / "heard.txt").read_text() == "postgres"
        assert len(seen) == 1 and "uid 1000 pid 7" in seen[0] and QUESTION in seen[0]
        [closed] = await engine.questions(goal.id)
        assert (closed.answer, closed.how, closed.answered_by) == ("postgres", "answer", "uid 1000 pid 7")
        assert closed.message_id is not None
        final = await engine.get(goal.id)
        assert final.rounds == 2  # the ask's round and the answer's; the wait counted none

        with pytest.raises(QuestionClosed, match=r"answered by uid 1000 pid 7 at .*'postgres'"):
            await engine.answer(goal.id, q.id, "sqlite")


async def test_two_answers_racing_one_wins_every_time(db_path: Path, tmp_path: Path) -> None:
    seen: list[str] = []
    async with goal_runtime(db_path, asker(seen), "race") as (rt, engine, _model):
        for i in range(20):
            workdir = tmp_path / f"work{i}"
            workdir.mkdir()
            goal = await _asked(rt, engine, workdir)
            got = await asyncio.gather(
                engine.answer(goal.id, None, "first", caller={"uid": 1, "pid": 1}),
                engine.answer(goal.id, None, "second", caller={"web": "phone"}),
                return_exceptions=True,
            )
            wins = [g for g in got if not isinstance(g, BaseException)]
            losses = [g for g in got if isinstance(g, BaseException)]
            assert len(wins) == 1 and len(losses) == 1, got
            assert isinstance(losses[0], QuestionClosed)
            [q] = await engine.questions(goal.id)
            assert q.answered_by in str(losses[0])
            await wait_status(rt, goal, GoalStatus.COMPLETED)
        assert len(seen) == 20


@pytest.mark.parametrize("default", ["sqlite", None])
async def test_the_deadline_uses_the_default_or_pauses(default: str | None, db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    seen: list[str] = []
    options = ["sqlite", "postgres"]
    async with goal_runtime(db_path, asker(seen, options=options, default=default), "deadline") as (rt, engine, _m):
        sid = await rt.create_session(workdir=workdir)
        goal = await engine.create(
            GoalSpec(objective="Write the report.", session_id=sid, rules=StopRules(question_timeout_seconds=0.5))
        )
        await wait_status(rt, goal, GoalStatus.WAITING)
        if default is None:
            paused = await wait_status(rt, goal, GoalStatus.PAUSED)
            assert paused["reason"].startswith("question_unanswered: nobody answered question q_")
            [q] = await engine.questions(goal.id)
            assert (q.how, q.answer, q.open) == ("unanswered", None, False)
            assert seen == []
            with pytest.raises(QuestionClosed, match="deadline passed unanswered"):
                await engine.answer(goal.id, q.id, "too late")
        else:
            await wait_status(rt, goal, GoalStatus.COMPLETED)
            assert (workdir / "heard.txt").read_text() == "sqlite"
            assert "default answer is used" in seen[0]
            [q] = await engine.questions(goal.id)
            assert (q.how, q.answer, q.answered_by) == ("default", "sqlite", "deadline")


async def test_a_withdrawn_question_lets_the_goal_go_on_with_the_reason(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    seen: list[str] = []
    async with goal_runtime(db_path, asker(seen), "withdraw") as (rt, engine, _m):
        goal = await _asked(rt, engine, workdir)
        await engine.answer(goal.id, None, "use whatever is there", withdraw=True, caller={"uid": 0, "pid": 1})
        await wait_status(rt, goal, GoalStatus.COMPLETED)
        assert "withdrew your question" in seen[0] and "use whatever is there" in seen[0]
        [q] = await engine.questions(goal.id)
        assert (q.how, q.answer) == ("withdrawn", "use whatever is there")


async def test_pausing_or_cancelling_a_waiting_goal_withdraws_its_question(db_path: Path, tmp_path: Path) -> None:
    seen: list[str] = []
    async with goal_runtime(db_path, asker(seen), "pause") as (rt, engine, _m):
        for verb in ("pause", "cancel"):
            workdir = tmp_path / verb
            workdir.mkdir()
            goal = await _asked(rt, engine, workdir)
            changed = await getattr(engine, verb)(goal.id)
            assert changed.memory.question is None
            [q] = await engine.questions(goal.id)
            assert q.how == "withdrawn" and q.answer == f"the goal was {changed.status.value}"
            with pytest.raises(QuestionClosed, match=r"no open question: .*withdrawn by goald"):
                await engine.answer(goal.id, None, "late")


async def test_bad_answers_are_refused_and_change_nothing(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    async with goal_runtime(db_path, asker([], options=["a", "b"]), "bad") as (rt, engine, _m):
        goal = await _asked(rt, engine, workdir)
        with pytest.raises(ValueError, match=r"option 3: question q_.* has options 1 to 2"):
            await engine.answer(goal.id, None, option=3)
        with pytest.raises(ValueError, match="give the answer's text"):
            await engine.answer(goal.id, None, "  ")
        with pytest.raises(LookupError, match="no question"):
            await engine.answer(goal.id, "q_nothing", "a")
        after = await engine.get(goal.id)
        assert after.status is GoalStatus.WAITING and after.revision == goal.revision
        [q] = await engine.questions(goal.id)
        assert q.open


async def test_a_question_is_notified_repeated_until_answered_and_its_answer_said(
    db_path: Path, tmp_path: Path
) -> None:
    """One ``goal_question`` notification when it is asked, then one per reminder (at most two here),
    and a ``goal_answered`` one naming who answered; each in the transaction of its change."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    reminders = Reminders(every=0.3, most=2)
    async with goal_runtime(db_path, asker([], options=["a", "b"]), "remind", reminders=reminders) as (rt, engine, _m):
        goal = await _asked(rt, engine, workdir)

        async def sent() -> list[dict[str, Any]]:
            rows = await rt.store.read(
                lambda conn: conn.execute("SELECT kind, payload FROM outbox ORDER BY id").fetchall()
            )
            return [{"kind": r["kind"], **json.loads(r["payload"])} for r in rows]

        async with asyncio.timeout(30):
            while sum(1 for n in await sent() if n["kind"] == "goal_question") < 3:
                await engine.settled()
                await asyncio.sleep(0.05)  # polling the outbox table: no event announces a notification
        questions = [n for n in await sent() if n["kind"] == "goal_question"]
        assert [n["reminder"] for n in questions] == [0, 1, 2]
        assert all(n["question"]["options"] == ["a", "b"] and n["question"]["text"] == QUESTION for n in questions)
        assert "asks (reminder 2): Which database" in questions[2]["summary"]
        await engine.answer(goal.id, None, option=1, caller={"web": "phone"})
        await wait_status(rt, goal, GoalStatus.COMPLETED)
        kinds = [n["kind"] for n in await sent()]
        assert kinds.count("goal_question") == 3  # no reminder after the answer, nor past the most
        [said] = [n for n in await sent() if n["kind"] == "goal_answered"]
        assert said["question"]["answeredBy"] == "web token phone"
        assert "answered by web token phone: a" in said["summary"]
