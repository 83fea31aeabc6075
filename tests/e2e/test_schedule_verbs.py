"""``goald schedule run|suspend|resume`` and the listings' wording, through a real daemon's socket.

``schedule run`` fires once, now, as one run row marked ``manual`` (like ``kubectl create job
--from=cronjob``), and leaves the schedule's cursor and next fire alone; ``schedule suspend`` stops
the fires, each instant that comes due recorded ``skipped_suspended``; ``schedule resume`` follows
the misfire policy for the instants skipped (``coalesce``: one fire now; ``skip``: none). Waits are
on the schedule's own session events (``schedule/run``), each with a time limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Daemon

from daemon.client import Connection as Client
from daemon.schedule import SCHEDULE_CHANGED, SCHEDULE_RUN

LIMIT = 30.0


async def runs_after_change(client: Client, session_id: str, change: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` ``schedule/run`` events after the ``schedule/changed`` event ``change``."""
    await client.call("session/subscribe", {"sessionId": session_id, "afterSeq": 0})
    seen: list[dict[str, Any]] = []
    changed = False
    async with asyncio.timeout(LIMIT):
        while len(seen) < count:
            note = await client.next_notification()
            if note["method"] != "session.event":
                continue
            event = note["params"]["event"]
            if event["type"] == SCHEDULE_CHANGED and event["data"]["change"] == change:
                changed = True
            elif event["type"] == SCHEDULE_RUN and changed:
                seen.append(event["data"])
    return seen


