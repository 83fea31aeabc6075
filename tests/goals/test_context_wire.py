"""Compaction against a local OpenAI-compatible server that enforces a context window.

The real :class:`~agent.models.openai.OpenAIModel` (the official SDK inside) talks to a local
server on 127.0.0.1 speaking the chat-completions wire format. The server counts a request's tokens
as its body bytes / 4 and answers 400 ``context_length_exceeded`` past its window, as vLLM and OpenAI
do; otherwise it plays the same deterministic agent as :mod:`context_models`. A goal of many rounds
with large tool outputs runs to completion, and:

* each request's prompt, as sent on the wire, starts with the whole previous prompt (its messages,
  byte for byte), except right after a compaction (Must-show 7);
* the window is never refused after the first calibration (Must-show 6, in process; the model
  starts with no calibration and a configured window, the server enforces it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from context_models import DUMP_CHARS, dump_tool, objective
from providers_server import ProviderServer, Recorded, Respond, oa_call, oa_chunk, oa_usage, openai_stream, openai_text
from test_context import PATIENT, wait_ended

from agent import ModelRegistry, Runtime, ToolRegistry, file_tools
from agent.context import SUMMARY_INSTRUCTION
from agent.models.health import reported_prompt_tokens
from agent.models.openai import OpenAIModel
from goals import Budgets, GoalEngine, GoalSpec, GoalStatus, tools_for_goal_sessions

WINDOW = 6000
ROUNDS = 50


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def _messages_prefix(raw: bytes) -> bytes:
    """The request body up to the end of its last message (what the next request must start with)."""
    return raw[: raw.index(b'],"max_tokens"')]


class WindowServer:
    """Answers each request by rule (see the module docstring)."""

    def __init__(self, server: ProviderServer) -> None:
        self.server = server
        self.refused: list[int] = []
        self.kinds: list[str] = []
        server.on_request = self.answer

    def answer(self, req: Recorded) -> None:
        tokens = len(req.raw) // 4
        if tokens > WINDOW:
            self.refused.append(len(self.server.requests) - 1)
            self.kinds.append("refused")
            message = (
                f"This model's maximum context length is {WINDOW} tokens. However, your messages resulted in "
                f"{tokens} tokens. Please reduce the length of the messages."
            )
            body = {"error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}}
            self.server.add(Respond.json(400, body))
            return
        usage = oa_usage(tokens, 20)
        messages = req.body["messages"]
        if _text(messages[-1]) == SUMMARY_INSTRUCTION:
            self.kinds.append("summary")
            self.server.add(Respond.stream(openai_text([f"Earlier: {len(messages)} messages of work."], usage=usage)))
            return
        self.kinds.append("turn")
        n, step, target = 0, 0, ROUNDS
        for i in range(len(messages) - 1, -1, -1):
            text = _text(messages[i]) if messages[i]["role"] == "user" else ""
            if "Round " in text:
                n = int(text.split("Round ", 1)[1].split()[0].rstrip(".").split("/")[0])
                step = sum(1 for m in messages[i + 1 :] if m["role"] == "assistant")
                break
        if n >= target:
            calls = [("goal_complete", {"summary": "done", "evidence": "files"})] if step == 0 else []
        elif step == 0:
            calls = [("write_file", {"path": f"r{n}.txt", "content": f"round {n}\n"}), ("dump", {"round": n})]
        else:
            calls = []
        if not calls:
            self.server.add(Respond.stream(openai_text([f"round {n} done"], usage=usage)))
            return
        chunks = [oa_chunk(role="assistant")]
        for i, (name, args) in enumerate(calls):
            chunks.append(oa_chunk(tool_calls=[oa_call(i, id=f"call_{n}_{i}", name=name, args=json.dumps(args))]))
        chunks += [oa_chunk(finish="tool_calls"), oa_chunk(no_choices=True, usage=usage)]
        self.server.add(Respond.stream(openai_stream(chunks)))


async def test_prefix_is_stable_and_the_window_is_kept_on_the_wire(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    async with ProviderServer() as server:
        rules = WindowServer(server)
        model = OpenAIModel(
            "windowed", base_url=server.url + "/v1", api_key="sk-test", timeout=10.0, max_tokens=256,
            context_window=WINDOW, provider="local",
        )  # fmt: skip
        registry = ModelRegistry({model.spec: model}, default=model.spec)

        def tools(row: Any) -> ToolRegistry:
            return ToolRegistry([*file_tools(), dump_tool(), *tools_for_goal_sessions(row.config)])

        try:
            async with Runtime.open(db_path, models=registry, tools=tools) as rt:
                async with GoalEngine.running(rt, timer_interval=0.05) as engine:
                    goal = await engine.create(
                        GoalSpec(
                            objective=objective(ROUNDS),
                            workdir=str(workdir),
                            budgets=Budgets(max_rounds=ROUNDS + 5),
                            rules=PATIENT,
                        )
                    )
                    changed = await wait_ended(rt, goal, within=110.0)
                    await engine.settled()
                    final = await engine.get(goal.id)
        finally:
            await model.aclose()
    assert final.status is GoalStatus.COMPLETED, (changed, final.status_reason)
    assert not server.unexpected
    assert ROUNDS * DUMP_CHARS // 4 > 5 * WINDOW
    # The window: every request the server accepted fit it, and none was refused after the first
    # calibration (the model's first reported usage).
    assert all(len(r.raw) // 4 <= WINDOW for i, r in enumerate(server.requests) if i not in rules.refused)
    assert not [i for i in rules.refused if i > 0], rules.refused
    # Prefix stability: each turn request starts with the previous one's messages, byte for byte,
    # unless a compaction (a summary request) came between them.
    summaries = rules.kinds.count("summary")
    assert summaries >= 3
    breaks = repeated = total = 0
    previous: bytes | None = None
    for req, kind in zip(server.requests, rules.kinds, strict=True):
        if kind != "turn":
            previous = None
            continue
        prefix = _messages_prefix(req.raw)
        total += len(prefix)
        if previous is not None:
            assert prefix.startswith(previous), "a request rewrote the prompt of the one before"
            repeated += len(previous)
        else:
            breaks += 1
        previous = prefix
    assert breaks <= summaries + 1
    share = repeated / total
    print(f"prefix repeated from the previous request: {share:.1%} of prompt bytes; {summaries} compactions")
    assert share > 0.5


async def test_context_length_answers_are_classified() -> None:
    from agent import ModelError, ModelErrorKind, ModelRequest
    from agent.messages import TextBlock
    from agent.models.anthropic import AnthropicModel
    from agent.models.base import ConvMessage

    request = ModelRequest(None, (ConvMessage(role="user", content=[TextBlock(text="hi")]),), (), 16)
    openai_body = {
        "error": {
            "message": "This model's maximum context length is 4096 tokens. "
            "However, your messages resulted in 5000 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    anthropic_body = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"},
    }
    async with ProviderServer() as server:
        server.add(Respond.json(400, openai_body), Respond.json(400, anthropic_body))
        oa = OpenAIModel("m", base_url=server.url + "/v1", api_key="sk-test", timeout=5.0)
        an = AnthropicModel("c", base_url=server.url, api_key="sk-test", timeout=5.0)
        try:
            for model, tokens in ((oa, 5000), (an, 210000)):
                try:
                    await model.complete(request)
                except ModelError as exc:
                    assert exc.kind is ModelErrorKind.CONTEXT_LENGTH, exc
                    assert reported_prompt_tokens(exc.message) == tokens
                else:
                    raise AssertionError("the refusal was not raised")
        finally:
            await oa.aclose()
            await an.aclose()
