"""Faults of real servers, replayed from recordings in ``tests/wire/`` (its README says which).

Each recording is served by the local server of ``providers_server`` to the real provider class,
through a real runtime turn where the driver's reaction matters. Where a fault has both a recording
written by hand and one captured from a real ``llama-server`` (``*.captured.*``, by
``scripts/record_wire.py``), the test runs on each (ids ``by-hand`` and ``captured``). Pins (issue 25):

* a tool call cut off by the output limit (llama-server: the arguments end mid-string, then
  ``finish_reason: "length"``) ends the turn ``max_tokens`` after one request: the call is recorded
  as a note, never run, never called malformed, never retried;
* llama-server's 400 refusal ("request (2253 tokens) exceeds the available context size (2048
  tokens)") teaches the model its window, recorded as ``server refusal``; compaction aims at it at
  once and the retry fits;
* a model whose window the configuration does not set asks the server at first use (``/props``,
  ``/v1/models``, ``/api/show``), once, and a 404 changes nothing;
* llama-cpp-python's empty HTTP 200 after a prompt near the window (written by hand, and captured
  from its real server) is a probable overflow: the view is compacted and the request retried
  once, the empty attempt charged nothing and never counted against the provider's circuit breaker;
* a keep-alive connection the server closed after a streamed answer (llama-server's answer ends
  without ``Connection: close``) fails nothing: the next request is sent again at once on a new
  connection, with no failed attempt recorded and no breaker count;
* a server that sends no usage is charged estimates at the model's running ratio of the calls that
  did report usage, and an answer's estimate never exceeds the call's ``max_tokens``;
* llama-server's error event inside a 200 stream (the model's output left the tool-call format,
  captured) is a failed attempt that is retried, a server fault (never a dropped connection) that
  counts against the provider's breaker, its message in plain words; the retry's answer ends the turn.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from providers_server import (
    WIRE,
    ProviderServer,
    Recorded,
    Respond,
    oa_chunk,
    oa_usage,
    openai_stream,
    openai_text,
    recorded_frames,
    recorded_response,
    run_turn,
)
from pydantic import BaseModel

from agent import (
    ContextCompacted,
    EventType,
    FunctionTool,
    Limits,
    Model,
    ModelRegistry,
    Runtime,
    ToolContext,
    Usage,
)
from agent.context import SUMMARY_INSTRUCTION
from agent.messages import TextBlock
from agent.models.base import CUT_CALL_HEAD, ConvMessage, ModelRequest, ToolSpec
from agent.models.health import GuardedModel, ProviderHealth
from agent.models.openai import OpenAIModel


class WriteArgs(BaseModel):
    path: str
    content: str


@pytest.fixture
async def server() -> AsyncIterator[ProviderServer]:
    async with ProviderServer() as srv:
        yield srv
        srv.assert_done()


#: The tool call cut by the output limit: written by hand, and captured from a real llama-server.
CUT_CALLS = pytest.mark.parametrize(
    "recording",
    ["llama_server_cut_tool_call.sse", "llama_server_cut_tool_call.captured.sse"],
    ids=["by-hand", "captured"],
)


def cut_call_facts(name: str) -> tuple[int, str]:
    """A recorded cut tool call's total tokens (its usage chunk) and its arguments, joined."""
    total, args = 0, ""
    for frame in recorded_frames(name):
        for line in frame.decode().splitlines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            total = chunk.get("usage", {}).get("total_tokens", total)
            for choice in chunk["choices"]:
                for call in choice["delta"].get("tool_calls") or []:
                    args += call["function"].get("arguments") or ""
    return total, args


def captured_body(name: str) -> dict[str, Any]:
    """The JSON body of a recorded whole answer."""
    return dict(json.loads(json.loads((WIRE / name).read_text())["body"]))


def llama_server(server: ProviderServer, name: str = "SmolLM2-135M-Instruct", **kw: Any) -> OpenAIModel:
    """The OpenAI-compatible provider pointed at the local server, as at a llama-server."""
    return OpenAIModel(name, base_url=server.url + "/v1", api_key="", **{"timeout": 5.0, "max_tokens": 32, **kw})


