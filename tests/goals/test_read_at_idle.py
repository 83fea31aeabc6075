"""A goal's evaluation reads what it decides from with the commit of its session's idle (issue 30).

The transaction that leaves a goal session idle (the turn's end, on the driver) also reads the goal
and the interval's events, in its own ``COMMIT``'s round trip (:meth:`agent.tx.Tx.commit`, the
store's ``at_idle``: the goal engine's :meth:`~goals.following.GoalFollowing._idle_read`); the
evaluation of that idle decides from those rows instead of opening a read of its own. Pins, on both
stores:

* goals run round after round with no evaluation read of their own, and end exactly as they do
  when every evaluation reads (the same rounds, the same status and reason);
* what was read with the idle is what a read of its own finds; it is used once, and not at all
  once this process wrote the session (an event after the idle) or the goal (a new revision)
  since: the evaluation then reads;
* a reader that fails, or whose rows cannot be taken, leaves the idle committed (logged; the
  evaluation reads);
* on PostgreSQL the reads cost the idle's transaction no round trip.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from goalkit import goal_runtime

import goals.engine
from agent import AgentStatus, Reply, SessionState, Store, Tx
from goals import Budgets, GoalSpec, GoalStatus
from goals.engine import GoalEngine
from goals.queries import round_of
from goals.store import save_goal

pytestmark = pytest.mark.both_stores

WAIT = 20.0


def _idle_again(sid: str) -> Any:
    def run(tx: Tx) -> None:  # a turn's worth of status: running, then idle (as a turn's end leaves it)
        tx.set_status(sid, AgentStatus.RUNNING)
        tx.set_status(sid, AgentStatus.IDLE)

    return run


async def _rounds(db_path: Path | str, workdir: Path, monkeypatch: pytest.MonkeyPatch, *, at_idle: bool) -> Any:
    """A goal of 4 rounds that never claims completion (exhausted at its budget); how many
    evaluations read on their own, how many decisions were made, and the goal as it ended."""
    reads = 0
    read = goals.engine.round_of

    def counted(tx: Tx, goal_id: str, session_id: str | None) -> Any:
        nonlocal reads
        reads += 1
        return read(tx, goal_id, session_id)

    monkeypatch.setattr(goals.engine, "round_of", counted)
    if not at_idle:
        monkeypatch.setattr(GoalEngine, "_idle_read", lambda self, sid, st: None)
    decisions, ended = 0, asyncio.Event()

    def decided(inp: Any, decision: Any) -> None:
        nonlocal decisions
        decisions += 1
        if not decision.goal.status.live:
            ended.set()

    async with goal_runtime(db_path, lambda request: Reply.say("working on it"), on_decision=decided) as (
        _rt,
        engine,
        _,
    ):
        goal = await engine.create(
            GoalSpec(objective="Keep going.", workdir=str(workdir), budgets=Budgets(max_rounds=4))
        )
        async with asyncio.timeout(WAIT):
            await ended.wait()
        goal = await engine.get(goal.id)
    monkeypatch.undo()
    return reads, decisions, goal


async def test_rounds_decide_from_what_their_idle_read_and_end_as_with_reads_of_their_own(
    db_path: Path | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_reads, without = tmp_path / "with", tmp_path / "without"
    with_reads.mkdir()
    without.mkdir()
    reads, decisions, goal = await _rounds(db_path, with_reads, monkeypatch, at_idle=True)
    other = db_path if isinstance(db_path, str) else tmp_path / "other.db"  # PostgreSQL: the same database
    alone_reads, alone_decisions, alone = await _rounds(other, without, monkeypatch, at_idle=False)
    assert (goal.status, goal.status_reason, goal.rounds) == (alone.status, alone.status_reason, alone.rounds)
    assert goal.status is GoalStatus.EXHAUSTED and goal.rounds == 4
    assert decisions == alone_decisions >= 4
    assert alone_reads >= decisions, "without the idle's reads, every evaluation reads"
    assert reads == 0, f"{reads} evaluations read on their own"


async def test_what_an_idle_read_is_used_once_and_not_after_a_later_write(db_path: Path | str, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    async with goal_runtime(db_path, lambda request: Reply.say("working on it")) as (rt, engine, _):
        goal = await engine.create(GoalSpec(objective="Hold.", workdir=str(workdir)))
        goal = await engine.pause(goal.id)
        await engine.settled()
        async with asyncio.timeout(WAIT):  # its turn over: nothing else writes the session
            await (await rt.agent(goal.session_id)).when_idle()
        assert engine._remove is not None
        engine._remove()  # no idle wakes an evaluation: the test takes what each idle read itself
        engine._remove = None
        store, sid = rt.store, goal.session_id

        async def idle() -> None:
            await store.transact(_idle_again(sid), session=sid)

        await idle()
        got = engine._read_at_idle(goal.id, sid)
        assert got is not None
        read = await store.transact(lambda tx: round_of(tx, goal.id, sid), session=sid)
        assert got[0] == read[0]
        assert (got[1].status, got[1].status_seq, got[1].last_seq) == (
            read[1].status,
            read[1].status_seq,
            read[1].last_seq,
        )
        assert [e.seq for e in got[2]] == [e.seq for e in read[2]] and got[2], "the interval's events"
        assert engine._read_at_idle(goal.id, sid) is None, "taken once"

        await idle()  # then this process writes the session: the idle is no longer its last state
        await store.transact(lambda tx: tx.emit(sid, "test/note", {}), session=sid)
        assert engine._read_at_idle(goal.id, sid) is None

        await idle()  # then this process writes the goal: a new revision
        current = await engine.get(goal.id)
        await store.transact(
            lambda tx: save_goal(tx, current.model_copy(update={"objective": "Hold on."}), current.revision)
        )
        assert engine._read_at_idle(goal.id, sid) is None

        await idle()  # another goal's id: not this one's read
        assert engine._read_at_idle("goal_other", sid) is None


async def test_a_reader_that_fails_leaves_the_idle_committed(store: Store) -> None:
    from agent import create_session

    sid = await store.transact(lambda tx: create_session(tx))
    taken: list[Any] = []

    def reader(session_id: str, state: SessionState) -> Any:
        def take(rows: Any) -> None:
            taken.append(rows)
            raise RuntimeError("cannot take these rows")

        return [
            ("SELECT seq FROM events WHERE session_id=? AND seq<=? ORDER BY seq", (session_id, state.last_seq))
        ], take

    store.at_idle = reader
    await store.transact(_idle_again(sid), session=sid)
    state = await store.session_state(sid)
    assert state.status is AgentStatus.IDLE
    assert [[r["seq"] for r in rows] for rows in taken[0]] == [list(range(1, state.last_seq + 1))]

    def broken(session_id: str, state: SessionState) -> Any:
        raise RuntimeError("cannot say what to read")

    store.at_idle = broken  # the reader itself fails: the idle is committed all the same
    await store.transact(_idle_again(sid), session=sid)
    after = await store.session_state(sid)
    assert after.status is AgentStatus.IDLE and after.status_seq > state.status_seq


async def test_the_idle_reads_cost_no_round_trip(store: Store) -> None:
    from agent import create_session

    if store.round_trips is None:
        pytest.skip("round trips are PostgreSQL's")
    sid = await store.transact(lambda tx: create_session(tx))
    await store.transact(_idle_again(sid), session=sid)  # this node knows the session's state now
    before = store.round_trips
    await store.transact(_idle_again(sid), session=sid)
    alone = store.round_trips - before
    got: list[Any] = []
    store.at_idle = lambda session_id, state: (
        [("SELECT COUNT(*) AS n FROM events WHERE session_id=?", (session_id,))],
        got.append,
    )
    before = store.round_trips
    await store.transact(_idle_again(sid), session=sid)
    assert store.round_trips - before == alone == 1
    assert got and got[0][0][0]["n"] == (await store.session_state(sid)).last_seq


async def test_the_idle_reads_come_back_whichever_way_the_write_commits(store: Store) -> None:
    """A write opened on the state its node knows goes as one text (no ``BEGIN``, no ``COMMIT``); one
    on a state read first (unknown here) ends with its ``COMMIT``: the reads' rows come back from
    either, and those of two sessions made idle in one transaction each to its own reader."""
    from agent import create_session

    first = await store.transact(lambda tx: create_session(tx))
    second = await store.transact(lambda tx: create_session(tx))
    got: dict[str, Any] = {}

    def reader(session_id: str, state: SessionState) -> Any:
        def take(rows: Any) -> None:
            got[session_id] = [[r["seq"] for r in rows[0]], rows[1][0]["n"]]

        return [
            ("SELECT seq FROM events WHERE session_id=? AND seq<=? ORDER BY seq", (session_id, state.last_seq)),
            ("SELECT COUNT(*) AS n FROM sessions WHERE id=?", (session_id,)),
        ], take

    store.at_idle = reader
    for known in (True, False):
        if not known:
            store._states.pop(first, None)  # the next write reads the state first (its BEGIN sent then)
        got.clear()
        await store.transact(_idle_again(first), session=first)
        top = (await store.session_state(first)).last_seq
        assert got == {first: [list(range(1, top + 1)), 1]}, f"known={known}"

    def both(tx: Tx) -> None:
        _idle_again(first)(tx)
        _idle_again(second)(tx)

    got.clear()
    await store.transact(both)
    tops = [(await store.session_state(sid)).last_seq for sid in (first, second)]
    assert got == {first: [list(range(1, tops[0] + 1)), 1], second: [list(range(1, tops[1] + 1)), 1]}
