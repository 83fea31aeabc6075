"""Client time per step through a real provider: flat from step 2 to step 2,000?

A local OpenAI-compatible server (a child process, so its work does not share the client's event
loop) answers every ``POST /chat/completions`` at once with a short SSE stream: a ``noop`` tool
call while a loop lasts, then a text answer. It stamps, on the system-wide monotonic clock, when
each request had arrived whole and when its response's last byte was written; it reads requests
into one reused buffer, so its own reading of a long body adds as little as possible. goald's
OpenAI-compatible provider (the official SDK underneath) and the real driver run:

1. one turn of N tool-calling steps (default 2,000): the client time of a step is from the end of
   one response to the arrival of the next request (committing the assistant message, running
   the tool, committing its result, reserving the next call, building and sending the request);
   printed for the first, middle and last 100 steps;
2. one goal of R rounds (default 200) through the real goal engine, each round a text answer:
   the time from the committed ``status: idle`` to the arrival of the next round's request, per
   round, split into stages (idle → the engine's continuation committed → admitted by the next
   turn → request on the wire); printed for the first, middle and last 100 rounds;
3. a bare aiosqlite ``INSERT`` + ``COMMIT`` at the same ``synchronous`` level, for scale.

It also counts the messages the provider converted per request (constant: only what the step
added) against the messages the request carried, and prints the CPU time the client's event-loop
thread spent per step (first, middle and last 100 steps), and the client process's CPU time per step
over all its threads (the store's thread included: a cost that grew off the event loop, a query or a
commit that slows with the turn's length, would show there): on a machine shared with other work,
those figures move far less than the wall-clock ones. On a loaded machine (load average ~10 on 2
cores) the wall-clock ratio of the last 100 steps to the first swung from 0.96 to 3.51 between two
runs while both CPU ratios stayed at 1.02-1.06: the tail's requests are ~400 kB against ~1 kB at
the start, and a contended machine delays the local server's reading of them, not goald's work.

The tool answers ``--result-bytes`` (default 1,000) a call, so the one turn outgrows the model's
default 128k-token window (the server counts a request's prompt tokens as its body's bytes / 4 and
reports them as usage): the turn's oldest steps are left out (issue 25), and the loop prints the
largest request, by goald's estimate and by the server's count, against the window (every one must
be under it), and the ``context/compacted`` events the turn recorded. The last 100 steps must take
at most 1.5x the first 100.

Run: ``python benchmarks/bench_http_loop.py [--steps N] [--rounds R] [--result-bytes B]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiosqlite
from loguru import logger
from pydantic import BaseModel

from agent import ContextCompacted, Event, EventType, FunctionTool, ModelRegistry, Runtime, ToolContext, ToolRegistry
from agent.context import ContextMeter
from agent.models.openai import OpenAIModel


def now() -> float:
    """The system-wide monotonic clock (comparable between the two processes)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# -- the server (child process) ------------------------------------------------------------------


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


def _stream(frames: list[bytes]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"


USAGE = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
#: Bytes a token, as the server counts a prompt (its body's bytes / 4).
BYTES_PER_TOKEN = 4
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


def usage(body_bytes: int) -> dict[str, int]:
    prompt = body_bytes // BYTES_PER_TOKEN
    return {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}


def tool_answer(n: int, used: dict[str, int] = USAGE) -> bytes:
    call = {"index": 0, "id": f"call_{n}", "type": "function", "function": {"name": "noop", "arguments": "{}"}}
    return _stream(
        [
            _chunk({"role": "assistant", "content": None, "tool_calls": [call]}),
            _chunk({}, finish="tool_calls"),
            _chunk({}, usage=used),
            b"data: [DONE]\n\n",
        ]
    )


def text_answer(used: dict[str, int] = USAGE, text: str = "working on it") -> bytes:
    return _stream(
        [
            _chunk({"role": "assistant", "content": text}),
            _chunk({}, finish="stop"),
            _chunk({}, usage=used),
            b"data: [DONE]\n\n",
        ]
    )


class Server:
    """Model ``loop-N``: a tool call for the first N requests, then text (a summary request is
    answered with a summary). Any other model: text. Anything but a chat completion: 404."""

    def __init__(self) -> None:
        self.stamps: list[tuple[float, float, float, int]] = []  # (head, arrived, ended, body bytes)
        self.counts: dict[str, int] = {}

    def answer(self, head: bytes, body_start: bytes, body_bytes: int = 0, summary: bool = False) -> bytes:
        """The response to a whole request (``body_start``: the first bytes of its body)."""
        if head.startswith(b"GET /stats"):
            data = json.dumps(self.stamps).encode()
            self.stamps = []
            return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data)
        if not head.startswith(b"POST /v1/chat/completions"):
            return NOT_FOUND  # the window probes (/props, /v1/models, /api/show): the default window stays
        used = usage(body_bytes)
        if summary:
            return text_answer(used, "The earlier steps called noop and got its long answer each time.")
        model = body_start[: body_start.index(b",")].split(b'"')[-2].decode()
        n = self.counts[model] = self.counts.get(model, 0) + 1
        loop = int(model[5:]) if model.startswith("loop-") else 0
        return tool_answer(n, used) if n <= loop else text_answer(used)


