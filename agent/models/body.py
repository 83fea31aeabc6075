"""A provider's request body built from parts serialized once: a conversation's messages as the items
of a JSON array, kept per session (:class:`JSONLog`), and JSON as the SDKs write it
(:func:`dump_json`). Used by :mod:`agent.models.openai` and :mod:`agent.models.anthropic`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from agent.models.base import MessageLog, ToolSpec

__all__ = ["JSONLog", "dump_json"]


def dump_json(value: object) -> bytes:
    """``value`` as the SDKs serialize a request body: compact, UTF-8, no ASCII escaping, no NaN."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class JSONLog(MessageLog):
    """A conversation's messages serialized once each, as the comma-separated items of a JSON array.

    ``body`` holds the closed items; a provider that merges consecutive messages into one wire
    message (Anthropic) keeps the last one open (``open_role``/``open_items``) until a message of
    another role closes it. The tool specs and the system prompt are kept serialized too, keyed by
    the objects they came from.
    """

    def __init__(self) -> None:
        super().__init__()
        self.body = bytearray()
        self.open_role: str | None = None
        self.open_items: list[bytes] = []
        self.tools: Sequence[ToolSpec] | None = None
        self.tools_json = b""
        self.system: str | None = None
        self.system_json = b""

    def reset(self) -> None:
        super().reset()
        self.body = bytearray()
        self.open_role, self.open_items = None, []

    def add_item(self, item: bytes) -> None:
        """Append one closed item to the array."""
        if self.body:
            self.body += b","
        self.body += item

    def items_pieces(self) -> list[bytes | bytearray]:
        """The array's items (without brackets) as pieces to join, the open wire message last."""
        if self.open_role is None:
            return [self.body]
        tail = b'{"role":"%s","content":[%s]}' % (self.open_role.encode(), b",".join(self.open_items))
        return [self.body, b",", tail] if self.body else [tail]
