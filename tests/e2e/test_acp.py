"""``goald acp`` driven by the official ACP client (``acp.spawn_agent_process``) as a subprocess.

The bridge runs as ``python -m daemon --config X acp`` with the scripted models of
``tests/acp_models.py`` (``tests/`` is on the child's ``PYTHONPATH``). Every test waits on
protocol messages, or on events from the control socket of the daemon embedded in the bridge,
with a time limit; the only latency is the scripted model's. A model call that must surely be in
flight waits at a :class:`Gate` (a unix socket the test opens) for as long as the test needs.

What is pinned (invariant 8 and the ACP issue):

* the stop reason comes from the turn that admitted the prompt: ``end_turn``, ``max_tokens``,
  ``max_turn_requests``, ``refusal``; a spend-budget refusal → ``max_tokens``; a model error, and
  a turn interrupted by the bridge shutting down, fail the request with a JSON-RPC error that
  carries the turn's message; a message cancelled while queued (never admitted) → ``cancelled``,
  even though the interval's only turn ended ``end_turn``;
* ``session/cancel`` mid-turn settles the prompt ``cancelled``, and the cancelled turn's late end
  never settles the next prompt;
* a second prompt while one is in flight is refused with ``invalid_params``, also when both
  requests are on the wire before either is answered (exactly one is refused);
* every update of a prompt's interval is on the wire before the prompt's response;
* ``/goal`` settles at once, its rounds arrive as updates outside any prompt, and it completes;
  ``/goal pause`` lets the running round finish and starts nothing new, ``/goal resume`` carries
  on to completion, ``/goal cancel`` interrupts the running round; ``session/cancel`` with no
  prompt in flight interrupts the turn (it ends ``cancelled``) and pauses the goal;
* ``session/load`` in a new process replays the history as updates before its response;
* stdout carries protocol messages only, even when the process and its children print.

The stop-reason table and the slot's bookkeeping are also checked directly, in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
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
from harness import all_events, child_env, goald_argv, toml_text

from agent import Event
from daemon.acp import AdmittingTurn, PromptSlot, goal_command, stop_reason
from daemon.client import Connection as ControlClient

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
    #: How many incoming messages had arrived when each request (by id) went out.
    sent_at: dict[int, int] = field(default_factory=dict)
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
            self.sent_at[msg["id"]] = len(self.wire)

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
async def bridge_process(tmp_path: Path) -> AsyncIterator[tuple[Any, Recorder, Path, Any]]:
    """``goald acp`` as a subprocess with an initialized official client; yields (conn, recorder,
    workdir, process). The process must have exited 0 once the client closed its stdin."""
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
            # The SDK's wait for the bridge to exit after stdin closes, before it sends SIGTERM: a
            # guard, as long as the other limits (a starved machine once took 15 s to stop it).
            transport_kwargs={"stderr": stderr, "shutdown_timeout": LIMIT},
            observers=[rec.observe],
        ) as (conn, proc):
            async with asyncio.timeout(LIMIT):
                init = await conn.initialize(
                    protocol_version=acp.PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
                )
            assert init.agent_capabilities is not None and init.agent_capabilities.load_session
            yield conn, rec, workdir, proc
    finally:
        os.close(stderr)
    # Closing stdin (or SIGTERM) stopped the bridge cleanly.
    assert proc.returncode == 0, (tmp_path / "stderr.log").read_text()[-4000:]


@contextlib.asynccontextmanager
async def bridge(tmp_path: Path) -> AsyncIterator[tuple[Any, Recorder, Path]]:
    """Like :func:`bridge_process`; yields (conn, recorder, workdir)."""
    async with bridge_process(tmp_path) as (conn, rec, workdir, _):
        yield conn, rec, workdir


# -- the daemon side: the bridge's control socket, and a gate for model calls ----------------------


def control_socket(tmp_path: Path) -> Path:
    """The control socket of the daemon embedded in the bridge (``<state_dir>/acp/goald.sock``)."""
    return tmp_path / "st" / "acp" / "goald.sock"


@dataclass
class Watch:
    """Every event of one session, as a client of the bridge's control socket receives them."""

    client: ControlClient
    events: list[dict[str, Any]] = field(default_factory=list)

    async def until(self, check: Callable[[list[dict[str, Any]]], Any], limit: float = LIMIT) -> Any:
        """Wait (with a time limit) until ``check(events)`` returns something truthy; return it."""
        async with asyncio.timeout(limit):
            while not (found := check(self.events)):
                note = await self.client.next_notification()
                if note.get("method") == "session.event":
                    self.events.append(note["params"]["event"])
            return found


