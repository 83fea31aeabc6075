"""The control protocol at unit level: framing (:func:`read_frames`), one connection's loop
(:func:`serve_connection` over a real socket pair) and the :class:`Dispatcher`'s error answers.

What is pinned: frames arrive whole however the bytes are chunked; a frame over the limit is
skipped up to its newline, answered with an error, and the next frame is served; every malformed
frame gets the JSON-RPC error the spec names (-32700, -32600, -32601, -32602 with the offending
field in ``data.field``) or goald's application code (:class:`ErrorCode`); a notification is never
answered. The real daemon's method table (``build_dispatcher``) is used for the params checks: a
host that was never started validates params before it touches anything.

The only stand-in is :class:`ChunkReader`, a ``StreamReader`` that hands out exactly the chunks a
test lists (the kernel would coalesce writes, so a socket cannot pin a particular split).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agent import Conflict, InvalidInput, InvalidTransition, NotFound, SessionId
from daemon.host import Host
from daemon.rpc.methods import build_dispatcher
from daemon.rpc.protocol import Dispatcher, ErrorCode, Peer, RpcError, encode, read_frames
from daemon.rpc.server import serve_connection

WAIT = 10.0
MAX = 1024


class ChunkReader(asyncio.StreamReader):
    """A reader that returns exactly the listed chunks (each cut to the size asked for), then EOF."""

    def __init__(self, chunks: Sequence[bytes]) -> None:
        super().__init__()
        self._chunks = [c for c in chunks if c]
        self.reads = 0

    async def read(self, n: int = -1) -> bytes:
        self.reads += 1
        if not self._chunks:
            return b""
        head = self._chunks[0]
        if 0 < n < len(head):
            self._chunks[0] = head[n:]
            return head[:n]
        self._chunks.pop(0)
        return head


async def frames_of(chunks: Sequence[bytes], max_bytes: int = MAX) -> list[bytes | None]:
    out: list[bytes | None] = []
    async with asyncio.timeout(WAIT):
        async for frame in read_frames(ChunkReader(chunks), max_bytes):
            out.append(frame)
    return out


# -- framing -------------------------------------------------------------------------------


async def test_a_frame_split_across_chunks_arrives_whole() -> None:
    frame = b'{"jsonrpc":"2.0","id":1,"method":"initialize"}'
    # Every split point, including one that leaves the newline alone in the last chunk.
    for cut in range(1, len(frame) + 1):
        assert await frames_of([frame[:cut], frame[cut:] + b"\n"]) == [frame]
    # One byte at a time.
    assert await frames_of([bytes([b]) for b in frame + b"\n"]) == [frame]


async def test_several_frames_in_one_chunk_arrive_in_order() -> None:
    a, b, c = b'{"id":1}', b'{"id":2}', b'{"id":3}'
    assert await frames_of([a + b"\n" + b + b"\n" + c + b"\n"]) == [a, b, c]
    # A chunk that ends one frame and starts the next.
    assert await frames_of([a + b"\n" + b[:3], b[3:] + b"\n" + c + b"\n"]) == [a, b, c]


async def test_blank_lines_are_skipped_and_a_last_frame_without_newline_is_served_at_eof() -> None:
    a, b = b'{"id":1}', b'{"id":2}'
    assert await frames_of([b"\n\n  \n" + a + b"\r\n\n", b"  \t\n" + b]) == [a + b"\r", b]


async def test_a_frame_at_the_limit_is_served_and_one_byte_more_is_refused() -> None:
    at_limit = b"x" * MAX
    over = b"y" * (MAX + 1)
    assert await frames_of([at_limit + b"\n" + over + b"\n" + b"next\n"]) == [at_limit, None, b"next"]


@pytest.mark.parametrize(
    "layout",
    [
        "one chunk",
        "oversized frame spread over chunks without a newline",
        "newline alone at the start of the next chunk",
        "oversized frame bigger than a read",
    ],
)
async def test_an_oversized_frame_is_skipped_up_to_its_newline_then_the_next_frame_is_served(layout: str) -> None:
    before, after = b'{"id":"before"}', b'{"id":"after"}'
    big = b'{"id":"big","pad":"' + b"z" * (3 * MAX) + b'"}'
    match layout:
        case "one chunk":
            chunks = [before + b"\n" + big + b"\n" + after + b"\n"]
        case "oversized frame spread over chunks without a newline":
            chunks = [before + b"\n" + big[:100], big[100 : MAX + 50], big[MAX + 50 : 2 * MAX], big[2 * MAX :] + b"\n"]
            chunks.append(after + b"\n")
        case "newline alone at the start of the next chunk":
            chunks = [before + b"\n" + big, b"\n" + after + b"\n"]
        case "oversized frame bigger than a read":
            # Larger than read_frames' 64 KiB reads, with a limit above one read.
            big = b"w" * (200 * 1024)
            chunks = [before + b"\n" + big + b"\n" + after + b"\n"]
            assert await frames_of(chunks, max_bytes=100 * 1024) == [before, None, after]
            return
    assert await frames_of(chunks) == [before, None, after]


async def test_eof_inside_an_oversized_frame_ends_the_stream_without_a_frame() -> None:
    assert await frames_of([b'{"id":1}\n', b"q" * (2 * MAX)]) == [b'{"id":1}']


async def test_several_oversized_frames_each_get_one_refusal() -> None:
    big = b"o" * (2 * MAX)
    assert await frames_of([big + b"\n" + big + b"\n", b'{"id":1}\n' + big, b"\n"]) == [None, None, b'{"id":1}', None]


# -- the dispatcher ------------------------------------------------------------------------


class EchoParams(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    text: str
    times: int = Field(default=1, ge=1, le=3)


class Recorder:
    """A peer's outgoing messages, and the calls the test methods saw."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.calls: list[str] = []
        self.peer = Peer(send=self._send)

    async def _send(self, msg: dict[str, Any]) -> None:
        self.sent.append(msg)


