"""A goal's decision commits with the opening of the turn its continuation starts (issue 30: ≤ 6 round
trips per round), on both stores.

A decision that queues a continuation for a session whose driver is here and waiting is handed to
that driver (:meth:`agent.driver.Agent.open_after`, :mod:`goals.committing`): it commits first in the
write that opens the turn admitting the continuation and reserves the turn's first call. Pins:

* every such round's decision, continuation, opening and first reservation are one transaction
  (the events and the call's row carry that transaction's time), and a goal runs the same rounds to
  the same end as when each decision commits on its own, in fewer transactions;
* a person's follow-up that lands between the decision and that write makes the decision stale
  there: nothing of it is written, the turn admits the follow-up alone, and the goal decides again
  at the next idle — every round's continuation admitted exactly once.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from goalkit import goal_runtime

from agent import Agent, Reply, ScriptedModel, Store
from goals import Budgets, GoalSpec, GoalStatus

pytestmark = pytest.mark.both_stores

WAIT = 20.0
ROUNDS = 4  # under the stall rule's pause (4 rounds without progress pauses at the fifth decision)


class Racing(ScriptedModel):
    """A scripted model that runs :attr:`race` when its :attr:`at`-th step begins: after the driver
    planned the turn (with what was handed to it), before the write that opens it."""

    race: Callable[[], Awaitable[None]] | None = None
    at = 0
    steps = 0

    async def discover_window(self) -> None:
        self.steps += 1
        if self.race is not None and self.steps == self.at:
            await self.race()


async def run_goal(db_path: Path | str, workdir: Path, model: ScriptedModel) -> tuple[Any, list[Any], int, Any]:
    """A goal of :data:`ROUNDS` rounds that never claims completion; the goal as it ended, its
    session's events, the transactions on its session, and the runtime's store rows of its calls."""
    ended = asyncio.Event()
    count = 0
    sid = ""

    def decided(inp: Any, decision: Any) -> None:
        if not decision.goal.status.live:
            ended.set()

    async with goal_runtime(db_path, model, on_decision=decided) as (rt, engine, _):
        transact = rt.store.transact

        async def counting(fn: Any, session: str | None = None, **kw: Any) -> Any:
            nonlocal count
            count += session is not None and session == sid
            return await transact(fn, session=session, **kw)

        rt.store.transact = counting  # type: ignore[method-assign]
        goal = await engine.create(
            GoalSpec(objective="Keep going.", workdir=str(workdir), budgets=Budgets(max_rounds=ROUNDS))
        )
        sid = goal.session_id
        async with asyncio.timeout(WAIT):
            await ended.wait()
        await engine.settled()
        rt.store.transact = transact  # type: ignore[method-assign]
        goal = await engine.get(goal.id)
        events = await rt.store.events_after(sid, 0)
        calls = await rt.store.read(
            lambda conn: [
                dict(r) for r in conn.execute("SELECT turn_id, started_at FROM model_calls WHERE session_id=?", (sid,))
            ]
        )
    return goal, events, count, calls


def rounds_in_one_write(events: list[Any], calls: list[dict[str, Any]]) -> int:
    """How many turns were opened in the transaction that queued their continuation (a decision's)
    and reserved their first call (events and rows of one transaction share its time)."""
    first_call = {}
    for call in sorted(calls, key=lambda c: c["started_at"]):
        first_call.setdefault(call["turn_id"], call["started_at"])
    by_time = collections.defaultdict(list)
    for e in events:
        by_time[e.at].append(e.type)
    # A continuing decision writes the goal's row and queues the continuation (no event of its own).
    return sum(
        1
        for e in events
        if e.type == "turn/start" and "message/queued" in by_time[e.at] and first_call.get(e.data["turnId"]) == e.at
    )


async def test_a_round_decided_opens_its_turn_and_reserves_its_call_in_one_write(
    db_path: Path | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    goal, events, count, calls = await run_goal(db_path, tmp_path / "a", ScriptedModel(lambda r: Reply.say("on it")))
    monkeypatch.setattr(Agent, "open_after", lambda self, write, rows: None)
    other = db_path if isinstance(db_path, str) else tmp_path / "other.db"  # PostgreSQL: the same database
    alone, alone_events, alone_count, alone_calls = await run_goal(
        other, tmp_path / "b", ScriptedModel(lambda r: Reply.say("on it"))
    )
    assert (goal.status, goal.status_reason, goal.rounds) == (alone.status, alone.status_reason, alone.rounds)
    assert goal.status is GoalStatus.EXHAUSTED and goal.rounds == ROUNDS
    # Every round but the first (whose continuation the goal's creation queued) was decided so.
    assert rounds_in_one_write(events, calls) == ROUNDS - 1
    assert rounds_in_one_write(alone_events, alone_calls) == 0
    assert count <= alone_count - (ROUNDS - 1), (count, alone_count)


async def test_a_follow_up_between_the_decision_and_its_write_makes_it_stale_there(
    db_path: Path | str, tmp_path: Path
) -> None:
    model = Racing(lambda r: Reply.say("on it"))
    model.at = 2  # the second turn: the first whose continuation a decision queued
    ended = asyncio.Event()

    def decided(inp: Any, decision: Any) -> None:
        if not decision.goal.status.live:
            ended.set()

    async with goal_runtime(db_path, model, on_decision=decided) as (rt, engine, _):
        goal = await engine.create(
            GoalSpec(objective="Keep going.", workdir=str(tmp_path), budgets=Budgets(max_rounds=3))
        )

        async def race() -> None:
            await rt.enqueue(goal.session_id, "a person's note")

        model.race = race
        async with asyncio.timeout(WAIT):
            await ended.wait()
        await engine.settled()
        goal = await engine.get(goal.id)
        events = await rt.store.events_after(goal.session_id, 0)
    second = model.calls[1].request.messages[-1]
    assert [b.text for b in second.content] == ["a person's note"]  # type: ignore[union-attr]
    admitted = [e.data["source"] for e in events if e.type == "message/admitted"]
    refs = [s["ref"] for s in admitted if s["kind"] == "goal"]
    assert len(refs) == len(set(refs)) == goal.rounds == 3  # each round's continuation admitted once
    assert [s["kind"] for s in admitted].count("user") == 1
    assert goal.status is GoalStatus.EXHAUSTED
    assert isinstance(rt.store, Store)
