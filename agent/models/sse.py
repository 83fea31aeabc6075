"""Server-sent events read from a stream's bytes as they arrive (:class:`SSEParser`): what the
OpenAI-compatible and Anthropic streams are made of.
"""

from __future__ import annotations

import re

__all__ = ["SSEParser"]

_LINE_END = re.compile(rb"\r\n|\r|\n")


class SSEParser:
    """Server-sent events from a byte stream, decoded as the SDKs decode them.

    Lines end at CR, LF or CRLF (also when a CRLF is split between two chunks); a line is UTF-8
    (strictly: a bad byte raises ``UnicodeDecodeError``); a blank line dispatches the event if any
    field was set; ``data`` lines are joined with newlines; comments and unknown fields are
    ignored; an unfinished event at the end of the stream is dropped. Linear in the bytes fed,
    however they are split.
    """

    __slots__ = ("_data", "_event", "_id", "_retry", "_skip_lf", "_tail")

    def __init__(self) -> None:
        self._tail: list[bytes] = []
        self._skip_lf = False
        self._event: str | None = None
        self._data: list[str] = []
        self._id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        """The events ``chunk`` completes, each as ``(event name or None, data)``."""
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]  # the LF of a CRLF whose CR ended the last chunk
        if not chunk:
            return []
        if _LINE_END.search(chunk) is None:
            self._tail.append(chunk)
            return []
        if self._tail:
            self._tail.append(chunk)
            chunk = b"".join(self._tail)
        lines = _LINE_END.split(chunk)
        last = lines.pop()
        self._tail = [last] if last else []
        self._skip_lf = chunk[-1] == 13
        events: list[tuple[str | None, str]] = []
        for raw in lines:
            line = raw.decode()
            if not line:
                if self._event is None and not self._data and self._id is None and self._retry is None:
                    continue
                events.append((self._event, "\n".join(self._data)))
                self._event, self._data, self._retry = None, [], None
                continue
            if line[0] == ":":
                continue
            name, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
            elif name == "id":
                if "\0" not in value:
                    self._id = value
            elif name == "retry":
                try:
                    self._retry = int(value)
                except ValueError:
                    pass
        return events
