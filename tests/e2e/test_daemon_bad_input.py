"""Bad input against the real daemon (a ``goald serve`` subprocess, ready on ``READY=1``).

The daemon issue's item 6: each kind of bad input is sent to a live daemon that keeps serving the
other clients. For every case:

* the answer is the right JSON-RPC error and names the field or the problem;
* the connection that sent it keeps working (a call after the bad frame, on the same connection);
* a second client, already subscribed to a running goal's session, keeps receiving its events
  (an event committed after the bad input was answered arrives);
* nothing was written: the goals, schedules, sessions, an idle session's events and the work
  directory root are the same before and after.

Also: an invalid config file stops ``goald serve`` before it starts (exit 78, the key named, no
socket); ``goald config check`` prints the settings with secrets masked; ``goald serve --stdio``
speaks the same protocol on stdin/stdout, with only JSON-RPC on stdout and logs on stderr.

The running goal uses a scripted model this module defines (:func:`endless_model`), loaded by the
daemon through a ``kind = "scripted"`` provider; the daemon child has this directory on its path.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness import Daemon, child_env, goald_argv

from agent import ModelRequest, Reply, ScriptedModel, ToolCall
from daemon.client import Connection as Client
from daemon.rpc.protocol import ErrorCode, RpcError, encode

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
WAIT = 15.0
MIB = 1024 * 1024

CONFIG = """\
state_dir = "{state}"
log_level = "INFO"
sandbox = "none"
default_model = "scripted:echo"
shutdown_grace_seconds = 2
workdir_roots = ["{root}"]

[providers.t]
kind = "scripted"
script = "test_daemon_bad_input:endless_model"
"""


def endless_model(name: str) -> ScriptedModel:
    """A goal model that never finishes: each round records a new progress note, then ends the turn.

    A new distinct note is progress, so the goal keeps running round after round (its session keeps
    committing events) until it is cancelled. The small delays are the model "thinking".
    """

    def rule(request: ModelRequest) -> Reply:
        last_user = max((i for i, m in enumerate(request.messages) if m.role == "user"), default=-1)
        step = sum(1 for m in request.messages[last_user + 1 :] if m.role == "assistant")
        if step == 0:
            note = f"progress at message {len(request.messages)}"
            return Reply(tool_calls=[ToolCall("goal_progress", {"note": note})], delay=0.03)
        return Reply.say("round done", delay=0.03)

    return ScriptedModel(rule, name=name, record=False)


# -- the live daemon -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module's bad-input cases (each case makes its own goal and session)."""
    base = tmp_path_factory.mktemp("bad-input")
    state = base / "state"
    root = base / "work"
    (base / "outside").mkdir()
    root.mkdir()
    (root / "escape").symlink_to(base / "outside", target_is_directory=True)
    d = Daemon(state)
    d.config_path.write_text(CONFIG.format(state=state, root=root))
    d.start(extra_env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS), str(Path(__file__).resolve().parent)])})
    try:
        yield d
    finally:
        try:
            assert d.terminate() == 0, d.stderr()
        finally:
            d.close()


@dataclass
class Live:
    """A running goal watched by ``observer``, an idle session, and ``client``, the one that misbehaves."""

    daemon: Daemon
    client: Client
    observer: Client
    goal_id: str
    goal_key: str
    goal_session: str
    idle_session: str

    @property
    def root(self) -> Path:
        return self.daemon.state_dir.parent / "work"

    @property
    def outside(self) -> Path:
        return self.daemon.state_dir.parent / "outside"


async def wait_event(client: Client, session_id: str, after_seq: int) -> dict[str, Any]:
    """The first ``session.event`` of ``session_id`` with a seq above ``after_seq`` (with a time limit)."""
    async with asyncio.timeout(WAIT):
        while True:
            note = await client.next_notification()
            params = note.get("params", {})
            if note["method"] == "session.event" and params["sessionId"] == session_id and params["seq"] > after_seq:
                return params  # type: ignore[no-any-return]


_goal_keys = itertools.count(1)


@pytest.fixture
async def live(daemon: Daemon) -> AsyncIterator[Live]:
    client = await Client.connect(daemon.socket_path)
    observer = await Client.connect(daemon.socket_path)
    try:
        key = f"running-{next(_goal_keys)}"
        made = await observer.call(
            "goal/create",
            {"objective": "keep making progress", "key": key, "model": "t:endless", "budgets": {"maxRounds": 100_000}},
        )
        await observer.call("session/subscribe", {"sessionId": made["sessionId"], "afterSeq": 0})
        # The goal is running: its session commits turns.
        await wait_event(observer, made["sessionId"], 0)
        idle = await client.call("session/new", {"model": "scripted:echo"})
        yield Live(daemon, client, observer, made["goalId"], key, made["sessionId"], idle["sessionId"])
        cancelled = await client.call("goal/cancel", {"goalId": made["goalId"]})
        assert cancelled["status"] == "cancelled"
    finally:
        await client.close()
        await observer.close()


