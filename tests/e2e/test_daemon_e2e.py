"""End-to-end: the real ``goald serve`` as a subprocess, driven only through the CLI and its socket.

Each test starts its own daemon on a state directory in ``tmp_path`` with a real ``NOTIFY_SOCKET``
(see ``harness.py``). Goals use ``test:worker`` from ``goald_testmodels`` (loaded inside the daemon):
a deterministic model whose per-call latency is stated in the goal's objective, so a test can
act while a goal runs. Waiting is always on an event, a notify datagram or a process exit, with a
time limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from harness import Daemon, all_events, continuation_ids, rpc, spend_of, wait_goal

from daemon.client import Connection as Client

TERMINAL = {"completed", "failed", "cancelled", "paused", "exhausted"}
LIMIT = 30.0


# -- what the events say ---------------------------------------------------------------------


def facts_upto(events: list[dict[str, Any]], goal_id: str, cursor: int) -> dict[str, Any]:
    """Rounds (admitted continuations), tokens and cost in the events up to seq ``cursor``."""
    mine = continuation_ids(events, goal_id)
    upto = [e for e in events if e["seq"] <= cursor]
    spent = [spend_of(e) for e in upto]
    return {
        "rounds": sum(1 for e in upto if e["type"] == "message/admitted" and e["data"]["messageId"] in mine),
        "tokens": sum(t for t, _ in spent),
        "cost": sum(c for _, c in spent),
    }


def status_at(events: list[dict[str, Any]], cursor: int) -> str | None:
    """The goal's status once the idle at ``cursor`` was decided: the last ``goal/changed`` up to
    it, or the one its decision committed (which comes before the next turn starts)."""
    status = None
    for e in events:
        if e["seq"] > cursor and e["type"] == "turn/start":
            break
        if e["type"] == "goal/changed":
            status = e["data"]["status"]
    return status


def assert_tells_the_truth(goal: dict[str, Any], events: list[dict[str, Any]], where: str) -> None:
    """A goal read at any instant agrees with the session's events up to its cursor."""
    cursor = goal["evaluatedSeq"]
    facts = facts_upto(events, goal["id"], cursor)
    assert goal["rounds"] == facts["rounds"], f"{where}: rounds at seq {cursor}"
    assert goal["tokens"] == facts["tokens"], f"{where}: tokens at seq {cursor}"
    assert goal["cost"] == pytest.approx(facts["cost"], rel=1e-9, abs=1e-12), f"{where}: cost at seq {cursor}"
    assert goal["status"] == status_at(events, cursor), f"{where}: status at seq {cursor}"


def assert_changes_tell_the_truth(events: list[dict[str, Any]], goal_id: str) -> None:
    """Each ``goal/changed`` carries the counters of the idle it was decided at."""
    last_idle = 0
    for e in events:
        if e["type"] == "status" and e["data"]["status"] == "idle":
            last_idle = e["seq"]
        if e["type"] == "goal/changed":
            facts = facts_upto(events, goal_id, last_idle)
            assert (e["data"]["rounds"], e["data"]["tokens"]) == (facts["rounds"], facts["tokens"]), e
            assert e["data"]["cost"] == pytest.approx(facts["cost"], rel=1e-9, abs=1e-12), e


# -- 1. a goal from the CLI, observed at each step --------------------------------------------


