"""Operating a cluster: ``goald status``, ``goald node list`` and ``goald node drain`` on real daemons
sharing one real PostgreSQL (issue: "Past one machine", Operations).

Pins:

- ``goald status`` lists every node (name, id, alive, leases held of the limit, last heartbeat),
  marks the node that answered, and says the store is PostgreSQL with its URL;
- ``goald node drain OTHER`` makes the other node hand its sessions back at their next idle: its
  goals go on and complete on the remaining node, its lease count falls to 0 and stays there while
  the goals run, and no turn of it starts after; ``--undo`` lets it take work again;
- a drain undone while the node's sessions come to rest leaves no goal without a node deciding it;
- ``node/drain`` of a node that does not exist is refused (-32001) naming it, and changes nothing;
- the status page shows the node that drives each goal, in the goals table and on the goal's page;
- on SQLite there is no cluster: ``goald node list`` says so, and ``goald status`` shows no nodes.

Every wait is on the daemons' status or the database, with a time limit; none sleeps.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from clusterkit import q, until
from harness import TEST_MODELS, Daemon, rpc

from daemon.rpc.protocol import ErrorCode, RpcError

pytestmark = pytest.mark.timeout(300)

TTL = 3.0
#: ``await cluster(n, **config)``: n more running nodes.
Cluster = Callable[..., Awaitable[list[Daemon]]]


@pytest.fixture
def cluster(tmp_path: Path, pg_dsn: str) -> Iterator[Cluster]:
    """``await cluster(n, **config)``: n more running nodes (named n0, n1, ...) on the test's PostgreSQL
    database, each with ``config`` over the common settings."""
    started: list[Daemon] = []

    async def start(count: int, **config: Any) -> list[Daemon]:
        made = []
        for _ in range(count):
            name = f"n{len(started)}"
            d = Daemon(
                tmp_path / name,
                config={
                    **TEST_MODELS,
                    "store": pg_dsn,
                    "workdir_roots": [str(tmp_path / "work")],
                    "cluster": {"node_name": name, "lease_ttl_seconds": TTL, "labels": [f"rack-{name}"]},
                    **config,
                },
            )
            started.append(d)
            made.append(d)
            d.start()
        for d in made:  # a node joins its cluster right after READY=1
            await _joined(d)
        return made

    yield start
    for d in started:
        d.close()


async def _joined(d: Daemon) -> None:
    async def joined() -> bool:
        return (await rpc(d.socket_path, "daemon/health"))["cluster"] is not None

    await until(joined, f"{d.state_dir.name} joined the cluster", limit=30, step=0.05)


async def nodes_of(d: Daemon) -> dict[str, dict[str, Any]]:
    """``node/list`` through ``d``, by node name."""
    return {n["name"]: n for n in (await rpc(d.socket_path, "node/list"))["nodes"]}


async def add_goals(d: Daemon, count: int, directive: str) -> list[str]:
    ids = []
    for i in range(count):
        g = await rpc(
            d.socket_path,
            "goal/create",
            {"objective": f"Goal {i}. {directive}", "model": "test:worker", "verify": [{"cmd": "true"}]},
        )
        ids.append(g["goalId"])
    return ids


def statuses(dsn: str, ids: list[str]) -> dict[str, int]:
    return dict(q(dsn, "SELECT status, COUNT(*) FROM goals WHERE id = ANY(%s) GROUP BY status", ids))


def turns_on(dsn: str, node_id: str) -> int:
    return int(
        q(dsn, "SELECT COUNT(*) FROM events WHERE type = 'turn/start' AND data::jsonb->>'node' = %s", node_id)[0][0]
    )


async def test_status_lists_every_node_with_its_leases(cluster: Cluster, pg_dsn: str) -> None:
    a, b = await cluster(2)
    # Long goals, so both nodes hold sessions while we look (a goal is held by the node it was made on).
    await add_goals(a, 2, "[rounds=30 delay=0.2]")
    await add_goals(b, 2, "[rounds=30 delay=0.2]")

    async def both_hold() -> bool:
        nodes = await nodes_of(a)
        return set(nodes) == {"n0", "n1"} and all(n["leases"] >= 2 for n in nodes.values())

    await until(both_hold, "both nodes holding their goals' sessions")
    code, out, err = await a.acli("status")
    assert code == 0, err
    health = await rpc(a.socket_path, "daemon/health")
    ids = {n["name"]: n["nodeId"] for n in health["cluster"]["nodes"]}
    lines = out.splitlines()
    assert any(line.startswith("store:     PostgreSQL postgresql://") for line in lines), out
    assert "nodes:" in out
    for name in ("n0", "n1"):
        (line,) = [x for x in lines if x.strip().startswith(f"{name} ")]
        assert ids[name] in line and "alive" in line and f"labels rack-{name}" in line, line
        held = re.search(r"leases (\d+)/1000", line)
        assert held is not None and int(held.group(1)) >= 2, line
        assert re.search(r"heartbeat (just now|\d+s ago)", line), line
        assert ("(this node)" in line) == (name == "n0"), line
    # --json is daemon/health as it is.
    code, out, err = await a.acli("status", "--json")
    assert code == 0, err
    assert '"cluster"' in out and '"nodes"' in out
    # node list says the same, from the other side.
    code, out, err = await b.acli("node", "list")
    assert code == 0, err
    (mine,) = [x for x in out.splitlines() if "(this node)" in x]
    assert mine.strip().startswith("n1 ")


async def test_drain_hands_a_node_s_sessions_back_at_their_next_idle(cluster: Cluster, pg_dsn: str) -> None:
    a, b = await cluster(2)
    b_id = (await rpc(b.socket_path, "daemon/health"))["cluster"]["nodeId"]
    # n1's goals must still be running when n1 is empty, or their going on on n0 pins nothing. The
    # drain takes the CLI's start, a heartbeat and at most one round of each: whatever the load,
    # far less than the 90 model calls of 0.2 s each (18 s of the model alone) that n1's goals
    # need before they can complete; checked below, not assumed.
    rounds = 30
    on_b = await add_goals(b, 4, f"[rounds={rounds} delay=0.2]")
    ids = on_b + await add_goals(a, 2, "[rounds=12 delay=0.2]")

    async def b_holds() -> bool:
        return (await nodes_of(a))["n1"]["leases"] >= 4

    await until(b_holds, "node n1 holding its goals")
    code, out, err = await a.acli("node", "drain", "n1")
    assert code == 0, err
    assert "n1" in out and b_id in out and "next idle" in out

    async def b_empty() -> bool:
        n1 = (await nodes_of(a))["n1"]
        return bool(n1["draining"] and n1["leases"] == 0)

    await until(b_empty, "node n1 handing every session back", limit=60)
    turns_then = turns_on(pg_dsn, b_id)
    handed_back = q(pg_dsn, "SELECT id, status, rounds FROM goals WHERE id = ANY(%s)", on_b)
    assert [r for r in handed_back if r[1] != "active" or r[2] >= rounds] == [], (
        f"n1's goals should be handed back with rounds left: {handed_back}"
    )

    # The goals go on, on n0 alone; n1 holds nothing and starts no turn while they run.
    async def completed() -> bool:
        assert (await nodes_of(a))["n1"]["leases"] == 0
        return statuses(pg_dsn, ids).get("completed", 0) == len(ids)

    await until(completed, "every goal completed on n0", limit=180, step=0.25)
    assert turns_on(pg_dsn, b_id) == turns_then
    assert sorted(q(pg_dsn, "SELECT rounds, status_reason FROM goals WHERE id = ANY(%s)", ids)) == (
        [(12, "verified")] * 2 + [(rounds, "verified")] * 4
    )
    # Each of n1's goals ran its last rounds on n0 (it was handed back, not finished on n1).
    sessions = [r[0] for r in q(pg_dsn, "SELECT session_id FROM goals WHERE id = ANY(%s)", on_b)]
    finished_on = q(
        pg_dsn,
        "SELECT DISTINCT ON (session_id) data::jsonb->>'node' FROM events WHERE session_id = ANY(%s)"
        " AND type = 'turn/start' ORDER BY session_id, seq DESC",
        sessions,
    )
    assert len(finished_on) == 4 and all(r[0] != b_id for r in finished_on), finished_on
    dup = q(
        pg_dsn,
        "SELECT session_id, source_ref FROM inbox WHERE source_kind = 'goal' AND fate = 'admitted'"
        " GROUP BY session_id, source_ref HAVING COUNT(*) > 1",
    )
    assert dup == []

    # A goal created through the draining node runs elsewhere.
    (elsewhere,) = await add_goals(b, 1, "[rounds=1]")
    await until(lambda: _completed(pg_dsn, elsewhere), "a goal made through n1 completed", limit=60)
    assert (await nodes_of(a))["n1"]["leases"] == 0

    # --undo: n1 takes work again.
    code, out, err = await b.acli("node", "drain", "n1", "--undo")
    assert code == 0, err
    assert "takes work again" in out
    await until(lambda: _not_draining(a, "n1"), "n1 taking work again", limit=30)
    again = await add_goals(b, 2, "[rounds=4 delay=0.1]")

    async def b_holds_again() -> bool:
        return (await nodes_of(a))["n1"]["leases"] >= 1

    await until(b_holds_again, "n1 holding new work")
    await until(lambda: _all_completed(pg_dsn, again), "the new goals completed", limit=60)
    assert turns_on(pg_dsn, b_id) > turns_then


async def test_a_drain_undone_at_once_leaves_no_goal_behind(cluster: Cluster, pg_dsn: str) -> None:
    a, b = await cluster(2)
    ids = await add_goals(b, 4, "[rounds=8 delay=0.1]")

    async def b_holds() -> bool:
        return (await nodes_of(a))["n1"]["leases"] >= 4

    await until(b_holds, "node n1 holding its goals")
    await rpc(a.socket_path, "node/drain", {"node": "n1"})

    async def b_draining() -> bool:
        return bool((await rpc(b.socket_path, "daemon/health"))["cluster"]["draining"])

    await until(b_draining, "n1 draining by its own account", limit=30, step=0.02)
    # Undone while its sessions come to rest: those it still holds are decided for again, none is left idle.
    await rpc(a.socket_path, "node/drain", {"node": "n1", "undo": True})
    await until(lambda: _all_completed(pg_dsn, ids), "every goal completed", limit=90)
    assert q(pg_dsn, "SELECT DISTINCT rounds, status_reason FROM goals") == [(8, "verified")]


async def _completed(dsn: str, goal_id: str) -> bool:
    return bool(q(dsn, "SELECT 1 FROM goals WHERE id = %s AND status = 'completed'", goal_id))


async def _all_completed(dsn: str, ids: list[str]) -> bool:
    return statuses(dsn, ids).get("completed", 0) == len(ids)


async def _not_draining(d: Daemon, name: str) -> bool:
    return not (await nodes_of(d))[name]["draining"]


async def test_draining_an_unknown_node_is_refused_naming_it(cluster: Cluster, pg_dsn: str) -> None:
    a, b = await cluster(2)
    before = q(pg_dsn, "SELECT id, draining FROM nodes ORDER BY id")
    with pytest.raises(RpcError) as refused:
        await rpc(a.socket_path, "node/drain", {"node": "no-such-node"})
    assert refused.value.code == ErrorCode.NOT_FOUND
    assert "no-such-node" in refused.value.message
    code, _out, err = await a.acli("node", "drain", "no-such-node", "--undo")
    assert code == 3 and "no-such-node" in err, err
    with pytest.raises(RpcError) as bad:
        await rpc(a.socket_path, "node/drain", {"node": ""})
    assert bad.value.code == ErrorCode.INVALID_PARAMS
    assert q(pg_dsn, "SELECT id, draining FROM nodes ORDER BY id") == before
    assert all(not n["draining"] for n in (await nodes_of(b)).values())
    # No name: the node that answers drains (and a drain of this node shows in its own status).
    asked = await rpc(b.socket_path, "node/drain", {})
    b_id = (await rpc(b.socket_path, "daemon/health"))["cluster"]["nodeId"]
    assert asked == {"nodeIds": [b_id], "draining": True}

    async def b_says_draining() -> bool:
        return bool((await rpc(b.socket_path, "daemon/health"))["cluster"]["draining"])

    await until(b_says_draining, "n1 draining by its own account", limit=30)
    code, out, err = await b.acli("status")
    assert code == 0 and "DRAINING" in out, (out, err)
    # The caller is recorded in the drain's log line.
    assert re.search(r"node/drain: node n1 .* asked by uid \d+ pid \d+", b.stderr()), b.stderr()


async def test_on_sqlite_there_is_no_cluster(daemon: Daemon) -> None:
    code, out, err = await daemon.acli("node", "list")
    assert code == 1 and out == "", (code, out)
    assert "there is no cluster" in err and "SQLite" in err, err
    with pytest.raises(RpcError) as refused:
        await rpc(daemon.socket_path, "node/drain", {"node": "x"})
    assert refused.value.code == ErrorCode.NOT_SUPPORTED
    assert "there is no cluster" in refused.value.message
    code, out, err = await daemon.acli("status")
    assert code == 0, err
    assert "nodes:" not in out and "\ndatabase:  " in out, out


def _get(port: int, path: str, token: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


async def test_a_goal_cancelled_through_another_node_has_its_running_turn_interrupted(
    cluster: Cluster, pg_dsn: str
) -> None:
    a, b = await cluster(2)
    # One model call takes two minutes: the turn is still running when the cancel comes, and it
    # could only end within the wait below by being interrupted.
    (gid,) = await add_goals(a, 1, "[rounds=5 delay=120]")
    sid = (await rpc(a.socket_path, "goal/get", {"goalId": gid}))["sessionId"]
    a_id = (await rpc(a.socket_path, "daemon/health"))["cluster"]["nodeId"]

    async def running_on_a() -> bool:
        rows = q(pg_dsn, "SELECT data::jsonb->>'node' FROM events WHERE session_id = %s AND type = 'turn/start'", sid)
        return [r[0] for r in rows] == [a_id]

    await until(running_on_a, "the goal's first turn running on n0")
    changed = await rpc(b.socket_path, "goal/cancel", {"goalId": gid})  # through the node that does not hold it
    assert changed["status"] == "cancelled"

    async def turn_ended() -> list[str]:
        rows = q(pg_dsn, "SELECT data FROM events WHERE session_id = %s AND type = 'turn/end'", sid)
        return [json.loads(r[0])["reason"] for r in rows]

    assert await until(turn_ended, "the running turn ended on n0", limit=60) == ["cancelled"]
    assert (await rpc(a.socket_path, "goal/get", {"goalId": gid}))["status"] == "cancelled"
    assert "was cancelled on another node: interrupting its running turn" in a.stderr_path.read_text(errors="replace")
    # Nothing more ran: no second turn, on either node.
    assert len(q(pg_dsn, "SELECT 1 FROM events WHERE session_id = %s AND type = 'turn/start'", sid)) == 1


async def test_the_status_page_shows_the_node_of_each_goal(cluster: Cluster, pg_dsn: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    (a,) = await cluster(1, web={"enabled": True, "listen": f"127.0.0.1:{port}"})
    (b,) = await cluster(1)
    (gid,) = await add_goals(b, 1, "[rounds=400 delay=0.2]")

    async def b_holds() -> bool:
        return (await nodes_of(a))["n1"]["leases"] == 1

    await until(b_holds, "n1 holding the goal")
    token = (await a.acli("web", "token", "add", "ops"))[1].strip()
    status, body = await asyncio.to_thread(_get, port, "/", token)
    assert status == 200, body
    assert "<th>node</th>" in body and '<td class="node">n1</td>' in body, body
    status, body = await asyncio.to_thread(_get, port, f"/goals/{gid}", token)
    assert status == 200, body
    assert '<span id="goal-node">n1</span>' in body, body
    # The page's node is goal/describe's and goal/list's (what the CLI can read too), asked of either node.
    for d in (a, b):
        assert (await rpc(d.socket_path, "goal/describe", {"goalId": gid, "events": 0}))["node"] == "n1"
        (listed,) = (await rpc(d.socket_path, "goal/list", {}))["goals"]
        assert listed["node"] == "n1"
    await rpc(a.socket_path, "goal/cancel", {"goalId": gid})
