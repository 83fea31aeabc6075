"""A TCP relay that delays every byte by a fixed time each way: a database a network hop away.

This machine's kernel has no ``netem``, so a benchmark that needs PostgreSQL behind a round trip of
R ms (``benchmarks/bench_cluster.py --rtt-ms``) puts this relay between the daemons and the server:
it listens on 127.0.0.1, connects each accepted connection to the target, and forwards what either
side sends R/2 ms after it arrived, in order: each chunk is a timer on the event loop, so a burst
is not spread out (the link is delayed, not slowed). It runs as a process of its own so that the
benchmark's own blocking queries never stall it, and prints its port on its first line of output
once it listens.

Run: ``python benchmarks/delay_relay.py --to PORT --rtt-ms R`` (``--port P`` to choose its port).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Callable
from functools import partial


class _Side(asyncio.Protocol):
    """One end of a relayed connection: what it receives is written to its peer ``delay`` later.

    Each chunk is one timer on the event loop (no task, queue or sleep per chunk: the relay's own
    CPU is what a host with two cores has least of while a cluster runs through it). Due times of
    one direction only grow, so its chunks are written in the order they came.
    """

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self._last = 0.0  # the last due time: the next is later (equal timers keep no order)
        self._early: list[bytes] = []  # what came before the peer was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def join(self, peer: _Side) -> None:
        self.peer, peer.peer = peer, self
        for data in self._early:
            self._send(data)
        self._early.clear()

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self._early.append(data)
        else:
            self._send(data)

    def _send(self, data: bytes) -> None:
        self._later(partial(self._write, data))

    def _write(self, data: bytes) -> None:
        peer = self.peer.transport if self.peer is not None else None
        if peer is not None and not peer.is_closing():
            peer.write(data)

    def eof_received(self) -> bool:
        # An end that stops sending (a half close) does so at the other end too, after what it sent.
        self._later(self._end_peer)
        return True  # the other direction stays open

    def connection_lost(self, exc: Exception | None) -> None:
        self._later(self._close_peer)

    def _later(self, fn: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        self._last = max(loop.time() + self.delay, self._last + 1e-6)
        loop.call_at(self._last, fn)

    def _end_peer(self) -> None:
        peer = self.peer.transport if self.peer is not None else None
        if peer is not None and not peer.is_closing() and peer.can_write_eof():
            peer.write_eof()

    def _close_peer(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def serve(target: int, rtt_ms: float, port: int) -> None:
    delay = rtt_ms / 2000.0
    loop = asyncio.get_running_loop()

    async def accepted(client: _Side) -> None:
        try:
            _, server = await loop.create_connection(lambda: _Side(delay), "127.0.0.1", target)
        except OSError:
            if client.transport is not None:
                client.transport.close()
            return
        client.join(server)
        if client.transport is None or client.transport.is_closing():
            server.transport.close() if server.transport is not None else None

    def client_side() -> _Side:
        side = _Side(delay)
        loop.call_soon(lambda: loop.create_task(accepted(side)))
        return side

    server = await loop.create_server(client_side, "127.0.0.1", port)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    # Stopped by the benchmark: the connections are not unwound one by one, the process ends.
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", type=int, required=True, help="the target's port on 127.0.0.1")
    parser.add_argument("--rtt-ms", type=float, required=True, help="the round trip to add (each way: half)")
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (default: any free one)")
    args = parser.parse_args()
    asyncio.run(serve(args.to, args.rtt_ms, args.port))


if __name__ == "__main__":
    main()