@CUT_CALLS
async def test_a_tool_call_cut_by_the_output_limit_ends_max_tokens_with_one_request(
    server: ProviderServer, db_path: Path, recording: str
) -> None:
    total, arguments = cut_call_facts(recording)
    ran: list[WriteArgs] = []

    async def write(args: WriteArgs, ctx: ToolContext) -> str:
        ran.append(args)
        return "written"

    server.add(Respond.stream(recorded_frames(recording)))
    model = llama_server(server, "cut-call")
    try:
        record = await run_turn(
            db_path, model, "write a.txt", tools=[FunctionTool("write_file", "write", WriteArgs, write)]
        )
    finally:
        await model.aclose()
    end = record.turn_end
    assert (end["reason"], end.get("modelFinish")) == ("max_tokens", "max_tokens")
    assert len(server.requests) == 1
    assert ran == []
    assert not record.of(EventType.MODEL_ERROR)
    assert [c["error_class"] for c in record.calls] == [None]
    # The usage the server reported is what is charged.
    assert record.charged_tokens == total
    if recording == "llama_server_cut_tool_call.sse":
        assert (total, arguments) == (1250, '{"path":"a.txt","content":"txt')
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["finishReason"] == "max_tokens"
    [note] = answer.data["content"]
    assert note["type"] == "text"
    assert "write_file" in note["text"] and "cut off by the output limit" in note["text"]
    assert arguments[:CUT_CALL_HEAD] in note["text"]
    assert not record.of(EventType.TOOL_RESULT)


async def _session(db_path: Path, model: Model, *texts: str) -> list[Any]:
    """The events of a fresh session of a real runtime that sent ``texts`` one after another."""
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    async with Runtime.open(db_path, models=registry) as rt:
        gid = await rt.create_guard(Limits(max_tokens=10_000_000))
        sid = await rt.create_session(guard_id=gid, config={"agent": {"retry": {"base_delay": 0.001}}})
        agent = await rt.agent(sid)
        for text in texts:
            await agent.followup(text)
            async with asyncio.timeout(30):
                await agent.when_idle()
        return await rt.store.events_after(sid, 0)


@pytest.mark.parametrize(
    "recording",
    ["llama_server_context_refusal.response.json", "llama_server_context_refusal.captured.response.json"],
    ids=["by-hand", "captured"],
)
async def test_llama_server_s_refusal_teaches_the_window_and_the_retry_fits(
    server: ProviderServer, db_path: Path, recording: str
) -> None:
    server.add(
        Respond.stream(openai_text(["noted"], usage=oa_usage(1100, 2))),
        recorded_response(recording),
        Respond.stream(openai_text(["Earlier: the user sent a long message A."], usage=oa_usage(1150, 12))),
        Respond.stream(openai_text(["done"], usage=oa_usage(1160, 1))),
    )
    model = llama_server(server, "learns")
    assert (model.context_window, model.window_source) == (128_000, "default")
    try:
        events = await _session(db_path, model, "A " + "a" * 4000, "B " + "b" * 4000)
    finally:
        await model.aclose()
    # The window the server stated, with where it came from, used from the next request on.
    assert (model.context_window, model.window_source) == (2048, "server refusal")
    assert model.window_info() == {"contextWindow": 2048, "windowSource": "server refusal"}
    _, refused, summary, retry = server.requests
    assert SUMMARY_INSTRUCTION[:40] in summary.raw.decode()
    [error] = [e.data for e in events if e.type == EventType.MODEL_ERROR]
    assert (error["kind"], error["retrying"]) == ("context_length", True)
    assert "exceeds the available context size (2048 tokens)" in error["message"]
    # Compaction aimed at the learned window: the retry is smaller and estimated to fit it.
    [compacted] = [e.payload for e in events if isinstance(e.payload, ContextCompacted)]
    assert compacted.tokens_after + retry.body["max_tokens"] <= 2048
    assert len(retry.raw) < len(refused.raw)
    assert "b" * 4000 in retry.raw.decode()  # the newest message is kept whole
    assert retry.body["max_tokens"] <= 2048 // 4
    ends = [e.data for e in events if e.type == EventType.TURN_END]
    assert [e["reason"] for e in ends] == ["end_turn", "end_turn"]
    # The server was asked for its window once, at first use; its 404s changed nothing.
    assert [(p.method, p.path) for p in server.probes] == [
        ("GET", "/props"),
        ("GET", "/v1/models"),
        ("POST", "/api/show"),
    ]