@contextlib.asynccontextmanager
async def watch(tmp_path: Path, sid: str) -> AsyncIterator[Watch]:
    """Subscribe to ``sid`` from its first event on the bridge's control socket."""
    client = await ControlClient.connect(control_socket(tmp_path))
    try:
        await client.call("session/subscribe", {"sessionId": sid, "afterSeq": 0})
        yield Watch(client)
    finally:
        await client.close()


def first(kind: str, **data: Any) -> Callable[[list[dict[str, Any]]], dict[str, Any] | None]:
    """A check for :meth:`Watch.until`: the first event of ``kind`` whose data has ``data``."""

    def check(events: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next((e for e in events if e["type"] == kind and data.items() <= e["data"].items()), None)

    return check


def acp_queued(nth: int = 1) -> Callable[[list[dict[str, Any]]], dict[str, Any] | None]:
    """A check for :meth:`Watch.until`: the ``nth`` message the bridge queued (source ref ``acp``)."""

    def check(events: list[dict[str, Any]]) -> dict[str, Any] | None:
        mine = [e for e in events if e["type"] == "message/queued" and e["data"]["source"].get("ref") == "acp"]
        return mine[nth - 1] if len(mine) >= nth else None

    return check


async def admitting_turn_end(w: Watch, message_id: str) -> dict[str, Any]:
    """The ``turn/end`` of the turn that admitted ``message_id``."""
    admitted = await w.until(first("message/admitted", messageId=message_id))
    end: dict[str, Any] = await w.until(first("turn/end", turnId=admitted["data"]["turnId"]))
    return end


class Gate:
    """A unix socket that ``[gate PATH]`` model calls (``tests/acp_models.py``) connect to and wait
    at until :meth:`release`: a call in flight for exactly as long as the test says."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="gate-", dir="/tmp"))
        self.path = self._dir / "g.sock"
        #: A model call is waiting at the gate.
        self.entered = asyncio.Event()
        self._open = asyncio.Event()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    def __str__(self) -> str:
        return f"[gate {self.path}]"

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._on_call, path=str(self.path))

    async def _on_call(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.entered.set()
        try:
            await self._open.wait()
            writer.write(b"x")
            await writer.drain()
        except ConnectionError:
            pass  # the call was interrupted and hung up
        finally:
            writer.close()

    async def wait_entered(self) -> None:
        """Wait (with a time limit) until a model call waits at the gate."""
        async with asyncio.timeout(LIMIT):
            await self.entered.wait()

    def release(self) -> None:
        """Open the gate: every waiting call (and every later one) goes on."""
        self._open.set()

    async def close(self) -> None:
        self.release()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=LIMIT)
        shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture
async def gate() -> AsyncIterator[Gate]:
    g = Gate()
    await g.start()
    try:
        yield g
    finally:
        await g.close()


def text(value: str) -> list[TextContentBlock]:
    """A one-block text prompt."""
    return [TextContentBlock(type="text", text=value)]


async def _new(conn: Any, workdir: Path) -> str:
    """A new ACP session working in ``workdir``."""
    async with asyncio.timeout(LIMIT):
        return str((await conn.new_session(cwd=str(workdir), mcp_servers=[])).session_id)


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


async def test_a_budget_refusal_settles_max_tokens(tmp_path: Path) -> None:
    # The control protocol puts goals only in the configured work-directory roots (strictly inside one).
    write_config(tmp_path, workdir_roots=[str(tmp_path)])
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = await _new(conn, workdir)
        assert (await prompt(conn, sid, "before any budget")).stop_reason == "end_turn"
        # An ACP session spends without limit; a goal's budget binds the goal's session. `/goal` takes
        # no budget, so the goal comes from the bridge's control socket, on this very session.
        add = ["goal", "add", "--session", sid, "--max-tokens", "50", "Spend almost nothing"]
        proc = await asyncio.create_subprocess_exec(
            *goald_argv(),
            "--socket",
            str(control_socket(tmp_path)),
            *add,
            env=child_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(LIMIT):
            out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert out.decode().endswith(f" on session {sid}\n")
        await rec.wait_for(lambda: "(exhausted" in plan_head(rec, sid))
        async with watch(tmp_path, sid) as w:
            start = len(rec.updates)
            assert (await prompt(conn, sid, "one more")).stop_reason == "max_tokens"
            assert rec.text(sid, start) == ""  # the guard refused the call: the model never answered
            queued = await w.until(acp_queued(2))  # the first was "before any budget"
            end = await admitting_turn_end(w, queued["data"]["messageId"])
        assert end["data"]["reason"] == "budget"


async def test_a_message_never_admitted_settles_cancelled(tmp_path: Path, gate: Gate) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = await _new(conn, workdir)
        async with watch(tmp_path, sid) as w:
            # Another client of the same daemon starts a turn on the session; its model call waits at the gate.
            other = await w.client.call("session/prompt", {"sessionId": sid, "text": f"{gate} from elsewhere"})
            await gate.wait_entered()
            # The ACP prompt queues behind that turn; the other client cancels it there.
            pending = asyncio.create_task(prompt(conn, sid, "queued behind it"))
            mine = (await w.until(acp_queued()))["data"]["messageId"]
            await w.client.call("session/cancelMessage", {"sessionId": sid, "messageId": mine})
            await w.until(first("message/cancelled", messageId=mine))
            assert not pending.done()  # it settles at idle, not at the cancel
            gate.release()
            assert (await pending).stop_reason == "cancelled"
            # The interval's only turn was the other client's, and it ended end_turn: the stop reason is
            # the ACP message's own (it was never admitted), not the last turn's.
            theirs = await admitting_turn_end(w, other["messageId"])
            assert theirs["data"]["reason"] == "end_turn"
            assert not first("message/admitted", messageId=mine)(w.events)
            assert rec.text(sid) == "released"  # the other turn streamed to the editor all the same


async def test_a_turn_interrupted_by_shutdown_fails_the_request_with_its_message(tmp_path: Path, gate: Gate) -> None:
    write_config(tmp_path, shutdown_grace_seconds=0.2)
    async with bridge_process(tmp_path) as (conn, _, workdir, proc):
        sid = await _new(conn, workdir)
        pending = asyncio.create_task(prompt(conn, sid, f"{gate} hold on"))
        await gate.wait_entered()  # the prompt's turn is running its model call
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(RequestError) as failed:
            await pending
        assert failed.value.code == -32603
        assert "the daemon is shutting down" in str(failed.value)
        assert failed.value.data["reason"] == "interrupted"


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


async def test_of_two_prompts_sent_back_to_back_exactly_one_is_refused(tmp_path: Path) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = await _new(conn, workdir)
        start = len(rec.updates)
        # Both tasks start in the same loop iteration: both requests are written before any answer.
        outcomes = await asyncio.gather(prompt(conn, sid, "alpha"), prompt(conn, sid, "beta"), return_exceptions=True)
        ids = rec.sent["session/prompt"][-2:]
        answered = [rec.response_index(i) for i in ids]
        assert all(rec.sent_at[i] <= min(answered) for i in ids)
        refused = [(i, o) for i, o in enumerate(outcomes) if isinstance(o, RequestError)]
        settled = [(i, o) for i, o in enumerate(outcomes) if not isinstance(o, BaseException)]
        assert len(refused) == len(settled) == 1, outcomes
        (_, error), (won, response) = refused[0], settled[0]
        assert error.code == -32602
        assert str(error).startswith("a prompt is already in flight on this session")
        assert response.stop_reason == "end_turn"
        said = ["alpha", "beta"][won]
        assert rec.text(sid, start) == f"ack: {said}"
        # The refused prompt left no trace: only the other one was ever queued.
        events = await all_events(control_socket(tmp_path), sid)
        (queued,) = [e["data"]["messageId"] for e in events if e["type"] == "message/queued"]
        (admitted,) = [e["data"] for e in events if e["type"] == "message/admitted"]
        assert admitted["messageId"] == queued and admitted["content"] == [{"type": "text", "text": said}]
        assert (await prompt(conn, sid, "then one more")).stop_reason == "end_turn"


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


def goal_round(events: list[dict[str, Any]], round_no: int = 1) -> dict[str, Any] | None:
    """The ``message/admitted`` of a goal's continuation for ``round_no``."""
    return next(
        (
            e
            for e in events
            if e["type"] == "message/admitted"
            and e["data"]["source"].get("kind") == "goal"
            and str(e["data"]["source"].get("ref", "")).rpartition("#")[2] == str(round_no)
        ),
        None,
    )


async def test_cancel_without_a_prompt_interrupts_the_turn_and_pauses_the_goal(tmp_path: Path, gate: Gate) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = await _new(conn, workdir)
        objective = f"/goal Keep going {gate} [rounds=9] [delay=0.3]"
        assert (await prompt(conn, sid, objective)).stop_reason == "end_turn"
        await gate.wait_entered()  # round 1's first model call is in flight
        await conn.cancel(session_id=sid)
        await rec.wait_for(lambda: "(paused" in plan_head(rec, sid))
        # The turn running round 1 was interrupted (it ended cancelled; its model call never returned).
        async with watch(tmp_path, sid) as w:
            round1 = await w.until(goal_round)
            end = await w.until(first("turn/end", turnId=round1["data"]["turnId"]))
        assert end["data"]["reason"] == "cancelled"
        assert not (workdir / "round1.txt").exists()
        gate.release()
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


async def test_goal_pause_then_status_then_resume_and_the_goal_completes(tmp_path: Path, gate: Gate) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = await _new(conn, workdir)
        async with watch(tmp_path, sid) as w:
            assert (await prompt(conn, sid, f"/goal Three rounds {gate} [rounds=3]")).stop_reason == "end_turn"
            await gate.wait_entered()  # round 1 is under way
            start = len(rec.updates)
            assert (await prompt(conn, sid, "/goal pause")).stop_reason == "end_turn"
            assert "is paused" in rec.text(sid, start)
            await rec.wait_for(lambda: "(paused" in plan_head(rec, sid))
            # Pausing lets the running round finish (unlike session/cancel or /goal cancel) ...
            gate.release()
            round1 = await w.until(goal_round)
            end = await w.until(first("turn/end", turnId=round1["data"]["turnId"]))
            assert end["data"]["reason"] == "end_turn"
            assert (workdir / "round1.txt").exists()
            await rec.wait_for(lambda: "Round 1 finished." in rec.text(sid))
            start = len(rec.updates)
            assert (await prompt(conn, sid, "/goal status")).stop_reason == "end_turn"
            assert " paused " in rec.text(sid, start)
            # The session still takes prompts while its goal is paused.
            start = len(rec.updates)
            assert (await prompt(conn, sid, "anything new?")).stop_reason == "end_turn"
            assert rec.text(sid, start) == "ack: anything new?"
            asked = await admitting_turn_end(w, (await w.until(acp_queued()))["data"]["messageId"])
            start = len(rec.updates)
            assert (await prompt(conn, sid, "/goal resume")).stop_reason == "end_turn"
            assert "is active" in rec.text(sid, start)
            await rec.wait_for(lambda: "(completed" in plan_head(rec, sid))
            await w.until(first("goal/changed", status="completed"))
        # ... and starts nothing new: the session went idle after round 1 and again after the prompt,
        # and no continuation was queued until the resume. (Which round the resume issues is the goal
        # engine's bookkeeping, not pinned here.)
        events = w.events
        at = events.index(asked)
        idle = next(
            i for i in range(at, len(events)) if events[i]["type"] == "status" and events[i]["data"]["status"] == "idle"
        )
        changes = [e["data"]["status"] for e in events if e["type"] == "goal/changed"]
        assert changes == ["active", "paused", "active", "completed"]
        queued = [
            i for i, e in enumerate(events) if e["type"] == "message/queued" and e["data"]["source"]["kind"] == "goal"
        ]
        paused_at = next(
            i for i, e in enumerate(events) if e["type"] == "goal/changed" and e["data"]["status"] == "paused"
        )
        assert queued[0] < paused_at and len(queued) > 1 and all(i > idle for i in queued[1:])
        entries = [e.content for e in rec.of(sid, "plan")[-1].entries]
        assert {"Round 1", "Round 2", "Round 3"} <= set(entries)
        assert all((workdir / f"round{n}.txt").exists() for n in (1, 2, 3))
        start = len(rec.updates)
        assert (await prompt(conn, sid, "/goal status")).stop_reason == "end_turn"
        assert " completed " in rec.text(sid, start)
        # Nothing is left to pause.
        start = len(rec.updates)
        assert (await prompt(conn, sid, "/goal pause")).stop_reason == "end_turn"
        assert rec.text(sid, start) == "This session has no active or paused goal."


async def test_goal_cancel_interrupts_the_running_round(tmp_path: Path, gate: Gate) -> None:
    async with bridge(tmp_path) as (conn, rec, workdir):
        sid = await _new(conn, workdir)
        assert (await prompt(conn, sid, f"/goal Two rounds {gate} [rounds=2]")).stop_reason == "end_turn"
        await gate.wait_entered()
        start = len(rec.updates)
        assert (await prompt(conn, sid, "/goal cancel")).stop_reason == "end_turn"
        assert "is cancelled" in rec.text(sid, start)
        await rec.wait_for(lambda: "(cancelled" in plan_head(rec, sid))
        # Cancelling interrupts the running round (unlike pausing, which lets it finish).
        async with watch(tmp_path, sid) as w:
            round1 = await w.until(goal_round)
            end = await w.until(first("turn/end", turnId=round1["data"]["turnId"]))
        assert end["data"]["reason"] == "cancelled"
        assert not (workdir / "round1.txt").exists()
        start = len(rec.updates)
        assert (await prompt(conn, sid, "/goal status")).stop_reason == "end_turn"
        assert " cancelled " in rec.text(sid, start)
        # An ended goal is not managed any more.
        for word in ("pause", "cancel"):
            start = len(rec.updates)
            assert (await prompt(conn, sid, f"/goal {word}")).stop_reason == "end_turn"
            assert rec.text(sid, start) == "This session has no active or paused goal."
        start = len(rec.updates)
        assert (await prompt(conn, sid, "/goal resume")).stop_reason == "end_turn"
        assert "a goal that is cancelled cannot become active" in rec.text(sid, start)


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


async def test_disposing_a_settled_slot_keeps_its_outcome() -> None:
    # The bridge closing (SIGTERM) right after a prompt's interval closed must not turn the turn's
    # failure into "cancelled"; a slot still open when disposed does settle cancelled.
    settled, open_ = PromptSlot("msg_a"), PromptSlot("msg_b")
    for event in [
        _event(1, "message/queued", messageId="msg_a"),
        _event(2, "turn/start", turnId="turn_a"),
        _event(3, "message/admitted", messageId="msg_a", turnId="turn_a"),
        _event(4, "turn/end", turnId="turn_a", reason="interrupted", error="the daemon is shutting down"),
        _event(5, "status", status="idle"),
    ]:
        settled.observe(event)
    open_.observe(_event(1, "message/queued", messageId="msg_b"))
    settled.dispose()
    open_.dispose()
    with pytest.raises(RequestError) as failed:
        settled.outcome()
    assert failed.value.data["reason"] == "interrupted"
    assert open_.settled.result() == -1 and open_.outcome() == "cancelled"


def test_goal_command_parsing() -> None:
    assert goal_command("/goal Ship it") == "Ship it"
    assert goal_command("  /goal\n  multi\nline ") == "multi\nline"
    assert goal_command("/goal") == ""
    assert goal_command("/goalie") is None
    assert goal_command("please /goal x") is None