async def test_schedule_run_fires_once_now_as_one_manual_run(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon()
    sched = await d.acli_json(
        "schedule", "add", "--cron", "0 3 1 1 *", "--key", "yearly", "--model", "test:worker",
        "Yearly [rounds=1 delay=0]",
    )  # fmt: skip
    code, out, _ = await d.acli("schedule", "runs", "yearly")
    assert code == 0 and out == ""
    code, _, err = await d.acli("schedule", "runs", "yearly")
    assert "schedule yearly has no runs yet" in err

    run = await d.acli_json("schedule", "run", "yearly")
    assert run["outcome"] == "fired" and run["manual"] is True and run["goalId"]
    assert run["reason"].startswith("run by hand (goald schedule run): created goal ")
    [stored] = await d.acli_json("schedule", "runs", "yearly")
    assert stored == run
    [goal] = await d.acli_json("goal", "list")
    assert goal["id"] == run["goalId"]
    [listed] = await d.acli_json("schedule", "list")
    # The cursor and the next fire are the trigger's: a manual run is not one of its instants.
    assert listed["lastFireAt"] is None and listed["nextFireAt"] == sched["nextFireAt"]
    assert listed["lastGoalId"] == run["goalId"] and listed["lastOutcome"] == "fired"

    code, out, err = await d.acli("schedule", "run", "yearly")
    assert code == 0, err
    assert "fired (manual)" in out and "run by hand" in out
    assert len(await d.acli_json("schedule", "runs", "yearly")) == 2
    code, out, _ = await d.acli("schedule", "runs", "yearly")
    assert out.count("fired (manual)") == 2

    code, _, err = await d.acli("schedule", "run", "nope")
    assert code == 3 and "no schedule with id or key 'nope'" in err


async def test_suspend_records_skipped_instants_and_fires_nothing(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon()
    sched = await d.acli_json(
        "schedule", "add", "--every", "1", "--concurrency", "allow", "--key", "tick", "--model", "test:worker",
        "Tick [rounds=1 delay=0]",
    )  # fmt: skip
    async with await Client.connect(d.socket_path) as client:
        waiting = asyncio.create_task(runs_after_change(client, sched["sessionId"], "suspended", 3))
        code, out, err = await d.acli("schedule", "suspend", "tick")
        assert code == 0, err
        assert out.startswith(f"suspended schedule {sched['id']} (tick)")
        skipped = await waiting
    assert [r["outcome"] for r in skipped] == ["skipped_suspended"] * 3
    assert all(r["reason"].startswith("skipped: the schedule is suspended (since ") for r in skipped)
    assert all("goalId" not in r for r in skipped)
    runs = await d.acli_json("schedule", "runs", "tick", "--limit", "1000")
    fired = {r["goalId"] for r in runs if r["outcome"] == "fired"}
    assert {g["id"] for g in await d.acli_json("goal", "list")} == fired
    [listed] = await d.acli_json("schedule", "list")
    assert listed["suspendedAt"] is not None
    code, out, _ = await d.acli("schedule", "list")
    header, line = out.splitlines()
    assert header.split() == ["ID", "KEY", "TRIGGER", "SUSPENDED", "NEXT", "LAST"]
    assert "  since " in line and "skipped (suspended)" in line
    # Suspending again changes nothing.
    again = await d.acli_json("schedule", "suspend", "tick")
    assert again["suspendedAt"] == listed["suspendedAt"]


async def test_resume_follows_the_misfire_policy(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon()
    added = {}
    for misfire in ("coalesce", "skip"):
        added[misfire] = await d.acli_json(
            "schedule", "add", "--every", "1", "--misfire", misfire, "--concurrency", "allow", "--key", misfire,
            "--model", "test:worker", f"Tick {misfire} [rounds=1 delay=0]",
        )  # fmt: skip
    async with await Client.connect(d.socket_path) as client:
        for misfire, sched in added.items():
            waiting = asyncio.create_task(runs_after_change(client, sched["sessionId"], "suspended", 1))
            await d.acli_json("schedule", "suspend", misfire)
            [skipped] = await waiting
            assert skipped["outcome"] == "skipped_suspended"

    coalesced = await d.acli_json("schedule", "resume", "coalesce")
    assert coalesced["schedule"]["suspendedAt"] is None
    run = coalesced["run"]
    assert run is not None and run["outcome"] == "fired" and run["goalId"] and run["manual"] is False
    assert "skipped while suspended (misfire policy coalesce)" in run["reason"]
    assert run["goalId"] in {g["id"] for g in await d.acli_json("goal", "list")}

    code, out, err = await d.acli("schedule", "resume", "skip")
    assert code == 0, err
    assert out.startswith(f"resumed schedule {added['skip']['id']} (skip); nothing fired")
    # Resumed, both fire again at their instants.
    async with await Client.connect(d.socket_path) as client:
        for misfire, sched in added.items():
            [again] = await runs_after_change(client, sched["sessionId"], "resumed", 1)
            assert again["outcome"] == "fired", (misfire, again)


async def test_schedule_add_takes_every_budget_and_rm_says_what_it_removed(
    start_daemon: Callable[..., Daemon],
) -> None:
    d = start_daemon()
    sched = await d.acli_json(
        "schedule", "add", "--cron", "0 3 * * *", "--key", "nightly", "--max-rounds", "5", "--max-tokens", "9000",
        "--max-cost", "0.5", "--max-wall", "1800", "--deadline", "2099-01-01T00:00:00Z", "--model", "test:worker",
        "Nightly",
    )  # fmt: skip
    assert sched["goal"]["budgets"] == {
        "max_rounds": 5,
        "max_tokens_total": 9000,
        "max_cost": 0.5,
        "max_wall_seconds": 1800.0,
        "deadline": "2099-01-01T00:00:00Z",
    }
    code, out, err = await d.acli("schedule", "rm", "nightly")
    assert code == 0, err
    assert out == f"removed schedule {sched['id']} (nightly); its runs and goals stay\n"
    code, out, err = await d.acli("schedule", "list")
    assert (code, out) == (0, "") and "no schedules" in err


async def test_goald_reload_applies_the_goals_file_through_the_socket(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    goals_file = tmp_path / "goals.toml"
    goals_file.write_text("")
    d = start_daemon(goals_file=str(goals_file))
    goals_file.write_text(
        '[[schedule]]\nkey = "nightly"\ntrigger = { kind = "cron", expr = "0 3 * * *" }\n'
        '[schedule.goal]\nobjective = "Nightly"\n'
    )
    code, out, err = await d.acli("reload")
    assert code == 0, err
    assert out == "reloaded: 0 goal(s) and 1 schedule(s) applied from the goals file\n"
    assert [s["key"] for s in await d.acli_json("schedule", "list")] == ["nightly"]
    assert await d.acli_json("reload") == {"goals": 0, "schedules": 1}


async def test_goal_list_limit_shows_the_newest_n(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon()
    made = [
        (await d.acli_json("goal", "add", "--model", "test:worker", f"Goal {i} [rounds=1 delay=0]"))["goalId"]
        for i in range(3)
    ]
    listed = await d.acli_json("goal", "list", "--limit", "2")
    assert [g["id"] for g in listed] == made[::-1][:2]
    code, out, err = await d.acli("goal", "list", "--limit", "2")
    assert code == 0 and len(out.splitlines()) == 3 and "(2 of 3 goals shown: --limit 2)" in err
    code, _, err = await d.acli("goal", "list", "--limit", "0")
    assert code == 2 and "--limit must be at least 1" in err
