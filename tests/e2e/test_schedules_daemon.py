"""Schedules in the real daemon, and the scheduler service driven across daylight-saving changes.

The first part runs ``goald serve`` as a subprocess (``harness.py``) and drives it only through the
CLI and the socket: fires missed while the daemon was down follow the misfire policy at start, a
fire during the previous goal's run is recorded ``skipped_concurrency``, a 1 s interval fires
within 10 s (its lag printed), and schedule keys of any length work with ``schedule rm|runs``.
Goals use ``test:worker`` (``goald_testmodels``), whose per-call latency the objective states.

The second part is in-process: :class:`daemon.schedule.Scheduler` on a real SQLite file with an
injected clock, driven the way APScheduler drives it (wake at the armed job's next run time, hand
the instant to the job), for a cron schedule in Europe/Berlin across the spring-forward and
fall-back days of 2071 — far enough ahead that APScheduler's own wall clock never finds the job
due during the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from harness import Daemon

from agent import Store
from daemon.client import Connection as Client
from daemon.schedule import SCHEDULE_RUN, FireClaim, RunOutcome, Schedule, Scheduler

LIMIT = 30.0


def when(raw: str) -> datetime:
    return datetime.fromisoformat(raw)


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="microseconds")


async def schedule_runs(
    client: Client, session_id: str, count: int, limit: float
) -> list[tuple[dict[str, Any], float]]:
    """The first ``count`` ``schedule/run`` events of a schedule's session, each with the time it arrived."""
    await client.call("session/subscribe", {"sessionId": session_id, "afterSeq": 0})
    seen: list[tuple[dict[str, Any], float]] = []
    async with asyncio.timeout(limit):
        while len(seen) < count:
            note = await client.next_notification()
            if note["method"] == "session.event" and note["params"]["event"]["type"] == SCHEDULE_RUN:
                seen.append((note["params"]["event"], time.time()))
    return seen


# -- missed fires at start ---------------------------------------------------------------------

MISFIRE_CASES = {
    # key: (CLI options, outcomes of the two instants due while down, whether the later one fires)
    "hourly-coalesce": (["--misfire", "coalesce"], ["coalesced", "fired"]),
    "hourly-skip": (["--misfire", "skip"], ["missed", "missed"]),
    "hourly-deadline-10m": (["--misfire", "coalesce", "--starting-deadline", "600"], ["missed", "missed"]),
    "hourly-deadline-2h": (["--misfire", "coalesce", "--starting-deadline", "7200"], ["coalesced", "fired"]),
}


async def test_fires_missed_while_the_daemon_was_down_follow_the_misfire_policy_at_start(
    start_daemon: Callable[..., Daemon],
) -> None:
    d = start_daemon()
    for key, (options, _) in MISFIRE_CASES.items():
        await d.acli_json(
            "schedule", "add", "--every", "3600", "--key", key, *options, "--model", "test:worker",
            f"Refresh {key} [rounds=1 delay=0]",
        )  # fmt: skip
    assert d.terminate() == 0

    # While it is down, rewrite each schedule's history: its interval started 2.5 h ago and the
    # first instant was handled; the next two (1.5 h and 0.5 h ago) came due with nobody running.
    now = datetime.now(UTC)
    anchor = now - timedelta(hours=2.5)
    due = [anchor + timedelta(hours=1), anchor + timedelta(hours=2)]
    with contextlib.closing(sqlite3.connect(d.state_dir / "goald.db")) as db, db:
        for key in MISFIRE_CASES:
            db.execute(
                "UPDATE schedules SET anchor_at=?, active_since=?, last_fire_at=? WHERE key=?",
                (iso(anchor), iso(now - timedelta(hours=3)), iso(anchor), key),
            )
    d.start()  # READY=1 comes after the missed fires were settled

    fired_goals = set()
    for key, (_, expected) in MISFIRE_CASES.items():
        runs = list(reversed(await d.acli_json("schedule", "runs", key)))
        assert [(when(r["scheduledFor"]), r["outcome"]) for r in runs] == list(zip(due, expected, strict=True)), key
        if expected[-1] == "fired":
            assert runs[0]["goalId"] is None and "coalesced into" in runs[0]["reason"]
            assert runs[1]["goalId"] and "misfire policy coalesce" in runs[1]["reason"]
            fired_goals.add(runs[1]["goalId"])
        else:
            assert all(r["goalId"] is None for r in runs), key
        if key == "hourly-skip":
            assert all("misfire policy skip" in r["reason"] for r in runs)
        if key == "hourly-deadline-10m":
            # The daemon read its clock a moment after `now`: 0.5 h late, plus the seconds since.
            found = re.fullmatch(r"missed: (\d+)s late, past the starting deadline of 600s", runs[1]["reason"])
            assert found is not None, runs[1]["reason"]
            assert 1800 <= int(found.group(1)) <= 1800 + (datetime.now(UTC) - now).total_seconds() + 1
    listed = {s["key"]: s for s in await d.acli_json("schedule", "list")}
    for key, (_, expected) in MISFIRE_CASES.items():
        assert listed[key]["lastOutcome"] == expected[-1]
        assert when(listed[key]["lastFireAt"]) == due[-1]
        assert when(listed[key]["nextFireAt"]) == anchor + timedelta(hours=3)
    goals = await d.acli_json("goal", "list")
    assert {g["id"] for g in goals} == fired_goals and len(fired_goals) == 2

    # A second start finds nothing more to settle: no run, no goal twice.
    assert d.terminate() == 0
    d.start()
    for key in MISFIRE_CASES:
        assert len(await d.acli_json("schedule", "runs", key)) == 2
    assert {g["id"] for g in await d.acli_json("goal", "list")} == fired_goals


