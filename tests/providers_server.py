"""A local HTTP/1.1 server that speaks the providers' real wire formats, scripted per request.

Tests point the real provider classes (and the official SDKs inside them) at it. Each request
takes the next scripted :class:`Respond` in order and is recorded (method, path, headers, JSON
body) so a test can assert what was sent. Responses can be:

* an SSE stream (OpenAI ``data: {chat.completion.chunk}`` lines ending in ``data: [DONE]``;
  Anthropic ``event:`` / ``data:`` pairs), sent with chunked transfer encoding, frame by frame;
* an error status with a JSON body and headers (``429`` + ``Retry-After``, ``500``, ``401``);
* a stream cut mid-way: the socket is closed before the terminating chunk (``ending="drop"``),
  or the body ends cleanly but early (build the frames without a finish);
* a stall (``ending="stall"``) or a delay before the headers (``delay=``), for timeouts.

A model that asks the server for its window (``GET /props``, ``GET /v1/models``, ``POST
/api/show``) or to count tokens (``POST /apply-template``, ``POST /tokenize``) is answered apart:
from ``probe_answers`` by path (a list: one answer a request, in order), else 404, never from the
script, and recorded in ``probes``, not ``requests``.

Frames are built per provider (``oa_*`` and ``an_*``), or from one provider-neutral description
(text parts, :class:`Call` s with their argument fragments, a :class:`~agent.Usage`) by
``openai_answer``/``anthropic_answer`` and ``openai_started``/``anthropic_started``: the
contract suite scripts the same scenario in each provider's own wire format with them.

Only 127.0.0.1 is used; every response closes its connection, so each request is one connection,
except one scripted ``keep_alive``: its connection stays open, and the next request on it is
closed unanswered (a server that closed an idle keep-alive connection), recorded in ``hung_up``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any, Literal

from agent import (
    Event,
    EventType,
    Limits,
    Model,
    ModelRegistry,
    Runtime,
    Tool,
    ToolRegistry,
    Usage,
    usage_of_guard,
)

Ending = Literal["complete", "drop", "stall"]


@dataclass
class Recorded:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes
    #: When the request had arrived whole (wall clock, UTC).
    at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass
class Respond:
    """One scripted response."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    #: A whole body (JSON responses).
    body: bytes | None = None
    #: SSE frames, sent as chunks one by one (a streamed response).
    frames: list[bytes] | None = None
    #: How a streamed response ends: cleanly, by closing the socket without the final chunk, or by stalling.
    ending: Ending = "complete"
    #: Seconds to wait before sending anything (a slow server).
    delay: float = 0.0
    #: Seconds between frames.
    frame_delay: float = 0.0
    #: Keep the connection open after the answer (no ``Connection: close``), then close it without
    #: a byte when the client sends its next request on it: a server that closed an idle keep-alive
    #: connection (the client meets "Server disconnected without sending a response").
    keep_alive: bool = False
    #: Answer without ``Connection: close`` (the headers may say ``Keep-Alive``), then close the
    #: connection at once: what a real llama-server does after a streamed answer
    #: (``tests/wire/llama_server_keep_alive_close.captured.json``).
    close_after: bool = False

    @classmethod
    def json(cls, status: int, body: Any, headers: dict[str, str] | None = None) -> Respond:
        """A JSON response (an error, usually)."""
        return cls(status=status, body=json.dumps(body).encode(), headers=dict(headers or {}))

    @classmethod
    def stream(cls, frames: list[bytes], *, ending: Ending = "complete", **kw: Any) -> Respond:
        """A ``text/event-stream`` response."""
        return cls(frames=list(frames), ending=ending, **kw)