def make_dispatcher(rec: Recorder) -> Dispatcher:
    d = Dispatcher()

    @d.method("echo", EchoParams)
    async def echo(p: EchoParams, peer: Peer) -> dict[str, Any]:
        rec.calls.append(p.text)
        return {"text": p.text * p.times}

    @d.method("ping")
    async def ping(peer: Peer) -> None:
        rec.calls.append("ping")

    failures: dict[str, BaseException] = {
        "notFound": NotFound("goal goal_x not found"),
        "transition": InvalidTransition("cannot resume a completed goal"),
        "conflict": Conflict("a live goal already runs on this session"),
        "shutting": RpcError(ErrorCode.SHUTTING_DOWN, "the daemon is stopping"),
        "pruned": RpcError(ErrorCode.EVENTS_PRUNED, "events before seq 40 are no longer kept", {"firstSeq": 40}),
        "invalid": InvalidInput("objective must not be empty"),
        "internal": RuntimeError("secret internal detail"),
    }

    class FailParams(BaseModel):
        kind: str

    @d.method("fail", FailParams)
    async def fail(p: FailParams, peer: Peer) -> None:
        rec.calls.append(f"fail:{p.kind}")
        raise failures[p.kind]

    return d


async def answer(d: Dispatcher, rec: Recorder, frame: bytes | dict[str, Any]) -> dict[str, Any] | None:
    raw = frame if isinstance(frame, bytes) else json.dumps(frame).encode()
    async with asyncio.timeout(WAIT):
        return await d.handle_frame(raw, rec.peer)


def error_of(resp: dict[str, Any] | None) -> dict[str, Any]:
    assert resp is not None, "a request must be answered"
    assert resp["jsonrpc"] == "2.0"
    assert "result" not in resp, resp
    err = resp["error"]
    assert isinstance(err["code"], int) and isinstance(err["message"], str) and err["message"]
    return err  # type: ignore[no-any-return]


def test_error_codes_are_the_documented_numbers() -> None:
    assert {c.name: int(c) for c in ErrorCode} == {
        "PARSE_ERROR": -32700,
        "INVALID_REQUEST": -32600,
        "METHOD_NOT_FOUND": -32601,
        "INVALID_PARAMS": -32602,
        "INTERNAL_ERROR": -32603,
        "NOT_FOUND": -32001,
        "INVALID_TRANSITION": -32002,
        "CONFLICT": -32003,
        "SHUTTING_DOWN": -32004,
        "EVENTS_PRUNED": -32005,
        "STORAGE_UNAVAILABLE": -32006,
        "NOT_SUPPORTED": -32007,
    }


