"""MCP servers as tools, against a real stdio MCP server written with the official SDK
(tests/mcp_fixture_server.py): listing, calls, errors, a server killed mid-session, a session's turn."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness import Daemon, all_events
from sandboxkit import sandbox_python

from agent import EventType, Reply, ScriptedModel, ToolContext, ToolRegistry
from agent.sandbox import Sandbox, SandboxUnavailable, detect_bwrap
from agent.tools.mcp import McpServer, McpServers
from agent.tools.mcp_tool import McpTool, tool_name
from daemon.client import Connection as Client
from daemon.mcp_servers import build_mcp_servers
from daemon.settings import ConfigError, load_settings

FIXTURE = Path(__file__).resolve().parents[1] / "mcp_fixture_server.py"
#: The interpreter itself, outside any virtualenv.
BASE_PYTHON = os.path.realpath(sys.executable)
CRASHED = "MCP server fixture crashed during the call; restarted; retry if the call is safe"


def ctx() -> ToolContext:
    return ToolContext(session_id="s", turn_id="t", call_id="c")


def fixture_server(**kw: object) -> McpServer:
    return McpServer("fixture", [sys.executable, str(FIXTURE)], **kw)  # type: ignore[arg-type]


@pytest.fixture
async def server() -> AsyncIterator[McpServer]:
    async with fixture_server(env={"FIXTURE_GREETING": "hello from config"}) as srv:
        yield srv


async def registry_of(server: McpServer) -> ToolRegistry:
    return ToolRegistry(list(await server.tools()))


async def server_pid(reg: ToolRegistry) -> int:
    out = await reg.call("fixture__pid", {}, ctx())
    assert not out.is_error, out.content
    return int(out.content)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_tools_are_listed_with_the_server_prefix_and_its_schemas(server: McpServer) -> None:
    assert server.starts == 0  # started lazily, on first use
    tools = await server.tools()
    assert server.starts == 1 and server.running
    by_name = {t.name: t for t in tools}
    assert set(by_name) == {f"fixture__{n}" for n in ("add", "count", "pid", "env", "fail", "hang")}
    add = by_name["fixture__add"]
    assert isinstance(add, McpTool) and add.remote_name == "add"
    spec = add.spec()
    assert spec.description == "Add two integers and say the sum."
    assert spec.input_schema["required"] == ["a", "b"]
    assert spec.input_schema["properties"]["a"]["type"] == "integer"
    # The server marked `add` read-only, so repeating it after an unknown outcome is harmless.
    assert add.repeat_safe and not by_name["fixture__count"].repeat_safe
    # Listing again reuses the running process.
    await server.tools()
    assert server.starts == 1


def test_tool_names_are_safe_for_every_provider() -> None:
    assert tool_name("files", "read.file/v2") == "files__read_file_v2"
    assert len(tool_name("s", "x" * 100)) == 64
    with pytest.raises(ValueError, match="single '_'"):
        McpServer("bad__name", ["true"])
    with pytest.raises(ValueError, match="empty"):
        McpServer("ok", [])


async def test_a_call_passes_arguments_and_env_and_returns_text(server: McpServer) -> None:
    reg = await registry_of(server)
    out = await reg.call("fixture__add", {"a": 20, "b": 22}, ctx())
    assert (out.content, out.is_error) == ("20 + 22 = 42", False)
    out = await reg.call("fixture__env", {"name": "FIXTURE_GREETING"}, ctx())
    # The value reached the server (only its exact value is replaced), and, as every value of a
    # server's environment may be a token, it is redacted from what the server returns.
    assert out.content == "[redacted]"
    out = await reg.call("fixture__env", {"name": "NOT_SET_HERE"}, ctx())
    assert out.content == "(unset)"


async def test_tool_errors_come_back_as_error_results(server: McpServer) -> None:
    reg = await registry_of(server)
    out = await reg.call("fixture__fail", {"reason": "not today"}, ctx())
    assert out.is_error and "refused: not today" in out.content
    # Arguments are checked by the server against the schema it published.
    out = await reg.call("fixture__add", {"a": "many"}, ctx())
    assert out.is_error and "add" in out.content
    # A tool the server does not have (e.g. gone since the listing).
    out = await server.call("nope", {})
    assert out.is_error and "nope" in out.content
    # None of this disturbed the server.
    assert server.starts == 1 and server.running


async def test_server_killed_during_a_call_is_restarted_and_the_call_says_so(server: McpServer, tmp_path: Path) -> None:
    reg = await registry_of(server)
    assert (await reg.call("fixture__count", {}, ctx())).content == "call 1"
    inside: asyncio.Queue[int] = asyncio.Queue()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await inside.put(int(await reader.readline()))
        writer.close()
        await writer.wait_closed()

    address = str(tmp_path / "hang.sock")
    listener = await asyncio.start_unix_server(on_connect, address)
    async with listener:
        call = asyncio.create_task(reg.call("fixture__hang", {"address": address}, ctx()))
        async with asyncio.timeout(30):
            pid = await inside.get()  # the server is inside the call
        os.kill(pid, signal.SIGKILL)
        out = await asyncio.wait_for(call, 30)
    assert (out.content, out.is_error) == (CRASHED, True)
    # Restarted before that answer: a new process, with fresh state, serving the next call.
    assert server.starts == 2 and server.running
    new_pid = await server_pid(reg)
    assert new_pid != pid and gone(pid)
    assert (await reg.call("fixture__count", {}, ctx())).content == "call 1"


async def test_server_killed_between_calls_then_called(server: McpServer) -> None:
    reg = await registry_of(server)
    pid = await server_pid(reg)
    os.kill(pid, signal.SIGKILL)
    # Called at once: the request meets the dead server, so the call cannot know what happened.
    out = await reg.call("fixture__add", {"a": 1, "b": 2}, ctx())
    assert (out.content, out.is_error) == (CRASHED, True)
    # The next call is served by the restarted server.
    out = await reg.call("fixture__add", {"a": 1, "b": 2}, ctx())
    assert (out.content, out.is_error) == ("1 + 2 = 3", False)
    assert server.starts == 2 and await server_pid(reg) != pid


async def test_server_seen_dead_while_idle_is_restarted_before_the_call(server: McpServer) -> None:
    reg = await registry_of(server)
    pid = await server_pid(reg)
    os.kill(pid, signal.SIGKILL)
    async with asyncio.timeout(30):
        await server.wait_lost()
    assert not server.running
    # The call never reached the dead server, so it goes to a new one instead of failing.
    out = await reg.call("fixture__add", {"a": 2, "b": 2}, ctx())
    assert (out.content, out.is_error) == ("2 + 2 = 4", False)
    assert server.starts == 2 and await server_pid(reg) != pid


async def test_a_server_that_cannot_start_gives_a_clear_error(tmp_path: Path) -> None:
    async with McpServer("missing", [str(tmp_path / "no-such-server")]) as srv:
        out = await srv.call("anything", {})
    assert out.is_error and out.content.startswith("MCP server missing could not start: command not found")
    script = "import sys; sys.stderr.write('config file is broken\\n'); sys.exit(3)"
    async with McpServer("broken", [sys.executable, "-c", script]) as srv:
        out = await srv.call("anything", {})
        assert out.is_error and "could not start" in out.content
        assert out.content.endswith("its stderr ended with:\nconfig file is broken")
        assert not srv.running and srv.cached_tools() == []


async def test_a_server_that_never_answers_times_out_at_start() -> None:
    # Reads the handshake (and everything else) and never answers.
    async with McpServer("mute", [sys.executable, "-c", "import sys; sys.stdin.read()"], start_timeout=0.5) as srv:
        out = await srv.call("anything", {})
    assert out.is_error and out.content == "MCP server mute could not start: no answer within 0.5s"


async def test_close_stops_the_process_and_later_calls_say_so() -> None:
    srv = fixture_server()
    reg = await registry_of(srv)
    pid = await server_pid(reg)
    await srv.aclose()
    assert gone(pid)
    out = await reg.call("fixture__add", {"a": 1, "b": 1}, ctx())
    assert (out.content, out.is_error) == ("MCP server fixture is shut down", True)


async def test_wrap_rewrites_the_command() -> None:
    async with fixture_server(wrap=lambda argv: ["env", "WRAPPED=yes", *argv]) as srv:
        out = await srv.call("env", {"name": "WRAPPED"})
    assert out.content == "yes"


async def test_servers_start_together_and_a_broken_one_offers_nothing(tmp_path: Path) -> None:
    servers = McpServers([fixture_server(), McpServer("missing", [str(tmp_path / "nothing")])])
    async with servers:
        assert servers.servers[0].running
        names = {t.name for t in servers.tools()}
        assert "fixture__add" in names and not any(n.startswith("missing__") for n in names)
    assert not servers.servers[0].running


async def test_a_session_offers_the_tools_and_a_turn_calls_one(open_runtime, server: McpServer) -> None:
    model = ScriptedModel([Reply.call("fixture__add", a=40, b=2), Reply.say("the sum is 42")])
    async with open_runtime(model, tools=await server.tools()) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("add 40 and 2")
        async with asyncio.timeout(30):
            await agent.when_idle()
        events = await rt.store.events_after(sid, 0)
    model.assert_done()
    offered = {spec.name: spec for spec in model.calls[0].request.tools}
    assert "fixture__add" in offered
    assert offered["fixture__add"].input_schema["required"] == ["a", "b"]
    results = [e.data for e in events if e.type == EventType.TOOL_RESULT]
    assert [(r["name"], r["content"], r["isError"]) for r in results] == [("fixture__add", "40 + 2 = 42", False)]
    # The model saw the server's answer in its next prompt.
    assert "40 + 2 = 42" in str(model.calls[1].request.messages[-1])


# A stdlib-only MCP server (the wire format by hand), for the bwrap sandbox: its private /tmp hides a
# virtualenv that lives under /tmp, and with it the SDK.
PLAIN_SERVER = r"""
import json, os, sys