class ProviderServer:
    """``async with ProviderServer() as server``; ``server.url``; ``server.add(Respond...)``; ``server.requests``."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.unexpected: list[Recorded] = []
        #: Requests that asked for the model's window (``GET /props``, ``GET /v1/models``,
        #: ``POST /api/show``), answered by ``probe_answers`` by path, else 404.
        self.probes: list[Recorded] = []
        self.probe_answers: dict[str, Respond | list[Respond]] = {}
        #: Requests sent on a kept-alive connection the server then closed without answering
        #: (``Respond(keep_alive=True)``); not in ``requests``.
        self.hung_up: list[Recorded] = []
        self._script: deque[Respond] = deque()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._closing = asyncio.Event()
        self.port = 0
        #: Called with each request as it arrives whole, before it is answered (the client is waiting).
        self.on_request: Callable[[Recorded], None] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def add(self, *responses: Respond) -> None:
        """Script the next responses, in order."""
        self._script.extend(responses)

    @property
    def remaining(self) -> int:
        """Scripted responses not yet used."""
        return len(self._script)

    def assert_done(self) -> None:
        """Fail if a request came unscripted or a scripted response was never used."""
        assert not self.unexpected, f"unexpected request(s): {[r.path for r in self.unexpected]}"
        assert not self._script, f"{len(self._script)} scripted response(s) never requested"

    async def __aenter__(self) -> ProviderServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing.set()
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        for task in list(self._handlers):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            request = await self._read_request(reader)
            if request is None:
                return
            if is_probe(request):
                # A model asking the server for its window (best effort): answered apart, never
                # from the script, and not counted among the requests.
                self.probes.append(request)
                probe = self.probe_answers.get(request.path)
                if isinstance(probe, list):
                    probe = probe.pop(0) if probe else None
                await self._send(writer, probe or Respond.json(404, {"error": "not found"}))
                return
            self.requests.append(request)
            if self.on_request is not None:
                self.on_request(request)
            if self._script:
                respond = self._script.popleft()
            else:
                self.unexpected.append(request)
                respond = Respond.json(500, {"error": {"message": "unscripted request", "type": "test_error"}})
            await self._send(writer, respond)
            if respond.keep_alive:
                later = await self._read_request(reader)
                if later is not None:
                    self.hung_up.append(later)  # closed below, unanswered
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_request(self, reader: asyncio.StreamReader) -> Recorded | None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _version = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
        return Recorded(method=method, path=path, headers=headers, body=body, raw=raw)

    async def _wait(self, seconds: float) -> None:
        # Returns early when the server closes, so a stalled handler never outlives its test.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    async def _send(self, writer: asyncio.StreamWriter, respond: Respond) -> None:
        if respond.delay:
            await self._wait(respond.delay)
        try:
            reason = HTTPStatus(respond.status).phrase
        except ValueError:
            reason = "Overloaded" if respond.status == 529 else "Unknown"
        headers = {k.lower(): v for k, v in respond.headers.items()}
        if not (respond.keep_alive or respond.close_after):
            headers["connection"] = "close"
        if respond.frames is None:
            body = respond.body or b""
            headers.setdefault("content-type", "application/json")
            headers["content-length"] = str(len(body))
            writer.write(_head(respond.status, reason, headers) + body)
            await writer.drain()
            return
        headers.setdefault("content-type", "text/event-stream")
        headers["transfer-encoding"] = "chunked"
        writer.write(_head(respond.status, reason, headers))
        await writer.drain()
        for frame in respond.frames:
            if respond.frame_delay:
                await self._wait(respond.frame_delay)
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            await writer.drain()
        if respond.ending == "complete":
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        elif respond.ending == "stall":
            await self._wait(60.0)
        # "drop": close the socket with the body unfinished (no terminating chunk).


def is_probe(request: Recorded) -> bool:
    """Whether a request asks for the model's window or counts tokens (asked of a self-hosted server)."""
    path = request.path.split("?", 1)[0]
    if request.method == "GET":
        return path.endswith(("/props", "/v1/models"))
    return request.method == "POST" and path.endswith(("/api/show", "/apply-template", "/tokenize"))


