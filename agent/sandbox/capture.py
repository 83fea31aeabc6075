"""Output capture: both streams are read as they come, and only their head and tail are kept.

Both output streams are read as they come and only their first and last ``output_cap / 2`` bytes
are kept (plus a margin as long as the longest secret, so redaction never meets a secret cut in
two); the middle of longer output is replaced with a marker. Secrets are redacted before
anything is returned.
"""

from __future__ import annotations

import asyncio

from agent.redact import Redactor

_READ = 65536


class Capture:
    """The first and the last ``cap / 2`` bytes of a stream (plus a margin each side), and its size."""

    def __init__(self, cap: int, margin: int) -> None:
        self.cap = max(cap, 2)
        self.margin = margin
        self.head_keep = self.cap // 2
        self.tail_keep = self.cap - self.head_keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_keep + self.margin - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            limit = self.tail_keep + self.margin
            if len(self.tail) > 4 * limit:
                del self.tail[: len(self.tail) - limit]

    def saw(self, needle: bytes) -> bool:
        """Whether ``needle`` is in what is kept (the head or the tail)."""
        return needle in self.head or needle in self.tail

    def text(self, redactor: Redactor) -> str:
        limit = self.tail_keep + self.margin
        if len(self.tail) > limit:
            del self.tail[: len(self.tail) - limit]
        if len(self.head) + len(self.tail) == self.total:
            whole = redactor.redact(bytes(self.head + self.tail).decode("utf-8", errors="replace"))
            if self.total <= self.cap:
                return whole
            return cut(whole[: self.head_keep], whole[-self.tail_keep :], self.total)
        # The middle is gone: each piece is redacted whole first, then its margin (where a secret
        # may have been cut in two) is dropped.
        head = redactor.redact(bytes(self.head).decode("utf-8", errors="replace"))
        tail = redactor.redact(bytes(self.tail).decode("utf-8", errors="replace"))
        head = head[: max(0, min(self.head_keep, len(head) - self.margin))]
        tail = tail[min(len(tail), max(self.margin, len(tail) - self.tail_keep)) :]
        return cut(head, tail, self.total)


def cut(head: str, tail: str, total: int) -> str:
    return f"{head}\n[... output truncated: {total} bytes in all; the middle is not shown ...]\n{tail}"


async def pump(stream: asyncio.StreamReader | None, capture: Capture) -> None:
    if stream is None:
        return
    while True:
        data = await stream.read(_READ)
        if not data:
            return
        capture.feed(data)
