"""The Python SDK against the real daemon: receipts, notifications, and ``run()``'s owned interval.

The daemon is the real ``goald serve`` (``harness.Daemon``) with the models of ``sdk_testmodels``
loaded inside it, and one turn slot (``max_concurrent_turns = 1``), so a test can keep a message
queued by holding the slot with a slow turn of another session. A model's ``[delay=s]`` directive
is the model being slow; tests wait for a model call's announcement, an event or a status, always
with a time limit.

What is pinned (docs/architecture.md#invariants: 6 and 7, and its owned interval):

* ``prompt()`` answers the ``MessageId`` receipt while a slow model is still working;
* ``run()`` collects from its own message's ``message/queued`` event to the first idle after it:
  an idle and events that precede the receipt are ignored, work already running when the message
  arrived and steering admitted mid-interval are part of it (and may produce the final response);
* ``finish_reason`` is the last root turn's end in the interval: ``end_turn``, ``max_tokens``,
  ``error``, ``cancelled``, and ``None`` when the message is cancelled before any turn; partial
  text of an interrupted step is never the final response;
* usage includes subagent sessions, each model call counted once: the ``model/charged`` event
  with which a real ``delegate`` call settles its child's spend in the parent does not count the
  child again, while a reservation charged in full does count (once);
* a private ``goald serve --stdio`` child is stopped with escalation (``shutdown``, closing its
  stdin, SIGTERM, SIGKILL); a connection lost mid-interval raises ``RunIncomplete`` with what was
  seen.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from harness import Daemon, ModelCalls, child_env, toml_text
from pydantic import BaseModel
from sdk_testmodels import delegate_usage

from agent import EndReason, FunctionTool, MessageId, ModelRequest, Reply, ScriptedModel, TextBlock, ToolCall, Usage
from daemon.sdk import (
    Client,
    Interval,
    MessageIdReused,
    Notifications,
    RunIncomplete,
    RunResult,
    SessionEvent,
    StatusChange,
    StopStep,
    find_receipt,
)

LIMIT = 30.0
CONFIG: dict[str, Any] = {
    "providers": {"t": {"kind": "scripted", "script": "sdk_testmodels:build"}},
    "default_model": "t:chat",
    "max_concurrent_turns": 1,
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One real daemon for the module (each test works in its own sessions)."""
    d = Daemon(tmp_path_factory.mktemp("sdk"), config=CONFIG)
    d.start()
    yield d
    try:
        assert d.terminate() == 0
    finally:
        d.close()


@pytest.fixture
def child_log(tmp_path: Path) -> Iterator[IO[bytes]]:
    """Where a private daemon's stderr goes."""
    with open(tmp_path / "child.log", "wb") as log:
        yield log


@pytest.fixture
async def client(daemon: Daemon) -> AsyncIterator[Client]:
    """A client on the daemon's socket."""
    c = await Client.connect(daemon.socket_path)
    yield c
    await c.close()


def drain(calls: ModelCalls) -> None:
    """Forget announcements of earlier calls (the kernel keeps only a few queued)."""
    calls.sock.setblocking(False)
    try:
        while True:
            calls.sock.recv(4096)
    except BlockingIOError:
        pass
    finally:
        calls.sock.setblocking(True)


async def announced(daemon: Daemon, wanted: str) -> None:
    """Wait until a model call announcing ``wanted`` has started inside the daemon."""
    await asyncio.to_thread(daemon.calls.wait, wanted, LIMIT)


async def next_idle(stream: Notifications, session_id: str) -> int:
    """The sequence number of the session's next idle status, as ``session.status`` reports it."""
    async with asyncio.timeout(LIMIT):
        while True:
            note = await stream.next()
            if isinstance(note, StatusChange) and note.session_id == session_id and note.status == "idle":
                return note.seq


async def next_event(stream: Notifications, session_id: str, kind: str, **data: Any) -> SessionEvent:
    """The session's next event of ``kind`` whose data has the given values."""
    async with asyncio.timeout(LIMIT):
        while True:
            note = await stream.next()
            if (
                isinstance(note, SessionEvent)
                and note.session_id == session_id
                and note.type == kind
                and all(note.data.get(k) == v for k, v in data.items())
            ):
                return note


