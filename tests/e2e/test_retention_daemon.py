"""Retention through a real daemon: ``goald store stats|compact|vacuum`` and what clients see after.

A real ``goald serve`` process runs a goal to completion on the test's scripted worker (each
continuation carries a 30 KB objective, so the goal's history is large), and a second goal that
stays live (paused). Retention ages are in seconds: ``history_seconds = 0.001``, so the completed
goal is old enough by the time ``store compact`` runs; the periodic timer is off
(``interval_seconds = 0``) so only the command prunes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TEST_MODELS, Daemon, all_events, paused_at_rest, rpc, wait_goal

from daemon.client import Connection as Client
from daemon.rpc.protocol import RpcError

RETENTION = {"history_seconds": 0.001, "keep_events": 6, "interval_seconds": 0, "workdir_seconds": 0}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "state", config={**TEST_MODELS, "retention": RETENTION})
    d.start()
    yield d
    d.close()


async def test_compact_prunes_ended_goals_shrinks_the_file_and_clients_see_the_boundary(daemon: Daemon) -> None:
    sock = daemon.socket_path
    big = "x" * 30_000
    done = await rpc(sock, "goal/create", {"objective": f"[rounds=8] Write the rounds. {big}", "model": "test:worker"})
    live = await rpc(sock, "goal/create", {"objective": "[rounds=50 delay=0.05] Keep going.", "model": "test:worker"})
    await rpc(sock, "goal/pause", {"goalId": live["goalId"]})
    ended = await wait_goal(sock, done["goalId"], {"completed", "failed", "paused", "exhausted"})
    assert ended["status"] == "completed"
    await wait_goal(sock, live["goalId"], {"paused"})
    # A round admitted before the pause still ends, and the paused goal records it at the next idle.
    paused = await paused_at_rest(sock, live["goalId"], live["sessionId"])
    live_events = await all_events(sock, live["sessionId"])
    last_seq = (await rpc(sock, "agent/status", {"sessionId": done["sessionId"]}))["lastSeq"]

    code, out, err = await daemon.acli("store", "stats", "--json")
    assert code == 0, err
    before = json.loads(out)
    assert before["autoVacuum"] == "incremental" and before["rows"]["goals"] == 2
    assert before["largestSessions"][0]["sessionId"] == done["sessionId"]

    code, out, err = await daemon.acli("store", "compact", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["goalsPruned"] == 1 and report["events"] > 0
    assert report["bytesAfter"] < report["bytesBefore"] - 200_000, report

    code, out, err = await daemon.acli("store", "stats", "--json")
    after = json.loads(out)
    assert after["fileBytes"] < before["fileBytes"] - 200_000
    assert after["rows"]["events"] < before["rows"]["events"]

    # The ended goal shows the same outcome, summary and counters (goal/get, and `goal show`).
    got = await rpc(sock, "goal/get", {"goalId": done["goalId"]})
    for key in ("status", "statusReason", "resultSummary", "evidence", "rounds", "tokens", "cost"):
        assert got[key] == ended[key], key
    assert got["resultSummary"] == "all 8 rounds written" and got["rounds"] == 8
    code, out, err = await daemon.acli("goal", "show", done["goalId"])
    assert code == 0 and "completed" in out and "all 8 rounds written" in out, (out, err)

    # The live goal is untouched.
    assert await rpc(sock, "goal/get", {"goalId": live["goalId"]}) == paused
    assert await all_events(sock, live["sessionId"]) == live_events

    # A subscriber resuming below the oldest kept event is told where the kept events begin.
    kept = await all_events(sock, done["sessionId"])
    first = kept[0]["seq"]
    assert first > 1 and kept[-1]["seq"] == last_seq and len(kept) >= 6
    with pytest.raises(RpcError) as refused:
        await rpc(sock, "session/subscribe", {"sessionId": done["sessionId"], "afterSeq": 0})
    assert refused.value.code == -32005 and refused.value.data == {"firstSeq": first}
    assert f"seq {first}" in refused.value.message
    async with await Client.connect(sock) as client:
        ok = await client.call("session/subscribe", {"sessionId": done["sessionId"], "afterSeq": first - 1})
        assert ok["afterSeq"] == first - 1
        note = await asyncio.wait_for(client.next_notification(), 30)
        assert note["params"]["seq"] == first

    # New events of the pruned session continue its numbering. (A message to its ended goal is
    # refused and changes nothing; with ``reopen`` the goal is reopened first.)
    note = {"sessionId": done["sessionId"], "text": "a note", "delivery": "context"}
    with pytest.raises(RpcError) as not_sent:
        await rpc(sock, "session/prompt", note)
    assert not_sent.value.code == -32002 and await all_events(sock, done["sessionId"], last_seq) == []
    await rpc(sock, "session/prompt", {**note, "reopen": True})
    new = await all_events(sock, done["sessionId"], last_seq)
    assert new[0]["seq"] == last_seq + 1
    assert {"goal/changed", "message/queued"} <= {e["type"] for e in new}

    # The offline full VACUUM refuses while the daemon holds the state directory, and changes nothing.
    code, out, err = await daemon.acli("store", "vacuum")
    assert code == 75 and "stop the daemon first" in err


def test_offline_vacuum_runs_once_the_daemon_is_stopped(daemon: Daemon) -> None:
    assert daemon.terminate() == 0
    done = daemon.cli("store", "vacuum")
    assert done.returncode == 0, done.stderr
    assert "auto_vacuum incremental -> incremental" in done.stdout