@pytest.mark.parametrize(
    ("path", "answer", "source", "window"),
    [
        ("/props", {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1}, "server /props", 2048),
        ("/props", captured_body("llama_server_props.captured.response.json"), "server /props", 2048),
        (
            "/v1/models",
            {"object": "list", "data": [{"id": "asks", "object": "model", "max_model_len": 4096}]},
            "server /v1/models",
            4096,
        ),
        (
            "/api/show",
            {"parameters": "num_ctx 8192", "model_info": {"llama.context_length": 131072}},
            "server /api/show",
            8192,
        ),
    ],
    ids=["llama-server", "llama-server-captured", "vllm", "ollama"],
)
async def test_an_unset_window_is_asked_of_the_server_at_first_use(
    server: ProviderServer, db_path: Path, path: str, answer: dict[str, Any], source: str, window: int
) -> None:
    server.probe_answers[path] = Respond.json(200, answer)
    server.add(Respond.stream(openai_text(["hi"])), Respond.stream(openai_text(["again"])))
    model = llama_server(server, "asks")
    try:
        await _session(db_path, model, "hello", "hello again")
    finally:
        await model.aclose()
    assert (model.context_window, model.window_source) == (window, source)
    asked = [p.path for p in server.probes]
    assert asked[-1] == path and len(asked) == len(set(asked))  # once each, up to the one that said


async def test_a_configured_window_is_not_asked(server: ProviderServer, db_path: Path) -> None:
    server.add(Respond.stream(openai_text(["hi"])))
    model = llama_server(server, "configured", context_window=4096)
    try:
        await _session(db_path, model, "hello")
    finally:
        await model.aclose()
    assert (model.context_window, model.window_source) == (4096, "config")
    assert server.probes == []


@pytest.mark.parametrize(
    "recording",
    ["llama_cpp_python_empty_200.response.json", "llama_cpp_python_empty_200.captured.response.json"],
    ids=["by-hand", "captured"],
)
async def test_an_empty_200_after_a_prompt_near_the_window_is_a_probable_overflow(
    server: ProviderServer, db_path: Path, recording: str
) -> None:
    server.add(
        Respond.stream(openai_text(["noted"], usage=oa_usage(700, 2))),
        recorded_response(recording),
        Respond.stream(openai_text(["Earlier: the user sent a long message A."], usage=oa_usage(650, 12))),
        Respond.stream(openai_text(["done"], usage=oa_usage(800, 1))),
    )
    health = ProviderHealth("local", failure_threshold=1)
    model = GuardedModel(llama_server(server, "overflows", context_window=2048), health)
    try:
        events = await _session(db_path, model, "A " + "a" * 2500, "B " + "b" * 1500)
    finally:
        await model.aclose()
    [error] = [e.data for e in events if e.type == EventType.MODEL_ERROR]
    assert (error["kind"], error["retrying"]) == ("context_length", True)
    assert error["message"].startswith("probable overflow: ") and "empty stream" in error["message"]
    assert "near the context window of 2048 tokens (config)" in error["message"]
    # The stream never began: nothing charged, nothing estimated.
    assert Usage.model_validate(error["usage"]) == Usage() and not error.get("estimated")
    _, empty, summary, retry = server.requests
    assert SUMMARY_INSTRUCTION[:40] in summary.raw.decode()
    assert len(retry.raw) < len(empty.raw)
    assert [e.data["reason"] for e in events if e.type == EventType.TURN_END] == ["end_turn", "end_turn"]
    # The server answered: no failure counted against its breaker (one would have opened it).
    assert (health.breaker.state.value, health.breaker.consecutive_failures) == ("closed", 0)


