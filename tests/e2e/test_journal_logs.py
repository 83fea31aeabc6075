"""Structured logs: the journal's native protocol under systemd, JSON lines when configured.

A real datagram socket stands in for the journal (``journal_socket`` in the config points the
daemon at it), and the daemon's stderr is a file whose device and inode the test puts in
``JOURNAL_STREAM``, exactly as systemd does for a unit whose stderr is the journal. Every line
about the goal then arrives as a datagram with ``GOAL_ID=`` (and ``SESSION_ID=`` where the line
names the session), a priority and the message; nothing goes to stderr. With ``log_format =
"json"`` and no journal, stderr carries one JSON object per line with the same ids.
"""

from __future__ import annotations

import json
import socket
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TEST_MODELS, Daemon, wait_goal


def parse_datagram(data: bytes) -> dict[str, str]:
    """The journal's native format: ``NAME=value\\n``, or ``NAME\\n`` + 64-bit length + bytes + ``\\n``."""
    fields: dict[str, str] = {}
    i = 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            name, _, value = line.partition(b"=")
            fields[name.decode()] = value.decode()
            i = nl + 1
        else:
            (size,) = struct.unpack("<Q", data[nl + 1 : nl + 9])
            fields[line.decode()] = data[nl + 9 : nl + 9 + size].decode()
            assert data[nl + 9 + size : nl + 10 + size] == b"\n"
            i = nl + 10 + size
    return fields


class FakeJournal:
    """A bound datagram socket read by a thread (the daemon's sends block while its queue is full)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gj-", dir="/tmp"))
        self.path = self.dir / "socket"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.entries: list[dict[str, str]] = []
        self.changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return
            with self.changed:
                self.entries.append(parse_datagram(data))
                self.changed.notify_all()

    def wait_for(self, goal_id: str, text: str, timeout: float = 30.0) -> dict[str, str]:
        def found() -> dict[str, str] | None:
            return next((e for e in self.entries if e.get("GOAL_ID") == goal_id and text in e["MESSAGE"]), None)

        with self.changed:
            assert self.changed.wait_for(lambda: found() is not None, timeout), [e["MESSAGE"] for e in self.entries]
            entry = found()
            assert entry is not None
            return entry

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(5)
        self.path.unlink(missing_ok=True)
        self.dir.rmdir()


@pytest.fixture
def journal() -> Iterator[FakeJournal]:
    j = FakeJournal()
    yield j
    j.close()


async def test_lines_about_a_goal_reach_the_journal_with_its_fields(tmp_path: Path, journal: FakeJournal) -> None:
    daemon = Daemon(tmp_path / "state", config={**TEST_MODELS, "journal_socket": str(journal.path)})
    daemon.stderr_path.touch()
    st = daemon.stderr_path.stat()
    try:
        daemon.start(extra_env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}", "INVOCATION_ID": "0" * 32})
        created = await daemon.acli_json("goal", "add", "write [rounds=1 delay=0.01]", "--model", "test:worker")
        goal_id = created["goalId"]
        await wait_goal(daemon.socket_path, goal_id, {"completed"})
        entry = journal.wait_for(goal_id, "new -> active")
        assert entry["PRIORITY"] == "6"
        assert entry["SYSLOG_IDENTIFIER"] == "goald"
        assert entry["STATUS"] == "active"  # what the engine bound to the line goes along
        assert entry["CODE_FILE"].endswith(".py") and int(entry["CODE_LINE"]) > 0
        # Lines that name the session carry its id too; no line names another goal than its own.
        with journal.changed:
            about = [e for e in journal.entries if goal_id in e["MESSAGE"]]
            assert about and all(e.get("GOAL_ID") == goal_id for e in about)
            assert all(e["SESSION_ID"] in e["MESSAGE"] for e in journal.entries if "SESSION_ID" in e)
            assert any(e["MESSAGE"] == "daemon serving" for e in journal.entries)
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    # The journal had every line; stderr had none of them.
    assert "daemon serving" not in daemon.stderr_path.read_text()


async def test_a_redirected_stderr_is_not_the_journal(tmp_path: Path, journal: FakeJournal) -> None:
    # JOURNAL_STREAM inherited from a unit, stderr sent elsewhere: plain stderr lines, no datagrams.
    daemon = Daemon(tmp_path / "state", config={**TEST_MODELS, "journal_socket": str(journal.path)})
    try:
        daemon.start(extra_env={"JOURNAL_STREAM": "1:2"})
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    assert "daemon serving" in daemon.stderr_path.read_text()
    assert journal.entries == []


async def test_json_lines_carry_the_goal_and_session(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path / "state", config={**TEST_MODELS, "log_format": "json"})
    try:
        daemon.start()
        created = await daemon.acli_json("goal", "add", "write [rounds=1 delay=0.01]", "--model", "test:worker")
        await wait_goal(daemon.socket_path, created["goalId"], {"completed"})
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    lines = [json.loads(line) for line in daemon.stderr_path.read_text().splitlines() if line.strip()]
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    about = [ln for ln in lines if created["goalId"] in ln["message"]]
    assert about and all(ln["goal_id"] == created["goalId"] for ln in about)
    assert all(ln["session_id"] in ln["message"] for ln in lines if "session_id" in ln)
