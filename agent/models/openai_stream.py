"""A streamed chat completion assembled from its chunks (:mod:`agent.models.openai`): its text, its
tool calls from their pieces, its finish reason and its usage.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from agent.messages import Block, TextBlock, ToolUseBlock
from agent.models._http import as_object, objects_of
from agent.models.base import DeltaCallback, FinishReason, ModelError, ModelErrorKind, cut_call_note, with_cut_notes
from agent.spend import Usage

__all__ = ["Assembly", "PartialCall", "answer_text", "map_usage"]


def map_usage(usage: object) -> Usage:
    """Chat-completions usage (its JSON object) as goald's: cached prompt tokens are cache reads, not input."""
    usage = as_object(usage, "usage")
    prompt = int(usage.get("prompt_tokens") or 0)
    output = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    if details is not None:
        details = as_object(details, "usage.prompt_tokens_details")
    cached = int(details.get("cached_tokens") or 0) if details is not None else 0
    written = int(details.get("cache_write_tokens") or 0) if details is not None else 0
    cached = min(max(cached, 0), prompt)
    written = min(max(written, 0), prompt - cached)
    return Usage(
        input_tokens=prompt - cached - written,
        output_tokens=max(output, 0),
        cache_read_tokens=cached,
        cache_write_tokens=written,
    )


@dataclass
class PartialCall:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class Assembly:
    """The answer as the chunks build it."""

    text: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, PartialCall] = field(default_factory=dict)
    finish: str | None = None
    usage: Usage | None = None

    def feed(self, chunk: Any, on_delta: DeltaCallback | None) -> None:
        """Take one chunk (its JSON); a shape the protocol does not have raises ``TypeError``."""
        chunk = as_object(chunk, "the chunk")
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = map_usage(usage)
        for choice in objects_of(chunk.get("choices"), "choices"):
            if choice.get("index", 0) not in (0, None):
                continue  # we never ask for n > 1
            delta = choice.get("delta")
            if delta is not None:
                delta = as_object(delta, "delta")
                content = delta.get("content")
                if content:
                    if not isinstance(content, str):
                        raise TypeError(f"delta.content is a {type(content).__name__}, not a string")
                    self.text.append(content)
                    if on_delta is not None:
                        on_delta(content)
                refusal = delta.get("refusal")
                if refusal:
                    self.refusal.append(str(refusal))
                for call in objects_of(delta.get("tool_calls"), "tool_calls"):
                    at = call.get("index")
                    index = int(at if at is not None else len(self.calls))
                    part = self.calls.get(index)
                    if part is None:
                        part = self.calls[index] = PartialCall()
                    if call.get("id"):
                        part.id = str(call["id"])
                    fn = call.get("function")
                    if fn is not None:
                        fn = as_object(fn, "function")
                        name = fn.get("name")
                        if name and not part.name:
                            part.name = str(name)
                        arguments = fn.get("arguments")
                        if arguments:
                            if not isinstance(arguments, str):
                                raise TypeError(f"tool arguments are a {type(arguments).__name__}, not a string")
                            part.arguments.append(arguments)
            finish = choice.get("finish_reason")
            if finish:
                self.finish = str(finish)

    def content(self) -> list[Block]:
        blocks: list[Block] = []
        text = "".join(self.text) + "".join(self.refusal)
        if text:
            blocks.append(TextBlock(text=text))
        if self.finish == "length":
            # Cut off by the output limit: the finish reason comes first. The calls are incomplete
            # (their arguments may not parse): recorded as notes, never run, never "malformed".
            notes = [cut_call_note(self.calls[i].name, "".join(self.calls[i].arguments)) for i in sorted(self.calls)]
            return with_cut_notes(blocks, notes)
        for index in sorted(self.calls):
            part = self.calls[index]
            if not part.name:
                raise ModelError(ModelErrorKind.MALFORMED, f"tool call #{index} in the stream has no function name")
            raw = "".join(part.arguments).strip()
            try:
                args = json.loads(raw) if raw else {}
            except json.JSONDecodeError as exc:
                raise ModelError(
                    ModelErrorKind.MALFORMED,
                    f"the arguments of tool call {part.name!r} are not valid JSON ({exc.msg} at char {exc.pos}):"
                    f" {raw[:200]!r}",
                    usage=self.usage,
                ) from None
            if not isinstance(args, dict):
                raise ModelError(
                    ModelErrorKind.MALFORMED,
                    f"the arguments of tool call {part.name!r} are a JSON {type(args).__name__}, not an object",
                    usage=self.usage,
                )
            blocks.append(ToolUseBlock(id=part.id or f"call_{uuid.uuid4().hex[:24]}", name=part.name, input=args))
        return blocks

    def finish_reason(self, has_calls: bool) -> FinishReason:
        finish = self.finish
        if finish == "content_filter" or self.refusal:
            return FinishReason.REFUSAL
        if finish == "length":
            return FinishReason.MAX_TOKENS
        if has_calls:
            # Some servers say "stop" after tool calls; the calls are what matters.
            return FinishReason.TOOL_USE
        if finish not in ("stop", "tool_calls", "function_call"):
            logger.warning("unknown finish_reason {!r}; treating it as the end of the answer", finish)
        return FinishReason.END_TURN


def answer_text(got: Assembly) -> str:
    """What the model wrote: its text and each tool call's name and arguments."""
    calls = "".join(f"{c.name}{''.join(c.arguments)}" for c in got.calls.values())
    return "".join(got.text) + "".join(got.refusal) + calls
