"""goald's conversation in chat completions' messages: each message converted once, kept in the
request's wire cache (:class:`~agent.models.base.WireCache`) and serialized once
(:mod:`agent.models.body`), the system prompt and the tools with it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from agent.messages import TextBlock, ToolResultBlock, ToolUseBlock
from agent.models.base import ConvMessage, ModelRequest, ToolSpec
from agent.models.body import JSONLog, dump_json

if TYPE_CHECKING:
    from openai.types.chat import (
        ChatCompletionAssistantMessageParam,
        ChatCompletionFunctionToolParam,
        ChatCompletionMessageFunctionToolCallParam,
        ChatCompletionMessageParam,
    )

#: Prefix of a tool result that reports an error (chat completions has no error flag for tool messages).
TOOL_ERROR_PREFIX = "[tool error] "


def to_chat_messages(
    system: str | None, messages: list[ConvMessage] | tuple[ConvMessage, ...]
) -> list[ChatCompletionMessageParam]:
    """goald's conversation as chat-completions messages.

    The system prompt comes first; an assistant message carries its tool calls; every tool result
    becomes its own ``tool`` message, right where the conversation has it.
    """
    out: list[ChatCompletionMessageParam] = []
    if system:
        out.append({"role": "system", "content": system})
    for msg in messages:
        out.extend(chat_messages_of(msg))
    return out


def chat_messages_of(msg: ConvMessage) -> list[ChatCompletionMessageParam]:
    """The chat-completions messages one of goald's messages becomes (none, one, or one per tool result)."""
    texts = [b.text for b in msg.content if isinstance(b, TextBlock)]
    if msg.role == "assistant":
        uses = [b for b in msg.content if isinstance(b, ToolUseBlock)]
        assistant: ChatCompletionAssistantMessageParam = {"role": "assistant", "content": "".join(texts)}
        if uses:
            calls: list[ChatCompletionMessageFunctionToolCallParam] = [
                {
                    "id": u.id,
                    "type": "function",
                    "function": {"name": u.name, "arguments": json.dumps(u.input, ensure_ascii=False)},
                }
                for u in uses
            ]
            assistant["tool_calls"] = calls
            if not assistant["content"]:
                assistant["content"] = None
        return [assistant]
    out: list[ChatCompletionMessageParam] = []
    for result in msg.content:
        if isinstance(result, ToolResultBlock):
            text = TOOL_ERROR_PREFIX + result.content if result.is_error else result.content
            out.append({"role": "tool", "tool_call_id": result.tool_use_id, "content": text})
    if texts:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


#: Where a conversation's chat-completions form is kept in its :class:`~agent.models.base.WireCache`.
WIRE_KEY = "openai.chat"


def take(request: ModelRequest) -> JSONLog:
    """The request's conversation serialized: what the cache holds, plus each new message, once."""
    cache = request.cache
    log = cache.log(WIRE_KEY, JSONLog) if cache is not None else JSONLog()
    new = log.new_messages(request.messages)
    if new is None:
        log.reset()
        new = request.messages
    for msg in new:
        for item in chat_messages_of(msg):
            data = dump_json(item)
            log.add_item(data)
            if cache is not None:
                cache.serialized_bytes += len(data)
        log.messages.append(msg)
        if cache is not None:
            cache.converted += 1
    if log.tools is not request.tools:
        log.tools = request.tools
        log.tools_json = dump_json(to_chat_tools(tuple(request.tools))) if request.tools else b""
    if log.system is not request.system:
        log.system = request.system
        log.system_json = dump_json({"role": "system", "content": request.system}) if request.system else b""
    return log


def to_chat_tools(tools: list[ToolSpec] | tuple[ToolSpec, ...]) -> list[ChatCompletionFunctionToolParam]:
    """goald's tool specs as chat-completions function tools."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": dict(t.input_schema)},
        }
        for t in tools
    ]