async def test_a_valid_request_is_answered_with_its_id_and_result() -> None:
    rec = Recorder()
    d = make_dispatcher(rec)
    for req_id in (7, "req-7", 0, ""):
        resp = await answer(d, rec, {"jsonrpc": "2.0", "id": req_id, "method": "echo", "params": {"text": "ab"}})
        assert resp == {"jsonrpc": "2.0", "id": req_id, "result": {"text": "ab"}}
    # A handler that returns nothing answers an empty object; "params": null is no params.
    resp = await answer(d, rec, {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": None})
    assert resp == {"jsonrpc": "2.0", "id": 1, "result": {}}
    # "id": null is a request (not a notification), and it is answered.
    resp = await answer(d, rec, {"jsonrpc": "2.0", "id": None, "method": "ping"})
    assert resp == {"jsonrpc": "2.0", "id": None, "result": {}}
    assert rec.calls == ["ab"] * 4 + ["ping", "ping"]


@pytest.mark.parametrize(
    "frame",
    [
        b"{",
        b'{"jsonrpc": "2.0", "id": 1, "method": ',
        b"{'jsonrpc': '2.0'}",
        b'\xff\xfe{"jsonrpc":"2.0"}',
        b"",
        b"[" * 100_000,  # nested past the parser's recursion limit
        b"1" * 5_000,  # an integer past Python's int-from-string digit limit
        b'{"jsonrpc":"2.0","id":' + b"9" * 5_000 + b',"method":"ping"}',
    ],
    ids=["open-brace", "truncated", "single-quotes", "bad-utf8", "empty", "deep-nesting", "huge-int", "huge-int-id"],
)
async def test_a_frame_that_does_not_parse_is_a_parse_error_with_a_null_id(frame: bytes) -> None:
    rec = Recorder()
    d = make_dispatcher(rec)
    resp = await answer(d, rec, frame)
    err = error_of(resp)
    assert resp is not None and resp["id"] is None
    assert err["code"] == -32700
    assert err["message"].startswith("parse error")
    assert rec.calls == []


@pytest.mark.parametrize(
    ("frame", "reply_id", "says"),
    [
        ([1, 2, 3], None, "JSON object"),
        ("a string", None, "JSON object"),
        (42, None, "JSON object"),
        (None, None, "JSON object"),
        ({"id": 4, "method": "ping"}, 4, "jsonrpc"),
        ({"jsonrpc": "1.0", "id": 5, "method": "ping"}, 5, "jsonrpc"),
        ({"jsonrpc": 2.0, "id": 6, "method": "ping"}, 6, "jsonrpc"),
        ({"jsonrpc": "2.0", "id": True, "method": "ping"}, None, "id"),
        ({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}, None, "id"),
        ({"jsonrpc": "2.0", "id": {"n": 1}, "method": "ping"}, None, "id"),
        ({"jsonrpc": "2.0", "id": [1], "method": "ping"}, None, "id"),
        ({"jsonrpc": "2.0", "id": 8}, 8, "method"),
        ({"jsonrpc": "2.0", "id": 9, "method": 12}, 9, "method"),
        ({"jsonrpc": "2.0", "id": 10, "method": ""}, 10, "method"),
        ({"jsonrpc": "2.0", "id": 11, "method": None}, 11, "method"),
    ],
    ids=[
        "array",
        "string",
        "number",
        "null",
        "no-jsonrpc",
        "jsonrpc-1.0",
        "jsonrpc-number",
        "id-bool",
        "id-float",
        "id-object",
        "id-array",
        "no-method",
        "method-number",
        "method-empty",
        "method-null",
    ],
)
async def test_an_invalid_request_is_refused_with_32600(frame: Any, reply_id: Any, says: str) -> None:
    rec = Recorder()
    d = make_dispatcher(rec)
    resp = await answer(d, rec, frame)
    err = error_of(resp)
    assert err["code"] == -32600
    assert resp is not None and resp["id"] == reply_id
    assert says in err["message"]
    assert rec.calls == []


async def test_an_unknown_method_is_32601_and_names_the_method() -> None:
    rec = Recorder()
    d = make_dispatcher(rec)
    err = error_of(await answer(d, rec, {"jsonrpc": "2.0", "id": 3, "method": "goal/explode", "params": {}}))
    assert err["code"] == -32601
    assert err["data"] == {"method": "goal/explode"}
    assert "goal/explode" in err["message"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "text"),
        ({"text": 5}, "text"),
        ({"text": "a", "times": 0}, "times"),
        ({"text": "a", "times": "many"}, "times"),
        ({"text": "a", "volume": 11}, "volume"),
        ([1, 2], "params"),
        ("text", "params"),
    ],
    ids=["missing", "wrong-type", "out-of-range", "not-a-number", "unknown-field", "array", "string"],
)
async def test_invalid_params_are_32602_with_the_field_named(params: Any, field: str) -> None:
    rec = Recorder()
    d = make_dispatcher(rec)
    err = error_of(await answer(d, rec, {"jsonrpc": "2.0", "id": 1, "method": "echo", "params": params}))
    assert err["code"] == -32602
    assert err["data"]["field"] == field
    assert field in err["message"]
    assert rec.calls == [], "a handler must not run on invalid params"