def usage_in(result: RunResult) -> tuple[int, int, int]:
    """Input tokens, output tokens and model calls the result's events record."""
    kinds = ("assistant/message", "model/error")
    used = [e.data["usage"] for e in result.events if e.type in kinds and "usage" in e.data]
    return sum(u["input_tokens"] for u in used), sum(u["output_tokens"] for u in used), len(used)


def assert_owned_interval(result: RunResult) -> None:
    """The shape every interval has: the receipt first, one idle (the last event), nothing earlier."""
    first = result.events[0]
    assert (first.type, first.data["messageId"], first.seq) == ("message/queued", result.message_id, result.first_seq)
    root = [e for e in result.events if e.session_id == result.session_id]
    assert all(e.seq >= result.first_seq for e in root)
    assert len({(e.session_id, e.seq) for e in result.events}) == len(result.events)
    idles = [e.seq for e in root if e.type == "status" and e.data["status"] == "idle"]
    assert idles == [result.idle_seq] == [root[-1].seq]


# -- low level -----------------------------------------------------------------------------------


async def test_prompt_returns_the_receipt_before_a_slow_model_has_finished(daemon: Daemon, client: Client) -> None:
    sid = await client.new_session(model="t:chat")
    with client.notifications() as stream:
        await client.subscribe(sid)
        drain(daemon.calls)
        mid = await client.prompt(sid, "[delay=1.5] slow one")
        assert isinstance(mid, MessageId)
        # The model call is in flight (announced at its start; it answers 1.5 s later) ...
        await announced(daemon, "sdk chat step=0 [delay=1.5] slow one")
        state = await client.status(sid)
        page = await client.call("session/events", {"sessionId": sid, "afterSeq": 0})
        types = [e["type"] for e in page["events"]]
        # ... and the receipt is already durable, while no answer exists yet.
        assert state.status == "running"
        assert "message/queued" in types and "assistant/message" not in types
        idle = await next_idle(stream, sid)
    answer = await client.call("session/events", {"sessionId": sid, "afterSeq": 0})
    by_type = {e["type"]: e for e in answer["events"]}
    assert "".join(b["text"] for b in by_type["assistant/message"]["data"]["content"]) == "ack: [delay=1.5] slow one"
    assert by_type["status"]["seq"] == idle  # session.status carries its status event's sequence number


async def test_the_receipt_is_only_a_message_id(daemon: Daemon, client: Client) -> None:
    sid = await client.new_session(model="t:chat")
    raw = await client.call("session/prompt", {"sessionId": sid, "text": "just a receipt"})
    assert set(raw) == {"messageId"}


# -- run(): the owned interval -------------------------------------------------------------------


async def test_collect_ignores_an_idle_and_events_that_precede_the_receipt(daemon: Daemon, client: Client) -> None:
    sid = await client.new_session(model="t:chat")
    with client.notifications() as stream, client.notifications() as watch:
        await client.subscribe(None)
        await client.prompt(sid, "first")
        earlier_idle = await next_idle(watch, sid)
        second = await client.prompt(sid, "second")
        # `stream` holds the first message's whole activity and its idle before the second's receipt.
        result = await client.collect(stream, sid, second)
    assert_owned_interval(result)
    assert result.first_seq > earlier_idle
    assert result.final_response == "ack: second"
    assert result.finish_reason is EndReason.END_TURN
    assert [e.text for e in result.events if e.type == "assistant/message"] == ["ack: second"]


