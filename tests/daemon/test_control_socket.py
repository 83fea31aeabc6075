"""The control socket's bounds and its stop, in process: the real :class:`UnixServer` on a real unix
socket in ``tmp_path``, with a small dispatcher whose methods a test controls.

What is pinned: a frame begun and not finished within ``frame_timeout`` closes its connection
(also when its bytes trickle in), a complete frame is not cut by it; a connection with no
subscription is closed after ``idle_timeout`` of silence, a subscriber is not; at the cap a new
connection closes the oldest connection that holds no subscription (preferring one that owes no
answer), and one that is all subscribers refuses the newcomer; the server logs these a line a
second at most; the soft descriptor limit is raised to the hard one. And the ordering behind the
one-shot interrupt case: :meth:`UnixServer.stop` lets the request in flight write its answer
before it closes the connection (before, ``stop`` cancelled the connection mid-request, and a
client whose ``session/interrupt`` ended a ``goald run`` read "the daemon closed the connection").
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

from daemon.rpc.protocol import Dispatcher, Peer, encode
from daemon.rpc.server import ConnectionLimits, RateLimitedLog, UnixServer, raise_nofile_limit

WAIT = 10.0


@dataclass
class Client:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def call(self, method: str, req_id: int = 1) -> dict[str, Any]:
        await self.send(encode({"jsonrpc": "2.0", "id": req_id, "method": method}))
        return await self.recv()

    async def recv(self) -> dict[str, Any]:
        async with asyncio.timeout(WAIT):
            line = await self.reader.readline()
        assert line.endswith(b"\n"), f"the server closed the connection (got {line!r})"
        msg = json.loads(line)
        assert isinstance(msg, dict)
        return msg

    async def closed_by_server(self, within: float = WAIT) -> bool:
        """Whether the server closes this connection within ``within`` seconds (reads to end of file)."""
        try:
            async with asyncio.timeout(within):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            pass
        return True

    def close(self) -> None:
        self.writer.close()


class Harness:
    """A :class:`UnixServer` on ``tmp_path`` and the clients a test opens."""

    def __init__(self, tmp_path: Path, limits: ConnectionLimits) -> None:
        self.path = tmp_path / "c.sock"
        self.dispatcher = Dispatcher()
        self.server = UnixServer(self.path, self.dispatcher, 1 << 16, limits=limits)
        self.clients: list[Client] = []
        d = self.dispatcher

        @d.method("ping")
        async def ping(peer: Peer) -> dict[str, Any]:
            return {"pong": True}

        @d.method("subscribe")
        async def subscribe(peer: Peer) -> dict[str, Any]:
            # What session/subscribe does: a task that streams until the connection closes.
            peer.tasks.spawn(peer.closed.wait())
            return {}

    async def connect(self) -> Client:
        reader, writer = await asyncio.open_unix_connection(str(self.path))
        client = Client(reader, writer)
        self.clients.append(client)
        return client

    async def connected(self) -> Client:
        """A client the server has surely taken in (it answered a call)."""
        client = await self.connect()
        assert (await client.call("ping"))["result"] == {"pong": True}
        return client


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Any]:
    made: list[Harness] = []

    async def start(**limits: Any) -> Harness:
        h = Harness(tmp_path, ConnectionLimits(**limits))
        await h.server.start()
        made.append(h)
        return h

    yield start
    for h in made:
        for c in h.clients:
            c.close()
        await h.server.stop()


@pytest.fixture
def log_lines() -> Any:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m).rstrip("\n")), level="DEBUG", format="{message}")
    yield lines
    logger.remove(sink)


async def test_stop_lets_the_request_in_flight_write_its_answer_before_the_connection_closes(tmp_path: Path) -> None:
    d = Dispatcher()
    server = UnixServer(tmp_path / "s.sock", d, 1 << 16)
    stopping: list[asyncio.Task[None]] = []

    @d.method("session/interrupt")
    async def interrupt(peer: Peer) -> dict[str, Any]:
        # As in `goald run`: this very call ends the run, whose end stops the host (and its socket)
        # while the call is still being answered. The stop gets a fair while to run meanwhile.
        stopping.append(asyncio.get_running_loop().create_task(server.stop()))
        await asyncio.wait({stopping[0]}, timeout=0.3)
        return {"interrupted": True}

    await server.start()
    reader, writer = await asyncio.open_unix_connection(str(tmp_path / "s.sock"))
    client = Client(reader, writer)
    try:
        answer = await client.call("session/interrupt")
        assert answer["result"] == {"interrupted": True}
        assert await client.closed_by_server()  # and then the connection closes: the stop goes on
        async with asyncio.timeout(WAIT):
            await stopping[0]
        assert not (tmp_path / "s.sock").exists()
    finally:
        client.close()
        await server.stop()


async def test_stop_does_not_wait_for_an_idle_connection(make: Any) -> None:
    h = await make()
    client = await h.connected()
    async with asyncio.timeout(WAIT):
        await h.server.stop()
    assert await client.closed_by_server()


async def test_a_partial_frame_times_out_and_a_complete_frame_does_not(make: Any, log_lines: list[str]) -> None:
    h = await make(frame_timeout=0.3)
    stuck = await h.connected()
    await stuck.send(b'{"jsonrpc":"2.0","id":2,"method":"pi')
    # A frame that trickles in, byte by byte, past the timeout in all: still a frame not finished.
    trickle = await h.connected()
    body = b'{"jsonrpc":"2.0","id":3,"method":"ping"}'
    steady = await h.connected()
    for i in range(len(body)):
        await trickle.send(body[i : i + 1])
        await steady.call("ping")  # the server keeps serving meanwhile
        if trickle.reader.at_eof():
            break
    assert await stuck.closed_by_server()
    assert await trickle.closed_by_server()
    assert (await steady.call("ping"))["result"] == {"pong": True}
    assert any("unfinished" in line for line in log_lines), log_lines


async def test_an_idle_connection_is_closed_unless_it_holds_a_subscription(make: Any) -> None:
    h = await make(idle_timeout=0.3)
    subscriber = await h.connected()
    assert (await subscriber.call("subscribe", 2))["result"] == {}
    idle = await h.connected()
    assert await idle.closed_by_server()
    assert not await subscriber.closed_by_server(within=0.6)  # twice the idle timeout: still open
    assert (await subscriber.call("ping", 3))["result"] == {"pong": True}


async def test_at_the_cap_the_oldest_connection_without_a_subscription_makes_room(make: Any) -> None:
    h = await make(max_connections=3)
    oldest = await h.connected()
    assert (await oldest.call("subscribe", 2))["result"] == {}
    second = await h.connected()
    third = await h.connected()
    assert h.server.connections == 3
    newcomer = await h.connected()  # answered: room was made
    assert await second.closed_by_server()
    assert h.server.connections == 3
    for kept in (oldest, third, newcomer):
        assert (await kept.call("ping", 9))["result"] == {"pong": True}


async def test_at_a_cap_of_subscribers_a_newcomer_is_refused(make: Any, log_lines: list[str]) -> None:
    h = await make(max_connections=2)
    subs = [await h.connected() for _ in range(2)]
    for s in subs:
        assert (await s.call("subscribe", 2))["result"] == {}
    refused = await h.connect()
    assert await refused.closed_by_server()
    for s in subs:
        assert (await s.call("ping", 3))["result"] == {"pong": True}
    assert sum("refused" in line for line in log_lines) == 1


async def test_dropping_many_connections_logs_a_line_a_second_at_most(make: Any, log_lines: list[str]) -> None:
    h = await make(max_connections=5)
    for _ in range(60):
        await h.connected()
    # 55 were dropped within well under a second or two: one line, maybe two.
    assert 1 <= sum("at its cap" in line for line in log_lines) <= 3, log_lines


def test_the_rate_limited_log_counts_what_it_held_back(log_lines: list[str]) -> None:
    log = RateLimitedLog(interval=3600)
    for _ in range(5):
        log.warning("accept", "cannot accept: {}", "Too many open files")
    assert log_lines == ["cannot accept: Too many open files"]
    log.flush()
    assert len(log_lines) == 2 and "4 more" in log_lines[1]


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 64:
        pytest.skip(f"hard limit {hard}: nothing to raise to")
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    try:
        assert raise_nofile_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_stale_socket_file_is_replaced_and_a_live_one_refused(tmp_path: Path) -> None:
    async def go() -> None:
        h = Harness(tmp_path, ConnectionLimits())
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(h.path))
        stale.close()  # the file stays, nobody listens
        await h.server.start()
        other = UnixServer(h.path, h.dispatcher, 1 << 16)
        with pytest.raises(RuntimeError, match="already serves"):
            await other.start()
        client = await h.connected()
        client.close()
        await h.server.stop()

    asyncio.run(go())