async def test_a_method_without_params_refuses_params_naming_the_first() -> None:
    rec = Recorder()
    d = make_dispatcher(rec)
    err = error_of(await answer(d, rec, {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"loud": True}}))
    assert err["code"] == ErrorCode.INVALID_PARAMS
    assert err["data"]["field"] == "loud"
    assert rec.calls == []


@pytest.mark.parametrize(
    ("kind", "code", "data"),
    [
        ("notFound", -32001, None),
        ("transition", -32002, None),
        ("conflict", -32003, None),
        ("shutting", -32004, None),
        ("pruned", -32005, {"firstSeq": 40}),
        ("invalid", -32602, {"field": None}),
        ("internal", -32603, None),
    ],
)
async def test_handler_failures_map_to_their_codes(kind: str, code: int, data: Any) -> None:
    rec = Recorder()
    d = make_dispatcher(rec)
    err = error_of(await answer(d, rec, {"jsonrpc": "2.0", "id": "f", "method": "fail", "params": {"kind": kind}}))
    assert err["code"] == code
    assert err.get("data") == data
    if kind == "internal":
        # An unexpected failure is reported by type only: internals do not leak to clients.
        assert "secret internal detail" not in json.dumps(err)
        assert "RuntimeError" in err["message"]
    assert rec.calls == [f"fail:{kind}"]


@pytest.mark.parametrize(
    "frame",
    [
        {"jsonrpc": "2.0", "method": "echo", "params": {"text": "n"}},
        {"jsonrpc": "2.0", "method": "ping"},
        {"jsonrpc": "2.0", "method": "no/such/method"},
        {"jsonrpc": "2.0", "method": "echo", "params": {"text": "n", "times": 99}},
        {"jsonrpc": "2.0", "method": "fail", "params": {"kind": "notFound"}},
        {"jsonrpc": "2.0", "method": "fail", "params": {"kind": "internal"}},
    ],
    ids=["runs", "no-params", "unknown-method", "invalid-params", "handler-error", "internal-error"],
)
async def test_a_notification_is_never_answered(frame: dict[str, Any]) -> None:
    rec = Recorder()
    d = make_dispatcher(rec)
    assert await answer(d, rec, frame) is None
    assert rec.sent == []
    method = frame["method"]
    if method == "echo" and frame["params"].get("times") is None:
        assert rec.calls == ["n"], "a valid notification still runs"
    if method == "ping":
        assert rec.calls == ["ping"]
    if method == "fail":
        assert rec.calls == [f"fail:{frame['params']['kind']}"]


# -- the daemon's own method table (params are checked before anything is touched) ----------


@pytest.fixture
def daemon_dispatcher(unstarted_host: Callable[..., Host]) -> Dispatcher:
    """The real daemon's dispatcher on a host that was never started (no store, no engine)."""
    return build_dispatcher(unstarted_host(sandbox="none"))