async def test_run_on_a_busy_session_owns_from_its_receipt_to_the_next_idle(daemon: Daemon, client: Client) -> None:
    sid = await client.new_session(model="t:chat")
    # A second subscription to the same session (replaying from 0): every event reaches the client twice.
    await client.subscribe(sid, after_seq=0)
    drain(daemon.calls)
    first = await client.prompt(sid, "[delay=2] first")
    await announced(daemon, "sdk chat step=0 [delay=2] first")
    result = await client.run("second", sid)
    assert_owned_interval(result)
    # The first turn started before the receipt: its start and its admission are not in the interval ...
    assert not [e for e in result.events if e.type == "turn/start" and e.seq < result.first_seq]
    assert all(e.data.get("messageId") != first for e in result.events)
    # ... but its answer and its end came after the receipt, so they are part of the interval.
    assert [e.text for e in result.events if e.type == "assistant/message"] == ["ack: [delay=2] first", "ack: second"]
    assert [e.data["reason"] for e in result.events if e.type == "turn/end"] == ["end_turn", "end_turn"]
    assert result.final_response == "ack: second"
    assert result.finish_reason is EndReason.END_TURN
    assert usage_in(result) == (20, 8, 2)
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.model_calls) == (20, 8, 2)


async def test_steering_mid_interval_is_in_the_events_and_may_give_the_final_response(
    daemon: Daemon, client: Client
) -> None:
    sid = await client.new_session(model="t:chat")
    drain(daemon.calls)
    run = asyncio.ensure_future(client.run("[tool=1 delay=1.5] start the note", sid))
    await announced(daemon, "sdk chat step=0 [tool=1 delay=1.5] start the note")
    steer = await client.prompt(sid, "change of plan", delivery="steer")
    async with asyncio.timeout(LIMIT):
        result = await run
    assert_owned_interval(result)
    kinds = {(e.type, e.data.get("messageId")) for e in result.events}
    assert {("message/queued", steer), ("message/admitted", steer)} <= kinds
    # The steer joined the running turn at its next step, and that step answered it.
    assert [e.data["reason"] for e in result.events if e.type == "turn/end"] == ["end_turn"]
    assert result.final_response == "ack: change of plan"
    assert result.finish_reason is EndReason.END_TURN


@pytest.mark.parametrize(
    ("model", "finish", "response", "usage"),
    [
        ("t:chat", EndReason.END_TURN, "ack: go", (10, 4, 1)),
        ("t:maxtok", EndReason.MAX_TOKENS, "cut off mid", (5, 7, 1)),
        ("t:fail", EndReason.ERROR, None, (0, 0, 1)),
    ],
)
async def test_finish_reason_is_the_last_root_turn_end(
    client: Client, model: str, finish: EndReason, response: str | None, usage: tuple[int, int, int]
) -> None:
    result = await client.run("go", model=model)
    assert_owned_interval(result)
    assert result.finish_reason is finish
    assert result.final_response == response
    assert usage_in(result) == usage
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.model_calls) == usage


async def test_finish_reason_is_none_when_the_message_is_cancelled_before_any_turn(
    daemon: Daemon, client: Client
) -> None:
    busy = await client.new_session(model="t:chat")
    waiting = await client.new_session(model="t:chat")
    drain(daemon.calls)
    await client.prompt(busy, "[delay=30] hold the only turn slot")
    await announced(daemon, "sdk chat step=0 [delay=30] hold the only turn slot")
    mid = MessageId.new()
    try:
        with client.notifications() as watch:
            await client.subscribe(waiting)
            run = asyncio.ensure_future(client.run("never admitted", waiting, message_id=mid))
            await next_event(watch, waiting, "message/queued", messageId=mid)
            await client.cancel_message(waiting, mid)
            async with asyncio.timeout(LIMIT):
                result = await run
    finally:
        await client.interrupt(busy)
    assert_owned_interval(result)
    assert [e.type for e in result.events] == ["message/queued", "status", "message/cancelled", "status"]
    assert result.finish_reason is None
    assert result.final_response is None
    assert result.usage.model_calls == 0


async def test_interrupted_partial_text_is_not_the_final_response(daemon: Daemon, client: Client) -> None:
    sid = await client.new_session(model="t:stream")
    drain(daemon.calls)
    run = asyncio.ensure_future(client.run("[chunk_delay=30] stream it", sid))
    # Announced: the first chunk is already streamed, the second is 30 s away.
    await announced(daemon, "sdk stream step=0 [chunk_delay=30] stream it")
    await client.interrupt(sid)
    async with asyncio.timeout(LIMIT):
        result = await run
    assert_owned_interval(result)
    partial = [e for e in result.events if e.type == "assistant/message"]
    assert [(e.text, e.data.get("interrupted")) for e in partial] == [("first part, ", True)]
    assert result.final_response is None
    assert result.finish_reason is EndReason.CANCELLED


