"""The ``shell`` tool: a command in the sandbox, its own process group, exit code and both streams.

Pinned here: a timeout kills the whole command, a grandchild that ignores SIGTERM included (with
bubblewrap, and unconfined with ``sandbox = "none"``); output over the cap is cut with a marker;
secret values never reach the stored ``tool/result``; a daemon without a sandbox does not offer
the tool and a call to it says why.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sandboxkit import sandbox_in

from agent import (
    EventType,
    ModelRegistry,
    Redactor,
    Reply,
    Runtime,
    Sandbox,
    SandboxUnavailable,
    ScriptedModel,
    Shell,
    ToolCall,
    ToolContext,
    ToolRegistry,
    file_tools,
)
from agent.sandbox import Network

needs_bwrap = pytest.mark.needs_bwrap
SECRET = "ghp_9Qm2vX7tLr4Ks8Zw1Nb6"


def bwrap_sandbox(workdir: Path, **kw: Any) -> Sandbox:
    return sandbox_in(workdir, **kw)


def per_call(kind: str, **kw: Any) -> Callable[[ToolContext], Sandbox]:
    """A sandbox source like the daemon's: built for each call from the session's work directory."""

    def make(ctx: ToolContext) -> Sandbox:
        if ctx.workdir is None:
            raise SandboxUnavailable("this session has no work directory")
        if kind == "none":
            return Sandbox.none(ctx.workdir, kill_grace=0.3, **kw)
        return bwrap_sandbox(ctx.workdir, **kw)

    return make


def ctx_in(workdir: Path | None) -> ToolContext:
    return ToolContext(session_id="s", turn_id="t", call_id="c", workdir=workdir)


def processes_named(marker: str) -> list[int]:
    """PIDs whose command line contains ``marker`` (other than this test process)."""
    return [
        int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid() and marker.encode() in cmdline(e)
    ]


def cmdline(pid: int | str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


async def exited(pid: int, marker: str, limit: float = 10.0) -> None:
    """Wait (with a time limit) until ``pid`` — while it is the process named ``marker`` — has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if marker.encode() not in cmdline(pid):
            return  # a zombie has no command line, or the PID belongs to another process by now
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, done.set)  # a pidfd reads ready once its process has exited
        try:
            async with asyncio.timeout(limit):
                await done.wait()
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


def stored_bytes(db_path: Path) -> list[bytes]:
    """The raw bytes of the database and its write-ahead log."""
    files = [db_path, db_path.with_name(db_path.name + "-wal")]
    return [f.read_bytes() for f in files if f.exists()]


@needs_bwrap
async def test_exit_code_and_both_streams(tmp_path: Path) -> None:
    registry = ToolRegistry([Shell(per_call("bwrap"))])
    ok = await registry.call("shell", {"command": "echo out; echo err >&2"}, ctx_in(tmp_path))
    assert ok.content == "exit code: 0\n--- stdout ---\nout\n--- stderr ---\nerr"
    assert not ok.is_error
    bad = await registry.call("shell", {"command": "exit 3"}, ctx_in(tmp_path))
    assert bad.content == "exit code: 3\n(no output)" and bad.is_error
    missing = await registry.call("shell", {"command": "true"}, ctx_in(None))
    assert missing.is_error and missing.content == "shell is not available: this session has no work directory"


@needs_bwrap
async def test_a_timeout_kills_a_grandchild_that_ignores_sigterm(db_path: Path, tmp_path: Path) -> None:
    """Through a real runtime: the model's call times out, the result says so, nothing is left running."""
    marker = f"goald-shell-tmo-{os.getpid()}"
    command = f"(trap '' TERM; exec -a {marker} sleep 600) & echo started; wait"
    model = ScriptedModel([Reply.call("shell", command=command, timeout_seconds=0.5), Reply.say("done")])
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    shell = Shell(per_call("bwrap"), default_timeout=30)
    async with Runtime.open(db_path, models=registry, tools=lambda row: ToolRegistry([shell])) as rt:
        sid = await rt.create_session(workdir=tmp_path)
        agent = await rt.agent(sid)
        await agent.followup("run it")
        async with asyncio.timeout(30):
            await agent.when_idle()
        events = await rt.store.events_after(sid, 0)
    model.assert_done()
    [result] = [e for e in events if e.type == EventType.TOOL_RESULT]
    assert result.data["isError"]
    assert result.data["content"] == (
        "timed out after 0.5s: the command and every process it started were killed\n--- stdout ---\nstarted"
    )
    # bwrap has exited, so its PID namespace is empty: no wait is needed to see the grandchild gone.
    assert processes_named(marker) == []


