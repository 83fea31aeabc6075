"""Crash repair after a real ``kill -9`` in the middle of a turn.

A child process (a real Python interpreter running a script this test writes) opens the store,
starts a turn and parks it at a chosen point: in a tool call that never returns, or in a model
call that never returns. While the turn is parked the child enqueues two more follow-ups, then
prints ``READY``. The parent sends ``SIGKILL``, waits for the process to die and opens the same
store with a new runtime. Repair must close the killed turn ``interrupted``, give the cut-off
tool call the "outcome unknown" result, charge the open reservation in full, and let the next
turn admit the queued follow-ups, each exactly once. A second reopen replays nothing.

Crash repair is part of the store contract: the test runs on a SQLite file and on a PostgreSQL
database (the child opens whichever ``db_path`` names; SQLite's integrity check is SQLite's only).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import storekit
from storekit import Location

from agent import (
    OUTCOME_UNKNOWN,
    Event,
    EventType,
    ModelRegistry,
    Reply,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolRegistry,
    ToolResultBlock,
)

#: The store contract: the test runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.both_stores

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 60.0

CHILD = r'''
"""Start a turn, park it (in a tool or in the model), enqueue two follow-ups, print READY, wait."""

import asyncio
import json
import sys

from pydantic import BaseModel

from agent import (
    FunctionTool, Limits, MessageId, ModelRegistry, Reply, Runtime, ScriptedModel, ToolCall, ToolRegistry,
)


class NoArgs(BaseModel):
    """No arguments."""


async def main(db: str, mode: str) -> None:
    started = asyncio.Event()
    seen: dict[str, str] = {}

    async def block(args: NoArgs, ctx) -> str:
        seen["turn"] = ctx.turn_id
        seen["call"] = ctx.call_id
        started.set()
        await asyncio.Event().wait()  # never returns: the process is killed here
        return "unreachable"

    def parked_model(request):
        started.set()
        return Reply.say("never committed", delay=3600)  # the process is killed during this call

    if mode == "tool":
        model = ScriptedModel([Reply(tool_calls=[ToolCall("block", id="call_block_1")])], name="crashy")
    else:
        model = ScriptedModel(parked_model, name="crashy")
    tool = FunctionTool("block", "blocks until the process dies", NoArgs, block, timeout=3600)
    registry = ModelRegistry()
    registry.add(model)
    registry.default = model.spec
    async with Runtime.open(db, models=registry, tools=lambda row: ToolRegistry([tool])) as rt:
        gid = await rt.create_guard(Limits(max_tokens=1_000_000))
        sid = await rt.create_session(guard_id=gid)
        agent = await rt.agent(sid)
        ids = [MessageId.new() for _ in range(3)]
        await agent.followup("first", message_id=ids[0])
        await asyncio.wait_for(started.wait(), 30)
        await agent.followup("second", message_id=ids[1])
        await agent.followup("third", message_id=ids[2])
        print("READY " + json.dumps({"sid": sid, "gid": gid, "ids": ids, **seen}), flush=True)
        await asyncio.Event().wait()


asyncio.run(main(sys.argv[1], sys.argv[2]))
'''


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _text(path: Path) -> str:
    return path.read_text(errors="replace")


async def _read_ready(proc: asyncio.subprocess.Process, stderr_path: Path) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:
        line = await proc.stdout.readline()
        if not line:
            await proc.wait()
            raise AssertionError(f"child exited ({proc.returncode}) before READY:\n{_text(stderr_path)}")
        if line.startswith(b"READY "):
            info: dict[str, Any] = json.loads(line[len(b"READY ") :])
            return info


def _write_child(tmp_path: Path, mode: str) -> tuple[Path, Path]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return script, tmp_path / f"child-{mode}.stderr"


def _open_for_child(path: Path) -> BinaryIO:
    return open(path, "wb")  # the caller closes it (a with-block)


async def _run_and_kill(tmp_path: Path, db: Location, mode: str) -> dict[str, Any]:
    """Run the child until READY, then ``kill -9`` it and wait for it to die."""
    script, stderr_path = _write_child(tmp_path, mode)
    with _open_for_child(stderr_path) as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            str(db),
            mode,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=_child_env(),
        )
        try:
            info = await asyncio.wait_for(_read_ready(proc, stderr_path), READY_TIMEOUT)
            os.kill(proc.pid, signal.SIGKILL)
            rc = await asyncio.wait_for(proc.wait(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert rc == -signal.SIGKILL
    return info


def _rows(db: Location, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """Rows read through a second, independent connection."""
    conn = storekit.connect(db)
    try:
        rows: list[Any] = conn.execute(sql, params).fetchall()
        return rows
    finally:
        conn.close()


def _integrity(db: Location) -> str:
    """SQLite's integrity check of the file (PostgreSQL has no such check: ``ok``)."""
    if storekit.is_postgres(db):
        return "ok"
    return str(storekit.scalar(db, "PRAGMA integrity_check"))


def _registry(model: ScriptedModel) -> ModelRegistry:
    registry = ModelRegistry()
    registry.add(model)
    registry.default = model.spec
    return registry


def _of(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.type == kind]


def _assert_admitted_once(db: Location, events: list[Event], ids: list[str]) -> None:
    counts = Counter(e.data["messageId"] for e in _of(events, EventType.MESSAGE_ADMITTED))
    assert all(n == 1 for n in counts.values()), counts
    assert set(counts) == set(ids)
    fates = {r["id"]: r["fate"] for r in _rows(db, "SELECT id, fate FROM inbox")}
    assert fates == dict.fromkeys(ids, "admitted")