async def test_run_refuses_a_message_id_that_was_used_before(client: Client) -> None:
    first = await client.run("once")
    with pytest.raises(MessageIdReused):
        await client.run("twice", first.session_id, message_id=first.message_id)


# -- subagents: the shared interval logic on a real runtime's events ----------------------------


class Delegate(BaseModel):
    """Arguments of the test's subagent tool."""

    task: str


async def test_usage_includes_subagent_sessions(open_runtime: Any) -> None:
    holder: dict[str, Any] = {}

    async def delegate(args: Delegate, ctx: Any) -> str:
        rt = holder["rt"]
        child = await rt.create_session(parent_session_id=ctx.session_id)
        agent = await rt.agent(child)
        await agent.followup(args.task)
        await agent.when_idle()
        return "the subagent finished"

    def rule(request: ModelRequest) -> Reply:
        last = max(i for i, m in enumerate(request.messages) if m.role == "user")
        text = "".join(b.text for b in request.messages[last].content if isinstance(b, TextBlock))
        if text == "sub task":
            return Reply.say("sub says hi", usage=Usage(input_tokens=7, output_tokens=3))
        if len(request.messages) - 1 == last:
            call = ToolCall("delegate", {"task": "sub task"})
            return Reply(tool_calls=[call], usage=Usage(input_tokens=2, output_tokens=1))
        return Reply.say("root done", usage=Usage(input_tokens=5, output_tokens=2))

    tool = FunctionTool("delegate", "run a subagent", Delegate, delegate)
    seen: list[SessionEvent] = []
    async with open_runtime(ScriptedModel(rule), tools=[tool]) as rt:
        holder["rt"] = rt
        remove = rt.store.hub.add_listener(lambda e: seen.append(SessionEvent.from_event(e)))
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        mid = await agent.enqueue("go")
        async with asyncio.timeout(LIMIT):
            await agent.when_idle()
        remove()
    at = find_receipt(seen, sid, mid)
    assert at is not None
    interval = Interval(seen[at], seen[:at])
    assert any(interval.feed(ev) for ev in seen[at + 1 :])
    result = interval.result(mid)
    assert_owned_interval(result)
    sessions = {e.session_id for e in result.events}
    assert len(sessions) == 2  # the root and its subagent
    assert result.final_response == "root done"  # the subagent's answer is not the root's
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.model_calls) == (14, 6, 3)


@pytest.mark.parametrize("depth", [1, 2])
async def test_usage_counts_each_delegated_subagent_once(client: Client, depth: int) -> None:
    # The real `delegate` tool in the daemon: the root delegates to a child (which, at depth 2,
    # delegates to a grandchild); each delegating call ends by charging its child's whole spend to
    # the parent as `model/charged` (`subagentSessionId`) while the child's own calls are in the
    # interval too.
    result = await client.run(f"[depth={depth}] go", model="t:delegate")
    assert_owned_interval(result)
    assert result.final_response == f"done at depth {depth}"
    assert result.finish_reason is EndReason.END_TURN
    root = result.session_id
    own: dict[str, list[dict[str, int]]] = {}
    for e in result.events:
        if e.type == "assistant/message":
            own.setdefault(e.session_id, []).append(e.data["usage"])
    assert len(own) == depth + 1  # the root and one subagent per level below it
    # What the model reported, per level: a delegating step and an answer, the leaf's answer alone.
    reported = [delegate_usage(level, step) for level in range(depth + 1) for step in range(2 if level else 1)]
    as_events = [Usage.model_validate(u) for calls in own.values() for u in calls]
    assert sorted(as_events, key=lambda u: u.total) == sorted(reported, key=lambda u: u.total)
    every = sum(reported, Usage())
    below_root = sum((Usage.model_validate(u) for sid, calls in own.items() if sid != root for u in calls), Usage())
    # The settle charges are there (one per delegating call), the root's carrying everything below it ...
    charges = [e for e in result.events if e.type == "model/charged"]
    assert len(charges) == depth and all(e.data.get("subagentSessionId") in own for e in charges)
    assert [e.data["tokens"] for e in charges if e.session_id == root] == [below_root.total]
    # ... and yet every call counts exactly once.
    used = result.usage
    assert Usage.model_validate(used.model_dump(include=set(Usage.model_fields))) == every
    assert (used.model_calls, used.charged_tokens, used.total_tokens) == (2 * depth + 1, 0, every.total)
    # A caller that saw the root session alone never saw the children's calls: for it the charge is
    # their only record, and the total is the same.
    alone = Interval(result.events[0])
    assert any(alone.feed(e) for e in result.events[1:] if e.session_id == root)
    root_only = sum((Usage.model_validate(u) for u in own[root]), Usage())
    assert (alone.usage.input_tokens, alone.usage.model_calls) == (root_only.input_tokens, 2)
    assert (alone.usage.charged_tokens, alone.usage.total_tokens) == (below_root.total, every.total)


