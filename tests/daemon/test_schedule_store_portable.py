"""The schedule tables' statements mean the same on both stores: a run's id comes back from the
insert itself (``RETURNING id``, not SQLite's ``lastrowid``), and an id prefix resolves to the
lowest matching id on each. Real SQLite file and real PostgreSQL database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent import Store
from daemon.schedule.model import RunOutcome, ScheduleSpec
from daemon.schedule.store import (
    MIGRATIONS,
    RunRow,
    list_runs,
    load_schedule,
    record_runs,
    resolve_schedule,
    save_schedule,
)

pytestmark = pytest.mark.both_stores


async def test_recorded_runs_carry_their_stored_ids(db_path: Path | str) -> None:
    store = await Store.open(db_path)
    try:
        await store.migrate("schedule", MIGRATIONS)
        now = datetime.now(UTC)
        spec = ScheduleSpec.parse(
            {"key": "nightly", "trigger": {"kind": "interval", "seconds": 60}, "goal": {"objective": "o"}}
        )
        sid = await store.transact(lambda tx: save_schedule(tx, spec, now))
        sched = await store.read(lambda c: load_schedule(c, sid))
        down: list[RunRow] = [
            (now, RunOutcome.MISSED, "down", None),
            (now + timedelta(minutes=1), RunOutcome.COALESCED, "down", None),
        ]
        fired: list[RunRow] = [(now + timedelta(minutes=2), RunOutcome.FIRED, "", None)]
        made = await store.transact(lambda tx: record_runs(tx, sched, down))
        made += await store.transact(lambda tx: record_runs(tx, sched, fired))
        stored = await store.read(lambda c: list_runs(c, sid, 10))
        assert [r.id for r in made] == sorted(r.id for r in stored) and len(set(r.id for r in made)) == 3
        assert [r.outcome for r in stored] == [RunOutcome.FIRED, RunOutcome.COALESCED, RunOutcome.MISSED]
        assert await store.read(lambda c: resolve_schedule(c, sid[:-3])) == sid
        assert await store.read(lambda c: resolve_schedule(c, "nightly")) == sid
    finally:
        await store.close()
