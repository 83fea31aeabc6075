"""Run the real daemon as a subprocess for end-to-end tests, and drive it through the CLI and socket.

Readiness is observed the way systemd observes it: the test binds a datagram ``NOTIFY_SOCKET`` and
waits for ``READY=1`` (with a timeout) — no polling sleeps. The child can import the modules in
``tests/`` (e.g. ``goald_testmodels``, deterministic slow models for a ``scripted`` provider), and
its config may hold tables (``{"providers": {"test": {...}}}`` becomes ``[providers.test]``).
Those models announce each call they start on a second datagram socket (``Daemon.calls``), so a
test can wait until a model call is surely in flight before it stops the daemon.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
#: Config that gives a child the ``test:worker`` and ``test:chat`` models of ``goald_testmodels``
#: (priced, so that cost is counted like tokens).
TEST_MODELS: dict[str, Any] = {
    "providers": {
        "test": {
            "kind": "scripted",
            "script": "goald_testmodels:slow",
            "prices": {"worker": {"input": 2.0, "output": 8.0}, "chat": {"input": 1.0, "output": 4.0}},
        }
    }
}
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_text(config: dict[str, Any]) -> str:
    """``config`` as TOML: scalars and lists as values (a dict in a list as an inline table), nested
    dicts as tables."""
    lines: list[str] = []

    def key(name: str) -> str:
        return name if _BARE_KEY.match(name) else json.dumps(name)

    def value_text(value: Any) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"{key(k)} = {value_text(v)}" for k, v in value.items()) + "}"
        if isinstance(value, list):
            return "[" + ", ".join(value_text(v) for v in value) + "]"
        return json.dumps(value)

    def table(prefix: str, data: dict[str, Any]) -> None:
        if prefix:
            lines.append(f"[{prefix}]")
        for name, value in data.items():
            if not isinstance(value, dict):
                if value is None:
                    raise ValueError(f"TOML has no null (key {name!r})")
                lines.append(f"{key(name)} = {value_text(value)}")
        for name, value in data.items():
            if isinstance(value, dict):
                table(f"{prefix}.{key(name)}" if prefix else key(name), value)

    table("", config)
    return "\n".join(lines) + "\n"


def goald_argv() -> list[str]:
    """How to run the installed ``goald`` command with this interpreter."""
    return [sys.executable, "-m", "daemon"]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child goald: this one, the repo and ``tests/`` importable, no provider
    keys, no systemd variables (a test passes its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOALD_") and "API_KEY" not in k}
    path = os.pathsep.join([str(ROOT), str(TESTS)])
    env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        env.pop(name, None)
    env.update(extra or {})
    return env


class ModelCalls:
    """A datagram socket on which ``goald_testmodels`` announces each model call as it starts."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="gm-", dir="/tmp"))
        self.path = self._dir / "calls.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        #: Every announcement received so far.
        self.seen: list[str] = []

    @property
    def env(self) -> dict[str, str]:
        """The child's environment variable that names the socket."""
        return {"TESTMODELS_CALLS_SOCKET": str(self.path)}

    def wait(self, wanted: str, timeout: float = 30.0) -> str:
        """Block until a call whose announcement starts with ``wanted`` starts (raise on timeout).

        The kernel queues a few datagrams only (``net.unix.max_dgram_qlen``, often 10); later
        announcements are dropped while nobody reads, so wait for a call before many others start.
        """
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no model call {wanted!r} within {timeout}s (seen: {self.seen[-5:]})")
            self.sock.settimeout(left)
            try:
                text = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            self.seen.append(text)
            if text.startswith(wanted):
                return text

    def close(self) -> None:
        """Release the socket."""
        self.sock.close()
        self.path.unlink(missing_ok=True)
        self._dir.rmdir()