async def test_a_reservation_charged_in_a_subagent_counts_once(daemon: Daemon, client: Client) -> None:
    # The grandchild's call is in flight when the root is interrupted: the cancel goes down the tree,
    # the open reservation is charged in full in the grandchild (`model/charged`, no subagent named),
    # and each delegating call's settle carries it up again (`subagentSessionId`).
    sid = await client.new_session(model="t:delegate")
    drain(daemon.calls)
    run = asyncio.ensure_future(client.run("[depth=2 hold=30] go", sid))
    try:
        await announced(daemon, "sdk delegate step=0 [depth=0 hold=30]")
    finally:
        await client.interrupt(sid)
    async with asyncio.timeout(LIMIT):
        result = await run
    assert_owned_interval(result)
    assert result.finish_reason is EndReason.CANCELLED
    charges = [e for e in result.events if e.type == "model/charged"]
    (held,) = [e for e in charges if "subagentSessionId" not in e.data]
    settles = {e.session_id: e.data["tokens"] for e in charges if "subagentSessionId" in e.data}
    sessions = {e.session_id for e in result.events}
    assert len(sessions) == 3 and held.session_id not in settles and set(settles) == sessions - {held.session_id}
    assert held.data["tokens"] > 0
    reported = [(e.session_id, Usage.model_validate(e.data["usage"])) for e in result.events if "usage" in e.data]
    calls = [u for _, u in reported]
    below_root = sum((u for session, u in reported if session != sid), Usage())
    assert settles[sid] == below_root.total + held.data["tokens"]
    # The charged reservation counts once; the settles that carry it up do not count again.
    assert result.usage.charged_tokens == held.data["tokens"]
    assert result.usage.model_calls == len(calls)
    assert result.usage.total_tokens == sum(c.total for c in calls) + held.data["tokens"]


# -- a private daemon ----------------------------------------------------------------------------


async def test_a_private_daemon_runs_and_stops_on_shutdown(child_log: IO[bytes]) -> None:
    client = await Client.spawn(env=child_env(), stderr=child_log)
    state = client.state_dir
    try:
        result = await client.run("hello", model="scripted:echo")
    finally:
        step = await client.close()
    assert result.final_response == "echo: hello"
    assert result.finish_reason is EndReason.END_TURN
    assert client.process is not None and client.process.returncode == 0
    assert step is StopStep.SHUTDOWN
    assert state is not None and not state.exists()


async def test_a_private_daemon_that_does_not_stop_is_killed(tmp_path: Path, child_log: IO[bytes]) -> None:
    client = await Client.spawn(state_dir=tmp_path / "state", env=child_env(), stderr=child_log, stop_timeout=0.3)
    proc = client.process
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)  # it can answer nothing, read nothing, and handle no SIGTERM
    step = await client.close()
    assert step is StopStep.SIGKILL
    assert proc.returncode == -signal.SIGKILL


#: What stopping a private child showed: the step, its exit code, and what it logged.
Stopped = tuple[StopStep | None, int | None, list[str]]