@pytest.mark.parametrize("mode", ["tool", "model"])
async def test_kill_9_mid_turn_is_repaired_on_reopen(tmp_path: Path, db_path: Location, mode: str) -> None:
    db = db_path
    info = await _run_and_kill(tmp_path, db, mode)
    sid, ids = info["sid"], info["ids"]

    # What the dead process left behind, seen through a second connection before any repair.
    open_turns = _rows(db, "SELECT id FROM turns WHERE end_reason IS NULL")
    assert len(open_turns) == 1
    killed = open_turns[0]["id"]
    if mode == "tool":
        assert info["turn"] == killed
    left = {r["id"]: (r["fate"], r["turn_id"]) for r in _rows(db, "SELECT id, fate, turn_id FROM inbox")}
    assert left == {ids[0]: ("admitted", killed), ids[1]: ("queued", None), ids[2]: ("queued", None)}
    reserved = _rows(db, "SELECT id, reserved_tokens, reserved_cost FROM model_calls WHERE state='reserved'")
    assert len(reserved) == (1 if mode == "model" else 0)

    model = ScriptedModel([Reply.say("answered both")], name="crashy")
    async with Runtime.open(db, models=_registry(model), tools=lambda row: ToolRegistry()) as rt:
        agent = await rt.agent(sid)
        snap = await asyncio.wait_for(agent.when_idle(), 30)
        guard = await rt.guard(info["gid"])
        spent_in_memory = guard.spent_tokens
        events = await rt.store.events_after(sid, 0)
    model.assert_done()

    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[-1].type == EventType.STATUS and events[-1].data["status"] == "idle"
    assert snap.seq == events[-1].seq

    ends = _of(events, EventType.TURN_END)
    assert [(e.data["turnId"], e.data["reason"]) for e in ends][:1] == [(killed, "interrupted")]
    assert len(ends) == 2 and ends[1].data["reason"] == "end_turn"
    new_turn = ends[1].data["turnId"]
    killed_end_seq = ends[0].seq

    # The follow-ups queued while the turn was parked are admitted by the next turn, once each.
    _assert_admitted_once(db, events, ids)
    admitted_by = {e.data["messageId"]: e.data["turnId"] for e in _of(events, EventType.MESSAGE_ADMITTED)}
    assert admitted_by == {ids[0]: killed, ids[1]: new_turn, ids[2]: new_turn}
    prompt = model.calls[0].request.messages
    user_texts = [b.text for m in prompt if m.role == "user" for b in m.content if isinstance(b, TextBlock)]
    assert user_texts == ["first", "second", "third"]

    calls = _rows(db, "SELECT * FROM model_calls ORDER BY started_at, attempt")
    killed_calls = [r for r in calls if r["turn_id"] == killed]
    charged = _of(events, EventType.MODEL_CHARGED)
    if mode == "tool":
        # The tool call cut off by the kill gets the "outcome unknown" result, as an error.
        results = _of(events, EventType.TOOL_RESULT)
        assert len(results) == 1
        result = results[0]
        assert result.data["toolUseId"] == "call_block_1" == info["call"]
        assert result.data["content"] == OUTCOME_UNKNOWN
        assert result.data["isError"] is True
        assert result.data["turnId"] == killed and result.seq < killed_end_seq
        seen = [b for m in prompt if m.role == "tool" for b in m.content if isinstance(b, ToolResultBlock)]
        assert [(b.tool_use_id, b.content, b.is_error) for b in seen] == [("call_block_1", OUTCOME_UNKNOWN, True)]
        # The model call before the tool had settled; nothing was left to charge.
        assert [r["state"] for r in killed_calls] == ["settled"]
        assert charged == []
    else:
        # The model call in flight at the kill: no assistant message, reservation charged in full.
        assert [e for e in _of(events, EventType.ASSISTANT_MESSAGE) if e.data["turnId"] == killed] == []
        assert len(killed_calls) == 1
        row = killed_calls[0]
        assert row["id"] == reserved[0]["id"]
        assert row["state"] == "charged_in_full"
        assert row["error_class"] == "interrupted"
        assert row["cost"] == row["reserved_cost"]
        assert row["reserved_tokens"] > 0
        assert len(charged) == 1
        assert charged[0].data["callIds"] == [row["id"]]
        assert charged[0].data["tokens"] == row["reserved_tokens"]
        assert charged[0].seq < killed_end_seq
    # The guard loaded after the crash counts the charged reservation plus what was settled since.
    expected = sum(
        r["reserved_tokens"]
        if r["state"] == "charged_in_full"
        else r["input_tokens"] + r["output_tokens"] + r["cache_read_tokens"] + r["cache_write_tokens"]
        for r in calls
    )
    assert spent_in_memory == expected
    assert all(r["state"] != "reserved" for r in calls)

    assert _integrity(db) == "ok"

    # Reopening again replays nothing: no turn, no model call, no new event.
    idle_model = ScriptedModel([], name="crashy")
    async with Runtime.open(db, models=_registry(idle_model), tools=lambda row: ToolRegistry()) as rt:
        again = await rt.store.events_after(sid, 0)
        assert rt.live_agents == {}
    assert idle_model.call_count == 0
    assert [(e.seq, e.type) for e in again] == [(e.seq, e.type) for e in events]
    _assert_admitted_once(db, again, ids)
    assert _integrity(db) == "ok"