SID = str(SessionId.new())


@pytest.mark.parametrize(
    ("method", "params", "field"),
    [
        ("goal/create", {}, "objective"),
        ("goal/create", {"objective": 7}, "objective"),
        ("goal/create", {"objective": "x", "budgets": {"maxRounds": -1}}, "budgets.maxRounds"),
        ("goal/create", {"objective": "x", "budgets": {"maxRounds": 0}}, "budgets.maxRounds"),
        ("goal/create", {"objective": "x", "budgets": {"maxCost": -0.5}}, "budgets.maxCost"),
        ("goal/create", {"objective": "x", "budgets": {"maxTokensTotal": -5}}, "budgets.maxTokensTotal"),
        ("goal/create", {"objective": "x", "budgets": {"maxWallSeconds": 0}}, "budgets.maxWallSeconds"),
        ("goal/create", {"objective": "x", "budgets": {"rounds": 3}}, "budgets.rounds"),
        ("goal/create", {"objective": "x", "verify": [{"cmd": ""}]}, "verify.0.cmd"),
        ("goal/create", {"objective": "x", "verify": [{"cmd": "true", "timeout": -1}]}, "verify.0.timeout"),
        ("goal/create", {"objective": "x", "stallRounds": 0}, "stallRounds"),
        ("goal/create", {"objective": "x", "frobnicate": True}, "frobnicate"),
        ("goal/get", {}, "goalId"),
        ("goal/resume", {"goalId": "goal_01M8XB6PZR8YFJ7F916F3C6TS5", "budgets": {"maxCost": 0}}, "budgets.maxCost"),
        ("goal/list", {"status": "sleeping"}, "status"),
        ("session/prompt", {"sessionId": SID}, "params"),
        ("session/prompt", {"sessionId": SID, "text": "a", "delivery": "shout"}, "delivery"),
        ("session/subscribe", {"afterSeq": -1}, "afterSeq"),
        ("session/events", {"sessionId": SID, "limit": 0}, "limit"),
        ("session/list", {"limit": 10_001}, "limit"),
        ("initialize", {"clientInfo": {"name": "x"}}, "clientInfo"),
        ("schedule/list", {"all": True}, "all"),
        ("schedule/add", {"trigger": {"kind": "cron", "expr": "* * * * *"}}, "goal"),
    ],
)
async def test_daemon_methods_name_the_invalid_field(
    daemon_dispatcher: Dispatcher, method: str, params: dict[str, Any], field: str
) -> None:
    rec = Recorder()
    resp = await answer(daemon_dispatcher, rec, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    err = error_of(resp)
    assert err["code"] == ErrorCode.INVALID_PARAMS, err
    assert err["data"]["field"] == field, err


async def test_daemon_methods_on_a_host_that_is_not_serving_answer_shutting_down(daemon_dispatcher: Dispatcher) -> None:
    rec = Recorder()
    for method, params in [("goal/list", {}), ("goal/create", {"objective": "x"}), ("session/new", {})]:
        resp = await answer(daemon_dispatcher, rec, {"jsonrpc": "2.0", "id": 2, "method": method, "params": params})
        assert error_of(resp)["code"] == ErrorCode.SHUTTING_DOWN, (method, resp)
    assert "goal/create" in daemon_dispatcher.methods and "schedule/add" in daemon_dispatcher.methods


# -- one connection: serve_connection over a real socket pair -------------------------------


class Conn:
    """The client end of a socket pair whose other end :func:`serve_connection` serves."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def recv(self) -> dict[str, Any]:
        async with asyncio.timeout(WAIT):
            line = await self.reader.readline()
        assert line.endswith(b"\n"), f"the server closed the connection (got {line!r})"
        msg = json.loads(line)
        assert isinstance(msg, dict)
        return msg


async def served(max_bytes: int) -> AsyncIterator[tuple[Conn, asyncio.Task[None], Recorder]]:
    rec = Recorder()
    d = make_dispatcher(rec)
    server_sock, client_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    s_reader, s_writer = await asyncio.open_unix_connection(sock=server_sock)
    task = asyncio.create_task(serve_connection(s_reader, s_writer, d, max_bytes))
    c_reader, c_writer = await asyncio.open_unix_connection(sock=client_sock, limit=2**22)
    try:
        yield Conn(c_reader, c_writer), task, rec
    finally:
        c_writer.close()
        await c_writer.wait_closed()
        async with asyncio.timeout(WAIT):
            await task


@pytest.fixture
async def conn() -> AsyncIterator[tuple[Conn, asyncio.Task[None], Recorder]]:
    async for item in served(64 * 1024):
        yield item


def req(req_id: int, text: str) -> bytes:
    return encode({"jsonrpc": "2.0", "id": req_id, "method": "echo", "params": {"text": text}})


async def test_an_oversized_frame_is_answered_with_an_error_and_the_next_frame_is_served(
    conn: tuple[Conn, asyncio.Task[None], Recorder],
) -> None:
    c, task, rec = conn
    # A valid request, one that would be valid but is over the limit, and another valid one, in one write
    # (the writer runs beside the reader: the oversized frame is bigger than the socket's buffers).
    big = encode({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": {"text": "B" * (200 * 1024)}})
    writer = asyncio.create_task(c.send(req(1, "first") + big + req(3, "third")))
    first, refusal, third = await c.recv(), await c.recv(), await c.recv()
    await writer
    assert first == {"jsonrpc": "2.0", "id": 1, "result": {"text": "first"}}
    assert refusal["id"] is None
    assert refusal["error"]["code"] == ErrorCode.INVALID_REQUEST
    assert refusal["error"]["data"] == {"maxBytes": 64 * 1024}
    assert "frame over" in refusal["error"]["message"]
    assert third == {"jsonrpc": "2.0", "id": 3, "result": {"text": "third"}}
    assert rec.calls == ["first", "third"], "the oversized request must not run"
    assert not task.done()


async def test_bad_frames_never_close_the_connection(conn: tuple[Conn, asyncio.Task[None], Recorder]) -> None:
    c, task, rec = conn
    bad: list[tuple[bytes, int]] = [
        (b"{not json\n", -32700),
        (b"[" * 10_000 + b"\n", -32700),
        (b"7" * 5_000 + b"\n", -32700),
        (b"\xc3\x28\n", -32700),
        (b"[1,2]\n", -32600),
        (b'{"jsonrpc":"2.0","id":false,"method":"echo"}\n', -32600),
        (b'{"jsonrpc":"2.0","id":5,"method":"nope"}\n', -32601),
        (b'{"jsonrpc":"2.0","id":6,"method":"echo","params":{"text":1}}\n', -32602),
        (b'{"jsonrpc":"2.0","id":7,"method":"fail","params":{"kind":"internal"}}\n', -32603),
    ]
    for n, (frame, code) in enumerate(bad):
        await c.send(frame)
        resp = await c.recv()
        assert resp["error"]["code"] == code, (frame[:40], resp)
        # The same connection still works after each bad frame.
        await c.send(req(100 + n, f"ok{n}"))
        assert await c.recv() == {"jsonrpc": "2.0", "id": 100 + n, "result": {"text": f"ok{n}"}}
    # A notification in the middle gets no answer: the next line is the next request's response.
    await c.send(encode({"jsonrpc": "2.0", "method": "echo", "params": {"text": "quiet"}}) + req(200, "after"))
    assert await c.recv() == {"jsonrpc": "2.0", "id": 200, "result": {"text": "after"}}
    assert "quiet" in rec.calls
    assert not task.done()


async def test_requests_split_across_writes_and_batched_in_one_write_are_answered_in_order(
    conn: tuple[Conn, asyncio.Task[None], Recorder],
) -> None:
    c, _, rec = conn
    frame = req(1, "split")
    await c.send(frame[:10])
    await c.send(frame[10:])
    assert (await c.recv())["id"] == 1
    await c.send(b"".join(req(i, f"b{i}") for i in range(2, 12)))
    assert [(await c.recv())["id"] for _ in range(2, 12)] == list(range(2, 12))
    assert rec.calls == ["split"] + [f"b{i}" for i in range(2, 12)]