def _head(status: int, reason: str, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# -- SSE frames ---------------------------------------------------------------------------------


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event (``data`` as JSON unless it is already a string)."""
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


# -- OpenAI chat completions ---------------------------------------------------------------------


def oa_chunk(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = None,
    refusal: str | None = None,
    role: str | None = None,
    usage: dict[str, Any] | None = None,
    no_choices: bool = False,
    model: str = "gpt-test",
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` object as OpenAI sends it."""
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if refusal is not None:
        delta["refusal"] = refusal
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    choices = [] if no_choices else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "system_fingerprint": "fp_test",
        "choices": choices,
        "usage": usage,
    }


def oa_call(index: int, *, id: str | None = None, name: str | None = None, args: str | None = None) -> dict[str, Any]:
    """One tool-call delta (the first of a call carries ``id`` and ``name``; later ones only argument text)."""
    out: dict[str, Any] = {"index": index}
    fn: dict[str, Any] = {}
    if id is not None:
        out["id"] = id
        out["type"] = "function"
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    if fn:
        out["function"] = fn
    return out


def oa_usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    """The usage object of the final chunk (``stream_options.include_usage``)."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def openai_stream(chunks: list[dict[str, Any]], *, done: bool = True) -> list[bytes]:
    """SSE frames of a chat-completions stream: ``data: {chunk}`` lines, then ``data: [DONE]``."""
    frames = [sse(c) for c in chunks]
    if done:
        frames.append(sse("[DONE]"))
    return frames


def openai_text(parts: list[str], *, finish: str = "stop", usage: dict[str, Any] | None = None) -> list[bytes]:
    """A whole text answer as OpenAI streams it: role chunk, content chunks, finish chunk, usage chunk, [DONE]."""
    chunks = [oa_chunk(role="assistant", content="")]
    chunks += [oa_chunk(content=p) for p in parts]
    chunks.append(oa_chunk(finish=finish))
    chunks.append(oa_chunk(no_choices=True, usage=usage or oa_usage(10, len(parts))))
    return openai_stream(chunks)


# -- Anthropic Messages --------------------------------------------------------------------------


def an_message_start(
    input_tokens: int = 10, *, cache_read: int = 0, cache_write: int = 0, model: str = "claude-test"
) -> bytes:
    """``event: message_start`` with the input usage."""
    return sse(
        {
            "type": "message_start",
            "message": {
                "id": "msg_test",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": input_tokens,
                    "cache_creation_input_tokens": cache_write,
                    "cache_read_input_tokens": cache_read,
                    "output_tokens": 1,
                },
            },
        },
        "message_start",
    )


def an_text(index: int, parts: list[str]) -> list[bytes]:
    """A text content block: start, one ``text_delta`` per part, stop."""
    frames = [
        sse(
            {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            "content_block_start",
        )
    ]
    frames += [
        sse(
            {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}},
            "content_block_delta",
        )
        for p in parts
    ]
    frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    return frames


def an_tool(index: int, id: str, name: str, json_parts: list[str]) -> list[bytes]:
    """A tool_use content block: start, one ``input_json_delta`` per part, stop."""
    frames = [
        sse(
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}},
            },
            "content_block_start",
        )
    ]
    frames += [
        sse(
            {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": p}},
            "content_block_delta",
        )
        for p in json_parts
    ]
    frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    return frames


def an_message_delta(stop_reason: str, output_tokens: int) -> bytes:
    """``event: message_delta`` with the stop reason and the cumulative output usage."""
    return sse(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        "message_delta",
    )


def an_message_stop() -> bytes:
    """``event: message_stop``."""
    return sse({"type": "message_stop"}, "message_stop")


def an_ping() -> bytes:
    """``event: ping`` (the API sends these; clients ignore them)."""
    return sse({"type": "ping"}, "ping")


def anthropic_text(
    parts: list[str],
    *,
    stop_reason: str = "end_turn",
    input_tokens: int = 10,
    output_tokens: int = 5,
    cache_read: int = 0,
    cache_write: int = 0,
) -> list[bytes]:
    """A whole text answer as the Messages API streams it."""
    return [
        an_message_start(input_tokens, cache_read=cache_read, cache_write=cache_write),
        an_ping(),
        *an_text(0, parts),
        an_message_delta(stop_reason, output_tokens),
        an_message_stop(),
    ]


# -- one scenario in either wire format ------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """A tool call to script: its id, its tool's name, and its arguments' JSON text in the fragments it streams in."""

    id: str
    name: str
    fragments: tuple[str, ...] = ()


def openai_answer(
    text: list[str] | None = None,
    calls: list[Call] | None = None,
    *,
    usage: Usage | None = None,
    finish: str | None = None,
) -> list[bytes]:
    """A whole answer as chat completions streams it: role chunk, text, tool calls, finish, usage, ``[DONE]``.

    The argument fragments of several calls interleave (round robin by index), as a server may send
    them; the first delta of each call carries its id and name. The finish reason is ``tool_calls``
    when there are calls, else ``stop``. Chat completions cannot report cache writes.
    """
    text, calls = list(text or []), list(calls or [])
    chunks = [oa_chunk(role="assistant", content="" if text else None)]
    chunks += [oa_chunk(content=p) for p in text]
    rounds = max([len(c.fragments) or 1 for c in calls], default=0)
    for r in range(rounds):
        for index, call in enumerate(calls):
            if r == 0:
                args = call.fragments[0] if call.fragments else None
                chunks.append(oa_chunk(tool_calls=[oa_call(index, id=call.id, name=call.name, args=args)]))
            elif r < len(call.fragments):
                chunks.append(oa_chunk(tool_calls=[oa_call(index, args=call.fragments[r])]))
    chunks.append(oa_chunk(finish=finish or ("tool_calls" if calls else "stop")))
    if usage is not None:
        if usage.cache_write_tokens:
            raise ValueError("chat completions has no cache writes to report")
        prompt = usage.input_tokens + usage.cache_read_tokens
        chunks.append(oa_chunk(no_choices=True, usage=oa_usage(prompt, usage.output_tokens, usage.cache_read_tokens)))
    return openai_stream(chunks)


def openai_started(text: list[str], *, input_tokens: int = 10, text_done: bool = False) -> list[bytes]:
    """The first frames of a chat-completions answer that never finishes: text chunks, no finish reason.

    Chat completions reports no usage before its last chunk, so ``input_tokens`` is not sent;
    ``text_done`` changes nothing either (there is no block to close).
    """
    del input_tokens, text_done
    first, *rest = text
    return [sse(oa_chunk(role="assistant", content=first)), *(sse(oa_chunk(content=p)) for p in rest)]


def anthropic_answer(
    text: list[str] | None = None,
    calls: list[Call] | None = None,
    *,
    usage: Usage | None = None,
    finish: str | None = None,
) -> list[bytes]:
    """A whole answer as the Messages API streams it: ``message_start``, a ping, one block per part, the end.

    The text is block 0 (when there is text), each call a ``tool_use`` block after it. The stop
    reason is ``tool_use`` when there are calls, else ``end_turn``.
    """
    text, calls = list(text or []), list(calls or [])
    u = usage or Usage(input_tokens=10, output_tokens=5)
    frames = [
        an_message_start(u.input_tokens, cache_read=u.cache_read_tokens, cache_write=u.cache_write_tokens),
        an_ping(),
    ]
    if text:
        frames += an_text(0, text)
    for offset, call in enumerate(calls):
        frames += an_tool(offset + (1 if text else 0), call.id, call.name, list(call.fragments))
    stop = finish or ("tool_use" if calls else "end_turn")
    return [*frames, an_message_delta(stop, u.output_tokens), an_message_stop()]


def anthropic_started(text: list[str], *, input_tokens: int = 10, text_done: bool = False) -> list[bytes]:
    """The first frames of a Messages answer that never finishes: ``message_start`` (the input usage), a text block.

    The block is left open unless ``text_done``; there is never a ``message_delta`` or ``message_stop``.
    """
    block = an_text(0, text)
    return [an_message_start(input_tokens), an_ping(), *(block if text_done else block[:-1])]


# -- one real runtime turn -------------------------------------------------------------------------


@dataclass
class TurnRecord:
    """What one turn through a real :class:`Runtime` left in the store."""

    events: list[Event]
    calls: list[dict[str, Any]]
    charged_tokens: int
    charged_cost: float

    def of(self, type_: str) -> list[Event]:
        """Events of one type."""
        return [e for e in self.events if e.type == type_]

    @property
    def turn_end(self) -> dict[str, Any]:
        """The data of the (single) ``turn/end`` event."""
        ends = self.of(EventType.TURN_END)
        assert len(ends) == 1, ends
        return ends[0].data


async def run_turn(
    db_path: Path, model: Model, text: str = "hello", *, tools: list[Tool[Any]] | None = None, seconds: float = 30.0
) -> TurnRecord:
    """Send one follow-up to a fresh session of a real runtime that uses ``model``; wait for idle.

    The session has a spend guard (so charges can be read back) and the driver retries after
    1 ms (``{"agent": {"retry": {"base_delay": 0.001}}}``).
    """
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    tool_list = list(tools or [])
    async with Runtime.open(db_path, models=registry, tools=lambda row: ToolRegistry(list(tool_list))) as rt:
        gid = await rt.create_guard(Limits(max_tokens=10_000_000))
        sid = await rt.create_session(guard_id=gid, config={"agent": {"retry": {"base_delay": 0.001}}})
        agent = await rt.agent(sid)
        await agent.followup(text)
        async with asyncio.timeout(seconds):
            await agent.when_idle()
        events = await rt.store.events_after(sid, 0)

        def read_calls(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute("SELECT * FROM model_calls WHERE session_id=? ORDER BY attempt", (sid,))
            return [dict(r) for r in rows.fetchall()]

        calls = await rt.store.read(read_calls)
        tokens, cost = await rt.store.transact(lambda tx: usage_of_guard(tx, gid))
    return TurnRecord(events=events, calls=calls, charged_tokens=tokens, charged_cost=cost)


#: Recorded answers of real servers (``tests/wire/``; its README says which were written by hand).
WIRE = Path(__file__).resolve().parent / "wire"


def recorded_frames(name: str) -> list[bytes]:
    """The events of a recorded stream (``tests/wire/NAME``), each a frame as sent (comments included:
    a header of ``:`` lines, which SSE readers ignore)."""
    raw = (WIRE / name).read_bytes()
    return [part + b"\n\n" for part in raw.split(b"\n\n") if part.strip()]


def recorded_response(name: str) -> Respond:
    """A recorded whole answer (``tests/wire/NAME``: JSON with ``status``, ``headers`` and ``body``,
    the body as the server sent it, as text; ``"chunked": true``: sent with chunked transfer
    encoding, as a stream is, the body as its one frame, or none if it is empty)."""
    rec = json.loads((WIRE / name).read_text())
    status, headers, body = int(rec["status"]), dict(rec.get("headers", {})), str(rec["body"]).encode()
    if rec.get("chunked"):
        return Respond(status=status, headers=headers, frames=[body] if body else [])
    return Respond(status=status, headers=headers, body=body)


def context_length_refusal(window: int, tokens: int) -> Respond:
    """OpenAI's (and vLLM's) 400 answer to a prompt of ``tokens`` tokens past a ``window``-token context."""
    message = (
        f"This model's maximum context length is {window} tokens. However, your messages resulted in "
        f"{tokens} tokens. Please reduce the length of the messages."
    )
    body = {"error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}}
    return Respond.json(400, body)
