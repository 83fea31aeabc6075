"""A TCP relay that delays every byte by a fixed time each way: a database a network hop away.

This machine's kernel has no ``netem``, so a benchmark that needs PostgreSQL behind a round trip of
R ms (``benchmarks/bench_cluster.py --rtt-ms``) puts this relay between the daemons and the server:
it listens on 127.0.0.1, connects each accepted connection to the target, and forwards what either
side sends R/2 ms after it arrived, in order. Each direction of each connection is one queue of
(due time, chunk), so a burst is not spread out (the link is delayed, not slowed). It runs as a
process of its own so that the benchmark's own blocking queries never stall it, and prints its port
on its first line of output once it listens.

Run: ``python benchmarks/delay_relay.py --to PORT --rtt-ms R`` (``--port P`` to choose its port).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def feed() -> None:
        while data := await reader.read(1 << 16):
            queue.put_nowait((loop.time() + delay, data))
        queue.put_nowait((loop.time() + delay, b""))

    feeder = asyncio.create_task(feed())
    try:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        feeder.cancel()
        with contextlib.suppress(BaseException):
            await feeder
        with contextlib.suppress(Exception):
            writer.close()


async def serve(target: int, rtt_ms: float, port: int) -> None:
    delay = rtt_ms / 2000.0

    async def accepted(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_forward(client_r, server_w, delay), _forward(server_r, client_w, delay))

    server = await asyncio.start_server(accepted, "127.0.0.1", port)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    # Stopped by the benchmark: its connections' tasks are not unwound one by one (their
    # cancellation is only noise on stderr), the process simply ends.
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