async def snapshot(live: Live) -> dict[str, Any]:
    """What bad input must not change (the running goal's own progress aside)."""
    c = live.client
    goals = (await c.call("goal/list"))["goals"]
    sessions = (await c.call("session/list", {"limit": 10_000}))["sessions"]
    events = await c.call("session/events", {"sessionId": live.idle_session, "limit": 10_000})
    return {
        "goals": sorted((g["id"], g["sessionId"], g["objective"]) for g in goals),
        "schedules": (await c.call("schedule/list"))["schedules"],
        "sessions": sorted(s["sessionId"] for s in sessions),
        "idle events": [(e["seq"], e["type"]) for e in events["events"]],
        "work root": sorted(os.listdir(live.root)),
    }


async def call_error(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The error a call is answered with (fails if it succeeds)."""
    with pytest.raises(RpcError) as info:
        async with asyncio.timeout(WAIT):
            await client.call(method, params)
    return {"code": info.value.code, "message": info.value.message, "data": info.value.data}


async def raw_error(client: Client, frame: bytes) -> dict[str, Any]:
    """Send a raw frame; the error answer (with a null id, the client hands it over as a notification)."""
    await client.send_raw(frame)
    async with asyncio.timeout(WAIT):
        note = await client.next_notification()
    assert note["method"] == "error", note
    return note["params"]  # type: ignore[no-any-return]


@dataclass
class Case:
    send: Callable[[Live], Awaitable[dict[str, Any]]]
    code: int
    field: str | None = None
    says: tuple[str, ...] = ()


def _goal(**params: Any) -> Callable[[Live], Awaitable[dict[str, Any]]]:
    return lambda live: call_error(live.client, "goal/create", params)


def _schedule(expr: str, goal: dict[str, Any] | None = None) -> Callable[[Live], Awaitable[dict[str, Any]]]:
    params = {"trigger": {"kind": "cron", "expr": expr}, "goal": goal or {"objective": "nightly report"}}
    return lambda live: call_error(live.client, "schedule/add", params)


def _oversized(live: Live) -> Awaitable[dict[str, Any]]:
    # A request that would create a goal if it were not over 1 MiB.
    frame = encode({"jsonrpc": "2.0", "id": 9, "method": "goal/create", "params": {"objective": "x" * (MIB + 10)}})
    assert len(frame) > MIB
    return raw_error(live.client, frame)


async def _outside_workdir(live: Live) -> dict[str, Any]:
    return await call_error(live.client, "goal/create", {"objective": "escape", "workdir": str(live.outside)})


async def _symlink_workdir(live: Live) -> dict[str, Any]:
    # A path inside the root that resolves outside it (the link was made before the daemon started).
    link = live.root / "escape"
    assert link.is_symlink()
    return await call_error(live.client, "goal/create", {"objective": "escape", "workdir": str(link)})


async def _relative_workdir(live: Live) -> dict[str, Any]:
    return await call_error(live.client, "goal/create", {"objective": "x", "workdir": "work/here"})


async def _session_outside(live: Live) -> dict[str, Any]:
    return await call_error(live.client, "session/new", {"workdir": str(live.outside)})


CASES: dict[str, Case] = {
    "malformed JSON": Case(
        lambda live: raw_error(live.client, b'{"jsonrpc":"2.0","id":1,"method":"goal/create","params":{"objec\n'),
        -32700,
        says=("parse error",),
    ),
    "JSON nested past the parser's depth": Case(
        lambda live: raw_error(live.client, b"[" * 50_000 + b"\n"), -32700, says=("parse error",)
    ),
    "a non-object (a batch array)": Case(
        lambda live: raw_error(live.client, b'[{"jsonrpc":"2.0","id":1,"method":"goal/list"}]\n'),
        -32600,
        says=("JSON object",),
    ),
    "a bare string": Case(lambda live: raw_error(live.client, b'"goal/list"\n'), -32600, says=("JSON object",)),
    "an unknown method": Case(
        lambda live: call_error(live.client, "goal/explode", {"goalId": live.goal_id}), -32601, says=("goal/explode",)
    ),
    "invalid params (wrong type)": Case(
        _goal(objective="x", budgets={"maxRounds": "lots"}), -32602, field="budgets.maxRounds"
    ),
    "invalid params (unknown field)": Case(_goal(objective="x", priority=1), -32602, field="priority"),
    "an oversized frame": Case(_oversized, -32600, says=("frame over 1048576 bytes",)),
    "a bad cron expression (out of range)": Case(
        _schedule("61 * * * *"), -32602, field="trigger.expr", says=("minute", "61")
    ),
    "a bad cron expression (too few fields)": Case(
        _schedule("every night"), -32602, field="trigger.expr", says=("5 fields",)
    ),
    "a schedule of an invalid goal": Case(
        _schedule("0 3 * * *", {"objective": ""}), -32602, field="goal", says=("objective",)
    ),
    "an empty objective": Case(_goal(objective=""), -32602, field="objective", says=("objective",)),
    "a blank objective on an existing session": Case(
        lambda live: call_error(live.client, "goal/create", {"objective": "  ", "sessionId": live.idle_session}),
        -32602,
        field="objective",
    ),
    "a negative round budget": Case(_goal(objective="x", budgets={"maxRounds": -3}), -32602, field="budgets.maxRounds"),
    "a negative cost budget": Case(_goal(objective="x", budgets={"maxCost": -1.5}), -32602, field="budgets.maxCost"),
    "a workdir outside the roots": Case(_outside_workdir, -32602, field="workdir", says=("outside",)),
    "a workdir that links outside the roots": Case(_symlink_workdir, -32602, field="workdir", says=("outside",)),
    "a relative workdir": Case(_relative_workdir, -32602, field="workdir", says=("absolute",)),
    "a session workdir outside the roots": Case(_session_outside, -32602, field="workdir", says=("outside",)),
    # Refused by the engine after the daemon made the new goal's work directory: it must not stay.
    "a goal key that is taken": Case(
        lambda live: call_error(live.client, "goal/create", {"objective": "again", "key": live.goal_key}),
        -32003,
        says=("already exists",),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_bad_input_is_refused_and_the_daemon_keeps_serving(live: Live, name: str) -> None:
    case = CASES[name]
    before = await snapshot(live)

    err = await case.send(live)

    assert err["code"] == case.code, err
    assert isinstance(err["message"], str) and err["message"], err
    if case.field is not None:
        assert (err.get("data") or {}).get("field") == case.field, err
    for word in case.says:
        assert word in err["message"], err
    if case.code == ErrorCode.METHOD_NOT_FOUND:
        assert err["data"] == {"method": "goal/explode"}

    # The same connection still works, and sees the goal still running.
    status = await live.client.call("agent/status", {"sessionId": live.goal_session})
    goal = await live.client.call("goal/get", {"goalId": live.goal_id})
    assert goal["status"] == "active"
    # The other client's subscription still streams: an event committed after the answer arrives.
    event = await wait_event(live.observer, live.goal_session, status["lastSeq"])
    assert event["seq"] > status["lastSeq"]
    # Nothing was written.
    assert await snapshot(live) == before


async def test_many_bad_frames_in_one_write_each_get_an_answer_in_order(live: Live) -> None:
    before = await snapshot(live)
    frames = [
        b"{oops\n",
        b"[]\n",
        b'{"jsonrpc":"2.0","id":"a","method":"no/such"}\n',
        encode({"jsonrpc": "2.0", "id": "big", "method": "goal/create", "params": {"objective": "y" * (MIB + 1)}}),
        b'{"jsonrpc":"2.0","id":"b","method":"goal/create","params":{"objective":""}}\n',
        b'{"jsonrpc":"2.0","method":"goal/create","params":{"objective":"a notification is not answered"}}\n',
    ]
    writer = asyncio.create_task(live.client.send_raw(b"".join(frames)))
    got = []
    async with asyncio.timeout(WAIT):
        for _ in range(5):
            note = await live.client.next_notification()
            assert note["method"] == "error", note
            got.append(note["params"]["code"])
    await writer
    assert got == [-32700, -32600, -32601, -32600, -32602]
    # The notification above was valid and did create a goal: a notification is executed, just not
    # answered. (A connection's frames are handled in order, so the snapshot's first call, on the
    # same connection, is answered after it.) Everything else is unchanged.
    after = await snapshot(live)
    new_goals = [g for g in after["goals"] if g not in before["goals"]]
    assert [g[2] for g in new_goals] == ["a notification is not answered"]
    for gid, _, _ in new_goals:
        await live.client.call("goal/cancel", {"goalId": gid})
    assert after["schedules"] == before["schedules"]
    assert after["idle events"] == before["idle events"]


def test_a_plain_socket_client_is_served_across_split_and_oversized_frames(daemon: Daemon) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(WAIT)
        sock.connect(str(daemon.socket_path))
        lines = sock.makefile("rb")

        def answer() -> dict[str, Any]:
            msg = json.loads(lines.readline())
            assert isinstance(msg, dict)
            return msg

        health = encode({"jsonrpc": "2.0", "id": 1, "method": "daemon/health"})
        sock.sendall(health[:9])
        sock.sendall(health[9:])
        assert answer()["result"]["status"] == "serving"
        sock.sendall(encode({"jsonrpc": "2.0", "id": 2, "method": "goal/list"}))
        goals_before = answer()["result"]["goals"]

        # A goal/create whose objective takes it past 1 MiB, written in pieces, then a request right
        # after its newline in the same write.
        sock.sendall(b'{"jsonrpc":"2.0","id":3,"method":"goal/create","params":{"objective":"')
        for _ in range(3):
            sock.sendall(b"p" * (MIB // 2))
        sock.sendall(b'"}}\n' + encode({"jsonrpc": "2.0", "id": 4, "method": "goal/list"}))
        refused = answer()
        assert refused["id"] is None
        assert refused["error"]["code"] == -32600
        assert refused["error"]["data"] == {"maxBytes": MIB}
        listed = answer()
        assert listed["id"] == 4
        assert sorted(g["id"] for g in listed["result"]["goals"]) == sorted(g["id"] for g in goals_before)
        lines.close()


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("max_turns = 3\n", "'max_turns': unknown key"),
        ('max_concurrent_turns = "four"\n', "'max_concurrent_turns'"),
        ('socket = "run/goald.sock"\n', "'socket'"),
        ('workdir_roots = ["relative/root"]\n', "'workdir_roots'"),
        ('durability = "sometimes"\n', "'durability'"),
        ("max_frame_bytes = 10\n", "'max_frame_bytes'"),
        ('[providers.p]\nkind = "openai"\nbase_urll = "http://127.0.0.1:1"\n', "'providers.p.base_urll'"),
        ('[providers.p]\nkind = "telepathy"\n', "'providers.p.kind'"),
        ('log_level = "INFO\n', "not valid TOML"),
    ],
    ids=[
        "unknown-key",
        "bad-type",
        "relative-path",
        "relative-root",
        "bad-choice",
        "out-of-range",
        "unknown-nested-key",
        "bad-provider-kind",
        "bad-toml",
    ],
)
def test_an_invalid_config_file_refuses_to_start_naming_the_key(tmp_path: Path, body: str, named: str) -> None:
    state = tmp_path / "state"
    config = tmp_path / "bad.toml"
    config.write_text(f'state_dir = "{state}"\n' + body)
    done = subprocess.run(
        [*goald_argv(), "--config", str(config), "serve"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 78, done.stderr
    assert named in done.stderr
    assert str(config) in done.stderr
    assert done.stdout == ""
    # It stopped before it started: no state directory, no database, no socket.
    assert not state.exists()

    check = subprocess.run(
        [*goald_argv(), "config", "check", "--config", str(config)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert check.returncode == 78, check.stderr
    assert named in check.stderr
    assert check.stdout == ""


def test_config_check_prints_the_settings_with_secrets_masked(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "goald.toml"
    config.write_text(
        f'state_dir = "{state}"\nmax_concurrent_turns = 2\n\n'
        '[providers.openai]\nkind = "openai"\napi_key = "sk-test-SECRET"\napi_key_env = "OPENAI_API_KEY"\n'
    )
    done = subprocess.run(
        [*goald_argv(), "config", "check", "--config", str(config)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr
    assert "SECRET" not in done.stdout and "SECRET" not in done.stderr
    shown = json.loads(done.stdout)
    assert shown["providers"]["openai"]["api_key"] == "********"
    assert shown["providers"]["openai"]["api_key_env"] == "OPENAI_API_KEY"
    assert shown["max_concurrent_turns"] == 2
    assert shown["state_dir"] == str(state)
    assert shown["socket"] == str(state / "goald.sock")
    # Checking writes nothing.
    assert not state.exists()


# -- the protocol on stdin/stdout --------------------------------------------------------------


def is_jsonrpc(msg: Any) -> bool:
    """A JSON-RPC 2.0 response (an id and exactly one of result/error) or notification (a method, no id)."""
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        return False
    if "id" in msg:
        return ("result" in msg) != ("error" in msg) and "method" not in msg
    return isinstance(msg.get("method"), str)


class Stdio:
    """A ``goald serve --stdio`` child, spoken to through its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[bytes] = []
        self.notes: list[dict[str, Any]] = []
        self._ids = 0

    async def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        async with asyncio.timeout(WAIT):
            line = await self.proc.stdout.readline()
        assert line.endswith(b"\n"), f"stdout ended: {line!r}"
        self.lines.append(line)
        msg = json.loads(line)
        assert is_jsonrpc(msg), msg
        return msg  # type: ignore[no-any-return]

    async def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A request; notifications that arrive before its response are kept in ``notes``."""
        self._ids += 1
        await self.write(encode({"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params or {}}))
        while True:
            msg = await self.read()
            if "id" not in msg:
                self.notes.append(msg)
                continue
            assert msg["id"] == self._ids, msg
            return msg

    async def notification(self) -> dict[str, Any]:
        if self.notes:
            return self.notes.pop(0)
        msg = await self.read()
        assert "id" not in msg, msg
        return msg


async def test_serve_stdio_speaks_the_protocol_on_stdin_and_stdout(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "goald.toml"
    config.write_text(f'state_dir = "{state}"\nsandbox = "none"\nlog_level = "DEBUG"\n')
    stderr_path = tmp_path / "stderr.log"
    stderr_fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        proc = await asyncio.create_subprocess_exec(
            *goald_argv(),
            "--config",
            str(config),
            "serve",
            "--stdio",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr_fd,
            env=child_env(),
            limit=2**22,
        )
    finally:
        os.close(stderr_fd)  # the child has its own copy
    io = Stdio(proc)
    try:
        init = await io.call("initialize")
        assert init["result"]["serverInfo"]["name"] == "goald"
        assert init["result"]["protocolVersion"] == 1

        sid = (await io.call("session/new", {"model": "scripted:echo"}))["result"]["sessionId"]
        sub = await io.call("session/subscribe", {"sessionId": sid, "afterSeq": 0})
        assert sub["result"]["sessionId"] == sid
        prompt = await io.call("session/prompt", {"sessionId": sid, "text": "hello over stdio"})
        message_id = prompt["result"]["messageId"]

        # The echo's answer, then the session going idle, arrive as notifications.
        answered = False
        async with asyncio.timeout(WAIT):
            while True:
                note = await io.notification()
                params = note["params"]
                assert params["sessionId"] == sid
                if note["method"] == "session.event" and params["event"]["type"] == "message/queued":
                    assert message_id in json.dumps(params["event"]["data"])
                if note["method"] == "session.event" and params["event"]["type"] == "assistant/message":
                    assert "echo: hello over stdio" in json.dumps(params["event"]["data"])
                    answered = True
                if note["method"] == "session.status" and params["status"] == "idle" and answered:
                    break

        # Bad input on stdio is answered too, and the pipe keeps serving.
        await io.write(b"{not json\n")
        bad = await io.read()
        assert bad["id"] is None and bad["error"]["code"] == -32700
        unknown = await io.call("session/teleport", {})
        assert unknown["error"]["code"] == -32601
        health = await io.call("daemon/health")
        assert health["result"]["status"] == "serving"
        assert health["result"]["version"]

        # Closing stdin ends the daemon cleanly.
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.stdout is not None
        async with asyncio.timeout(WAIT):
            rest = await proc.stdout.read()
            code = await proc.wait()
        assert code == 0, stderr_path.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    # stdout carried only JSON-RPC lines; the logs went to stderr.
    for line in [*io.lines, *rest.splitlines(keepends=True)]:
        if line.strip():
            assert is_jsonrpc(json.loads(line)), line
    logs = stderr_path.read_text()
    assert "daemon serving" in logs
    assert '"jsonrpc"' not in logs


def test_serve_stdio_whose_stdout_cannot_be_served_stops_instead_of_running_without_it(tmp_path: Path) -> None:
    # A regular file is not a pipe: asyncio cannot serve it. The daemon used to log that and go on
    # serving only its socket, with no stdio client ever to come; now it shuts down.
    state = tmp_path / "state"
    config = tmp_path / "goald.toml"
    config.write_text(f'state_dir = "{state}"\nsandbox = "none"\n')
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        proc = subprocess.Popen(
            [*goald_argv(), "--config", str(config), "serve", "--stdio"],
            env=child_env(),
            stdin=subprocess.PIPE,  # kept open: the stop must not come from stdin's end
            stdout=out,
            stderr=err,
        )
    assert proc.stdin is not None
    try:
        proc.wait(WAIT)
    finally:
        proc.stdin.close()
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    assert "daemon stopped" in (tmp_path / "err").read_text()
    assert (tmp_path / "out").read_bytes() == b""
    assert not (state / "goald.sock").exists()