#: A stand-in for ``goald serve --stdio`` that answers ``initialize`` and ignores ``shutdown``; it logs
#: each method and the end of its stdin to ``argv[2]``. ``argv[1]`` says how it ends: ``eof`` exits
#: when its stdin closes, ``term`` ignores that too and ends on SIGTERM (the default action).
#: The rest of its command line (``--log-level ... serve --stdio``) is ignored.
IGNORES_SHUTDOWN = """
import json, os, signal, sys

mode, log_path = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGTERM, signal.SIG_DFL)


def note(what):
    with open(log_path, "a") as log:
        log.write(what + "\\n")


for line in iter(sys.stdin.buffer.readline, b""):
    msg = json.loads(line)
    note(msg["method"])
    if msg["method"] == "initialize":
        reply = {"jsonrpc": "2.0", "id": msg["id"], "result": {"name": "fake", "protocolVersion": 1}}
        sys.stdout.buffer.write(json.dumps(reply).encode() + b"\\n")
        sys.stdout.buffer.flush()
note("eof")
if mode == "eof":
    os._exit(0)
while True:
    signal.pause()
"""


async def stop_a_child_that_ignores_shutdown(tmp_path: Path, mode: str) -> Stopped:
    """Spawn :data:`IGNORES_SHUTDOWN` in ``mode``, close the client: the step, the exit code, the child's log."""
    script, log = tmp_path / "ignores_shutdown.py", tmp_path / "seen.log"
    script.write_text(IGNORES_SHUTDOWN)
    # Each step waits this long for the exit: short, yet far above the fake's time to exit.
    client = await Client.spawn(
        argv=[sys.executable, str(script), mode, str(log)], state_dir=tmp_path, env=child_env(), stop_timeout=2.0
    )
    step = await client.close()
    assert client.process is not None
    return step, client.process.returncode, log.read_text().splitlines()


async def test_a_private_daemon_that_ignores_shutdown_stops_when_its_stdin_closes(tmp_path: Path) -> None:
    step, code, seen = await stop_a_child_that_ignores_shutdown(tmp_path, "eof")
    assert step is StopStep.STDIN_CLOSED
    assert seen == ["initialize", "shutdown", "eof"]  # asked first, then its stdin closed
    assert code == 0


async def test_a_private_daemon_that_ignores_shutdown_and_eof_stops_on_sigterm(tmp_path: Path) -> None:
    step, code, seen = await stop_a_child_that_ignores_shutdown(tmp_path, "term")
    assert step is StopStep.SIGTERM
    assert seen == ["initialize", "shutdown", "eof"]  # asked, its stdin closed, and still running
    assert code == -signal.SIGTERM


async def test_a_connection_lost_mid_interval_raises_run_incomplete(tmp_path: Path, child_log: IO[bytes]) -> None:
    config = tmp_path / "goald.toml"
    config.write_text(toml_text({"state_dir": str(tmp_path / "state"), **CONFIG}))
    client = await Client.spawn(config=config, env=child_env(), stderr=child_log)
    started = asyncio.Event()

    def on_event(ev: SessionEvent) -> None:
        if ev.type == "turn/start":
            started.set()

    try:
        run = asyncio.ensure_future(client.run("[delay=30] never answered", model="t:chat", on_event=on_event))
        async with asyncio.timeout(LIMIT):
            await started.wait()
        assert client.process is not None
        client.process.kill()
        with pytest.raises(RunIncomplete) as lost:
            async with asyncio.timeout(LIMIT):
                await run
    finally:
        step = await client.close()
    assert step is StopStep.EXITED
    partial = lost.value.result
    assert partial is not None and partial.idle_seq is None
    assert [e.type for e in partial.events[:3]] == ["message/queued", "status", "turn/start"]
    assert partial.finish_reason is None and partial.final_response is None


def test_the_readme_example_runs(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Python SDK") :]
    example = re.search(r"```python\n(.*?)\n```", section, re.S)
    assert example is not None
    script = tmp_path / "example.py"
    script.write_text(example.group(1))
    done = subprocess.run(
        [sys.executable, str(script)], env=child_env(), cwd=tmp_path, capture_output=True, text=True, timeout=LIMIT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "echo: hello"
    assert done.stdout.splitlines()[1].startswith("end_turn ")
