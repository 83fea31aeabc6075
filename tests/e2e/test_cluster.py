"""Several real daemons on one real PostgreSQL (issue: "Past one machine").

Pins, with real ``goald serve`` processes and the scripted test models:

- three nodes run many goals to completion: every goal's rounds were admitted exactly once, and each
  session was driven by one node at a time (over its events: no turn of one node between another
  node's turn start and end, and a change of node only after a turn ended);
- ``kill -9`` of one node mid-run: the others take its goals over within the lease TTL plus one
  heartbeat (measured from the kill), crash repair is recorded once per open turn, nothing
  acknowledged is lost, and no continuation is admitted twice;
- a node stopped with ``SIGSTOP`` past its TTL and continued: its late writes are refused (the
  fence), and its sessions go on with their new holder;
- a follow-up sent to node A for a session node B drives is admitted by B at once, woken by the
  notification of A's commit rather than by its slow poll (counted: more admissions than polls
  could account for), and a subscriber on node C sees the session's events in order;
- a graceful stop hands a node's sessions back at once, and ``node drain`` hands them back at
  their next idle.

CI runs small counts; the ``soak`` marker runs the issue's full counts.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import clusterkit
import psycopg
import pytest
from clusterkit import q, until
from harness import Daemon, rpc

from agent.relay import Listener
from daemon.client import Connection as Client

pytestmark = pytest.mark.timeout(600)

TTL = 3.0
#: How often a node polls for events its notifications missed (the store does not change it).
POLL: float = inspect.signature(Listener).parameters["poll_seconds"].default


def node(tmp_path: Path, name: str, dsn: str, **cluster: Any) -> Daemon:
    return clusterkit.node(
        tmp_path / name, name, dsn, cluster={"lease_ttl_seconds": TTL, **cluster}, max_concurrent_turns=64
    )


@pytest.fixture
def cluster(tmp_path: Path, pg_dsn: str) -> Iterator[Callable[..., list[Daemon]]]:
    started: list[Daemon] = []

    def start(count: int = 3, **cluster_settings: Any) -> list[Daemon]:
        nodes = [node(tmp_path, f"n{i + len(started)}", pg_dsn, **cluster_settings) for i in range(count)]
        for d in nodes:
            d.start()
        started.extend(nodes)
        return nodes

    yield start
    for d in started:
        d.close()


def check_one_driver_at_a_time(dsn: str) -> int:
    """Over every session's events: turns never overlap, and every turn names one node. Returns the
    number of sessions whose turns ran on more than one node (handed over between turns)."""
    rows = q(
        dsn,
        "SELECT session_id, seq, type, data FROM events WHERE type IN ('turn/start', 'turn/end')"
        " ORDER BY session_id, seq",
    )
    moved = 0
    by_session: dict[str, list[tuple[int, str, Any]]] = {}
    for sid, seq, typ, data in rows:
        by_session.setdefault(sid, []).append((seq, typ, data))
    for sid, evs in by_session.items():
        open_turn: str | None = None
        nodes: set[str] = set()
        for seq, typ, data in evs:
            d = json.loads(data)
            if typ == "turn/start":
                assert open_turn is None, f"{sid}: turn {d['turnId']} started at {seq} inside {open_turn}"
                assert d.get("node"), f"{sid}: turn at {seq} names no node"
                open_turn = d["turnId"]
                nodes.add(d["node"])
            else:
                assert open_turn == d["turnId"], f"{sid}: turn/end at {seq} of {d['turnId']}, open {open_turn}"
                open_turn = None
        moved += len(nodes) > 1
    return moved


def check_exactly_once(dsn: str) -> None:
    """Every goal continuation (one per round) was admitted at most once, and no queued message of a
    completed goal was left behind."""
    dup = q(
        dsn,
        "SELECT session_id, source_ref, COUNT(*) FROM inbox WHERE source_kind = 'goal' AND fate = 'admitted'"
        " GROUP BY session_id, source_ref HAVING COUNT(*) > 1",
    )
    assert dup == [], dup
    stranded = q(
        dsn,
        "SELECT i.id FROM inbox i JOIN goals g ON g.session_id = i.session_id WHERE i.fate = 'queued'"
        " AND g.status = 'completed'",
    )
    assert stranded == [], stranded


async def run_goals(nodes: list[Daemon], dsn: str, count: int, rounds: int, delay: float = 0.0) -> list[str]:
    ids = []
    for i in range(count):
        d = nodes[i % len(nodes)]
        directive = f"[rounds={rounds}" + (f" delay={delay}" if delay else "") + "]"
        g = await rpc(
            d.socket_path,
            "goal/create",
            {"objective": f"Goal {i}. {directive}", "model": "test:worker", "verify": [{"cmd": "true"}]},
        )
        ids.append(g["goalId"])
    return ids


async def all_completed(dsn: str, ids: list[str], limit: float) -> None:
    async def done() -> bool:
        rows = q(dsn, "SELECT status, COUNT(*) FROM goals GROUP BY status")
        counts = dict(rows)
        return counts.get("completed", 0) == len(ids)

    await until(done, f"{len(ids)} goals completed", limit=limit, step=0.25)


async def _many_goals(cluster: Callable[..., list[Daemon]], pg_dsn: str, count: int) -> None:
    # The default TTL: 300 goals on three nodes and PostgreSQL on two cores hold up an event loop
    # for seconds, past a 3 s TTL, and then leases move (correctly: fenced, repaired, counted once)
    # — this test is about runs that see no takeover, so every goal takes exactly its 3 rounds.
    nodes = cluster(3, lease_limit=max(10, count // 3), lease_ttl_seconds=15)
    ids = await run_goals(nodes, pg_dsn, count, rounds=3)
    await all_completed(pg_dsn, ids, limit=60 + count)
    check_exactly_once(pg_dsn)
    check_one_driver_at_a_time(pg_dsn)
    odd = q(
        pg_dsn,
        "SELECT id, session_id, rounds, status_reason FROM goals WHERE rounds <> 3 OR status_reason <> 'verified'",
    )
    assert odd == [], [(g, _story(pg_dsn, sid)) for g, sid, *_ in odd[:3]]
    held = {n["name"]: n["leases"] for n in (await rpc(nodes[0].socket_path, "daemon/health"))["cluster"]["nodes"]}
    assert set(held) == {d.state_dir.name for d in nodes}


def _story(dsn: str, sid: str) -> list[tuple[Any, ...]]:
    return q(dsn, "SELECT seq, type, LEFT(data, 160) FROM events WHERE session_id = %s ORDER BY seq", sid)


async def test_three_nodes_run_goals_to_completion_each_round_once(
    cluster: Callable[..., list[Daemon]], pg_dsn: str
) -> None:
    await _many_goals(cluster, pg_dsn, 30)


@pytest.mark.soak
async def test_three_nodes_run_300_goals(cluster: Callable[..., list[Daemon]], pg_dsn: str) -> None:
    await _many_goals(cluster, pg_dsn, 300)


#: The rounds each goal of the kill campaign needs (its script's): the minimum, and what it must count.
KILL_ROUNDS = 6


async def _kill_one(cluster: Callable[..., list[Daemon]], pg_dsn: str, repeats: int, goals: int = 9) -> list[float]:
    """``repeats`` kills, each of a node running its share of ``goals`` new goals."""
    takeovers: list[float] = []
    nodes = cluster(3)
    for attempt in range(repeats):
        live = [d for d in nodes if d.proc is not None and d.proc.poll() is None]
        await run_goals(live, pg_dsn, goals, rounds=KILL_ROUNDS, delay=0.1)
        victim = live[attempt % len(live)]
        victim_id = (await rpc(victim.socket_path, "daemon/health"))["cluster"]["nodeId"]

        async def victim_holds(victim_id: str = victim_id) -> bool:
            return bool(
                q(
                    pg_dsn,
                    "SELECT 1 FROM leases l JOIN goals g ON g.session_id = l.session_id"
                    " WHERE l.node_id = %s AND g.status = 'active' LIMIT 1",
                    victim_id,
                )
            )

        await until(victim_holds, "the victim holding sessions")
        # The sessions with work the victim holds (an ended goal's session has nothing to take over).
        held = [
            r[0]
            for r in q(
                pg_dsn,
                "SELECT l.session_id FROM leases l JOIN goals g ON g.session_id = l.session_id"
                " WHERE l.node_id = %s AND g.status = 'active'",
                victim_id,
            )
        ]
        assert victim.proc is not None
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(30)
        killed = time.monotonic()

        async def taken(held: list[str] = held, victim_id: str = victim_id) -> bool:
            rows = q(
                pg_dsn,
                "SELECT COUNT(*) FROM leases WHERE session_id = ANY(%s) AND node_id IS NOT NULL AND node_id <> %s",
                held,
                victim_id,
            )
            return bool(rows[0][0] == len(held))

        await until(taken, "the victim's sessions taken over", limit=TTL * 3 + 30, step=0.05)
        takeovers.append(time.monotonic() - killed)
        await all_completed(pg_dsn, q_ids(pg_dsn), limit=120)
        # A replacement node joins (a restarted daemon is a new node).
        nodes += cluster(1)
    check_exactly_once(pg_dsn)
    check_one_driver_at_a_time(pg_dsn)
    # Crash repair recorded once per interrupted turn: no turn ended twice.
    twice = q(
        pg_dsn,
        "SELECT data::jsonb->>'turnId', COUNT(*) FROM events WHERE type = 'turn/end' GROUP BY 1 HAVING COUNT(*) > 1",
    )
    assert twice == []
    for t in takeovers:
        assert t < TTL + TTL / 3 + 2.0, takeovers  # TTL plus one heartbeat (plus process noise)
    live = [d for d in nodes if d.proc is not None and d.proc.poll() is None]
    await check_rounds_and_interrupted_tokens(live[0], pg_dsn, repeats)
    return takeovers


async def check_rounds_and_interrupted_tokens(d: Daemon, dsn: str, kills: int) -> None:
    """Rounds and money belong to the model's work (issue 25): every goal counted exactly the rounds
    its script needs, however many of its turns a kill cut short (those re-run apart, as infra
    rounds); the tokens charged in full for calls a kill left without an outcome are the session's
    ``model/charged`` events, and ``goal/get`` and ``goald goal show`` report them apart."""
    goals = q(dsn, "SELECT id, session_id, status, status_reason, rounds, infra_rounds, interrupted_tokens FROM goals")
    off = [(g[0], g[2], g[3], g[4]) for g in goals if (g[2], g[3], g[4]) != ("completed", "verified", KILL_ROUNDS)]
    assert off == [], off
    charged = dict(
        q(
            dsn,
            "SELECT session_id, SUM((data::jsonb->>'tokens')::bigint) FROM events WHERE type = 'model/charged'"
            " AND data::jsonb->>'subagentSessionId' IS NULL GROUP BY session_id",
        )
    )
    assert {g[1]: g[6] for g in goals if g[6]} == {sid: int(n) for sid, n in charged.items() if n}
    duplicates = q(
        dsn,
        "SELECT COUNT(*) FROM (SELECT 1 FROM inbox WHERE source_kind = 'goal' AND fate = 'admitted'"
        " GROUP BY session_id, source_ref HAVING COUNT(*) > 1) AS d",
    )[0][0]
    rerun = sum(g[5] for g in goals)
    assert rerun >= 1, "no kill cut a turn short: the campaign showed nothing about rounds"
    interrupted = [(g[0], g[6]) for g in goals if g[6]]
    for gid, tokens in interrupted[:3]:
        view = await rpc(d.socket_path, "goal/get", {"goalId": gid})
        assert view["interruptedTokens"] == tokens and view["infraRounds"] >= 1, view
        code, shown, err = await d.acli("goal", "show", gid)
        assert code == 0, err
        assert f"interrupted: {tokens:,} tokens charged for interrupted calls" in shown, shown
    print(
        f"kill campaign: {kills} kill(s), {len(goals)} goals, rounds counted {sum(g[4] for g in goals)}"
        f" (minimum {KILL_ROUNDS * len(goals)}), {rerun} round(s) re-run apart, duplicate rounds {duplicates},"
        f" {sum(t for _, t in interrupted):,} tokens charged for interrupted calls in {len(interrupted)} goal(s)"
    )


def q_ids(dsn: str) -> list[str]:
    return [r[0] for r in q(dsn, "SELECT id FROM goals")]


async def test_a_killed_node_s_goals_are_taken_over_within_the_ttl(
    cluster: Callable[..., list[Daemon]], pg_dsn: str
) -> None:
    await _kill_one(cluster, pg_dsn, 3)  # a different node each time; the soak kills 20


@pytest.mark.soak
async def test_twenty_kills(cluster: Callable[..., list[Daemon]], pg_dsn: str) -> None:
    takeovers = await _kill_one(cluster, pg_dsn, 20, goals=15)  # 300 goals in all
    print(f"takeover after kill -9: median {statistics.median(takeovers):.2f}s max {max(takeovers):.2f}s")


async def test_a_stopped_node_s_late_writes_are_refused(cluster: Callable[..., list[Daemon]], pg_dsn: str) -> None:
    first, second = cluster(2)
    goal = await rpc(
        first.socket_path,
        "goal/create",
        {"objective": "Slow. [rounds=4 delay=2.5]", "model": "test:worker", "verify": [{"cmd": "true"}]},
    )
    sid = goal["sessionId"]
    ids = {(await rpc(d.socket_path, "daemon/health"))["cluster"]["nodeId"]: d for d in (first, second)}

    async def held_in_a_turn() -> str | None:
        rows = q(pg_dsn, "SELECT node_id FROM leases WHERE session_id = %s", sid)
        turns = q(pg_dsn, "SELECT 1 FROM turns WHERE session_id = %s AND end_reason IS NULL", sid)
        return rows[0][0] if rows and rows[0][0] in ids and turns else None

    # Whichever node claimed the new goal (its creator usually; the other's heartbeat may be first).
    a_id = await until(held_in_a_turn, "a node in a turn of the goal")
    a = ids[a_id]
    assert a.proc is not None
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:

        async def moved() -> bool:
            rows = q(pg_dsn, "SELECT node_id FROM leases WHERE session_id = %s", sid)
            return bool(rows and rows[0][0] not in (None, a_id))

        await until(moved, "the session taken over by b", limit=TTL * 4 + 10)
        before = q(pg_dsn, "SELECT COUNT(*) FROM events WHERE session_id = %s", sid)[0][0]
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    # a wakes mid-model-call; its next write must be refused and logged as such: one line at info,
    # no traceback (an expected, handled event: issue 25, point 9).
    await until(lambda: _logged(a, f"lease lost for session {sid}"), "a's refused late write", limit=30)
    log = a.stderr_path.read_text(errors="replace")
    refused = [line for line in log.splitlines() if "nothing was written" in line]
    assert len(refused) == 1 and " INFO " in refused[0] and "the session is let go" in refused[0], refused
    assert "Traceback" not in log and " ERROR " not in log, log

    async def completed() -> bool:
        return bool(q(pg_dsn, "SELECT 1 FROM goals WHERE id = %s AND status = 'completed'", goal["goalId"]))

    await until(completed, "the goal completed on b", limit=60)
    check_exactly_once(pg_dsn)
    check_one_driver_at_a_time(pg_dsn)
    after_turns = q(
        pg_dsn,
        "SELECT data FROM events WHERE session_id = %s AND type = 'turn/start' AND seq > %s",
        sid,
        before,
    )
    assert all(json.loads(d)["node"] != a_id for (d,) in after_turns)  # no turn of a after the takeover


async def _logged(d: Daemon, text: str) -> bool:
    return text in d.stderr_path.read_text(errors="replace")


async def test_a_follow_up_through_another_node_is_admitted_at_once(
    cluster: Callable[..., list[Daemon]], pg_dsn: str
) -> None:
    """b drives the session; each follow-up sent through a is admitted by b woken by a's commit's
    notification, not by b's slow poll. Pinned by counting, not by a latency: every follow-up is sent
    while b's session is idle (the idle was committed finding nothing queued, so only a relayed
    ``message/queued`` can wake it), and the next one only once the last was admitted. Were the
    notifications not heard, each admission would need a poll of its own, and polls run at least
    ``POLL`` seconds apart: N admissions would span at least (N - 1) polls' intervals. So the polls
    that can have run while they were pending bound how many the poll can have admitted; the rest
    were the notifications' doing. The time limit per follow-up is only a guard against a hang."""
    a, b, c = cluster(3)
    created = await rpc(b.socket_path, "session/new", {"model": "test:chat"})
    sid = created["sessionId"]
    await rpc(b.socket_path, "session/prompt", {"sessionId": sid, "text": "hello"})
    b_id = (await rpc(b.socket_path, "daemon/health"))["cluster"]["nodeId"]
    await until(lambda: _held_by(pg_dsn, sid, b_id), "b holding the session")

    seen: list[int] = []
    observer = await Client.connect(c.socket_path)
    count = 20
    # One connection for the many checks below (a connection per check is a backend forked each time).
    db = await asyncio.to_thread(psycopg.connect, pg_dsn, autocommit=True)
    try:

        async def idle() -> bool:
            """Whether the session's last event is ``status: idle`` (committed finding nothing queued)."""
            sql = "SELECT type, data::jsonb->>'status' FROM events WHERE session_id = %s ORDER BY seq DESC LIMIT 1"
            row = db.execute(sql, (sid,)).fetchone()
            return row == ("status", "idle")

        await observer.call("session/subscribe", {"sessionId": sid, "afterSeq": 0})
        await until(idle, "b's session idle after its first message", limit=30)
        first_sent = last_admitted = time.monotonic()
        for i in range(count):
            mid = (await rpc(a.socket_path, "session/prompt", {"sessionId": sid, "text": f"ping {i}"}))["messageId"]

            async def admitted(mid: str = mid) -> bool:
                return (
                    db.execute("SELECT 1 FROM inbox WHERE id = %s AND fate = 'admitted'", (mid,)).fetchone() is not None
                )

            await until(admitted, f"follow-up {i} admitted on b", limit=POLL * 3 + 10, step=0.01)
            last_admitted = time.monotonic()
            await until(idle, f"b's session idle after follow-up {i}", limit=30, step=0.01)
        top = q(pg_dsn, "SELECT MAX(seq) FROM events WHERE session_id = %s", sid)[0][0]
        async with asyncio.timeout(30):
            while not seen or seen[-1] < top:
                note = await observer.next_notification()
                params = note.get("params", {})
                if note["method"] == "session.event" and params["sessionId"] == sid:
                    seen.append(params["seq"])
    finally:
        await observer.close()
        db.close()
    assert seen == list(range(1, top + 1))
    # At most one poll at the start of the span and one per POLL seconds after: each admitted at
    # most one follow-up (the next was sent only after). All the others were relayed at once.
    span = last_admitted - first_sent
    by_poll_at_most = math.floor(span / POLL) + 1
    assert count - by_poll_at_most >= count // 2, (
        f"{count} follow-ups took {span:.1f}s: up to {by_poll_at_most} may have waited for b's poll"
        f" (every {POLL:g}s), so fewer than half were surely admitted by the notification"
    )
    turn_nodes = {
        r[0]
        for r in q(pg_dsn, "SELECT data::jsonb->>'node' FROM events WHERE session_id = %s AND type = 'turn/start'", sid)
    }
    assert turn_nodes == {b_id}
    assert len(q(pg_dsn, "SELECT 1 FROM inbox WHERE session_id = %s AND fate = 'admitted'", sid)) == count + 1


