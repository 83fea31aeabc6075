"""The benchmarks' delaying relay (``benchmarks/delay_relay.py``): the round trip it adds, bytes in
order through a burst, and a close passed on."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

RELAY = Path(__file__).resolve().parent.parent / "benchmarks" / "delay_relay.py"


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


def test_the_relay_adds_its_round_trip_keeps_order_and_passes_a_close_on() -> None:
    async def main() -> tuple[list[float], bytes, bytes, bytes]:
        server = await asyncio.start_server(_echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        relay = await asyncio.create_subprocess_exec(
            sys.executable, str(RELAY), "--to", str(port), "--rtt-ms", "20", stdout=asyncio.subprocess.PIPE
        )
        try:
            assert relay.stdout is not None
            listening = await asyncio.wait_for(relay.stdout.readline(), 30)
            reader, writer = await asyncio.open_connection("127.0.0.1", int(listening))
            trips = []
            for i in range(5):
                t0 = time.perf_counter()
                writer.write(b"%d;" % i)
                assert await asyncio.wait_for(reader.readuntil(b";"), 10) == b"%d;" % i
                trips.append(time.perf_counter() - t0)
            burst = b"".join(b"%d," % i for i in range(50_000))
            writer.write(burst)
            echoed = await asyncio.wait_for(reader.readexactly(len(burst)), 10)
            writer.write_eof()  # the echo server closes once it reads the end: the relay passes both on
            rest = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            await writer.wait_closed()
            return trips, burst, echoed, rest
        finally:
            relay.terminate()
            await asyncio.wait_for(relay.wait(), 10)
            server.close()
            await server.wait_closed()

    trips, burst, echoed, rest = asyncio.run(main())
    assert min(trips) >= 0.020, trips  # each way half the round trip
    assert echoed == burst
    assert rest == b""
