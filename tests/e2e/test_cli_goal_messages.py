"""End-to-end: truthful completion labels and messages to a goal that is not active, through the CLI.

Each test starts its own ``goald serve`` (see ``harness.py``) and drives it with the ``goald``
command. A goal without a verification command completes ``no_verification``, shown as
``completed (unverified: no verification)``, and ``goal add`` says so once. A message to an ended
goal's session is refused (``-32002``, exit 4) and nothing runs, unless ``--reopen``; a message to
a paused goal runs one turn, charged to the goal and not counted as a round, and ``--resume``
resumes the goal as well. Waiting is on events or goal changes, always with a time limit.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Daemon, all_events, spend_of, wait_events, wait_goal

LIMIT = 30.0
EXIT_CONFLICT = 4


async def add_goal(d: Daemon, objective: str, *options: str) -> tuple[str, str, str]:
    """``goald goal add`` with ``test:worker``: ``(goal id, session id, stderr)``."""
    code, out, err = await d.acli("goal", "add", objective, "--model", "test:worker", *options)
    assert code == 0, err
    ids = re.fullmatch(r"(goal_\S+) on session (ses_\S+)\n", out)
    assert ids is not None, out
    return ids[1], ids[2], err


async def wait_counted(d: Daemon, gid: str, sid: str, limit: float = LIMIT) -> dict[str, Any]:
    """The goal once its token counter holds every model call of its session so far (the engine
    counts at each idle, a paused goal too); raises on timeout."""
    async with asyncio.timeout(limit):
        while True:
            g: dict[str, Any] = await d.acli_json("goal", "show", gid)
            spent = sum(spend_of(e)[0] for e in await all_events(d.socket_path, sid))
            if g["tokens"] == spent:
                return g
            await asyncio.sleep(0.05)  # the engine's count is not an event: read again, bounded


def idle_after(kind: str, match: Callable[[dict[str, Any]], bool]) -> Callable[[list[dict[str, Any]]], bool]:
    """Whether the session went idle after an event of ``kind`` for which ``match`` holds."""

    def done(events: list[dict[str, Any]]) -> bool:
        seen = [e["seq"] for e in events if e["type"] == kind and match(e)]
        return bool(seen) and any(
            e["type"] == "status" and e["data"]["status"] == "idle" and e["seq"] > seen[0] for e in events
        )

    return done


def at_rest_after(kind: str, match: Callable[[dict[str, Any]], bool]) -> Callable[[list[dict[str, Any]]], bool]:
    """Whether an event of ``kind`` for which ``match`` holds came, and the session is idle now (its
    last status event says idle): a pause that lands mid-turn is followed by that turn's idle, one that
    lands between the idle and the next round's admission by none."""

    def done(events: list[dict[str, Any]]) -> bool:
        statuses = [e["data"]["status"] for e in events if e["type"] == "status"]
        return any(e["type"] == kind and match(e) for e in events) and bool(statuses) and statuses[-1] == "idle"

    return done


async def test_a_goal_without_verification_completes_unverified_and_says_so(daemon: Daemon) -> None:
    d = daemon
    gid, _, note = await add_goal(d, "Deploy the website [rounds=1]")
    assert note.count("will complete unverified") == 1, note
    g = await wait_goal(d.socket_path, gid, {"completed"}, LIMIT)
    assert g["statusReason"] == "no_verification"
    code, out, err = await d.acli("goal", "show", gid)
    assert code == 0, err
    assert "\nstatus:     completed (unverified: no verification)\n" in out
    code, out, _ = await d.acli("goal", "list")
    assert "  completed  unverified: no verification  " in out and "  verified  " not in out
    code, out, _ = await d.acli("goal", "logs", gid)
    assert "-> completed (unverified: no verification)" in out
    # With a verification command that passes: verified, and no note at add.
    vid, _, note = await add_goal(d, "Deploy it checked [rounds=1]", "--verify", "test -f round1.txt")
    assert "unverified" not in note
    v = await wait_goal(d.socket_path, vid, {"completed"}, LIMIT)
    assert v["statusReason"] == "verified"
    code, out, _ = await d.acli("goal", "show", vid)
    assert "\nstatus:     completed (verified)\n" in out