async def _held_by(dsn: str, sid: str, node_id: str) -> bool:
    return bool(q(dsn, "SELECT 1 FROM leases WHERE session_id = %s AND node_id = %s", sid, node_id))


async def test_a_goal_needing_a_label_runs_only_on_a_node_with_it(
    cluster: Callable[..., list[Daemon]], pg_dsn: str
) -> None:
    (plain,) = cluster(1)
    (labelled,) = cluster(1, labels=["gpu"])
    goal = await rpc(
        plain.socket_path,
        "goal/create",
        {"objective": "Label. [rounds=3]", "model": "test:worker", "verify": [{"cmd": "true"}], "nodeLabel": "gpu"},
    )
    gpu_id = (await rpc(labelled.socket_path, "daemon/health"))["cluster"]["nodeId"]

    async def completed() -> bool:
        return bool(q(pg_dsn, "SELECT 1 FROM goals WHERE id = %s AND status = 'completed'", goal["goalId"]))

    await until(completed, "the labelled goal completed", limit=60)
    ran_on = {
        r[0]
        for r in q(
            pg_dsn,
            "SELECT data::jsonb->>'node' FROM events WHERE session_id = %s AND type = 'turn/start'",
            goal["sessionId"],
        )
    }
    assert ran_on == {gpu_id}
    shown = plain.cli("goal", "show", goal["goalId"])
    assert "node label: gpu" in shown.stdout, shown.stdout