async def test_a_cli_goal_completes_and_goal_show_tells_the_truth_at_each_step(start_daemon: Any) -> None:
    d = start_daemon()
    created = await d.acli_json(
        "goal",
        "add",
        "Write three rounds of notes [rounds=3 delay=0.2]",
        "--title",
        "three rounds",
        "--model",
        "test:worker",
        "--verify",
        "test -f round3.txt",
    )
    gid, sid = created["goalId"], created["sessionId"]
    snapshots: list[tuple[str, dict[str, Any]]] = []
    async with await Client.connect(d.socket_path) as client:
        await client.call("session/subscribe", {"sessionId": sid, "afterSeq": 0})
        async with asyncio.timeout(LIMIT):
            while True:
                note = await client.next_notification()
                if note["method"] != "session.event":
                    continue
                ev = note["params"]["event"]
                if ev["type"] == "goal/changed" or (ev["type"] == "status" and ev["data"]["status"] == "idle"):
                    # At each change and each idle: the goal as the socket and the CLI show it.
                    snapshots.append(
                        (f"goal/get at seq {note['params']['seq']}", await client.call("goal/get", {"goalId": gid}))
                    )
                    snapshots.append(
                        (f"goal show at seq {note['params']['seq']}", await d.acli_json("goal", "show", gid))
                    )
                if ev["type"] == "goal/changed" and ev["data"]["status"] != "active":
                    break

    events = await all_events(d.socket_path, sid)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    for where, goal in snapshots:
        assert_tells_the_truth(goal, events, where)
    assert_changes_tell_the_truth(events, gid)
    # The snapshots followed the goal from its start to its end, never backwards.
    socket_rounds = [g["rounds"] for where, g in snapshots if where.startswith("goal/get")]
    assert socket_rounds[0] == 0 and socket_rounds == sorted(socket_rounds) and socket_rounds[-1] == 3

    final = await d.acli_json("goal", "show", gid)
    assert (final["status"], final["statusReason"]) == ("completed", "verified")
    assert final["rounds"] == 3 == len(continuation_ids(events, gid))
    assert final == await rpc(d.socket_path, "goal/get", {"goalId": gid})
    totals = facts_upto(events, gid, events[-1]["seq"])
    assert final["tokens"] == totals["tokens"] > 0
    assert final["cost"] == pytest.approx(totals["cost"]) and final["cost"] > 0
    last_change = [e for e in events if e["type"] == "goal/changed"][-1]["data"]
    assert (last_change["rounds"], last_change["tokens"]) == (final["rounds"], final["tokens"])
    assert [r["exitCode"] for r in final["lastVerification"]] == [0]
    files = await asyncio.to_thread(os.listdir, final["workdir"])
    assert sorted(files) == ["round1.txt", "round2.txt", "round3.txt"]
    # The list, the health and the logs say the same.
    listed = await d.acli_json("goal", "list")
    assert [(g["id"], g["status"], g["rounds"]) for g in listed] == [(gid, "completed", 3)]
    health = await d.acli_json("status")
    assert health["status"] == "serving" and health["goals"]["completed"] == 1
    code, out, err = await d.acli("goal", "logs", gid, "--json")
    assert code == 0, err
    logged = [json.loads(line) for line in out.splitlines()]
    assert [(e["seq"], e["type"]) for e in logged] == [(e["seq"], e["type"]) for e in events]


# -- 5. the systemd notify protocol -----------------------------------------------------------


async def _initialize_once(path: Path) -> Any:
    # One connection, one call, no retry: the socket must serve the moment READY=1 arrives.
    async with asyncio.timeout(5):
        async with await Client.connect(path) as client:
            return await client.call("initialize")


