"""``goald acp`` driven by the official ACP client (``acp.spawn_agent_process``) as a subprocess.

The bridge runs as ``python -m daemon --config X acp`` with the scripted models of
``tests/acp_models.py`` (``tests/`` is on the child's ``PYTHONPATH``). Every test waits on
protocol messages with a time limit; the only latency is the scripted model's.

What is pinned (invariant 8 and the ACP issue):

* the stop reason comes from the turn that admitted the prompt: ``end_turn``, ``max_tokens``,
  ``max_turn_requests``, ``refusal``; a model error fails the request with a JSON-RPC error that
  carries the model's message;
* ``session/cancel`` mid-turn settles the prompt ``cancelled``, and the cancelled turn's late end
  never settles the next prompt;
* a second prompt while one is in flight is refused with ``invalid_params``;
* every update of a prompt's interval is on the wire before the prompt's response;
* ``/goal`` settles at once, its rounds arrive as updates outside any prompt, and it completes;
  ``session/cancel`` with no prompt in flight interrupts the turn and pauses the goal;
* ``session/load`` in a new process replays the history as updates before its response;
* stdout carries protocol messages only, even when the process and its children print.

The stop-reason table and the slot's bookkeeping are also checked directly, in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import acp
import pytest
from acp import RequestError
from acp.connection import StreamDirection, StreamEvent
from acp.schema import AllowedOutcome, ClientCapabilities, RequestPermissionResponse, TextContentBlock
from acp_models import SLOW_TEXT
from harness import child_env, goald_argv, toml_text

from agent import Event
from daemon.acp import AdmittingTurn, PromptSlot, goal_command, stop_reason

LIMIT = 60.0


# -- the client side -------------------------------------------------------------------------------


@dataclass
class Recorder:
    """An ACP client that records every update, and every wire message in arrival order."""

    updates: list[tuple[str, Any]] = field(default_factory=list)
    #: How ``session/request_permission`` is answered: an option id, or ``None`` for "not implemented".
    answer: str | None = None
    #: Every permission request, as ``(session id, tool call, option ids)``.
    asked: list[tuple[str, Any, list[str]]] = field(default_factory=list)
    #: Incoming messages (responses and notifications), in arrival order.
    wire: list[dict[str, Any]] = field(default_factory=list)
    #: Ids of the requests this client sent, by method.
    sent: dict[str, list[int]] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        self._changed.set()

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any) -> Any:
        self.asked.append((session_id, tool_call, [o.option_id for o in options]))
        self._changed.set()
        if self.answer is None:
            raise RequestError.method_not_found("session/request_permission")
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=self.answer))

    def observe(self, event: StreamEvent) -> None:
        # Called synchronously by the connection for each message, in the order it goes or comes.
        msg = event.message
        if event.direction is StreamDirection.INCOMING:
            self.wire.append(msg)
            self._changed.set()
        elif "method" in msg and "id" in msg:
            self.sent.setdefault(msg["method"], []).append(msg["id"])

    async def wait_for(self, check: Callable[[], Any], limit: float = LIMIT) -> Any:
        """Wait (with a time limit) until ``check()`` returns something truthy; return it."""
        async with asyncio.timeout(limit):
            while True:
                self._changed.clear()
                found = check()
                if found:
                    return found
                await self._changed.wait()

    def of(self, sid: str, kind: str | None = None) -> list[Any]:
        """Updates of one session (of one kind)."""
        return [u for s, u in self.updates if s == sid and (kind is None or u.session_update == kind)]

    def text(self, sid: str, start: int = 0) -> str:
        """Agent text of a session, from update number ``start`` on."""
        return "".join(
            u.content.text for s, u in self.updates[start:] if s == sid and u.session_update == "agent_message_chunk"
        )

    def response_index(self, request_id: int) -> int:
        """Where on the wire the response to ``request_id`` arrived."""
        return next(i for i, m in enumerate(self.wire) if "method" not in m and m.get("id") == request_id)

    def wire_updates(self, sid: str, before: int, after: int = 0) -> list[dict[str, Any]]:
        """``session/update`` params of ``sid`` that arrived at wire positions ``[after, before)``."""
        return [
            m["params"]["update"]
            for m in self.wire[after:before]
            if m.get("method") == "session/update" and m["params"]["sessionId"] == sid
        ]

    def last_request_id(self, method: str) -> int:
        """The id of the last request of ``method`` this client sent."""
        return self.sent[method][-1]


def write_config(tmp_path: Path, **extra: Any) -> Path:
    """A config whose default model is ``acp:chat`` from ``tests/acp_models.py``."""
    config = tmp_path / "goald.toml"
    settings = {
        "state_dir": str(tmp_path / "st"),
        "log_level": "DEBUG",
        "default_model": "acp:chat",
        "shutdown_grace_seconds": 2.0,
        "providers": {"acp": {"kind": "scripted", "script": "acp_models:model"}},
        **extra,
    }
    config.write_text(toml_text(settings))
    return config


@contextlib.asynccontextmanager
async def bridge(tmp_path: Path) -> AsyncIterator[tuple[Any, Recorder, Path]]:
    """``goald acp`` as a subprocess with an initialized official client; yields (conn, recorder, workdir)."""
    config = tmp_path / "goald.toml"
    if not config.exists():
        write_config(tmp_path)
    workdir = tmp_path / "project"
    workdir.mkdir(exist_ok=True)
    rec = Recorder()
    # The bridge logs to stderr; a file, since the SDK would otherwise pipe it and nobody reads it.
    stderr = os.open(tmp_path / "stderr.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        async with acp.spawn_agent_process(
            rec,
            *goald_argv(),
            "--config",
            str(config),
            "acp",
            env=child_env(),
            transport_kwargs={"stderr": stderr, "shutdown_timeout": 15.0},
            observers=[rec.observe],
        ) as (conn, proc):
            async with asyncio.timeout(LIMIT):
                init = await conn.initialize(
                    protocol_version=acp.PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
                )
            assert init.agent_capabilities is not None and init.agent_capabilities.load_session
            yield conn, rec, workdir
    finally:
        os.close(stderr)
    # Closing stdin stopped the bridge cleanly.
    assert proc.returncode == 0, (tmp_path / "stderr.log").read_text()[-4000:]


def text(value: str) -> list[TextContentBlock]:
    """A one-block text prompt."""
    return [TextContentBlock(type="text", text=value)]


async def prompt(conn: Any, sid: str, value: str) -> Any:
    async with asyncio.timeout(LIMIT):
        return await conn.prompt(session_id=sid, prompt=text(value))


# -- stop reasons ----------------------------------------------------------------------------------


async def test_stop_reason_comes_from_the_admitting_turn(tmp_path: Path) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = (await conn.new_session(cwd=str(workdir), mcp_servers=[])).session_id
        await rec.wait_for(lambda: rec.of(sid, "available_commands_update"))
        (commands,) = rec.of(sid, "available_commands_update")
        assert [c.name for c in commands.available_commands] == ["goal"]
        cases = [
            ("hello there", "end_turn", "ack: hello there"),
            ("[max_tokens] please", "max_tokens", "This answer is cut o"),
            ("[refuse] please", "refusal", "I can't help with that."),
        ]
        for value, reason, said in cases:
            start = len(rec.updates)
            response = await prompt(conn, sid, value)
            assert response.stop_reason == reason, value
            # The whole answer was streamed before the response (chunks, not one message).
            assert rec.text(sid, start) == said
        start = len(rec.updates)
        response = await prompt(conn, sid, "[loop] forever")
        assert response.stop_reason == "max_turn_requests"
        calls = [u for _, u in rec.updates[start:] if u.session_update == "tool_call"]
        done = [u for _, u in rec.updates[start:] if u.session_update == "tool_call_update"]
        assert len(calls) == len(done) == 40  # the default step limit; every call got its result
        assert all(u.status == "completed" for u in done)


async def test_a_model_error_fails_the_request_with_its_message(tmp_path: Path) -> None:
    async with bridge(tmp_path) as (conn, _, workdir):
        sid = (await conn.new_session(cwd=str(workdir), mcp_servers=[])).session_id
        with pytest.raises(RequestError) as failed:
            await prompt(conn, sid, "[fail] now")
        assert failed.value.code == -32603
        assert "the provider rejected the request (scripted)" in str(failed.value)
        assert failed.value.data["reason"] == "error" and failed.value.data["errorKind"] == "bad_request"
        # The session goes on: the next prompt is its own interval.
        assert (await prompt(conn, sid, "still there?")).stop_reason == "end_turn"


# -- cancellation and the one in-flight prompt ------------------------------------------------------


async def test_cancel_mid_turn_settles_cancelled_and_the_late_end_never_settles_the_next(tmp_path: Path) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = (await conn.new_session(cwd=str(workdir), mcp_servers=[])).session_id
        start = len(rec.updates)
        slow = asyncio.create_task(prompt(conn, sid, "[slow] talk"))
        await rec.wait_for(lambda: rec.text(sid, start))  # the turn is streaming
        await conn.cancel(session_id=sid)
        response = await slow
        assert response.stop_reason == "cancelled"
        streamed = rec.text(sid, start)
        assert streamed and SLOW_TEXT.startswith(streamed) and streamed != SLOW_TEXT
        # The next prompt is settled by its own turn: its text, its stop reason.
        start = len(rec.updates)
        response = await prompt(conn, sid, "after the cancel")
        assert response.stop_reason == "end_turn"
        assert rec.text(sid, start) == "ack: after the cancel"


async def test_a_second_prompt_in_flight_is_refused(tmp_path: Path) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = (await conn.new_session(cwd=str(workdir), mcp_servers=[])).session_id
        start = len(rec.updates)
        first = asyncio.create_task(prompt(conn, sid, "[slow] first"))
        await rec.wait_for(lambda: rec.text(sid, start))
        with pytest.raises(RequestError) as refused:
            await prompt(conn, sid, "second")
        assert refused.value.code == -32602
        assert "already in flight" in str(refused.value)
        # The refused prompt changed nothing: the first one streams on and ends normally.
        assert (await first).stop_reason == "end_turn"
        assert rec.text(sid, start) == SLOW_TEXT
        assert "second" not in json.dumps([m for m in rec.wire if m.get("method") == "session/update"])
        # The slot is free again.
        assert (await prompt(conn, sid, "third")).stop_reason == "end_turn"


async def test_every_update_arrives_before_the_prompts_response(tmp_path: Path) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = (await conn.new_session(cwd=str(workdir), mcp_servers=[])).session_id
        before = len(rec.wire)
        assert (await prompt(conn, sid, "[tool] write")).stop_reason == "end_turn"
        at = rec.response_index(rec.last_request_id("session/prompt"))
        updates = rec.wire_updates(sid, before=at, after=before)
        kinds = [u["sessionUpdate"] for u in updates]
        assert "tool_call" in kinds and "tool_call_update" in kinds
        (result,) = [u for u in updates if u["sessionUpdate"] == "tool_call_update"]
        assert result["status"] == "completed"
        said = "".join(u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk")
        assert said == "Writing a note. Wrote note.txt."
        # Nothing of that interval came after the response.
        assert kinds.index("tool_call") < kinds.index("tool_call_update")
        assert not [m for m in rec.wire[at:] if m.get("method") == "session/update"]
        assert (workdir / "note.txt").read_text() == "hi\n"


# -- goals -----------------------------------------------------------------------------------------


def plan_head(rec: Recorder, sid: str) -> str:
    plans = rec.of(sid, "plan")
    return plans[-1].entries[0].content if plans else ""


async def test_goal_settles_at_once_and_its_rounds_stream_as_updates(tmp_path: Path) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = (await conn.new_session(cwd=str(workdir), mcp_servers=[])).session_id
        start = len(rec.updates)
        response = await prompt(conn, sid, "/goal Write two rounds [rounds=2] [delay=0.4]")
        assert response.stop_reason == "end_turn"
        at = rec.response_index(rec.last_request_id("session/prompt"))
        assert rec.text(sid, start).startswith("Goal goal_")
        # Settled as soon as the goal was durable: its plan is out, none of its work is.
        head = rec.wire_updates(sid, before=at)
        assert any(u["sessionUpdate"] == "plan" for u in head)
        assert not [u for u in head if u["sessionUpdate"] == "tool_call"]
        await rec.wait_for(lambda: "(completed" in plan_head(rec, sid))
        after = rec.wire_updates(sid, before=len(rec.wire), after=at)
        titles = [u.get("title") for u in after if u["sessionUpdate"] == "tool_call"]
        assert "write_file round1.txt" in titles and "write_file round2.txt" in titles
        assert "goal_complete" in titles
        entries = [e.content for e in rec.of(sid, "plan")[-1].entries]
        assert "Round 1" in entries and "Round 2" in entries
        assert (workdir / "round1.txt").exists() and (workdir / "round2.txt").exists()
        start = len(rec.updates)
        assert (await prompt(conn, sid, "/goal status")).stop_reason == "end_turn"
        assert " completed " in rec.text(sid, start)


async def test_cancel_without_a_prompt_interrupts_the_turn_and_pauses_the_goal(tmp_path: Path) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = (await conn.new_session(cwd=str(workdir), mcp_servers=[])).session_id
        assert (await prompt(conn, sid, "/goal Keep going [rounds=9] [delay=0.3]")).stop_reason == "end_turn"
        await rec.wait_for(lambda: rec.of(sid, "tool_call"))  # round 1 is under way
        await conn.cancel(session_id=sid)
        await rec.wait_for(lambda: "(paused" in plan_head(rec, sid))
        start = len(rec.updates)
        assert (await prompt(conn, sid, "/goal status")).stop_reason == "end_turn"
        assert " paused " in rec.text(sid, start)
        start = len(rec.updates)
        await prompt(conn, sid, "/goal resume")
        assert "is active" in rec.text(sid, start)
        await rec.wait_for(lambda: plan_head(rec, sid).endswith("[delay=0.3]"))
        start = len(rec.updates)
        await prompt(conn, sid, "/goal cancel")
        assert "is cancelled" in rec.text(sid, start)
        await rec.wait_for(lambda: "(cancelled" in plan_head(rec, sid))
        start = len(rec.updates)
        await prompt(conn, sid, "/goal Another one")
        assert rec.text(sid, start).startswith("Goal goal_")  # the session takes a new goal


# -- load ------------------------------------------------------------------------------------------


async def test_load_replays_history_as_updates_in_a_new_process(tmp_path: Path) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = (await conn.new_session(cwd=str(workdir), mcp_servers=[])).session_id
        assert (await prompt(conn, sid, "[tool] first")).stop_reason == "end_turn"
        assert (await prompt(conn, sid, "second")).stop_reason == "end_turn"
    async with bridge(tmp_path) as (conn, rec, workdir):
        with pytest.raises(RequestError) as unknown:
            await conn.load_session(cwd=str(workdir), session_id="ses_01M8XDSMWZFPC6QCQPYRGSN316", mcp_servers=[])
        assert unknown.value.code == -32602
        before = len(rec.wire)
        async with asyncio.timeout(LIMIT):
            await conn.load_session(cwd=str(workdir), session_id=sid, mcp_servers=[])
        at = rec.response_index(rec.last_request_id("session/load"))
        replay = rec.wire_updates(sid, before=at, after=before)
        flat = [
            (u["sessionUpdate"], u.get("content", {}).get("text") if isinstance(u.get("content"), dict) else None)
            for u in replay
        ]
        assert flat == [
            ("user_message_chunk", "[tool] first"),
            ("agent_message_chunk", "Writing a note. "),
            ("tool_call", None),
            ("tool_call_update", None),
            ("agent_message_chunk", "Wrote note.txt."),
            ("user_message_chunk", "second"),
            ("agent_message_chunk", "ack: second"),
        ]
        # The loaded session is live: a prompt works and streams.
        start = len(rec.updates)
        assert (await prompt(conn, sid, "third")).stop_reason == "end_turn"
        assert rec.text(sid, start) == "ack: third"


# -- permissions -----------------------------------------------------------------------------------


async def test_calls_outside_the_policy_ask_the_editor_only_while_a_prompt_waits(tmp_path: Path) -> None:
    write_config(tmp_path, tool_policy={"allow": ["read_file", "list_dir"]})
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = (await conn.new_session(cwd=str(workdir), mcp_servers=[])).session_id
        # Approved: the call runs, and the editor heard of it before it was asked.
        rec.answer = "allow_once"
        assert (await prompt(conn, sid, "[tool] write")).stop_reason == "end_turn"
        ((asked_sid, call, options),) = rec.asked
        assert asked_sid == sid and call.title == "write_file note.txt" and call.status == "pending"
        assert {"allow_once", "allow_always", "reject_once"} <= set(options)
        asked_at = next(i for i, m in enumerate(rec.wire) if m.get("method") == "session/request_permission")
        announced = [u for u in rec.wire_updates(sid, before=asked_at) if u["sessionUpdate"] == "tool_call"]
        assert [u["toolCallId"] for u in announced] == [call.tool_call_id]
        assert (workdir / "note.txt").read_text() == "hi\n"
        (done,) = [u for u in rec.of(sid, "tool_call_update") if u.tool_call_id == call.tool_call_id]
        assert done.status == "completed"
        # Refused: the call is denied like the policy denies it.
        (workdir / "note.txt").unlink()
        rec.answer = "reject_once"
        assert (await prompt(conn, sid, "[tool] again")).stop_reason == "end_turn"
        assert len(rec.asked) == 2
        refused = rec.of(sid, "tool_call_update")[-1]
        assert refused.status == "failed" and "denied by policy" in refused.content[0].content.text
        assert not (workdir / "note.txt").exists()
        # A goal's round outside any prompt is unattended: denied by the policy, nobody is asked.
        rec.answer = "allow_once"
        await prompt(conn, sid, "/goal One round [rounds=1]")
        await rec.wait_for(lambda: "(completed" in plan_head(rec, sid))
        assert len(rec.asked) == 2
        (write,) = [u for u in rec.of(sid, "tool_call") if u.title == "write_file round1.txt"]
        (denied,) = [u for u in rec.of(sid, "tool_call_update") if u.tool_call_id == write.tool_call_id]
        assert denied.status == "failed" and "denied by policy" in denied.content[0].content.text
        assert not (workdir / "round1.txt").exists()


# -- stdout purity ---------------------------------------------------------------------------------


async def test_stdout_carries_protocol_messages_only(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    workdir = tmp_path / "project"
    workdir.mkdir()
    err_path = tmp_path / "stderr.log"
    stderr = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = await asyncio.create_subprocess_exec(
            *goald_argv(),
            "--config",
            str(config),
            "acp",
            env=child_env(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
    finally:
        os.close(stderr)
    assert proc.stdin is not None and proc.stdout is not None

    async def call(rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n")
        await proc.stdin.drain()
        while True:
            line = await proc.stdout.readline()
            message = json.loads(line)  # every line is JSON ...
            assert message["jsonrpc"] == "2.0"  # ... and JSON-RPC
            if message.get("id") == rid and "method" not in message:
                return message

    async with asyncio.timeout(LIMIT):
        await call(0, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        sid = (await call(1, "session/new", {"cwd": str(workdir), "mcpServers": []}))["result"]["sessionId"]
        answer = await call(2, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "[print]"}]})
        assert answer["result"]["stopReason"] == "end_turn"
        proc.stdin.close()
        rest, _ = await proc.communicate()
    for line in rest.splitlines():
        assert json.loads(line)["jsonrpc"] == "2.0"
    assert proc.returncode == 0
    # What was printed went to stderr, the process's own and its child's alike.
    err = err_path.read_text()
    assert "STRAY-PRINT" in err and "STRAY-CHILD" in err


# -- in-process: the stop-reason table and the slot ------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "finish", "expected"),
    [
        ("end_turn", "end_turn", "end_turn"),
        ("end_turn", "refusal", "refusal"),
        ("max_tokens", "max_tokens", "max_tokens"),
        ("budget", None, "max_tokens"),
        ("max_steps", None, "max_turn_requests"),
        ("cancelled", None, "cancelled"),
    ],
)
def test_stop_reason_table(reason: str, finish: str | None, expected: str) -> None:
    turn = AdmittingTurn(turn_id="turn_1", reason=reason, model_finish=finish)
    assert stop_reason(turn, cancelled=False) == expected
    assert stop_reason(turn, cancelled=True) == "cancelled"


@pytest.mark.parametrize("reason", ["error", "interrupted"])
def test_failed_turns_raise_a_json_rpc_error_with_the_message(reason: str) -> None:
    turn = AdmittingTurn(turn_id="turn_1", reason=reason, error="boom: the provider is down")
    with pytest.raises(RequestError) as failed:
        stop_reason(turn, cancelled=False)
    assert "boom: the provider is down" in str(failed.value) and failed.value.data["reason"] == reason
    assert stop_reason(turn, cancelled=True) == "cancelled"
    assert stop_reason(None, cancelled=False) == "cancelled"  # never admitted: turnless


def _event(seq: int, kind: str, **data: Any) -> Event:
    return Event(session_id="ses_x", seq=seq, type=kind, data=data, at="2026-01-01T00:00:00+00:00")


async def test_a_slot_reads_only_its_own_admitting_turn_and_settles_at_the_next_idle() -> None:
    slot = PromptSlot("msg_new")
    events = [
        # The previous (cancelled) prompt's turn ends late, then the session idles before our message.
        _event(10, "turn/end", turnId="turn_old", reason="cancelled"),
        _event(11, "status", status="idle"),
        _event(12, "message/queued", messageId="msg_new"),
        _event(13, "status", status="running"),
        _event(14, "turn/start", turnId="turn_new"),
        _event(15, "message/admitted", messageId="msg_new", turnId="turn_new"),
        _event(16, "turn/end", turnId="turn_new", reason="max_steps"),
    ]
    for event in events:
        slot.observe(event)
    assert not slot.settled.done()
    slot.observe(_event(17, "status", status="idle"))
    assert slot.settled.result() == 17
    slot.observe(_event(18, "turn/end", turnId="turn_new", reason="error"))  # after settling: ignored
    assert slot.outcome() == "max_turn_requests"


async def test_a_message_cancelled_while_queued_settles_cancelled() -> None:
    slot = PromptSlot("msg_q")
    for event in [
        _event(3, "message/queued", messageId="msg_q"),
        _event(4, "message/cancelled", messageId="msg_q", reason="cancelled"),
        _event(5, "turn/end", turnId="turn_other", reason="end_turn"),
        _event(6, "status", status="idle"),
    ]:
        slot.observe(event)
    assert slot.settled.done() and slot.outcome() == "cancelled"


def test_goal_command_parsing() -> None:
    assert goal_command("/goal Ship it") == "Ship it"
    assert goal_command("  /goal\n  multi\nline ") == "multi\nline"
    assert goal_command("/goal") == ""
    assert goal_command("/goalie") is None
    assert goal_command("please /goal x") is None
