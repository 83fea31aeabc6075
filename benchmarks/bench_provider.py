"""Provider overhead: from the server's last byte to the committed assistant message.

A local HTTP server on 127.0.0.1 speaks the OpenAI chat-completions streaming wire format (SSE
``chat.completion.chunk`` frames and ``data: [DONE]``). Each big response streams about 1,000
tokens of text in small deltas, then a tool call whose arguments are split across chunks, then
usage. goald's OpenAI-compatible provider (the official SDK underneath) drives a real session: the
tool runs, and a short final answer ends each turn. The server pauses before each response's tail
(tool-call end, finish reason, usage, ``[DONE]``), as a real provider's pacing would let a client
keep up, so the figure is not inflated by a backlog. For each big response the benchmark takes the
time between the server writing its last byte and the ``assistant/message`` event being committed
and published, and prints the median and p99 over N responses (default 500).

Run: ``python benchmarks/bench_provider.py [--responses N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loguru import logger
from pydantic import BaseModel

from agent import Event, EventType, FunctionTool, ModelRegistry, Runtime, ToolContext, ToolRegistry
from agent.models.openai import OpenAIModel


def _chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench",
        "choices": [] if usage is not None else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def big_response(n: int) -> list[bytes]:
    words = [f"word{i % 97} " for i in range(1000)]
    frames = [_chunk({"role": "assistant", "content": ""})]
    frames += [_chunk({"content": "".join(words[i : i + 4])}) for i in range(0, len(words), 4)]
    args = json.dumps({"note": f"step {n}", "items": list(range(20))})
    frames.append(
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": "noop", "arguments": args[:10]},
                    }
                ]
            }
        )
    )
    frames.append(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[10:]}}]}))
    frames.append(_chunk({}, finish="tool_calls"))
    frames.append(_chunk({}, usage={"prompt_tokens": 1200, "completion_tokens": 1030, "total_tokens": 2230}))
    frames.append(b"data: [DONE]\n\n")
    return frames


def small_response() -> list[bytes]:
    return [
        _chunk({"role": "assistant", "content": "done"}),
        _chunk({}, finish="stop"),
        _chunk({}, usage={"prompt_tokens": 1300, "completion_tokens": 2, "total_tokens": 1302}),
        b"data: [DONE]\n\n",
    ]


class Server:
    def __init__(self) -> None:
        self.requests = 0
        self.last_byte: list[float] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self.handlers: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                self.requests += 1
                big = self.requests % 2 == 1
                frames = big_response(self.requests) if big else small_response()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                for i, frame in enumerate(frames):
                    if big and i == len(frames) - 5:
                        # Like a real provider, the tail comes after a pause: the client has read
                        # everything before it, so what is measured is goald's work on the tail.
                        await asyncio.sleep(0.02)
                    writer.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                if big:
                    self.last_byte.append(time.perf_counter())
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


class _Args(BaseModel):
    note: str = ""
    items: list[int] = []


async def _noop(args: _Args, ctx: ToolContext) -> str:
    return "ok"


async def run(responses: int) -> None:
    server = Server()
    await server.start()
    model = OpenAIModel("bench", base_url=f"http://127.0.0.1:{server.port}/v1", api_key="bench-key")
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    committed: list[float] = []

    def on_event(event: Event) -> None:
        if event.type == EventType.ASSISTANT_MESSAGE and event.data.get("finishReason") == "tool_use":
            committed.append(time.perf_counter())

    tools = ToolRegistry([FunctionTool("noop", "does nothing", _Args, _noop)])
    with tempfile.TemporaryDirectory() as tmp:
        async with Runtime.open(Path(tmp) / "goald.db", models=registry, tools=lambda row: tools) as rt:
            rt.store.hub.add_listener(on_event)
            sid = await rt.create_session()
            agent = await rt.agent(sid)
            t0 = time.perf_counter()
            for i in range(responses):
                await agent.followup(f"go {i}")
                await agent.when_idle()
            total = time.perf_counter() - t0
    if hasattr(model, "aclose"):
        await model.aclose()
    assert server.server is not None
    server.server.close()
    # The client closed its connections; let the handlers see the end of their streams.
    await asyncio.wait(server.handlers, timeout=5)
    gaps = [c - s for s, c in zip(server.last_byte, committed, strict=False)]
    gaps.sort()
    print(
        f"{len(gaps)} streamed responses of ~1,000 tokens with a tool call, OpenAI-compatible provider, "
        f"local server; {total:.1f} s in all"
    )
    print(
        f"  server's last byte -> committed assistant message: median {statistics.median(gaps) * 1e3:.2f} ms, "
        f"p99 {gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] * 1e3:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=500)
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    asyncio.run(run(args.responses))


if __name__ == "__main__":
    main()