async def test_a_takeover_onto_a_node_without_the_work_directory_pauses_the_goal(
    cluster: Callable[..., list[Daemon]], pg_dsn: str, tmp_path: Path
) -> None:
    (first,) = cluster(1)
    goal = await rpc(
        first.socket_path,
        "goal/create",
        {"objective": "Files. [rounds=50 delay=0.2]", "model": "test:worker", "verify": [{"cmd": "true"}]},
    )
    gid = goal["goalId"]
    workdir = Path(q(pg_dsn, "SELECT workdir FROM goals WHERE id = %s", gid)[0][0])
    await until(lambda: _rounds_at_least(pg_dsn, gid, 1), "a round")
    assert first.proc is not None
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(30)
    # The next node is a host without that directory (same path, not there).
    renamed = workdir.with_name(workdir.name + ".elsewhere")
    os.rename(workdir, renamed)
    (second,) = cluster(1)

    async def paused() -> tuple[str, str] | None:
        rows = q(pg_dsn, "SELECT status, status_reason FROM goals WHERE id = %s", gid)
        return rows[0] if rows and rows[0][0] == "paused" else None

    _, reason = await until(paused, "the goal paused by the new node", limit=TTL * 3 + 30)
    assert "is not on this node" in reason and str(workdir) in reason, reason
    assert not await asyncio.to_thread(os.path.exists, workdir)  # no empty directory made in its place
    shown = second.cli("goal", "show", gid)
    assert "is not on this node" in shown.stdout, shown.stdout


async def _rounds_at_least(dsn: str, gid: str, n: int) -> bool:
    return bool(q(dsn, "SELECT 1 FROM goals WHERE id = %s AND rounds >= %s", gid, n))
