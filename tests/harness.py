"""Run the real daemon as a subprocess for end-to-end tests, and drive it through the CLI and socket.

Readiness is observed the way systemd observes it: the test binds a datagram ``NOTIFY_SOCKET`` and
waits for ``READY=1`` (with a timeout) — no polling sleeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def goald_argv() -> list[str]:
    """How to run the installed ``goald`` command with this interpreter."""
    return [sys.executable, "-m", "daemon"]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child goald: this one, the repo importable, no provider keys."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOALD_") and "API_KEY" not in k}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("NOTIFY_SOCKET", None)
    env.update(extra or {})
    return env


class Daemon:
    """One ``goald serve`` process on a state directory."""

    def __init__(self, state_dir: Path, *, config: dict[str, Any] | None = None) -> None:
        self.state_dir = state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = state_dir / "goald.toml"
        cfg = {"state_dir": str(state_dir), "log_level": "DEBUG", **(config or {})}
        self.config_path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in cfg.items()))
        # AF_UNIX paths are short; keep the notify socket in a short temp dir.
        self._notify_dir = Path(tempfile.mkdtemp(prefix="gn-", dir="/tmp"))
        self.notify_path = self._notify_dir / "n.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.proc: subprocess.Popen[bytes] | None = None
        self.messages: list[str] = []
        self.stderr_path = state_dir / "stderr.log"

    @property
    def socket_path(self) -> Path:
        """The control socket."""
        return self.state_dir / "goald.sock"

    def start(self, *, extra_env: dict[str, str] | None = None, wait_ready: bool = True, timeout: float = 30.0) -> None:
        """Start the daemon (and wait for ``READY=1``)."""
        env = child_env({"NOTIFY_SOCKET": str(self.notify_path), **(extra_env or {})})
        self.messages.clear()
        self.proc = subprocess.Popen(
            [*goald_argv(), "--config", str(self.config_path), "serve"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.stderr_path, "ab"),  # noqa: SIM115 - the child owns it
            start_new_session=True,
        )
        if wait_ready:
            self.wait_message("READY=1", timeout)

    def wait_message(self, wanted: str, timeout: float = 30.0) -> str:
        """Block until a notify datagram containing ``wanted`` arrives (raise on timeout or exit)."""
        deadline = time.monotonic() + timeout
        for msg in self.messages:
            if wanted in msg.split("\n"):
                return msg
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {wanted!r} from the daemon within {timeout}s; stderr:\n{self.stderr()}")
            if self.proc is not None and self.proc.poll() is not None and not self._pending():
                raise RuntimeError(f"the daemon exited with {self.proc.returncode}; stderr:\n{self.stderr()}")
            self.notify.settimeout(min(left, 0.5))
            try:
                data = self.notify.recv(65536).decode()
            except TimeoutError:
                continue
            self.messages.append(data)
            if wanted in data.split("\n"):
                return data

    def _pending(self) -> bool:
        self.notify.setblocking(False)
        try:
            data = self.notify.recv(65536).decode()
        except BlockingIOError:
            return False
        finally:
            self.notify.setblocking(True)
        self.messages.append(data)
        return True

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
        for p in (self.notify_path,):
            p.unlink(missing_ok=True)
        self._notify_dir.rmdir()


async def rpc(path: Path, method: str, params: dict[str, Any] | None = None) -> Any:
    """One call on a fresh connection."""
    from daemon.client import Client

    client = await Client.connect(path)
    try:
        return await client.call(method, params)
    finally:
        await client.close()


async def wait_goal(path: Path, goal_id: str, statuses: set[str], limit: float = 60.0) -> dict[str, Any]:
    """Subscribe to the goal's session and wait (with a timeout) until the goal is in ``statuses``."""
    from daemon.client import Client

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
