"""The sd_notify client against a real datagram socket bound by the test, as systemd binds one.

The end-to-end check (``goald serve`` under a bound ``NOTIFY_SOCKET``) lives with the daemon's
tests; here the protocol itself: the address forms, the datagrams, the sender's credentials
(what ``NotifyAccess=main`` checks), the watchdog interval, and the watchdog loop's pings.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.notify import MAX_STATUS_CHARS, Notifier, notify_address, watchdog_interval, watchdog_loop

WAIT = 5.0


@pytest.fixture
def sock_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory for a unix socket: tmp_path unless its path is too long for sun_path."""
    if len(str(tmp_path / "notify.sock")) < 100:
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="gdn-") as short:
        yield Path(short)


@pytest.fixture
def receiver(sock_dir: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound AF_UNIX datagram socket (the "systemd" end) and its NOTIFY_SOCKET value."""
    path = sock_dir / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.settimeout(WAIT)
    try:
        yield sock, str(path)
    finally:
        sock.close()


def recv_fields(sock: socket.socket) -> list[str]:
    return sock.recv(65536).decode().split("\n")


def assert_nothing_pending(sock: socket.socket) -> None:
    sock.setblocking(False)
    try:
        with pytest.raises(BlockingIOError):
            sock.recv(65536)
    finally:
        sock.settimeout(WAIT)


def test_each_message_is_one_datagram_of_fields(receiver: tuple[socket.socket, str]) -> None:
    sock, value = receiver
    notifier = Notifier.from_env({"NOTIFY_SOCKET": value})
    assert notifier.enabled and notifier.watchdog_interval is None

    assert notifier.ready("serving; 2 active goal(s)")
    assert recv_fields(sock) == ["READY=1", "STATUS=serving; 2 active goal(s)"]
    assert notifier.status("serving; 1 active goal(s)")
    assert recv_fields(sock) == ["STATUS=serving; 1 active goal(s)"]
    assert notifier.watchdog()
    assert recv_fields(sock) == ["WATCHDOG=1"]
    assert notifier.stopping()
    assert recv_fields(sock) == ["STOPPING=1"]
    assert_nothing_pending(sock)
    notifier.close()


def test_sender_credentials_are_the_daemon_process(receiver: tuple[socket.socket, str]) -> None:
    # systemd attributes a datagram by its SCM_CREDENTIALS; NotifyAccess=main accepts only the main PID.
    sock, value = receiver
    notifier = Notifier.from_env({"NOTIFY_SOCKET": value})
    assert notifier.ready()
    data, ancdata, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(struct.calcsize("3i")))
    assert data == b"READY=1"
    creds = [d for level, kind, d in ancdata if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS]
    assert len(creds) == 1
    pid, uid, _gid = struct.unpack("3i", creds[0][: struct.calcsize("3i")])
    assert (pid, uid) == (os.getpid(), os.getuid())
    notifier.close()


def test_abstract_namespace_socket() -> None:
    name = f"goald-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(WAIT)
        notifier = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert notifier.address == "\0" + name
        assert notifier.ready("up")
        assert recv_fields(sock) == ["READY=1", "STATUS=up"]
        assert notifier.stopping("stopping; 0 session(s) running")
        assert recv_fields(sock) == ["STOPPING=1", "STATUS=stopping; 0 session(s) running"]
        notifier.close()


def test_a_status_is_one_bounded_line(receiver: tuple[socket.socket, str]) -> None:
    sock, value = receiver
    notifier = Notifier(notify_address(value))
    # A newline would start a field of its own: a status text must not be able to say READY=1.
    assert notifier.status("two\nREADY=1")
    assert recv_fields(sock) == ["STATUS=two READY=1"]
    assert notifier.status("x" * (MAX_STATUS_CHARS * 3))
    assert recv_fields(sock) == ["STATUS=" + "x" * MAX_STATUS_CHARS]
    notifier.close()


def test_without_notify_socket_everything_is_a_no_op() -> None:
    notifier = Notifier.from_env({})
    assert not notifier.enabled
    assert notifier.watchdog_interval is None
    assert (notifier.ready("x"), notifier.status("x"), notifier.watchdog(), notifier.stopping()) == (
        False,
        False,
        False,
        False,
    )


async def test_watchdog_loop_returns_at_once_without_a_socket() -> None:
    async with asyncio.timeout(WAIT):
        await watchdog_loop(Notifier(None, watchdog_interval=0.01), lambda: "never sent")


@pytest.mark.parametrize(
    ("value", "address"),
    [
        ("/run/systemd/notify", "/run/systemd/notify"),
        ("@sd-notify", "\0sd-notify"),
        ("", None),
        (None, None),
        ("@", None),
        ("relative/notify", None),
        ("vsock:2:1234", None),
    ],
)
def test_notify_address_forms(value: str | None, address: str | None) -> None:
    assert notify_address(value) == address


def test_variables_are_removed_for_child_processes(
    monkeypatch: pytest.MonkeyPatch, receiver: tuple[socket.socket, str]
) -> None:
    _sock, value = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", value)
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notifier = Notifier.from_env()
    assert notifier.address == value and notifier.watchdog_interval == 15.0
    # The sandboxed tools the daemon starts must not inherit a socket and a watchdog meant for it.
    assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} & set(os.environ)

    env = {"NOTIFY_SOCKET": value, "WATCHDOG_USEC": "1000000"}
    kept = Notifier.from_env(env, unset_environment=False)
    assert kept.watchdog_interval == 0.5
    assert env == {"NOTIFY_SOCKET": value, "WATCHDOG_USEC": "1000000"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "<self>"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "abc"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": ""}, None),
        ({"WATCHDOG_PID": "<self>"}, None),
    ],
)
def test_watchdog_interval_is_half_the_timeout_and_only_for_us(env: dict[str, str], expected: float | None) -> None:
    env = {k: (str(os.getpid()) if v == "<self>" else v) for k, v in env.items()}
    assert watchdog_interval(env) == expected


def test_no_watchdog_without_a_socket() -> None:
    assert Notifier.from_env({"WATCHDOG_USEC": "30000000"}).watchdog_interval is None


def test_a_vanished_socket_is_reported_not_raised(sock_dir: Path) -> None:
    notifier = Notifier(str(sock_dir / "gone.sock"), watchdog_interval=1.0)
    assert notifier.ready() is False
    assert notifier.watchdog() is False
    # It recovers by itself once the socket is there again.
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(sock_dir / "gone.sock"))
        sock.settimeout(WAIT)
        assert notifier.watchdog() is True
        assert recv_fields(sock) == ["WATCHDOG=1"]
    notifier.close()


async def _next_fields(sock: socket.socket) -> list[str]:
    data = await asyncio.get_running_loop().sock_recv(sock, 65536)
    return data.decode().split("\n")


async def test_watchdog_loop_keeps_pinging_and_refreshes_status(receiver: tuple[socket.socket, str]) -> None:
    sock, value = receiver
    sock.setblocking(False)
    notifier = Notifier(value, watchdog_interval=0.02)
    calls = 0

    async def status() -> str:
        nonlocal calls
        calls += 1
        return f"serving; {min(calls, 3)} active goal(s)"

    task = asyncio.create_task(watchdog_loop(notifier, status))
    pings = 0
    statuses: list[str] = []
    try:
        async with asyncio.timeout(WAIT):
            while pings < 6 or len(statuses) < 3:
                for field in await _next_fields(sock):
                    if field == "WATCHDOG=1":
                        pings += 1
                    else:
                        statuses.append(field)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        notifier.close()
    # A status is sent when it changes, not with every ping.
    assert statuses == [f"STATUS=serving; {n} active goal(s)" for n in (1, 2, 3)]
    assert calls >= 6


async def test_a_hung_status_never_stops_the_pings(receiver: tuple[socket.socket, str]) -> None:
    sock, value = receiver
    sock.setblocking(False)
    notifier = Notifier(value, watchdog_interval=0.02)
    never = asyncio.Event()

    async def status() -> str:
        await never.wait()
        return "unreachable"

    task = asyncio.create_task(watchdog_loop(notifier, status))
    received: list[str] = []
    try:
        async with asyncio.timeout(WAIT):
            while len(received) < 4:
                received += await _next_fields(sock)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        notifier.close()
    assert received == ["WATCHDOG=1"] * 4


async def test_a_failing_status_never_stops_the_pings(receiver: tuple[socket.socket, str]) -> None:
    sock, value = receiver
    sock.setblocking(False)
    notifier = Notifier(value, watchdog_interval=0.02)

    def status() -> str:
        raise LookupError("no such table: goals")

    task = asyncio.create_task(watchdog_loop(notifier, status))
    received: list[str] = []
    try:
        async with asyncio.timeout(WAIT):
            while len(received) < 3:
                received += await _next_fields(sock)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        notifier.close()
    assert received == ["WATCHDOG=1"] * 3


def stall_event_loop(seconds: float) -> None:
    """Blocking code run on the event loop's thread: what a stuck daemon looks like."""
    time.sleep(seconds)


async def test_a_blocked_event_loop_stops_the_pings(receiver: tuple[socket.socket, str]) -> None:
    # The pings come from the event loop itself, so a loop stuck in blocking code goes silent
    # and systemd's watchdog fires. A thread stamps each datagram as it arrives and hands the
    # stamp to the loop, which picks it up whenever it runs.
    sock, value = receiver
    sock.settimeout(0.05)
    loop = asyncio.get_running_loop()
    arrivals: asyncio.Queue[float] = asyncio.Queue()
    done = threading.Event()

    def record() -> None:
        while not done.is_set():
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            if data == b"WATCHDOG=1":
                loop.call_soon_threadsafe(arrivals.put_nowait, time.monotonic())

    thread = threading.Thread(target=record, daemon=True)
    thread.start()
    notifier = Notifier(value, watchdog_interval=0.02)
    task = asyncio.create_task(watchdog_loop(notifier))
    stamps: list[float] = []
    try:
        async with asyncio.timeout(WAIT):
            stamps.append(await arrivals.get())
            blocked_at = time.monotonic()
            stall_event_loop(0.8)
            unblocked_at = time.monotonic()
            while stamps[-1] < unblocked_at:
                stamps.append(await arrivals.get())
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        done.set()
        thread.join(WAIT)
        notifier.close()
    # Allow for a ping sent just before the block and read a little later by the thread.
    during = [t for t in stamps if blocked_at + 0.25 < t < unblocked_at]
    assert during == []
    assert stamps[-1] >= unblocked_at, "the pings resume once the loop runs again"
