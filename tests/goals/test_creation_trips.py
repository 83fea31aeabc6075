"""A goal's creation in two round trips (issue 30).

Creating a goal writes its spend guard, its session and the session's first events, claims its
work directory and queues round 1's continuation, in one transaction that holds the cluster alone
(the work directories' nesting is a rule over every goal and session). On PostgreSQL it was nine
round trips: the guard's insert, a check that the guard exists, the session's insert, a read of the
new session's state, and the three reads of the work-directory check, one at a time. Now every
insert travels with the next statement (the session's only where its guard exists, checked where
it runs), the new session's state is known without a read (it has nothing yet), and the three reads
go together: the opening with the inserts and the reads, the rest with the ``COMMIT``. Pins, on
both stores:

* a goal in a work directory is created in two round trips, and everything is written as before
  (the guard, the session, the goal, its continuation, the session's events numbered from 1);
* a session whose spend guard does not exist is refused with ``NotFound`` and writes nothing;
* the work-directory check still refuses a directory held by a live goal and one nested in a
  session's, naming them (the same reads, sent together).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent import NotFound, create_session
from agent.store import Store
from agent.tx import Tx
from goals import GoalConflict, GoalId, GoalSpec
from goals.creation import create_goal
from goals.schema import MIGRATIONS

pytestmark = pytest.mark.both_stores


@pytest.fixture
async def store(store: Store) -> Store:
    """The test's store with the goals' tables."""
    await store.migrate("goals", MIGRATIONS)
    return store


def spec(workdir: Path) -> GoalSpec:
    return GoalSpec.model_validate({"objective": f"work in {workdir.name}", "workdir": str(workdir)})


def create(spec: GoalSpec) -> object:
    def run(tx: Tx) -> object:
        return create_goal(
            tx,
            spec,
            goal_id=GoalId.new(),
            workdir=Path(spec.workdir or ""),
            baseline=None,
            policy=None,
            now=datetime.now(UTC),
        )[0]

    return run


async def count(store: Store, table: str) -> int:
    return int(await store.read(lambda conn: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]))


async def test_a_goal_is_created_in_two_round_trips(store: Store, tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    before = store.round_trips
    goal = await store.transact(create(spec(tmp_path / "w")))
    if before is not None:  # PostgreSQL: the opening, the inserts and the reads; the rest and COMMIT
        assert store.round_trips == before + 2
    sid = goal.session_id  # type: ignore[attr-defined]
    events = await store.events_after(sid, 0)
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "the new session's events from 1"
    assert events[0].type == "session/created"
    assert [e.type for e in events].count("message/queued") == 1, "round 1's continuation queued"
    assert (await count(store, "goals"), await count(store, "guards"), await count(store, "sessions")) == (1, 1, 1)
    state = await store.session_state(sid)
    assert state.last_seq == len(events), "the state the session was created with is the stored one"
    # The session's next write opens on that state and commits.
    await store.transact(lambda tx: tx.emit(sid, "test/next", {}), session=sid)
    assert (await store.events_after(sid, 0))[-1].seq == len(events) + 1


async def test_a_session_whose_guard_does_not_exist_is_refused_and_writes_nothing(store: Store) -> None:
    with pytest.raises(NotFound, match="no spend guard grd_missing"):
        await store.transact(lambda tx: create_session(tx, guard_id="grd_missing"))
    assert (await count(store, "sessions"), await count(store, "events")) == (0, 0)


async def test_the_work_directory_check_still_refuses_and_names_the_holder(store: Store, tmp_path: Path) -> None:
    (tmp_path / "held" / "inner").mkdir(parents=True)
    (tmp_path / "s" / "deep").mkdir(parents=True)
    first = await store.transact(create(spec(tmp_path / "held")))
    with pytest.raises(GoalConflict, match=f"held by goal {first.id}"):  # type: ignore[attr-defined]
        await store.transact(create(spec(tmp_path / "held" / "inner")))
    sid = await store.transact(lambda tx: create_session(tx, workdir=str(tmp_path / "s")))
    with pytest.raises(GoalConflict, match=f"the work directory of session {sid}"):
        await store.transact(create(spec(tmp_path / "s" / "deep")))
    assert await count(store, "goals") == 1, "each refusal wrote nothing"
