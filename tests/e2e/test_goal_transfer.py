"""``goald goal export`` / ``goald goal import`` between two real daemons on two state directories.

A goal completes on daemon A (the priced ``test:worker`` model, so its model calls and spend are
real rows); its export imported into daemon B shows there the same goal (status, counters, summary)
and every event of its session, in order with the same sequence numbers. Importing it again, a file
that is not an export, a newer export version, a live goal's export and a document whose rows do
not belong together are each refused with the reason, and B's store is unchanged by every refusal.
"""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

from harness import TEST_MODELS, Daemon, all_events, rpc, wait_goal


def table_counts(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: conn.execute(f'SELECT COUNT(*) FROM "{n}"').fetchone()[0] for n in names}
    finally:
        conn.close()


def comparable(goal: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "status", "statusReason", "rounds", "tokens", "cost", "resultSummary", "sessionId", "objective")
    return {k: goal.get(k) for k in keys}


async def test_a_completed_goal_and_its_events_move_to_another_daemon(tmp_path: Path) -> None:
    a = Daemon(tmp_path / "a", config=TEST_MODELS)
    b = Daemon(tmp_path / "b", config=TEST_MODELS)
    try:
        a.start()
        b.start()
        created = await a.acli_json("goal", "add", "move me [rounds=2 delay=0.01]", "--model", "test:worker")
        goal_id = created["goalId"]
        await wait_goal(a.socket_path, goal_id, {"completed"})
        source = await rpc(a.socket_path, "goal/get", {"goalId": goal_id})
        source_events = await all_events(a.socket_path, source["sessionId"])

        # A live goal does not move.
        live = await a.acli_json("goal", "add", "stay [rounds=1 hold_round=1 hold=100]", "--model", "test:worker")
        code, _, err = await a.acli("goal", "export", live["goalId"])
        assert code != 0 and "only an ended goal moves" in err

        exported = tmp_path / "goal.json"
        code, _, err = await a.acli("goal", "export", goal_id, "-o", str(exported))
        assert code == 0, err
        assert exported.stat().st_mode & 0o077 == 0
        doc = json.loads(exported.read_text())
        assert doc["format"] == "goald-goal" and doc["version"] == 1
        # -o never overwrites.
        code, _, err = await a.acli("goal", "export", goal_id, "-o", str(exported))
        assert code != 0 and "exists" in err

        before = table_counts(b.state_dir / "goald.db")
        done = await b.acli_json("goal", "import", str(exported))
        assert done["goalId"] == goal_id and done["status"] == "completed"
        moved = await rpc(b.socket_path, "goal/get", {"goalId": goal_id})
        assert comparable(moved) == comparable(source)
        assert source["id"] == goal_id and source["rounds"] == 2 and source["tokens"] > 0 and source["cost"] > 0
        moved_events = await all_events(b.socket_path, moved["sessionId"])
        assert [(e["seq"], e["type"], e["data"]) for e in moved_events] == [
            (e["seq"], e["type"], e["data"]) for e in source_events
        ]
        listed = (await rpc(b.socket_path, "goal/list", {}))["goals"]
        assert [g["id"] for g in listed] == [goal_id]
        after = table_counts(b.state_dir / "goald.db")
        assert after["goals"] == before["goals"] + 1
        assert after["model_calls"] > before["model_calls"]

        # Every refusal names its reason and changes nothing.
        def refused(text: str) -> Path:
            path = tmp_path / f"bad-{len(list(tmp_path.glob('bad-*')))}.json"
            path.write_text(text)
            return path

        newer = copy.deepcopy(doc)
        newer["version"] = 99
        stranger = copy.deepcopy(doc)
        stranger["goal"]["id"] = "goal_01JZZZZZZZZZZZZZZZZZZZZZZZ"
        stranger["tables"]["sessions"][0]["id"] = "ses_01JZZZZZZZZZZZZZZZZZZZZZZZ"
        unknown = copy.deepcopy(doc)
        unknown["tables"]["events"][0]["colour"] = "blue"
        cases = {
            "already exists": exported,
            "not JSON": refused("{not json"),
            "format is": refused(json.dumps({"format": "something else"})),
            "newer than this goald reads": refused(json.dumps(newer)),
            "not among the document's sessions": refused(json.dumps(stranger)),
            "does not know": refused(json.dumps(unknown)),
        }
        for reason, path in cases.items():
            code, _, err = await b.acli("goal", "import", str(path))
            assert code != 0, reason
            assert reason in err, (reason, err)
            assert "Traceback" not in err
            assert table_counts(b.state_dir / "goald.db") == after, reason
        assert a.terminate() == 0
        assert b.terminate() == 0
    finally:
        a.close()
        b.close()