@CUT_CALLS
async def test_a_keep_alive_connection_closed_after_a_streamed_answer_is_retried_without_a_breaker_count(
    server: ProviderServer, db_path: Path, recording: str
) -> None:
    server.add(
        Respond.stream(recorded_frames(recording), keep_alive=True),
        Respond.stream(openai_text(["fine"], usage=oa_usage(40, 1))),
    )
    health = ProviderHealth("local", failure_threshold=1)
    model = GuardedModel(llama_server(server, "keepalive", context_window=8192), health)
    try:
        events = await _session(db_path, model, "write a.txt", "and now?")
    finally:
        await model.aclose()
    assert len(server.hung_up) == 1 and len(server.requests) == 2
    assert not [e for e in events if e.type == EventType.MODEL_ERROR]
    assert [e.data["reason"] for e in events if e.type == EventType.TURN_END] == ["max_tokens", "end_turn"]
    assert (health.breaker.state.value, health.breaker.consecutive_failures, health.failures) == ("closed", 0, 0)


async def test_llama_server_s_close_after_a_streamed_answer_is_met_with_a_new_connection_and_no_failure(
    server: ProviderServer, db_path: Path
) -> None:
    captured = json.loads((WIRE / "llama_server_keep_alive_close.captured.json").read_text())
    # What the real server did: it said Keep-Alive, closed the connection right after the streamed
    # answer, and a second request on that connection got no response (the staged case above).
    assert captured["headers"]["Keep-Alive"].startswith("timeout=")
    assert captured["closed_by_server_when_idle"] is True
    assert captured["second_request_on_it"] == "closed without a response"
    said = {k: v for k, v in captured["headers"].items() if k.lower() not in ("transfer-encoding", "content-type")}
    server.add(
        Respond.stream(openai_text(["hi"], usage=oa_usage(20, 1)), headers=said, close_after=True),
        Respond.stream(openai_text(["fine"], usage=oa_usage(40, 1))),
    )
    health = ProviderHealth("local", failure_threshold=1)
    model = GuardedModel(llama_server(server, "keepalive", context_window=8192), health)
    try:
        events = await _session(db_path, model, "hello", "and now?")
    finally:
        await model.aclose()
    assert len(server.requests) == 2 and server.unexpected == []
    assert not [e for e in events if e.type == EventType.MODEL_ERROR]
    assert [e.data["reason"] for e in events if e.type == EventType.TURN_END] == ["end_turn", "end_turn"]
    assert (health.breaker.state.value, health.breaker.consecutive_failures, health.failures) == ("closed", 0, 0)