# -- concurrency and timing in the running daemon -----------------------------------------------


async def test_a_fire_while_the_previous_goal_is_still_active_is_recorded_skipped_concurrency(
    start_daemon: Callable[..., Daemon],
) -> None:
    d = start_daemon()
    # Each model call of this goal takes 60 s: the goal is surely still active a second later.
    sched = await d.acli_json(
        "schedule", "add", "--every", "1", "--key", "busy", "--model", "test:worker", "Busy work [rounds=1 delay=60]",
    )  # fmt: skip
    assert sched["concurrency"] == "forbid"
    async with await Client.connect(d.socket_path) as client:
        (first, _), (second, _) = await schedule_runs(client, sched["sessionId"], 2, LIMIT)
    assert first["data"]["outcome"] == "fired"
    goal_id = first["data"]["goalId"]
    assert second["data"]["outcome"] == "skipped_concurrency" and "goalId" not in second["data"]
    assert second["data"]["reason"] == f"the previous goal {goal_id} is still active (concurrency forbid)"
    assert when(second["data"]["scheduledFor"]) - when(first["data"]["scheduledFor"]) == timedelta(seconds=1)
    d.calls.wait("worker round=1 step=0")  # its first model call is in flight
    goal = await d.acli_json("goal", "show", goal_id)
    assert goal["status"] == "active"
    runs = list(reversed(await d.acli_json("schedule", "runs", "busy")))
    assert [r["outcome"] for r in runs[:2]] == ["fired", "skipped_concurrency"]
    assert [g["id"] for g in await d.acli_json("goal", "list")] == [goal_id]


async def test_a_one_second_interval_schedule_is_observed_firing_within_ten_seconds(
    start_daemon: Callable[..., Daemon],
) -> None:
    d = start_daemon()
    added_at = time.time()
    sched = await d.acli_json(
        "schedule", "add", "--every", "1", "--concurrency", "allow", "--key", "tick", "--model", "test:worker",
        "Tick [rounds=1 delay=30]",
    )  # fmt: skip
    async with await Client.connect(d.socket_path) as client:
        seen = await schedule_runs(client, sched["sessionId"], 3, 10.0 - (time.time() - added_at))
    instants = [when(e["data"]["scheduledFor"]) for e, _ in seen]
    committed = [(when(e["at"]) - t).total_seconds() for (e, _), t in zip(seen, instants, strict=True)]
    observed = [arrived - t.timestamp() for (_, arrived), t in zip(seen, instants, strict=True)]
    print(
        "1 s interval in the daemon subprocess: lag from the scheduled instant to the committed run "
        f"{[round(x, 4) for x in committed]} s, to the client seeing it {[round(x, 4) for x in observed]} s; "
        f"first fire seen {seen[0][1] - added_at:.3f} s after `schedule add` started"
    )
    assert [e["data"]["outcome"] for e, _ in seen] == ["fired"] * 3
    assert instants[0] == when(sched["nextFireAt"])
    assert [b - a for a, b in itertools.pairwise(instants)] == [timedelta(seconds=1)] * 2
    assert all(0 <= lag < 2.0 for lag in committed), committed
    assert len({e["data"]["goalId"] for e, _ in seen}) == 3