class Daemon:
    """One ``goald serve`` process on a state directory."""

    def __init__(self, state_dir: Path, *, config: dict[str, Any] | None = None) -> None:
        self.state_dir = state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = state_dir / "goald.toml"
        cfg = {"state_dir": str(state_dir), "log_level": "DEBUG", **(config or {})}
        self.config_path.write_text(toml_text(cfg))
        # AF_UNIX paths are short; keep the notify socket in a short temp dir.
        self._notify_dir = Path(tempfile.mkdtemp(prefix="gn-", dir="/tmp"))
        self.notify_path = self._notify_dir / "n.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.proc: subprocess.Popen[bytes] | None = None
        self.messages: list[str] = []
        #: Model calls of ``goald_testmodels`` models announce themselves here.
        self.calls = ModelCalls()
        self.stderr_path = state_dir / "stderr.log"

    @property
    def socket_path(self) -> Path:
        """The control socket."""
        return self.state_dir / "goald.sock"

    def start(self, *, extra_env: dict[str, str] | None = None, wait_ready: bool = True, timeout: float = 30.0) -> None:
        """Start the daemon (and wait for ``READY=1``)."""
        env = child_env({"NOTIFY_SOCKET": str(self.notify_path), **self.calls.env, **(extra_env or {})})
        self.messages.clear()
        # The child gets its own copy of the descriptor; ours is closed at once (left open, it is a
        # ResourceWarning when collected, which the suite's warnings-as-errors turns into a failure).
        with open(self.stderr_path, "ab") as stderr:
            self.proc = subprocess.Popen(
                [*goald_argv(), "--config", str(self.config_path), "serve"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        if wait_ready:
            self.wait_message("READY=1", timeout)

    def wait_message(self, wanted: str, timeout: float = 30.0) -> str:
        """Block until a notify datagram with the field ``wanted`` arrives (raise on timeout or exit).

        Datagrams already received (since the last :meth:`start`) count.
        """
        for msg in self.messages:
            if wanted in msg.split("\n"):
                return msg
        deadline = time.monotonic() + timeout
        while True:
            data = self.next_message(deadline - time.monotonic(), waiting_for=wanted)
            if wanted in data.split("\n"):
                return data

    def next_message(self, timeout: float = 30.0, *, waiting_for: str = "a notify datagram") -> str:
        """The next notify datagram, recorded in ``messages`` (raise on timeout, or if the daemon
        exited and nothing more is pending)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"no {waiting_for!r} from the daemon within {timeout:.1f}s; stderr:\n{self.stderr()}"
                )
            if self.proc is not None and self.proc.poll() is not None:
                pending = self.pending_message()
                if pending is None:
                    raise RuntimeError(f"the daemon exited with {self.proc.returncode}; stderr:\n{self.stderr()}")
                return pending
            self.notify.settimeout(min(left, 0.5))
            try:
                data = self.notify.recv(65536).decode()
            except TimeoutError:
                continue
            self.messages.append(data)
            return data

    def pending_message(self) -> str | None:
        """A notify datagram already received by the socket (recorded in ``messages``), or None."""
        self.notify.setblocking(False)
        try:
            data = self.notify.recv(65536).decode()
        except BlockingIOError:
            return None
        finally:
            self.notify.setblocking(True)
        self.messages.append(data)
        return data

    def stderr(self) -> str:
        """What the daemon logged."""
        return self.stderr_path.read_text(errors="replace")[-8000:] if self.stderr_path.exists() else ""

    def cli(self, *args: str, input: str | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``goald --config … ARGS`` and capture its output."""
        return subprocess.run(
            [*goald_argv(), "--config", str(self.config_path), *args],
            env=child_env(),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def cli_json(self, *args: str) -> Any:
        """Run a CLI command with ``--json`` and parse its stdout."""
        done = self.cli(*args, "--json")
        assert done.returncode == 0, f"goald {' '.join(args)} exited {done.returncode}: {done.stderr}"
        return json.loads(done.stdout)

    async def acli(self, *args: str, limit: float = 60.0) -> tuple[int, str, str]:
        """:meth:`cli` without blocking the event loop: ``(exit code, stdout, stderr)``."""
        proc = await asyncio.create_subprocess_exec(
            *goald_argv(),
            "--config",
            str(self.config_path),
            *args,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(limit):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def acli_json(self, *args: str) -> Any:
        """:meth:`cli_json` without blocking the event loop."""
        code, out, err = await self.acli(*args, "--json")
        assert code == 0, f"goald {' '.join(args)} exited {code}: {err}"
        return json.loads(out)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL and wait."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def close(self) -> None:
        """Stop the daemon if it still runs, and release the notify socket."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.notify.close()
        self.notify_path.unlink(missing_ok=True)
        self._notify_dir.rmdir()
        self.calls.close()


async def rpc(path: Path, method: str, params: dict[str, Any] | None = None) -> Any:
    """One call on a fresh connection."""
    from daemon.client import Connection as Client

    client = await Client.connect(path)
    try:
        return await client.call(method, params)
    finally:
        await client.close()


async def wait_goal(path: Path, goal_id: str, statuses: set[str], limit: float = 60.0) -> dict[str, Any]:
    """Subscribe to the goal's session and wait (with a timeout) until the goal is in ``statuses``."""
    from daemon.client import Connection as Client

    client = await Client.connect(path)
    try:
        goal = await client.call("goal/get", {"goalId": goal_id})
        await client.call("session/subscribe", {"sessionId": goal["sessionId"], "afterSeq": 0})
        async with asyncio.timeout(limit):
            while goal["status"] not in statuses:
                note = await client.next_notification()
                if note.get("method") == "session.event" and note["params"]["event"]["type"] == "goal/changed":
                    goal = await client.call("goal/get", {"goalId": goal_id})
        return goal
    finally:
        await client.close()


async def paused_at_rest(path: Path, goal_id: str, session_id: str, limit: float = 30.0) -> dict[str, Any]:
    """The paused goal once it is at rest: a round admitted before the pause has ended, the agent
    is idle, and the goal has recorded that round (``evaluatedSeq`` at or past its ``turn/end``;
    the ``goal/counted`` it writes then is the session's last event). Polls the goal's status,
    with a timeout."""
    async with asyncio.timeout(limit):
        while True:
            status = await rpc(path, "agent/status", {"sessionId": session_id})
            goal: dict[str, Any] = await rpc(path, "goal/get", {"goalId": goal_id})
            types = [(e["type"], e["seq"]) for e in await all_events(path, session_id)]
            ends = [seq for kind, seq in types if kind == "turn/end"]
            starts = sum(kind == "turn/start" for kind, _ in types)
            idle = status["status"] == "idle" and starts == len(ends)
            if idle and goal["evaluatedSeq"] >= max(ends, default=0):
                return goal
            await asyncio.sleep(0.05)


async def all_events(path: Path, session_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
    """Every event of a session after ``after_seq`` (``session/events``, page by page)."""
    from daemon.client import Connection as Client

    out: list[dict[str, Any]] = []
    async with await Client.connect(path) as client:
        while True:
            page = await client.call("session/events", {"sessionId": session_id, "afterSeq": after_seq, "limit": 500})
            out.extend(page["events"])
            if len(page["events"]) < 500:
                return out
            after_seq = page["lastSeq"]


def continuation_ids(events: list[dict[str, Any]], goal_id: str) -> set[str]:
    """Ids of a goal's continuations: queued with source ``goal`` and ref ``<goal_id>#<round>``."""
    return {
        e["data"]["messageId"]
        for e in events
        if e["type"] == "message/queued"
        and e["data"]["source"].get("kind") == "goal"
        and str(e["data"]["source"].get("ref", "")).startswith(goal_id + "#")
    }


def spend_of(event: dict[str, Any]) -> tuple[int, float]:
    """Tokens and cost an event records (what a goal's counters must add up to)."""
    d = event["data"]
    if event["type"] in ("assistant/message", "model/error"):
        return sum(int(v) for v in (d.get("usage") or {}).values()), float(d.get("cost") or 0.0)
    if event["type"] == "model/charged":
        return int(d.get("tokens") or 0), float(d.get("cost") or 0.0)
    return 0, 0.0


async def wait_events(
    d: Daemon, session_id: str, done: Callable[[list[dict[str, Any]]], bool], limit: float = 30.0
) -> list[dict[str, Any]]:
    """The session's events from the first, as soon as ``done(events)`` holds (raise on timeout)."""
    from daemon.client import Connection

    events: list[dict[str, Any]] = []
    async with await Connection.connect(d.socket_path) as client:
        await client.call("session/subscribe", {"sessionId": session_id, "afterSeq": 0})
        async with asyncio.timeout(limit):
            while not done(events):
                note = await client.next_notification()
                if note["method"] == "session.event":
                    events.append({"seq": note["params"]["seq"], **note["params"]["event"]})
    return events
