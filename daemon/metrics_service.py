"""Where the metrics go (``[metrics]`` in the config): a file for the node exporter's textfile
collector, and optionally an HTTP endpoint on a loopback address. What they say is
:mod:`daemon.metrics`'.

Why a file first: the node exporter already runs on most servers and already is scraped; a file it
picks up needs no port, no firewall rule and no authentication. The file is rewritten every
``interval_seconds`` atomically (a temporary file in the same directory, renamed over the old one),
so the collector never reads half a file; it is made world-readable (0644: the exporter runs as
another user, and the file holds counts, never a prompt or a secret). The endpoint collects at each
scrape; it listens on a loopback address only, unless ``allow_remote = true`` says otherwise (it has
no authentication).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent.db import database_errors
from daemon.metrics import Metrics


def _write_errors() -> tuple[type[Exception], ...]:
    """What a metrics write may fail with: the file, or reading either store."""
    return (OSError, *database_errors())


class MetricsSettings(BaseModel):
    """``[metrics]``: where the metrics go."""

    model_config = ConfigDict(extra="forbid")

    #: The file the node exporter's textfile collector reads (a ``.prom`` name in its directory).
    file: Path | None = None
    #: Seconds between rewrites of the file.
    interval_seconds: float = Field(default=15.0, gt=0, le=3600)
    #: ``HOST:PORT`` to serve ``/metrics`` on (a loopback address unless ``allow_remote``).
    listen: str | None = None
    #: Allow ``listen`` on an address that is not loopback (the endpoint has no authentication).
    allow_remote: bool = False

    @model_validator(mode="after")
    def _check(self) -> MetricsSettings:
        if self.file is not None and not self.file.expanduser().is_absolute():
            raise ValueError(f"file must be an absolute path, got {str(self.file)!r}")
        if self.listen is not None:
            host, port = split_listen(self.listen)
            if not self.allow_remote and not is_loopback(host):
                raise ValueError(
                    f"listen {self.listen!r} is not a loopback address; the endpoint has no authentication"
                    " (use 127.0.0.1 or ::1, or set allow_remote = true)"
                )
            del port
        return self


def split_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) as host and port; raises ``ValueError`` naming the problem."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"listen {value!r} must be HOST:PORT, e.g. 127.0.0.1:9464")
    host = host.removeprefix("[").removesuffix("]")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"listen {value!r}: the port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"listen {value!r}: the port must be 0..65535")
    return host, port


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback IP address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- the file ----------------------------------------------------------------------------------------


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: written to a temporary file beside it, flushed, renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fchmod(fd, 0o644)  # the node exporter runs as another user; the daemon's umask is 077
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]

#: The content type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsService:
    """Writes the file every interval and serves the endpoint (on aiohttp, like the status page),
    for as long as the daemon serves."""

    def __init__(self, metrics: Metrics, settings: MetricsSettings) -> None:
        self.metrics = metrics
        self.settings = settings
        self._runner: Any = None  # aiohttp's AppRunner, imported only when the endpoint is served
        self._tasks: list[asyncio.Task[None]] = []
        #: The address the endpoint listens on (port 0 in the config: the one the kernel chose).
        self.address: tuple[str, int] | None = None

    @property
    def enabled(self) -> bool:
        """Whether there is a file or an endpoint to serve."""
        return self.settings.file is not None or self.settings.listen is not None

    async def start(self, spawn: Spawn) -> None:
        """Write the file once, open the endpoint, and start the loops (with ``spawn``)."""
        if not self.enabled:
            return
        if self.metrics.lag is not None:
            self._tasks.append(spawn(self.metrics.lag.run()))
        if self.settings.listen is not None:
            await self._serve(self.settings.listen)
        if self.settings.file is not None:
            await self._write()
            self._tasks.append(spawn(self._write_loop()))

    async def _serve(self, listen: str) -> None:
        from aiohttp import web

        async def answer(request: web.Request) -> web.Response:
            body = (await self.metrics.text()).encode()
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

        async def not_found(request: web.Request) -> web.Response:
            return web.Response(status=404, text="not found: GET /metrics\n")

        app = web.Application()
        app.router.add_get("/metrics", answer)
        app.router.add_get("/", answer)
        app.router.add_route("*", "/{tail:.*}", not_found)
        host, port = split_listen(listen)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            await runner.cleanup()
            logger.error("metrics endpoint not served on {}: {}", listen, exc.strerror or exc)
            return
        self._runner = runner
        sock = runner.addresses[0]
        self.address = (str(sock[0]), int(sock[1]))
        logger.info("metrics served on http://{}:{}/metrics", *self.address)

    async def stop(self) -> None:
        """Stop the loops and the endpoint, then write the file one last time (within a bound)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.settings.file is not None:
            try:
                async with asyncio.timeout(5.0):
                    await self._write()
            except TimeoutError:
                logger.warning("the last metrics write took over 5 s; left as it was")

    async def _write(self) -> None:
        path = self.settings.file
        assert path is not None
        try:
            text = await self.metrics.text()
            await asyncio.to_thread(write_atomically, path.expanduser(), text)
        except _write_errors() as exc:
            logger.error("metrics not written to {}: {}", path, exc)

    async def _write_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval_seconds)
            await self._write()


async def scrape(host: str, port: int, path: str = "/metrics") -> str:
    """GET the endpoint once (for ``goald`` tooling and tests); the body as text (raises
    ``ConnectionError`` naming the status unless it is 200)."""
    import aiohttp

    url = f"http://[{host}]:{port}{path}" if ":" in host else f"http://{host}:{port}{path}"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
        if response.status != 200:
            raise ConnectionError(f"HTTP {response.status} {response.reason}")
        return text