TOOLS = [
    {"name": "look", "description": "What the server sees.",
     "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "die", "description": "Exit at once.", "inputSchema": {"type": "object", "properties": {}}},
]

def look(path):
    home = os.environ.get("HOME", "")
    try:
        with open(os.path.join(home, "probe"), "w") as fh:
            fh.write("x")
        home_writable = True
    except OSError:
        home_writable = False
    return {"pid": os.getpid(), "home": home, "cwd": os.getcwd(), "homeWritable": home_writable,
            "exists": os.path.exists(path), "greeting": os.environ.get("FIXTURE_GREETING")}

for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg or "method" not in msg:
        continue
    method, params = msg["method"], msg.get("params") or {}
    reply = {"jsonrpc": "2.0", "id": msg["id"]}
    if method == "initialize":
        reply["result"] = {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                           "serverInfo": {"name": "plain", "version": "1"}}
    elif method == "tools/list":
        reply["result"] = {"tools": TOOLS}
    elif method == "tools/call" and params["name"] == "die":
        os._exit(3)
    elif method == "tools/call" and params["name"] == "look":
        text = json.dumps(look(params["arguments"]["path"]))
        reply["result"] = {"content": [{"type": "text", "text": text}], "isError": False}
    else:
        reply["error"] = {"code": -32601, "message": "Method not found"}
    print(json.dumps(reply), flush=True)
"""


async def test_a_server_in_the_bwrap_sandbox_is_confined_and_restarted(tmp_path: Path) -> None:
    try:
        found = await asyncio.to_thread(detect_bwrap)
    except SandboxUnavailable as exc:
        pytest.skip(f"no usable bubblewrap here: {exc}")
    python = BASE_PYTHON
    if python.startswith("/tmp/"):
        pytest.skip("the interpreter lives under /tmp, which the sandbox replaces")
    home = tmp_path / "mcp-home"
    state = tmp_path / "state"
    home.mkdir()
    state.mkdir()
    (state / "goald.db").write_text("not for the server")
    (home / "server.py").write_text(PLAIN_SERVER)
    # The interpreter's installation is shown read-only: the sandbox shows only system directories.
    box = Sandbox(
        home,
        hidden=(state,),
        env={"FIXTURE_GREETING": "inside"},
        bwrap=found.path,
        disable_userns=found.disable_userns,
        read_only=(Path(sys.base_prefix),),
    )
    async with McpServer("boxed", [python, str(home / "server.py")], wrap=box.argv) as srv:
        reg = await registry_of(srv)
        assert reg.names == ["boxed__look", "boxed__die"]
        out = await reg.call("boxed__look", {"path": str(state / "goald.db")}, ctx())
        seen = json.loads(out.content)
        assert seen["pid"] <= 3  # its own PID namespace
        assert (seen["home"], seen["cwd"], seen["homeWritable"]) == (str(home), str(home), True)
        assert seen["exists"] is False and seen["greeting"] == "inside"
        out = await reg.call("boxed__die", {}, ctx())
        assert (out.content, out.is_error) == (CRASHED.replace("fixture", "boxed"), True)
        out = await reg.call("boxed__look", {"path": str(home / "probe")}, ctx())
        assert json.loads(out.content)["exists"] is True and srv.starts == 2


async def test_the_daemon_puts_each_server_in_a_sandbox_of_its_own(tmp_path: Path) -> None:
    try:
        await asyncio.to_thread(detect_bwrap)
    except SandboxUnavailable as exc:
        pytest.skip(f"no usable bubblewrap here: {exc}")
    if BASE_PYTHON.startswith("/tmp/"):
        pytest.skip("the interpreter lives under /tmp, which the sandbox replaces")
    state = tmp_path / "state"
    home = state / "mcp" / "plain"
    home.mkdir(parents=True)
    (home / "server.py").write_text(PLAIN_SERVER)
    (state / "goald.db").write_text("not for the server")
    python, env, shown = sandbox_python(home / "server.py")
    settings = load_settings(
        None,
        state_dir=state,
        sandbox="bwrap",
        mcp_servers={
            "plain": {
                "command": [python, str(home / "server.py")],
                "env": {"FIXTURE_GREETING": "configured", **env},
                "read_only_paths": [p for p in shown if not Path(p).is_relative_to(state)],
            }
        },
    )
    async with await build_mcp_servers(settings) as servers:
        reg = ToolRegistry(list(servers.tools()))
        seen = json.loads((await reg.call("plain__look", {"path": str(state / "goald.db")}, ctx())).content)
    # Its home is its own directory; the rest of the state directory is hidden from it.
    assert (seen["home"], seen["homeWritable"], seen["exists"]) == (str(home), True, False)
    # The configured value reached the server, and came back redacted.
    assert seen["greeting"] == "[redacted]" and seen["pid"] <= 3


def test_settings_name_mcp_servers_and_mask_their_env() -> None:
    settings = load_settings(
        None, mcp_servers={"files": {"command": ["mcp-files", "/srv"], "env": {"TOKEN": "s3cret"}}}
    )
    files = settings.mcp_servers["files"]
    assert (files.command, files.env, files.network, files.timeout_seconds) == (
        ["mcp-files", "/srv"],
        {"TOKEN": "s3cret"},
        False,
        60.0,
    )
    assert settings.masked()["mcp_servers"]["files"]["env"] == {"TOKEN": "********"}
    with pytest.raises(ConfigError, match="MCP server name 'a__b'"):
        load_settings(None, mcp_servers={"a__b": {"command": ["x"]}})
    with pytest.raises(ConfigError, match=r"mcp_servers\.x\.command"):
        load_settings(None, mcp_servers={"x": {"command": []}})


async def test_the_daemon_offers_configured_servers_to_sessions(tmp_path: Path) -> None:
    config = {
        "sandbox": "none",  # the virtualenv (with the SDK) may live under /tmp, which bwrap replaces
        "providers": {"mcp": {"kind": "scripted", "script": "mcp_fixture_server:models"}},
        "mcp_servers": {"fixture": {"command": [sys.executable, str(FIXTURE)]}},
    }
    daemon = Daemon(tmp_path / "state", config=config)
    try:
        await asyncio.to_thread(daemon.start)
        async with await Client.connect(daemon.socket_path) as client:
            session = await client.call("session/new", {"model": "mcp:caller"})
            sid = session["sessionId"]
            await client.call("session/subscribe", {"sessionId": sid, "afterSeq": 0})
            await client.call("session/prompt", {"sessionId": sid, "text": "add 2 and 3"})
            async with asyncio.timeout(60):
                while True:
                    note = await client.next_notification()
                    if note.get("method") == "session.event" and note["params"]["event"]["type"] == "turn/end":
                        break
        events = await all_events(daemon.socket_path, sid)
        results = [(e["data"]["name"], e["data"]["content"]) for e in events if e["type"] == "tool/result"]
        assert results[0] == ("fixture__add", "2 + 3 = 5")
        assert results[1][0] == "fixture__pid"
        pid = int(results[1][1])
        assert not gone(pid)
        assert await asyncio.to_thread(daemon.terminate) == 0
        assert gone(pid)  # the daemon stopped its server on the way out
    finally:
        daemon.close()


async def test_a_servers_secret_is_on_no_command_line_and_never_stored(tmp_path: Path) -> None:
    try:
        await asyncio.to_thread(detect_bwrap)
    except SandboxUnavailable as exc:
        pytest.skip(f"no usable bubblewrap here: {exc}")
    token = "mcp-token-7e51c0-do-not-store"
    python, env, shown = sandbox_python(FIXTURE)
    config = {
        "sandbox": "bwrap",
        "providers": {"sbx": {"kind": "scripted", "script": "sandbox_testmodels:models"}},
        "mcp_servers": {
            "fixture": {
                "command": [python, str(FIXTURE)],
                "env": {"FIXTURE_TOKEN": token, **env},
                # The interpreter, the virtualenv with the SDK, and the server's script.
                "read_only_paths": shown,
            }
        },
    }
    daemon = Daemon(tmp_path / "state", config=config)
    try:
        await asyncio.to_thread(daemon.start)
        async with await Client.connect(daemon.socket_path) as client:
            session = await client.call("session/new", {"model": "sbx:leaker"})
            sid = session["sessionId"]
            await client.call("session/subscribe", {"sessionId": sid, "afterSeq": 0})
            # The server runs (the daemon starts servers before READY): no command line holds the token.
            holders = [pid for pid in os.listdir("/proc") if pid.isdigit() and token.encode() in cmdline(pid)]
            assert holders == []
            assert any(b"mcp_fixture_server.py" in cmdline(pid) for pid in os.listdir("/proc") if pid.isdigit())
            await client.call("session/prompt", {"sessionId": sid, "text": "what is the token?"})
            async with asyncio.timeout(60):
                while True:
                    note = await client.next_notification()
                    if note.get("method") == "session.event" and note["params"]["event"]["type"] == "turn/end":
                        break
        events = await all_events(daemon.socket_path, sid)
        assert await asyncio.to_thread(daemon.terminate) == 0
    finally:
        daemon.close()
    results = [(e["data"]["name"], e["data"]["content"]) for e in events if e["type"] == "tool/result"]
    # The server printed the token; what was stored (and what the model read) is its redaction.
    assert results == [("fixture__env", "[redacted]")]
    assert token not in json.dumps(events)
    assert token not in (tmp_path / "state" / "stderr.log").read_text()


def cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""
