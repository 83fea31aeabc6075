"""The typed event vocabulary and the one interval watcher.

Pinned here:

* every kind the runtime and the goals write has a payload model discriminated by its ``Literal``
  type, and every event a real session writes reads as its model (not the fallback);
* the wire format does not change: ``data`` is stored and dumped exactly as written, and the
  typed view adds nothing to an event's dump;
* old rows still load: an unknown kind, or a stored object that no longer fits its model, reads as
  :class:`OtherPayload` carrying the raw object; building an event never validates its payload,
  and the payload is parsed once;
* :class:`IntervalWatcher` opens at its own message's receipt only, records the admitting turn or
  the cancellation, ignores idles before the receipt and other sessions' events, and closes at the
  first idle after the receipt; :func:`watch_interval` does so on a real session;
* :class:`TaskSet` keeps its tasks until done and stops them; :func:`redact` is the one redactor.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agent import (
    AgentStatus,
    AssistantMessage,
    EndReason,
    Event,
    EventType,
    IntervalWatcher,
    MessageAdmitted,
    MessageQueued,
    OtherPayload,
    Reply,
    RunFacts,
    ScriptedModel,
    StatusChanged,
    TaskSet,
    ToolResult,
    TurnEnded,
    parse_payload,
    register_payloads,
    watch_interval,
)
from agent.payloads import kind_of, registered_kinds
from agent.redact import MARK, redact
from goals import (
    GOAL_BLOCKED,
    GOAL_CHANGED,
    GOAL_CLAIM,
    GOAL_COUNTED,
    GOAL_EDITED,
    GOAL_FINGERPRINT,
    GOAL_PAYLOADS,
    GOAL_PROGRESS,
    GOAL_VERIFIED,
    GoalChanged,
)
from goals.store import GOAL_ANSWERED, GOAL_QUESTION

LIMIT = 10.0


def _event(seq: int, kind: str, session_id: str = "ses_x", **data: Any) -> Event:
    return Event(session_id=session_id, seq=seq, type=kind, data=data, at="2026-01-01T00:00:00+00:00")


def test_every_kind_has_a_model_discriminated_by_its_literal_type() -> None:
    kinds = registered_kinds()
    assert {str(k) for k in EventType} <= kinds
    assert {GOAL_CHANGED, GOAL_PROGRESS, GOAL_CLAIM, GOAL_BLOCKED, GOAL_VERIFIED} <= kinds
    goal_kinds = {
        GOAL_CHANGED,
        GOAL_PROGRESS,
        GOAL_CLAIM,
        GOAL_BLOCKED,
        GOAL_VERIFIED,
        GOAL_EDITED,
        GOAL_COUNTED,
        GOAL_FINGERPRINT,
        GOAL_QUESTION,
        GOAL_ANSWERED,
    }
    assert {kind_of(m) for m in GOAL_PAYLOADS} == goal_kinds
    # A kind reads as one model: registering another for it is refused, the same one again is not.
    register_payloads(GoalChanged)
    with pytest.raises(ValueError, match="goal/changed"):
        register_payloads(type("Other", (GoalChanged,), {}))


async def test_a_real_session_writes_only_typed_payloads_and_its_data_is_stored_as_written(
    open_runtime: Any, db_path: Path
) -> None:
    model = ScriptedModel([Reply.call("noop", text="calling"), Reply.say("all done")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.enqueue("go")
        async with asyncio.timeout(LIMIT):
            await agent.when_idle()
        events = await rt.store.events_after(sid, 0, limit=1000)
    kinds = {e.type for e in events}
    assert {"message/queued", "message/admitted", "turn/start", "turn/end", "assistant/message", "tool/result"} <= kinds
    for event in events:
        assert not isinstance(event.payload, OtherPayload), (event.type, event.data)
        assert event.payload.type == event.type
        assert "payload" not in event.model_dump()
    rows = sqlite3.connect(db_path).execute("SELECT seq, data FROM events WHERE session_id=? ORDER BY seq", (sid,))
    assert [(seq, json.loads(data)) for seq, data in rows] == [(e.seq, e.data) for e in events]
    answers = [e.payload for e in events if isinstance(e.payload, AssistantMessage)]
    assert [a.text for a in answers] == ["calling", "all done"]
    assert all(a.usage is not None for a in answers)
    end = [e.payload for e in events if isinstance(e.payload, TurnEnded)]
    assert [(t.reason, t.steps) for t in end] == [(EndReason.END_TURN, 2)]
    result = next(e.payload for e in events if isinstance(e.payload, ToolResult))
    assert (result.name, result.content, result.is_error) == ("noop", "ok", False)


def test_stored_keys_read_as_snake_case_and_the_data_is_untouched() -> None:
    data = {"turnId": "turn_1", "reason": "error", "steps": 3, "errorKind": "server", "error": "boom", "newKey": 1}
    event = _event(5, "turn/end", **data)
    ended = event.payload
    assert isinstance(ended, TurnEnded)
    assert (ended.turn_id, ended.reason, ended.error_kind, ended.error) == ("turn_1", EndReason.ERROR, "server", "boom")
    assert event.data == data  # a newer writer's key is ignored by the view and kept in the data
    assert json.loads(event.model_dump_json())["data"] == data
    changed = _event(6, GOAL_CHANGED, goalId="goal_1", status="paused", **{"from": "active"}).payload
    assert isinstance(changed, GoalChanged) and changed.from_ is not None and changed.from_.value == "active"


def test_old_and_unknown_rows_load_as_the_generic_payload() -> None:
    unknown = _event(1, "plugin/thing", x=1)
    assert unknown.payload == OtherPayload(type="plugin/thing", data={"x": 1})
    # A known kind whose stored object does not fit (an older writer): built without complaint,
    # read as the fallback with the raw object.
    old = _event(2, "status", state="idle")
    assert isinstance(old.payload, OtherPayload) and old.payload.data == {"state": "idle"}
    assert parse_payload("turn/end", {"turnId": "t", "reason": "exploded"}) == OtherPayload(
        type="turn/end", data={"turnId": "t", "reason": "exploded"}
    )


def test_the_payload_is_parsed_once_and_only_when_read() -> None:
    event = _event(3, "status", status="idle")
    assert "payload" not in event.__dict__  # building the event parsed nothing
    first = event.payload
    assert first is event.payload
    assert isinstance(first, StatusChanged) and first.status is AgentStatus.IDLE
    assert event == _event(3, "status", status="idle")  # the cache is not part of the fact


# -- the interval watcher ----------------------------------------------------------------------------


def test_the_watcher_opens_at_its_receipt_and_closes_at_the_first_idle_after_it() -> None:
    watch = IntervalWatcher("msg_b")
    script = [
        _event(10, "message/queued", messageId="msg_a"),
        _event(11, "status", status="idle"),  # before the receipt: stale
        _event(12, "message/queued", messageId="msg_b"),
        _event(12, "status", status="idle", session_id="ses_other"),  # another session
        _event(13, "status", status="running"),
        _event(14, "turn/start", turnId="turn_1"),
        _event(15, "message/admitted", messageId="msg_a", turnId="turn_1"),
        _event(16, "message/admitted", messageId="msg_b", turnId="turn_1"),
    ]
    assert [watch.observe(e) for e in script] == [False] * len(script)
    assert (watch.receipt_seq, watch.admitted_by, watch.cancelled, watch.session_id) == (12, "turn_1", False, "ses_x")
    assert watch.observe(_event(17, "turn/end", turnId="turn_1", reason="end_turn")) is False
    assert watch.observe(_event(18, "status", status="idle")) is True
    assert watch.idle_seq == 18
    assert watch.observe(_event(19, "status", status="idle")) is True and watch.idle_seq == 18


def test_the_watcher_records_a_cancelled_message_and_binds_to_its_session() -> None:
    watch = IntervalWatcher("msg_q", "ses_x")
    watch.observe(_event(3, "message/queued", messageId="msg_q", session_id="ses_y"))  # not its session
    assert not watch.received
    for event in [
        _event(3, "message/queued", messageId="msg_q"),
        _event(4, "message/cancelled", messageId="msg_q", reason="cancelled"),
    ]:
        watch.observe(event)
    assert watch.cancelled and watch.admitted_by is None
    assert watch.observe(_event(5, "status", status="idle"))


def test_run_facts_take_the_last_committed_text_and_the_last_turn_end() -> None:
    facts = RunFacts()
    for event in [
        _event(1, "assistant/message", content=[{"type": "text", "text": "first"}]),
        _event(2, "turn/end", turnId="t1", reason="max_steps"),
        _event(3, "assistant/message", content=[{"type": "text", "text": "partial"}], interrupted=True),
        _event(4, "assistant/message", content=[{"type": "text", "text": "  "}]),
        _event(5, "turn/end", turnId="t2", reason="cancelled"),
    ]:
        facts.observe(event)
    assert facts.final_response == "first"
    assert facts.last_end is not None and facts.last_end.reason is EndReason.CANCELLED


async def test_watch_interval_follows_a_real_session_to_idle(open_runtime: Any) -> None:
    model = ScriptedModel([Reply.call("noop"), Reply.say("answer")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        mid = await agent.enqueue("go")
        queued = next(
            e
            for e in await rt.store.events_after(sid, 0, limit=100)
            if isinstance(e.payload, MessageQueued) and e.payload.message_id == mid
        )
        async with asyncio.timeout(LIMIT):
            run = await watch_interval(rt.store, sid, mid, queued.seq)
        admitted = [
            e.payload for e in await rt.store.events_after(sid, 0, limit=100) if isinstance(e.payload, MessageAdmitted)
        ]
    assert run.watch.receipt_seq == queued.seq
    assert run.watch.admitted_by == admitted[0].turn_id
    assert run.watch.idle_seq is not None and run.watch.idle_seq > queued.seq
    assert run.facts.final_response == "answer"
    assert run.facts.last_end is not None and run.facts.last_end.reason is EndReason.END_TURN


# -- background tasks and redaction ----------------------------------------------------------------


async def test_a_task_set_keeps_its_tasks_until_done_and_stops_the_rest() -> None:
    tasks = TaskSet()
    release = asyncio.Event()
    quick = tasks.spawn(release.wait())
    stuck = tasks.spawn(asyncio.Event().wait())
    assert len(tasks) == 2 and tasks.busy()
    release.set()
    await quick
    assert len(tasks) == 1 and list(tasks) == [stuck]
    await tasks.drain(grace=0.05)
    assert stuck.cancelled() and len(tasks) == 0 and not tasks.busy()
    never = tasks.spawn(asyncio.Event().wait())
    await tasks.cancel()
    assert never.cancelled() and len(tasks) == 0


def test_one_redactor_for_keys_and_tool_secrets() -> None:
    assert redact("key sk-abcdef and sk-abcdef", "sk-abcdef") == f"key {MARK} and {MARK}"
    assert redact("text", None) == "text"
    assert redact("a 123 b", "123") == "a 123 b"  # shorter than the minimum: not a secret
    assert redact("one1 two2", "one1", None, "two2") == f"{MARK} {MARK}"