async def test_short_schedule_keys_work_with_schedule_rm_and_runs(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon()
    for key in ("ev", "e"):
        added = await d.acli_json("schedule", "add", "--cron", "0 3 * * *", "--key", key, "Report")
        assert added["key"] == key
        assert await d.acli_json("schedule", "runs", key) == []
    code, _, err = await d.acli("schedule", "rm", "ev")
    assert code == 0, err
    assert [s["key"] for s in await d.acli_json("schedule", "list")] == ["e"]
    code, _, err = await d.acli("schedule", "runs", "ev")
    assert code == 3 and "no schedule with id or key 'ev'" in err
    code, _, err = await d.acli("schedule", "rm", "ev")
    assert code == 3, err
    code, _, err = await d.acli("schedule", "rm", "e")
    assert code == 0, err
    assert await d.acli_json("schedule", "list") == []


# -- in-process: a cron schedule in Europe/Berlin across DST -------------------------------------

BERLIN = ZoneInfo("Europe/Berlin")
NIGHTLY = {"kind": "cron", "expr": "30 2 * * *"}


def berlin(raw: str) -> datetime:
    """A wall time in Berlin (first occurrence when ambiguous), as a UTC instant."""
    return datetime.fromisoformat(raw).replace(tzinfo=BERLIN).astimezone(UTC)


def local(instants: list[datetime]) -> list[str]:
    return [t.astimezone(BERLIN).strftime("%m-%d %H:%M %Z") for t in instants]


class Clock:
    """The scheduler's injected clock, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class InstantGoals:
    """The scheduler's callbacks over goals that finish as soon as they are made."""

    def __init__(self) -> None:
        self.fired: list[datetime] = []
        self.status: dict[str, str] = {}

    async def fire(self, schedule: Schedule, at: datetime, claim: FireClaim) -> str:
        goal_id = f"goal_{len(self.fired) + 1}"
        await claim.commit(goal_id)
        self.fired.append(at)
        self.status[goal_id] = "completed"
        return goal_id

    async def goal_status(self, goal_id: str) -> str | None:
        return self.status.get(goal_id)

    async def cancel_goal(self, goal_id: str) -> None:
        raise AssertionError("no goal is live, so none is replaced")


@contextlib.asynccontextmanager
async def scheduler(store: Store, goals: InstantGoals, clock: Clock) -> AsyncIterator[Scheduler]:
    sch = Scheduler(store, fire=goals.fire, goal_status=goals.goal_status, cancel_goal=goals.cancel_goal, clock=clock)
    await sch.start()
    try:
        yield sch
    finally:
        await sch.stop()


async def drive(sch: Scheduler, schedule_id: str, clock: Clock, until: datetime) -> list[datetime]:
    """Do what APScheduler does with the armed job, on the injected clock, up to ``until``.

    Wake at the job's next run time, hand that instant to the job, and ask the job's trigger for
    the next run time (as APScheduler does after each run). Returns the instants handed over.
    """
    job = sch._aps.get_job(schedule_id)
    handed: list[datetime] = []
    at = job.next_run_time
    while at is not None and at <= until:
        clock.now = at + timedelta(milliseconds=300)  # the wake-up is a little late, as in life
        await sch._run_due(schedule_id, [at])
        handed.append(at)
        at = job.trigger.get_next_fire_time(at, clock.now)
        assert (await sch.get(schedule_id)).next_fire_at == at  # what `schedule list` shows agrees
    return handed


DST = {
    # (start, end, local fire times in between, the fire armed after the end)
    # Spring forward on 2071-03-29 (02:00 CET -> 03:00 CEST): 02:30 does not exist that day.
    "spring": (
        "2071-03-28T00:00",
        "2071-03-31T12:00",
        ["03-28 02:30 CET", "03-30 02:30 CEST", "03-31 02:30 CEST"],
        "04-01 02:30 CEST",
    ),
    # Fall back on 2071-10-25 (03:00 CEST -> 02:00 CET): 02:30 happens twice and fires once, the first time.
    "fall": (
        "2071-10-24T00:00",
        "2071-10-26T12:00",
        ["10-24 02:30 CEST", "10-25 02:30 CEST", "10-26 02:30 CET"],
        "10-27 02:30 CET",
    ),
}


@pytest.mark.parametrize("season", list(DST))
async def test_the_scheduler_fires_a_berlin_cron_at_its_local_time_across_dst(db_path: Path, season: str) -> None:
    start, end, expected, armed = DST[season]
    clock = Clock(berlin(start))
    goals = InstantGoals()
    store = await Store.open(db_path)
    try:
        async with scheduler(store, goals, clock) as sch:
            sched = await sch.add(
                {"key": "night", "trigger": NIGHTLY, "timezone": "Europe/Berlin", "goal": {"objective": "Night job."}}
            )
            assert sch.planned() == {sched.id: berlin(f"{start[:10]}T02:30")}
            handed = await drive(sch, sched.id, clock, until=berlin(end))
            after = (await sch.get(sched.id)).next_fire_at
            assert after is not None and local([after]) == [armed]
            runs = list(reversed(await sch.runs(sched.id, limit=100)))
        assert local(handed) == expected
        assert goals.fired == handed
        assert [(r.scheduled_for, r.outcome, r.goal_id) for r in runs] == [
            (t, RunOutcome.FIRED, f"goal_{i}") for i, t in enumerate(handed, 1)
        ]
        if season == "fall":  # one fire on the day 02:30 happened twice: the first, at 00:30 UTC
            assert handed[1] == datetime(2071, 10, 25, 0, 30, tzinfo=UTC)
        else:  # no fire on the day without 02:30; the next one comes 23 hours after the last
            assert handed[1] - handed[0] == timedelta(hours=47)
        events = [e for e in await store.events_after(sched.session_id, 0) if e.type == SCHEDULE_RUN]
        assert [(when(e.data["scheduledFor"]), e.data["outcome"]) for e in events] == [(t, "fired") for t in handed]
    finally:
        await store.close()


MISSED_ACROSS_DST = [
    # (season, misfire, outcomes of the two instants missed after the first fire)
    ("spring", "coalesce", ["coalesced", "fired"]),
    ("spring", "skip", ["missed", "missed"]),
    ("fall", "coalesce", ["coalesced", "fired"]),
    ("fall", "skip", ["missed", "missed"]),
]


@pytest.mark.parametrize(("season", "misfire", "outcomes"), MISSED_ACROSS_DST)
async def test_fires_missed_across_a_dst_change_are_settled_at_their_local_times(
    db_path: Path, season: str, misfire: str, outcomes: list[str]
) -> None:
    start, end, expected, armed = DST[season]
    clock = Clock(berlin(start))
    goals = InstantGoals()
    store = await Store.open(db_path)
    try:
        async with scheduler(store, goals, clock) as sch:
            sched = await sch.add(
                {
                    "trigger": NIGHTLY,
                    "timezone": "Europe/Berlin",
                    "goal": {"objective": "Night job."},
                    "misfire": misfire,
                }
            )
            first = await drive(sch, sched.id, clock, until=clock.now + timedelta(hours=12))
        assert local(first) == expected[:1]
        clock.now = berlin(end)  # down across the DST day
        async with scheduler(store, goals, clock) as sch:
            runs = list(reversed(await sch.runs(sched.id, limit=100)))
            assert local(list(sch.planned().values())) == [armed]
        assert local([r.scheduled_for for r in runs]) == expected
        assert [r.outcome.value for r in runs] == ["fired", *outcomes]
        assert goals.fired == [r.scheduled_for for r in runs if r.outcome is RunOutcome.FIRED]
        assert all(r.reason for r in runs)
    finally:
        await store.close()