async def test_unconfined_timeout_kills_the_process_group(tmp_path: Path) -> None:
    """``sandbox = "none"``: the command's own process group, SIGTERM then SIGKILL to all of it."""
    marker = f"goald-shell-none-{os.getpid()}"
    registry = ToolRegistry([Shell(per_call("none"))])
    command = f"(trap '' TERM; exec -a {marker} sleep 600) & echo $! > child.pid; trap '' TERM; sleep 600"
    out = await registry.call("shell", {"command": command, "timeout_seconds": 0.5}, ctx_in(tmp_path))
    assert out.is_error and out.content.startswith("timed out after 0.5s")
    await exited(int((tmp_path / "child.pid").read_text()), marker)


@needs_bwrap
async def test_output_over_the_cap_is_truncated_with_the_marker(tmp_path: Path) -> None:
    registry = ToolRegistry([Shell(per_call("bwrap"), output_cap=2000)])
    command = "echo begin; seq 1 100000; echo end; seq 1 50000 >&2"
    out = await registry.call("shell", {"command": command}, ctx_in(tmp_path))
    stdout, stderr = out.content.split("--- stderr ---")
    assert stdout.startswith("exit code: 0\n--- stdout ---\nbegin\n1\n2\n")
    assert stdout.rstrip().endswith("99999\n100000\nend")
    total = len("begin\nend\n") + sum(len(f"{i}\n") for i in range(1, 100001))
    assert f"[... output truncated: {total} bytes in all; the middle is not shown ...]" in stdout
    assert "[... output truncated:" in stderr and stderr.rstrip().endswith("50000")
    assert len(out.content) < 2000 + 300
    assert not out.is_error


@needs_bwrap
async def test_the_timeout_asked_for_is_capped_by_the_tools_limit(tmp_path: Path) -> None:
    registry = ToolRegistry([Shell(per_call("bwrap"), default_timeout=0.5, max_timeout=0.5)])
    out = await registry.call("shell", {"command": "sleep 600", "timeout_seconds": 3600}, ctx_in(tmp_path))
    assert out.content.startswith("timed out after 0.5s")


@needs_bwrap
async def test_secrets_never_reach_the_stored_tool_results(db_path: Path, tmp_path: Path) -> None:
    """The goal's secret is in the command's environment; every way of printing it is redacted, and
    the registry's redactor also covers other tools (a file holding a provider key)."""
    provider_key = "sk-provider-4f9a8b7c6d"
    (tmp_path / "leaked.txt").write_text(f"key={provider_key}\n")
    model = ScriptedModel(
        [
            Reply(
                tool_calls=[
                    ToolCall("shell", {"command": 'echo "$GIT_TOKEN"; env | grep GIT_; echo "$GIT_TOKEN" >&2'}, id="a")
                ]
            ),
            Reply(
                tool_calls=[ToolCall("shell", {"command": 'printf %s "$GIT_TOKEN" > t.txt; cat t.txt; exit 1'}, id="b")]
            ),
            Reply(
                tool_calls=[
                    ToolCall("read_file", {"path": "leaked.txt"}, id="c"),
                    ToolCall("read_file", {"path": "t.txt"}, id="d"),
                ]
            ),
            Reply.say("done"),
        ]
    )
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    redactor = Redactor([provider_key, SECRET])
    shell = Shell(per_call("bwrap", secrets={"GIT_TOKEN": SECRET}))
    tools = lambda row: ToolRegistry([*file_tools(), shell], redactor=redactor)  # noqa: E731
    async with Runtime.open(db_path, models=registry, tools=tools) as rt:
        sid = await rt.create_session(workdir=tmp_path)
        agent = await rt.agent(sid)
        await agent.followup("print the token")
        async with asyncio.timeout(30):
            await agent.when_idle()
        events = await rt.store.events_after(sid, 0)
    model.assert_done()
    results = {e.data["toolUseId"]: e.data["content"] for e in events if e.type == EventType.TOOL_RESULT}
    assert results == {
        "a": "exit code: 0\n--- stdout ---\n[redacted]\nGIT_TOKEN=[redacted]\n--- stderr ---\n[redacted]",
        "b": "exit code: 1\n--- stdout ---\n[redacted]",
        "c": "key=[redacted]\n",
        "d": "[redacted]",
    }
    raw = b"".join(stored_bytes(db_path))
    assert SECRET.encode() not in raw and provider_key.encode() not in raw
    # The file the command wrote really holds the secret: the sandbox gave it, only the output is redacted.
    assert (tmp_path / "t.txt").read_text() == SECRET