def test_ready_comes_only_once_the_socket_serves_then_watchdog_then_stopping(start_daemon: Any) -> None:
    d = start_daemon(env={"WATCHDOG_USEC": "400000"}, wait_ready=False)
    while True:
        fields = d.next_message(LIMIT).split("\n")
        if "READY=1" in fields:
            break
        assert not any(f.startswith("WATCHDOG=") for f in fields), "a watchdog ping before READY=1"
    # The control socket exists (mode 0600) and answers right away.
    mode = os.stat(d.socket_path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    hello = asyncio.run(_initialize_once(d.socket_path))
    assert hello["serverInfo"]["name"] == "goald" and hello["protocolVersion"] == 1
    assert any(f.startswith("STATUS=serving") for f in fields)

    # WATCHDOG_USEC=400000: a ping every 0.2 s, from the event loop, for as long as it runs.
    # (Datagrams that queued up meanwhile are dropped, so that arrival times are send times.)
    while d.pending_message() is not None:
        pass
    pings = []
    while len(pings) < 4:
        if "WATCHDOG=1" in d.next_message(5).split("\n"):
            pings.append(time.monotonic())
    assert pings[-1] - pings[0] >= 0.4, "the pings keep a cadence; they are not a burst"

    assert d.proc is not None
    d.proc.terminate()
    stopping = d.wait_message("STOPPING=1", 10)
    assert "READY=1" not in stopping.split("\n")
    assert d.proc.wait(10) == 0
    assert not d.socket_path.exists(), "the socket file is removed on a clean stop"
    after = d.messages[d.messages.index(stopping) + 1 :]
    assert not any("READY=1" in m.split("\n") for m in after)


async def test_the_shutdown_method_sends_stopping_and_exits_0(start_daemon: Any) -> None:
    d = start_daemon()
    assert await rpc(d.socket_path, "shutdown") == {}
    await asyncio.to_thread(d.wait_message, "STOPPING=1", 10)
    assert d.proc is not None
    assert await asyncio.to_thread(d.proc.wait, 10) == 0
    code, _, err = await d.acli("status")
    assert code == 69 and "no goald daemon answers" in err


# -- 7. the socket: permissions, fan-out, resuming ----------------------------------------------


async def _collect_until_done(client: Client, goal_id: str) -> tuple[list[dict[str, Any]], list[int]]:
    """A subscriber's ``session.event`` params and ``session.status`` seqs, until the goal stops."""
    events: list[dict[str, Any]] = []
    statuses: list[int] = []
    while True:
        note = await client.next_notification()
        params = note["params"]
        if note["method"] == "session.status":
            statuses.append(params["seq"])
            continue
        assert note["method"] == "session.event", note
        events.append(params)
        ev = params["event"]
        if ev["type"] == "goal/changed" and ev["data"]["goalId"] == goal_id and ev["data"]["status"] != "active":
            return events, statuses


async def test_fifty_subscribers_each_receive_every_event_of_a_running_goal_in_order(start_daemon: Any) -> None:
    d = start_daemon()
    assert stat.S_IMODE(os.stat(d.socket_path).st_mode) == 0o600
    session = await rpc(d.socket_path, "session/new", {"model": "test:worker"})
    sid = session["sessionId"]
    clients = [await Client.connect(d.socket_path) for _ in range(50)]
    try:
        answers = await asyncio.gather(
            *(c.call("session/subscribe", {"sessionId": sid, "afterSeq": 0}) for c in clients)
        )
        assert all(a == {"sessionId": sid, "afterSeq": 0} for a in answers)
        # The goal starts only now, so all fifty see it live.
        created = await rpc(
            d.socket_path,
            "goal/create",
            {
                "objective": "Two rounds for fifty watchers [rounds=2 delay=0.05]",
                "model": "test:worker",
                "sessionId": sid,
                "verify": [{"cmd": "test -f round2.txt"}],
            },
        )
        assert created["workdir"] == session["workdir"]
        async with asyncio.timeout(LIMIT):
            seen = await asyncio.gather(*(_collect_until_done(c, created["goalId"]) for c in clients))
    finally:
        await asyncio.gather(*(c.close() for c in clients))

    truth = await all_events(d.socket_path, sid)
    assert [e["seq"] for e in truth] == list(range(1, len(truth) + 1))
    assert truth[-1]["type"] == "goal/changed" and truth[-1]["data"]["status"] == "completed"
    status_seqs = [e["seq"] for e in truth if e["type"] == "status"]
    assert len(status_seqs) >= 4
    for events, statuses in seen:
        assert [(p["seq"], p["event"]) for p in events] == [
            (e["seq"], {"type": e["type"], "data": e["data"], "at": e["at"]}) for e in truth
        ]
        assert all(p["sessionId"] == sid for p in events)
        assert statuses == status_seqs


async def test_a_subscriber_that_resumes_after_seq_misses_nothing(start_daemon: Any) -> None:
    d = start_daemon()
    created = await rpc(
        d.socket_path,
        "goal/create",
        {"objective": "Three rounds [rounds=3 delay=0.1]", "model": "test:worker", "verify": [{"cmd": "true"}]},
    )
    gid, sid = created["goalId"], created["sessionId"]

    def admits_round(params: dict[str, Any], round_no: int) -> bool:
        ev = params["event"]
        return ev["type"] == "message/admitted" and ev["data"]["source"].get("ref") == f"{gid}#{round_no}"

    async def read_until(client: Client, round_no: int) -> list[dict[str, Any]]:
        got = []
        while True:
            note = await client.next_notification()
            if note["method"] == "session.event":
                got.append(note["params"])
                if admits_round(note["params"], round_no):
                    return got

    async with asyncio.timeout(LIMIT):
        # A first connection reads up to round 1's admission, then goes away.
        async with await Client.connect(d.socket_path) as first:
            await first.call("session/subscribe", {"sessionId": sid, "afterSeq": 0})
            before = await read_until(first, 1)
        last_seen = before[-1]["seq"]
        # While it is gone, the goal moves on (another subscriber sees round 2 admitted).
        async with await Client.connect(d.socket_path) as watcher:
            await watcher.call("session/subscribe", {"sessionId": sid, "afterSeq": last_seen})
            await read_until(watcher, 2)
        # It comes back with afterSeq and gets the missed events, then the live ones.
        async with await Client.connect(d.socket_path) as again:
            answer = await again.call("session/subscribe", {"sessionId": sid, "afterSeq": last_seen})
            assert answer == {"sessionId": sid, "afterSeq": last_seen}
            after, _ = await _collect_until_done(again, gid)

    truth = await all_events(d.socket_path, sid)
    seqs = [p["seq"] for p in before + after]
    assert seqs == [e["seq"] for e in truth] == list(range(1, len(truth) + 1))
    assert [p["event"]["type"] for p in before + after] == [e["type"] for e in truth]
    missed = [p for p in after if admits_round(p, 2)]
    assert missed and missed[0]["seq"] > last_seen, "round 2 was admitted while the client was away"
    assert (await wait_goal(d.socket_path, gid, TERMINAL, LIMIT))["status"] == "completed"


# -- the CLI's exit codes ----------------------------------------------------------------------


def test_status_without_a_daemon_exits_69_with_a_clear_message(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "nobody-home")
    try:
        for args in (["status"], ["goal", "list"], ["status", "--json"]):
            done = d.cli(*args)
            assert done.returncode == 69, (args, done.stderr)
            assert done.stderr.startswith("goald: no goald daemon answers on ")
            assert str(d.socket_path) in done.stderr
            assert done.stdout == ""
    finally:
        d.close()


async def test_cli_exit_codes_not_found_conflict_and_usage(start_daemon: Any) -> None:
    d = start_daemon()
    missing_goal = "goal_" + "0" * 26
    missing_session = "ses_" + "0" * 26
    created = await rpc(d.socket_path, "goal/create", {"objective": "One round [rounds=1]", "model": "test:worker"})
    done = await wait_goal(d.socket_path, created["goalId"], TERMINAL, LIMIT)
    assert done["status"] == "completed"
    cases: list[tuple[list[str], int, str]] = [
        (["goal", "show", missing_goal], 3, f"no goal {missing_goal}"),
        (["goal", "pause", missing_goal], 3, f"no goal {missing_goal}"),
        (["goal", "logs", missing_goal], 3, f"no goal {missing_goal}"),
        (["send", missing_goal, "hello"], 3, f"no goal {missing_goal}"),
        (["send", missing_session, "hello"], 3, f"no session {missing_session}"),
        (["goal", "resume", created["goalId"]], 4, "a goal that is completed cannot become active"),
        (["goal", "show", "goal_!!"], 2, "malformed goal id"),
    ]
    results = await asyncio.gather(*(d.acli(*args) for args, _, _ in cases))
    for (args, want, text), (code, out, err) in zip(cases, results, strict=True):
        assert code == want, (args, code, err)
        assert text in err and err.startswith("goald: "), (args, err)
        assert out == "", (args, out)
    # Nothing was created or changed by the failed commands.
    listed = await d.acli_json("goal", "list")
    assert [(g["id"], g["status"]) for g in listed] == [(created["goalId"], "completed")]
