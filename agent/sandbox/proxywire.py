"""What the sandbox's network proxy (:mod:`agent.sandbox.proxy`) speaks: HTTP/1.x as a forward proxy.

A request's head read into where it goes and what is sent on (:func:`parse_head`: ``CONNECT
host:port``, or an absolute ``http://`` URI sent on in origin form, ``Host`` from the URI, the
hop-by-hop and ``Proxy-*`` headers dropped, ``Connection: close``), a verdict answered in plain text
(:func:`reply`), and a tunnel's bytes copied both ways until both ends are done or it idles
(:func:`splice`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from urllib.parse import urlsplit

from agent.errors import AgentError

__all__ = ["CHUNK", "MAX_HEAD", "Refused", "answer", "parse_head", "reply", "splice", "split_authority"]

#: A request's head (request line and headers) is at most this long.
MAX_HEAD = 64 * 1024
CHUNK = 64 * 1024
#: Headers a proxy consumes, never sent on (with ``Connection``'s own hop-by-hop list).
HOP = frozenset({"proxy-connection", "proxy-authorization", "proxy-authenticate", "connection", "keep-alive", "te"})


class Refused(AgentError):
    """A verdict on a request: answered with ``status``, reported with ``reason``."""

    def __init__(self, status: int, reason: str, *, address: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.address = address


async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    """Answer ``status`` and close, having read what the client still sends (at most 64 KiB, for
    at most a second): closing a unix socket with unread input would reset it, answer lost."""
    try:
        writer.write(answer(status, reason))
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(1.0):
            await reader.read(MAX_HEAD)
    except (OSError, TimeoutError):
        pass
    finally:
        writer.close()


def answer(status: int, reason: str) -> bytes:
    phrase = {403: "Forbidden", 400: "Bad Request", 431: "Request Header Fields Too Large", 502: "Bad Gateway"}.get(
        status, "Service Unavailable"
    )
    body = f"goald sandbox proxy: {reason}\n".encode(errors="replace")
    head = f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
    return (head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` (``[v6]:port``) as ``(host, port)``."""
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest.removeprefix(":") if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise Refused(400, f"{authority!r} is not host:port")
    else:
        host, sep, port_text = authority.rpartition(":")
        if not sep:
            host, port_text = authority, ""
    if not port_text:
        if default_port is None:
            raise Refused(400, f"{authority!r} names no port")
        return host.lower().removesuffix("."), default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Refused(400, f"{authority!r}: not a port")
    if not host:
        raise Refused(400, f"{authority!r} names no host")
    return host.lower().removesuffix("."), int(port_text)


def parse_head(head: bytes) -> tuple[str, str, int, bytes | None]:
    """A request's head: ``(method, host, port, what to send on)``; ``None`` to send for ``CONNECT``."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refused(400, "not an HTTP/1.x request")
    method, target, version = parts
    if method == "CONNECT":
        host, port = split_authority(target, None)
        return method, host, port, None
    url = urlsplit(target)
    if url.scheme.lower() != "http" or not url.netloc:
        raise Refused(400, f"a proxy needs an absolute http:// URI (got {target[:200]!r}); https goes through CONNECT")
    if "@" in url.netloc:
        raise Refused(400, "credentials in the URI are not sent through the proxy")
    host, port = split_authority(url.netloc, 80)
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    kept: list[str] = []
    drop = set(HOP)
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise Refused(400, "a malformed header")
        if name.strip().lower() == "connection":
            drop |= {v.strip().lower() for v in value.split(",")}
    for line in lines[1:]:
        name = line.partition(":")[0].strip().lower()
        if line and name not in drop and name != "host":
            kept.append(line)
    head_out = f"{method} {path} {version}\r\nHost: {url.netloc}\r\n" + "".join(f"{h}\r\n" for h in kept)
    return method, host, port, (head_out + "Connection: close\r\n\r\n").encode("latin-1")


async def splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    idle: float,
) -> None:
    """Copy both ways until both ends are done; a connection quiet both ways for ``idle`` seconds is closed."""
    last = [time.monotonic()]

    async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while True:
            try:
                data = await asyncio.wait_for(src.read(CHUNK), timeout=idle)
            except TimeoutError:
                if time.monotonic() - last[0] >= idle:
                    raise
                continue
            if not data:
                break
            last[0] = time.monotonic()
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            with contextlib.suppress(OSError):
                dst.write_eof()

    tasks = [asyncio.ensure_future(copy(reader, up_writer)), asyncio.ensure_future(copy(up_reader, writer))]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # an error or an idle timeout ends both ways
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