class Connection(asyncio.BufferedProtocol):
    """One client connection. Requests are read into one reused buffer (the kernel copies each byte
    once, and reading never pauses), so the stand-in's own reading adds as little as it can to the
    time a request takes to arrive whole: a request body grows to hundreds of kilobytes."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = bytearray(1 << 16)
        self.filled = 0
        self.head_end = 0
        self.need = 0  # bytes of the request being read (head and body); 0: its head is not in yet
        self.t_head = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.filled == len(self.buf):
            grown = bytearray(2 * len(self.buf))
            grown[: self.filled] = self.buf
            self.buf = grown
        return memoryview(self.buf)[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        while True:
            if not self.need:
                end = self.buf.find(b"\r\n\r\n", 0, self.filled)
                if end < 0:
                    return
                self.t_head = now()
                length = 0
                for line in bytes(self.buf[:end]).split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.head_end = end + 4
                self.need = self.head_end + length
            if self.filled < self.need:
                return
            arrived = now()
            head = bytes(self.buf[: self.head_end])
            start = bytes(self.buf[self.head_end : min(self.need, self.head_end + 256)])
            assert self.transport is not None
            summary = self.buf.find(b"is being compacted to fit", self.head_end, self.need) >= 0
            self.transport.write(self.server.answer(head, start, self.need - self.head_end, summary))
            if head.startswith(b"POST /v1/chat/completions"):  # not the window probes, not /stats
                self.server.stamps.append((self.t_head, arrived, now(), self.need - self.head_end))
            rest = self.filled - self.need
            self.buf[:rest] = self.buf[self.need : self.filled]
            self.filled, self.need = rest, 0


async def serve() -> None:
    server = Server()
    srv = await asyncio.get_running_loop().create_server(lambda: Connection(server), "127.0.0.1", 0)
    print(srv.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin


async def fetch_stamps(port: int) -> list[tuple[float, float, float, int]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /stats HTTP/1.1\r\ncontent-length: 0\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
    data = await reader.readexactly(length)
    writer.close()
    return [tuple(x) for x in json.loads(data)]  # type: ignore[misc]


# -- the client ----------------------------------------------------------------------------------


class _NoArgs(BaseModel):
    pass


RESULT = ["ok"]


async def _noop(args: _NoArgs, ctx: ToolContext) -> str:
    return RESULT[0]


def ms(values: list[float]) -> str:
    return f"mean {statistics.fmean(values) * 1e3:.3f} / median {statistics.median(values) * 1e3:.3f} ms"


def thirds(values: list[float], label: str, unit: str) -> list[float]:
    n = len(values)
    first, middle, last = values[:100], values[max(0, n // 2 - 50) : n // 2 + 50], values[-100:]
    print(f"  {label}, first 100 {unit}: {ms(first)}")
    print(f"  {label}, middle 100 {unit}: {ms(middle)}")
    ratio = statistics.fmean(last) / statistics.fmean(first)
    medians = statistics.median(last) / statistics.median(first)
    print(f"  {label}, last 100 {unit}: {ms(last)}  (last/first means {ratio:.2f}, medians {medians:.2f})")
    return [statistics.fmean(first), statistics.fmean(last)]


async def tool_loop(db: Path, port: int, steps: int) -> None:
    model = OpenAIModel(f"loop-{steps}", base_url=f"http://127.0.0.1:{port}/v1", api_key="bench-key")
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    tools = ToolRegistry([FunctionTool("noop", "does nothing", _NoArgs, _noop)])
    carried: list[int] = []
    converted: list[int] = []
    cpu: list[float] = []
    cpu_all: list[float] = []
    estimates: list[int] = []
    likely = ContextMeter.likely

    def estimating(meter: ContextMeter, prompt_bytes: int) -> int:
        # goald's estimate of each request, as the step decides on it whether the request fits.
        estimates.append(likely(meter, prompt_bytes))
        return estimates[-1]

    ContextMeter.likely = estimating  # type: ignore[method-assign]
    async with Runtime.open(db, models=registry, tools=lambda row: tools) as rt:
        sid = await rt.create_session(config={"agent": {"max_steps": steps + 10}})
        agent = await rt.agent(sid)
        measure = model.measure

        def counting(request: Any) -> int:
            cpu.append(time.thread_time())
            cpu_all.append(time.process_time())
            before = request.cache.converted if request.cache is not None else 0
            size = measure(request)
            carried.append(len(request.messages))
            converted.append((request.cache.converted if request.cache is not None else 0) - before)
            return size

        model.measure = counting  # type: ignore[method-assign]
        t0 = time.perf_counter()
        await agent.followup("go")
        await agent.when_idle()
        wall = time.perf_counter() - t0
        events = await rt.store.events_after(sid, 0, limit=10_000_000)
    ContextMeter.likely = likely  # type: ignore[method-assign]
    await model.aclose()
    stamps = await fetch_stamps(port)
    client = [b[1] - a[2] for a, b in itertools.pairwise(stamps)][:steps]
    to_head = [b[0] - a[2] for a, b in itertools.pairwise(stamps)][:steps]
    print(f"{steps}-step tool loop in one turn, OpenAI-compatible provider, local server: {wall:.2f} s wall")
    thirds(client, "client time per step (response end -> next request whole)", "steps")
    print(f"  the same to the next request's headers, last 100: {ms(to_head[-100:])}")
    thirds([b - a for a, b in itertools.pairwise(cpu)], "client event-loop thread CPU per step", "steps")
    # Every thread of the client (the store's too): a cost that grew off the event loop shows here.
    thirds([b - a for a, b in itertools.pairwise(cpu_all)], "client process CPU per step (all threads)", "steps")
    print(f"  request body: first {stamps[0][3]} B, last {stamps[-1][3]} B")
    print(
        f"  messages per request: carried {carried[0]} -> {carried[-1]} (max {max(carried)}); converted per "
        f"request: first {converted[1]}, median after the first {statistics.median(converted[1:])}"
    )
    window = model.context_window
    counted = max(s[3] for s in stamps) // BYTES_PER_TOKEN
    under = all(s[3] // BYTES_PER_TOKEN < window for s in stamps) and max(estimates) < window
    print(
        f"  largest request: goald's estimate {max(estimates)} tokens, the server's count {counted} tokens;"
        f" window {window} ({model.window_source}): every request under it: {under}"
    )
    compactions = [e.payload for e in events if isinstance(e.payload, ContextCompacted)]
    ends = [e.data for e in events if e.type == EventType.TURN_END]
    end = ends[-1]
    print(f"  context/compacted events: {len(compactions)}; the turn ended {end['reason']} after {end['steps']} steps")
    for c in compactions[:3] + (["..."] if len(compactions) > 4 else []) + compactions[3:][-1:]:
        if isinstance(c, str):
            print(f"    {c}")
            continue
        print(
            f"    {c.mode}: ~{c.tokens_before} -> ~{c.tokens_after} tokens, {c.messages} message(s) left out,"
            f" {c.steps_dropped} of this turn so far"
        )


async def goal_rounds(db: Path, port: int, rounds: int) -> None:
    from goals import Budgets, Decision, GoalEngine, GoalSpec, PolicyInput, StopRules, tools_for_goal_sessions

    model = OpenAIModel("goal", base_url=f"http://127.0.0.1:{port}/v1", api_key="bench-key")
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    stages: list[dict[str, float]] = []
    current: dict[str, float] = {}
    done = asyncio.Event()
    session: list[str] = []

    def on_event(event: Event) -> None:
        nonlocal current
        if not session or event.session_id != session[0]:
            return
        if event.type == EventType.STATUS and event.data["status"] == "idle":
            current = {"idle": now()}
            stages.append(current)
        elif event.type == EventType.MESSAGE_QUEUED and event.data["source"].get("kind") == "goal":
            current.setdefault("queued", now())
        elif event.type == EventType.MESSAGE_ADMITTED and event.data["source"].get("kind") == "goal":
            current.setdefault("admitted", now())

    def on_decision(inp: PolicyInput, decision: Decision) -> None:
        current.setdefault("decided", now())
        if decision.kind != "continue":
            done.set()

    async with Runtime.open(
        db, models=registry, tools=lambda row: ToolRegistry(tools_for_goal_sessions(row.config))
    ) as rt:
        async with GoalEngine.running(rt) as engine:
            rt.store.hub.add_listener(on_event)
            engine.add_decision_listener(on_decision)
            t0 = time.perf_counter()
            goal = await engine.create(
                GoalSpec(
                    objective="Benchmark: keep going.",
                    budgets=Budgets(max_rounds=rounds + 1),
                    rules=StopRules(stall_rounds=10**6),
                )
            )
            session.append(goal.session_id)
            await asyncio.wait_for(done.wait(), timeout=1200)
            wall = time.perf_counter() - t0
    await model.aclose()
    stamps = await fetch_stamps(port)
    arrivals = [s[1] for s in stamps]
    rows: list[dict[str, float]] = []
    for st in stages:
        nxt = next((a for a in arrivals if a > st.get("admitted", float("inf"))), None)
        if nxt is not None and {"decided", "queued", "admitted"} <= st.keys():
            rows.append({**st, "request": nxt})
    total = [r["request"] - r["idle"] for r in rows]
    print(f"{len(rows)}-round goal, one text answer a round, through the goal engine: {wall:.2f} s wall")
    thirds(total, "idle -> next round's request", "rounds")
    tail = total[-20:]
    print(f"  rounds {len(total) - 19}-{len(total)}: median {statistics.median(tail) * 1e3:.3f} ms")
    for a, b, label in (
        ("idle", "queued", "idle -> continuation committed (the engine reads, decides, commits)"),
        ("queued", "admitted", "queued -> admitted by the next turn"),
        ("admitted", "request", "admitted -> request whole at the server"),
    ):
        part = [r[b] - r[a] for r in rows]
        print(f"    {label}: first 100 {ms(part[:100])}; last 100 {ms(part[-100:])}")


async def bare_commit(path: Path, n: int = 2000) -> float:
    """Mean seconds of one aiosqlite INSERT + COMMIT at synchronous=NORMAL."""
    async with aiosqlite.connect(str(path)) as conn:
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=NORMAL")
        await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        await conn.commit()
        t0 = time.perf_counter()
        for _ in range(n):
            await conn.execute("INSERT INTO t(v) VALUES (?)", ("x" * 100,))
            await conn.commit()
        return (time.perf_counter() - t0) / n


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--result-bytes", type=int, default=1000, help="bytes of each tool result of the loop")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    RESULT[0] = "r" * args.result_bytes
    if args.serve:
        await serve()
        return
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    # The server is a child process, so its work does not run on the client's event loop or CPU.
    child = subprocess.Popen(  # noqa: ASYNC220  (started once, before anything is measured)
        [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        with tempfile.TemporaryDirectory() as tmp:
            if args.steps:
                await tool_loop(Path(tmp) / "loop.db", port, args.steps)
            if args.rounds:
                await goal_rounds(Path(tmp) / "goal.db", port, args.rounds)
            bare = await bare_commit(Path(tmp) / "bare.db")
            print(f"bare aiosqlite INSERT+COMMIT (synchronous=NORMAL), same run: {bare * 1e3:.3f} ms")
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=10)


if __name__ == "__main__":
    asyncio.run(main())