async def test_without_usage_the_estimate_follows_the_reported_calls_and_never_exceeds_max_tokens(
    server: ProviderServer, db_path: Path
) -> None:
    def answer(request: Recorded) -> None:
        if len(server.requests) == 1:
            # The first call reports its usage: one token per 8 bytes of request (a byte-frugal tokenizer).
            server.add(Respond.stream(openai_text(["ok"], usage=oa_usage(len(request.raw) // 8, 1))))
        else:
            # The next reports none, and answers 4,000 characters (cut by the output limit).
            server.add(Respond.stream(openai_stream([oa_chunk(content="z" * 4000), oa_chunk(finish="length")])))

    server.on_request = answer
    model = llama_server(server, "calibrated", context_window=100_000)  # 32 output tokens a call
    try:
        events = await _session(db_path, model, "first " + "a" * 3000, "second " + "b" * 3000)
    finally:
        await model.aclose()
    reported, estimated = (
        Usage.model_validate(e.data["usage"]) for e in events if e.type == EventType.ASSISTANT_MESSAGE
    )
    second = len(server.requests[1].raw)
    assert reported.input_tokens == len(server.requests[0].raw) // 8
    # The prompt at the calibrated ratio (not 3 bytes a token: that was 2.7 times too much here).
    assert abs(estimated.input_tokens - (second / 8 + 16)) <= 2
    assert estimated.input_tokens < second / 3 / 2
    # The answer's 4,000 characters are no more than the 32 tokens the call allowed.
    assert estimated.output_tokens == 32


async def test_llama_server_s_error_event_inside_a_200_stream_is_a_failed_attempt_that_is_retried(
    server: ProviderServer, db_path: Path
) -> None:
    # Captured: a write_file call streamed, then the model's output left the tool-call format and
    # llama-server ended the 200 stream with {"error": {"code": 500, ...}}: no finish reason, no usage.
    server.add(
        Respond.stream(recorded_frames("llama_server_format_error_in_stream.captured.sse")),
        Respond.stream(openai_text(["fine"], usage=oa_usage(40, 1))),
    )
    # A breaker that opens at the first server fault (and lets a probe through at once): the error
    # event must count as one, where an empty or malformed answer would not.
    changes: list[str] = []
    health = ProviderHealth("local", failure_threshold=1, cooldown=0.0)
    health.breaker.on_change = lambda old, new, *_: changes.append(f"{old}->{new}")
    model = GuardedModel(llama_server(server, "format-error", context_window=8192), health)
    try:
        events = await _session(db_path, model, "write a.txt")
    finally:
        await model.aclose()
    assert len(server.requests) == 2
    [error] = [e.data for e in events if e.type == EventType.MODEL_ERROR]
    # A server fault, not a dropped connection (``connection``) nor a malformed answer.
    assert (error["kind"], error["retrying"]) == ("server", True), error
    # In plain words: what the server did, and its own message.
    assert error["message"] == (
        "openai failed its answer: HTTP 200, then error 500 inside the stream (a server fault, not a dropped"
        " connection): The model produced output that does not match the expected peg-native format"
    )
    # Counted against the provider's breaker as a server failure: it opened, and the retry (its
    # probe) closed it; the provider's last error is the same words.
    assert changes == ["closed->open", "open->half_open", "half_open->closed"], changes
    assert (health.failures, health.breaker.consecutive_failures, health.state) == (1, 0, "closed")
    assert health.last_error == f"server: {error['message']}"
    # The answer had begun without usage: the prompt's likely size is charged, the cut answer nothing.
    usage = Usage.model_validate(error["usage"])
    assert error["estimated"] and usage.input_tokens > 0 and usage.output_tokens == 0
    assert not [e for e in events if e.type == EventType.TOOL_RESULT]  # the half-streamed call never ran
    assert [e.data["reason"] for e in events if e.type == EventType.TURN_END] == ["end_turn"]


def no_usage(text: str) -> list[bytes]:
    """A whole text answer from a server that reports no usage."""
    return openai_stream([oa_chunk(role="assistant", content=""), oa_chunk(content=text), oa_chunk(finish="stop")])


def asking(text: str) -> ModelRequest:
    """A one-message request of at most 32 output tokens, no tools."""
    return ModelRequest(
        system=None, messages=[ConvMessage(role="user", content=[TextBlock(text=text)])], tools=[], max_tokens=32
    )


def tokenize_recording() -> tuple[dict[str, Any], list[bytes], list[dict[str, Any]], dict[str, int]]:
    """The captured chat completion and the server's counts (``llama_server_tokenize.captured.json``):
    its request, its stream's frames with the usage chunk taken out (a server that reports none),
    the ``/apply-template`` and ``/tokenize`` exchanges, and the usage the server reported."""
    rec = json.loads((WIRE / "llama_server_tokenize.captured.json").read_text())
    frames, usage = [], None
    for part in rec["chat"]["body"].encode().split(b"\n\n"):
        if not part.strip():
            continue
        if part.startswith(b"data: {"):
            chunk = json.loads(part[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
                continue
        frames.append(part + b"\n\n")
    assert usage is not None
    return json.loads(rec["chat"]["request"]), frames, rec["exchanges"], usage


async def test_without_usage_llama_server_s_tokenizer_counts_the_call_as_the_server_did(
    server: ProviderServer,
) -> None:
    # Captured: a chat completion whose usage said 486 prompt + 48 completion tokens, and what
    # /apply-template and /tokenize answered for its prompt and its answer. Replayed without usage.
    sent, frames, exchanges, usage = tokenize_recording()
    server.probe_answers = {
        "/apply-template": Respond(status=200, body=exchanges[0]["body"].encode()),
        "/tokenize": [Respond(status=200, body=e["body"].encode()) for e in exchanges[1:]],
    }
    server.add(Respond.stream(frames))
    model = llama_server(server, "SmolLM2-135M-Instruct", max_tokens=sent["max_tokens"], context_window=2048)
    messages = [
        ConvMessage(role="user", content=[TextBlock(text=m["content"])])
        for m in sent["messages"]
        if m["role"] == "user"
    ]
    [system] = [m["content"] for m in sent["messages"] if m["role"] == "system"]
    tool = sent["tools"][0]["function"]
    request = ModelRequest(
        system=system,
        messages=messages,
        tools=[ToolSpec(name=tool["name"], description=tool["description"], input_schema=tool["parameters"])],
        max_tokens=sent["max_tokens"],
    )
    try:
        response = await model.complete(request)
    finally:
        await model.aclose()
    # The body goald sent is the one recorded (so the recorded counts are of it).
    [chat] = server.requests
    assert chat.body == sent
    # Counted by the server's tokenizer: exactly what the server reported when it did report.
    assert response.estimated
    assert (response.usage.input_tokens, response.usage.output_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert model.tokenizer == "llama-server"
    # Asked as recorded: the same body through the chat template, then its prompt and the answer.
    asked = [(p.path, p.body) for p in server.probes if p.path in ("/apply-template", "/tokenize")]
    assert asked == [(e["path"], json.loads(e["request"])) for e in exchanges]


async def test_without_usage_vllm_s_tokenizer_counts_the_call(server: ProviderServer) -> None:
    # vLLM (written by hand from its documented /tokenize: {"count", "max_model_len", "tokens"}): no
    # /apply-template (404); /tokenize with the messages counts the templated prompt, then the answer.
    server.probe_answers = {
        "/tokenize": [
            Respond.json(200, {"count": 57, "max_model_len": 4096, "tokens": list(range(57))}),
            Respond.json(200, {"count": 3, "max_model_len": 4096, "tokens": [1, 2, 3]}),
            Respond.json(200, {"count": 61, "max_model_len": 4096, "tokens": list(range(61))}),
            Respond.json(200, {"count": 2, "max_model_len": 4096, "tokens": [1, 2]}),
        ]
    }
    server.add(Respond.stream(no_usage("three words here")), Respond.stream(no_usage("two words")))
    model = llama_server(server, "vllm-model", context_window=4096)
    try:
        first = await model.complete(asking("count me"))
        second = await model.complete(asking("count me again"))
    finally:
        await model.aclose()
    # The answer's tokens and the end-of-answer token the model generated (finish "stop").
    assert (first.usage.input_tokens, first.usage.output_tokens) == (57, 3 + 1)
    assert (second.usage.input_tokens, second.usage.output_tokens) == (61, 2 + 1)
    assert model.tokenizer == "vllm"
    paths = [p.path for p in server.probes]
    # The llama-server route was tried once (404), then vLLM's for every call.
    assert paths == ["/apply-template", "/tokenize", "/tokenize", "/tokenize", "/tokenize"]
    prompt_ask = server.probes[1].body
    assert prompt_ask["model"] == "vllm-model" and prompt_ask["add_generation_prompt"] is True
    assert prompt_ask["messages"] == [{"role": "user", "content": "count me"}]
    assert server.probes[2].body == {"model": "vllm-model", "prompt": "three words here", "add_special_tokens": False}


async def test_without_a_tokenizer_the_server_is_asked_once_and_the_ratio_estimates(server: ProviderServer) -> None:
    server.add(Respond.stream(no_usage("one")), Respond.stream(no_usage("two")))
    model = llama_server(server, "no-tokenizer", context_window=4096)
    try:
        for text in ("first", "second"):
            response = await model.complete(asking(text))
            assert response.estimated and response.usage.input_tokens > 0
    finally:
        await model.aclose()
    assert model.tokenizer == "none"
    assert [p.path for p in server.probes] == ["/apply-template", "/tokenize"]
