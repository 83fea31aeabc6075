"""A streamed Messages answer assembled from its events (:mod:`agent.models.anthropic`): its text
and tool-use blocks from their pieces, its stop reason and its usage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from agent.messages import Block, TextBlock, ToolUseBlock
from agent.models._http import as_object
from agent.models.base import DeltaCallback, ModelError, ModelErrorKind, cut_call_note, with_cut_notes
from agent.spend import Usage

__all__ = ["Assembly", "PartialBlock"]


@dataclass
class PartialBlock:
    kind: str
    text: list[str] = field(default_factory=list)
    id: str = ""
    name: str = ""
    json: list[str] = field(default_factory=list)
    initial_input: dict[str, Any] | None = None


@dataclass
class Assembly:
    """The message as the events build it."""

    blocks: dict[int, PartialBlock] = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    saw_usage: bool = False
    stop_reason: str | None = None
    stopped: bool = False

    @property
    def usage(self) -> Usage | None:
        if not self.saw_usage:
            return None
        return Usage(
            input_tokens=max(0, self.input_tokens),
            output_tokens=max(0, self.output_tokens),
            cache_read_tokens=max(0, self.cache_read),
            cache_write_tokens=max(0, self.cache_write),
        )

    def _take_usage(self, usage: object) -> None:
        if usage is None:
            return
        usage = as_object(usage, "usage")
        self.saw_usage = True
        for attr, name in (
            ("input_tokens", "input_tokens"),
            ("output_tokens", "output_tokens"),
            ("cache_read_input_tokens", "cache_read"),
            ("cache_creation_input_tokens", "cache_write"),
        ):
            value = usage.get(attr)
            if value is not None:
                setattr(self, name, int(value))

    def feed(self, event: Any, on_delta: DeltaCallback | None) -> None:
        """Take one event (its JSON); a shape the protocol does not have raises ``TypeError`` or ``KeyError``."""
        event = as_object(event, "the event")
        kind = event.get("type")
        if kind == "message_start":
            self._take_usage(as_object(event["message"], "message").get("usage"))
        elif kind == "content_block_start":
            cb = as_object(event["content_block"], "content_block")
            part = PartialBlock(kind=str(cb["type"]))
            if part.kind == "text":
                text = cb.get("text")
                if text:
                    if not isinstance(text, str):
                        raise TypeError(f"text is {type(text).__name__}, not a string")
                    part.text.append(text)
                    if on_delta is not None:
                        on_delta(text)
            elif part.kind == "tool_use":
                part.id, part.name = str(cb["id"]), str(cb["name"])
                initial = cb.get("input")
                if initial is not None and not isinstance(initial, dict):
                    raise TypeError(f"tool_use input is {type(initial).__name__}, not an object")
                part.initial_input = dict(initial) if initial else None
            self.blocks[int(event["index"])] = part
        elif kind == "content_block_delta":
            index = int(event["index"])
            part = self.blocks.get(index) or self.blocks.setdefault(index, PartialBlock(kind="text"))
            delta = as_object(event["delta"], "delta")
            delta_kind = delta["type"]
            if delta_kind == "text_delta":
                text = delta.get("text")
                if not isinstance(text, str):
                    raise TypeError(f"text_delta.text is {type(text).__name__}, not a string")
                part.text.append(text)
                if on_delta is not None and text:
                    on_delta(text)
            elif delta_kind == "input_json_delta":
                partial_json = delta.get("partial_json")
                if not isinstance(partial_json, str):
                    raise TypeError(f"partial_json is {type(partial_json).__name__}, not a string")
                part.json.append(partial_json)
            # thinking, signature and citations deltas are not part of goald's message
        elif kind == "content_block_stop":
            int(event["index"])
        elif kind == "message_delta":
            stop = as_object(event["delta"], "delta").get("stop_reason")
            if stop:
                self.stop_reason = str(stop)
            self._take_usage(event.get("usage"))
        elif kind == "message_stop":
            self.stopped = True
        else:
            logger.debug("ignoring stream event {!r}", kind)

    def content(self, cut: bool = False) -> list[Block]:
        """The message's blocks; ``cut`` (stopped by the output limit): its tool calls, incomplete,
        become notes (never run, never "malformed")."""
        out: list[Block] = []
        notes: list[str] = []
        for index in sorted(self.blocks):
            part = self.blocks[index]
            if part.kind == "text":
                text = "".join(part.text)
                if text:
                    out.append(TextBlock(text=text))
            elif part.kind == "tool_use" and cut:
                notes.append(cut_call_note(part.name, "".join(part.json)))
            elif part.kind == "tool_use":
                if not part.name:
                    raise ModelError(ModelErrorKind.MALFORMED, f"tool_use block #{index} has no name", usage=self.usage)
                raw = "".join(part.json).strip()
                try:
                    args = json.loads(raw) if raw else (part.initial_input or {})
                except json.JSONDecodeError as exc:
                    raise ModelError(
                        ModelErrorKind.MALFORMED,
                        f"the input of tool call {part.name!r} is not valid JSON ({exc.msg} at char {exc.pos}):"
                        f" {raw[:200]!r}",
                        usage=self.usage,
                    ) from None
                if not isinstance(args, dict):
                    raise ModelError(
                        ModelErrorKind.MALFORMED,
                        f"the input of tool call {part.name!r} is a JSON {type(args).__name__}, not an object",
                        usage=self.usage,
                    )
                out.append(ToolUseBlock(id=part.id, name=part.name, input=args))
        return with_cut_notes(out, notes) if notes else out