async def test_send_to_a_cancelled_goal_is_refused_and_nothing_runs(daemon: Daemon) -> None:
    d = daemon
    gid, sid, _ = await add_goal(d, "Write notes [rounds=50 hold_round=1 hold=20]")
    await asyncio.to_thread(d.calls.wait, "worker round=1 step=0")  # a 20 s call: nothing written yet
    code, _, err = await d.acli("goal", "cancel", gid)
    assert code == 0, err
    await wait_events(d, sid, idle_after("goal/changed", lambda e: e["data"]["status"] == "cancelled"))
    g = await d.acli_json("goal", "show", gid)
    workdir = Path(g["workdir"])
    before = await all_events(d.socket_path, sid)

    for target in (gid, sid):
        code, out, err = await d.acli("send", target, "Round 7: write it anyway [rounds=50]")
        assert code == EXIT_CONFLICT, (code, out, err)
        assert out == "" and f"goal {gid} of this session is cancelled (by request)" in err
        assert "--reopen" in err
    # Nothing was queued, nothing ran, nothing was written in its work directory.
    assert await all_events(d.socket_path, sid) == before
    assert await asyncio.to_thread(lambda: sorted(p.name for p in workdir.iterdir())) == []
    assert (await d.acli_json("goal", "show", gid))["tokens"] == g["tokens"]


async def test_send_reopen_resumes_an_ended_goal_with_its_budgets_first(daemon: Daemon) -> None:
    d = daemon
    gid, sid, _ = await add_goal(d, "Write notes [rounds=1]", "--max-rounds", "5")
    done = await wait_goal(d.socket_path, gid, {"completed"}, LIMIT)
    code, _, err = await d.acli("send", gid, "Round 4: once more [rounds=1]")
    assert code == EXIT_CONFLICT and "is completed (unverified: no verification)" in err, err

    code, out, err = await d.acli("send", gid, "Round 4: once more [rounds=1]", "--reopen")
    assert code == 0, err
    mid = out.strip()
    assert re.fullmatch(r"msg_[0-9A-Z]{26}", mid) and f"goal {gid} reopened: active" in err
    events = await wait_events(
        d,
        sid,
        lambda evs: sum(e["type"] == "goal/changed" and e["data"]["status"] == "completed" for e in evs) == 2,
    )
    changes = [(e["data"]["from"], e["data"]["status"]) for e in events if e["type"] == "goal/changed"]
    assert changes == [(None, "active"), ("active", "completed"), ("completed", "active"), ("active", "completed")]
    assert mid in {e["data"]["messageId"] for e in events if e["type"] == "message/admitted"}
    g = await wait_counted(d, gid, sid)
    assert (Path(g["workdir"]) / "round4.txt").exists()
    assert g["status"] == "completed" and g["tokens"] > done["tokens"]
    assert g["budgets"]["maxRounds"] == 5


async def test_send_to_a_paused_goal_runs_one_turn_charged_not_a_round(daemon: Daemon) -> None:
    d = daemon
    gid, sid, _ = await add_goal(d, "Write notes [rounds=50 delay=0.2]")
    await asyncio.to_thread(d.calls.wait, "worker round=2 step=0")
    code, _, err = await d.acli("goal", "pause", gid)
    assert code == 0, err
    await wait_events(d, sid, at_rest_after("goal/changed", lambda e: e["data"]["status"] == "paused"))
    paused = await wait_counted(d, gid, sid)
    assert paused["status"] == "paused"

    code, out, err = await d.acli("send", gid, "Round 7: one thing more [rounds=50]")
    assert code == 0, err
    mid = out.strip()
    assert re.fullmatch(r"msg_[0-9A-Z]{26}", mid)
    assert f"goal {gid} is paused: this message runs one turn now, charged to the goal" in err
    await wait_events(d, sid, idle_after("message/admitted", lambda e: e["data"]["messageId"] == mid))
    g = await wait_counted(d, gid, sid)
    assert (Path(g["workdir"]) / "round7.txt").exists()
    assert g["status"] == "paused" and g["rounds"] == paused["rounds"] and g["tokens"] > paused["tokens"]

    # --resume resumes the goal as well: it goes on with its next round.
    resumed_seq = (await all_events(d.socket_path, sid))[-1]["seq"]
    code, out, err = await d.acli("send", gid, "Go on [rounds=50 delay=0.2]", "--resume")
    assert code == 0, err
    assert "is paused" not in err
    resumed = await d.acli_json("goal", "show", gid)
    assert resumed["status"] == "active"
    await asyncio.to_thread(d.calls.wait, "worker round=3 step=0")  # its next round runs
    events = await all_events(d.socket_path, sid, resumed_seq)
    assert [(e["data"]["from"], e["data"]["status"]) for e in events if e["type"] == "goal/changed"] == [
        ("paused", "active")
    ]
    code, _, err = await d.acli("goal", "cancel", gid)
    assert code == 0, err