async def test_without_a_sandbox_the_shell_is_not_offered_and_a_call_says_why(tmp_path: Path) -> None:
    why = "'bwrap' (bubblewrap) is not installed or not on PATH; install bubblewrap, or set sandbox = \"none\""
    registry = ToolRegistry(list(file_tools()), unavailable={"shell": why})
    assert "shell" not in [s.name for s in registry.specs()]
    out = await registry.call("shell", {"command": "id"}, ctx_in(tmp_path))
    assert out.is_error
    assert out.content == f"the tool 'shell' is not available here: {why}"
    unknown = await registry.call("nope", {}, ctx_in(tmp_path))
    assert unknown.content.startswith("unknown tool 'nope'")


# -- how the daemon wires it ---------------------------------------------------------------------


def build_host(tmp_path: Path, **settings: Any) -> tuple[Any, list[Any]]:
    """A daemon host (not running) whose sandbox profile was detected as at start, and its log records."""
    from loguru import logger

    from daemon.host import Host
    from daemon.settings import load_settings, sandbox_profile

    records: list[Any] = []
    sink = logger.add(lambda message: records.append(message.record), level="INFO")
    try:
        conf = load_settings(None, state_dir=str(tmp_path / "state"), **settings)
        host = Host(conf)
        host.sandboxing = sandbox_profile(conf)
    finally:
        logger.remove(sink)
    return host, records


def session_row(workdir: Path) -> Any:
    from agent import SessionId, SessionRow

    return SessionRow(id=SessionId.new(), workdir=str(workdir), created_at="2025-01-06T09:00:00+00:00")


async def test_a_daemon_without_bwrap_logs_an_error_offers_no_shell_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-bwrap-here"))
    host, records = build_host(tmp_path)
    errors = [r["message"] for r in records if r["level"].name == "ERROR"]
    assert len(errors) == 1 and "bubblewrap" in errors[0] and "not offered" in errors[0]
    tools = host._resolve(session_row(tmp_path)).tools
    assert "shell" not in [s.name for s in tools.specs()] and "read_file" in [s.name for s in tools.specs()]
    out = await tools.call("shell", {"command": "id"}, ctx_in(tmp_path))
    assert out.is_error
    assert out.content.startswith("the tool 'shell' is not available here: 'bwrap' (bubblewrap) is not installed")
    assert 'set sandbox = "none"' in out.content


async def test_sandbox_none_is_a_warning_and_the_shell_is_offered(tmp_path: Path) -> None:
    host, records = build_host(tmp_path, sandbox="none")
    warnings = [r["message"] for r in records if r["level"].name == "WARNING"]
    assert warnings == ['sandbox = "none": shell and verification commands run unconfined, as the daemon\'s user']
    assert "shell" in [s.name for s in host._resolve(session_row(tmp_path)).tools.specs()]


@needs_bwrap
def test_the_daemon_hides_its_own_paths_and_names_each_goals_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "git-token").write_text(SECRET + "\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    monkeypatch.setenv("GOALD_TEST_DB_URL", "postgres://r:pw@h/db")
    run_dir = tmp_path / "run"
    secrets = {"GIT_TOKEN": {"credential": "git-token"}, "DB_URL": {"env": "GOALD_TEST_DB_URL"}}
    host, records = build_host(
        tmp_path,
        socket=str(run_dir / "goald.sock"),
        database=str(tmp_path / "db" / "goald.db"),
        workdir_roots=[str(tmp_path / "roots" / "a"), str(tmp_path / "roots" / "b")],
        goal_sandbox={"reports": {"network": True, "secrets": secrets}, "missing": {"secrets": {"X": {"env": "NOPE"}}}},
    )
    profile = host.sandboxing
    assert profile.unavailable is None and profile.bwrap is not None
    assert {tmp_path / "state", tmp_path / "db", run_dir, creds} <= set(profile.hidden)
    assert profile.roots == (tmp_path / "roots" / "a", tmp_path / "roots" / "b")
    assert dict(profile.policies["reports"].secrets) == {"GIT_TOKEN": SECRET, "DB_URL": "postgres://r:pw@h/db"}
    assert profile.policies["reports"].network == Network("host")  # true, as before: "host"
    assert dict(profile.policies["missing"].secrets) == {}
    errors = [r["message"] for r in records if r["level"].name == "ERROR"]
    assert errors == ["tool secret X of goal 'missing' has no value (environment variable NOPE); left unset"]
    assert profile.redactor.redact(f"{SECRET} postgres://r:pw@h/db") == "[redacted] [redacted]"
    assert SECRET not in " ".join(str(r["message"]) for r in records)
