#!/usr/bin/env python3
"""Record real answers of llama.cpp's ``llama-server`` into ``tests/wire/`` (issue 25).

Starts the ``llama-server`` that ``scripts/build_llama_server.sh`` built (cache:
``$GOALD_REAL_MODEL_CACHE``, default ``~/.cache/goald-real-model``) with SmolLM2-135M-Instruct, a
2,048-token window (``-c 2048 -np 1 --jinja``) and a chat template that offers tools
(``NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja`` from the same llama.cpp sources: SmolLM2's
own template ignores ``tools``) on a free port of 127.0.0.1, sends it requests shaped as goald's
OpenAI-compatible provider sends them (streamed, ``stream_options.include_usage``, ``max_tokens``,
``tools``) and writes the answers as the server sent them:

* ``llama_server_cut_tool_call.captured.sse``: a ``write_file`` tool call cut by the output limit
  (``max_tokens`` 24): the stream body, ``:`` comment lines first (the server's build, the date, the
  request), then every event as sent. A 135M model does not begin a tool call by itself, so the
  answer's start is prefilled (a final assistant message, which llama-server continues); the server
  parses the prefill as part of the answer and streams the call;
* ``llama_server_context_refusal.captured.response.json``: the 400 answer to a streamed request
  over the window (``exceed_context_size_error``), as ``status``, ``headers`` and ``body``;
* ``llama_server_props.captured.response.json``: ``GET /props`` (where goald reads the window);
* ``llama_server_format_error_in_stream.captured.sse`` (when the model obliges within a few tries):
  a longer call whose output leaves the tool-call format: tool-call deltas, then an error event
  (code 500) inside the HTTP 200 stream, no finish reason, no usage;
* ``llama_server_tokenize.captured.json``: how goald counts a usage-less call with the server's
  tokenizer, each exchange as sent and answered: a streamed chat completion (its usage is the
  truth), ``POST /apply-template`` of the same body (the prompt as the chat template makes it),
  ``POST /tokenize`` of that prompt (special tokens on) and of the answer's text.

* ``llama_server_keep_alive_close.captured.json``: a streamed answer on a kept-alive connection, the
  connection then left idle until the server closes it, and a second request on it (what the
  client meets when it reuses that connection).

``--only NAME`` (repeatable: ``props``, ``cut``, ``refusal``, ``format-error``, ``tokenize``,
``keep-alive``)
records only those, leaving the other files as they are.

``--llama-cpp-python PYTHON`` records llama-cpp-python's server instead (``PYTHON -m
llama_cpp.server``, the package from its sdist, its native library from ``LLAMA_CPP_LIB_PATH``, the
same GGUF, ``n_ctx`` 2048): ``llama_cpp_python_empty_200.captured.response.json``, its answer to a
streamed chat completion whose prompt overflows the window, as ``status``, ``headers``, ``body``
(``chunked``: sent with chunked transfer encoding). Nothing of llama-cpp-python is compiled::

    C=~/.cache/goald-real-model
    python3 -m venv $C/lcp-venv && $C/lcp-venv/bin/pip install numpy diskcache jinja2 typing-extensions \
        uvicorn fastapi pydantic-settings sse-starlette 'starlette-context<0.4' PyYAML
    cmake -S $C/src/llama_cpp_python-0.3.36/vendor/llama.cpp -B $C/build/shared-0.3.36 -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF && cmake --build $C/build/shared-0.3.36 \
        --target llama -j 2
    LLAMA_CPP_LIB_PATH=$C/build/shared-0.3.36/bin LD_LIBRARY_PATH=$C/build/shared-0.3.36/bin \
        PYTHONPATH=$C/src/llama_cpp_python-0.3.36 .venv/bin/python scripts/record_wire.py \
        --llama-cpp-python $C/lcp-venv/bin/python

The hand-written recordings of the same faults stay beside them (``tests/wire/README.md``);
``tests/agent/test_recorded_faults.py`` replays both. Usage::

    scripts/build_llama_server.sh && .venv/bin/python scripts/record_wire.py [--out tests/wire]

Only the Python standard library is used (and ``tests/real_model/realkit.py`` to find and start the
server).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "real_model"))

from realkit import (  # noqa: E402
    MODEL_NAME,
    TOOL_TEMPLATE,
    LlamaServer,
    artifacts,
    cache_dir,
    free_port,
    http_json,
    sse_objects,
    tool_template,
)

WRITE_FILE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write a text file in the work directory (creates or replaces it).",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "the file's path"},
                "content": {"type": "string", "description": "the whole text of the file"},
            },
            "required": ["path", "content"],
        },
    },
}

SYSTEM = "You are a helpful assistant. You write files with the write_file tool."
ASK = "Use the write_file tool to write a file named a.txt that contains a 500-word essay about the sea."
#: The start of the answer, prefilled (llama-server continues a final assistant message): a 135M
#: model does not start a tool call by itself, but goes on with one once begun; the server's parser
#: reads the prefill as part of the answer and streams the call from its first argument.
PREFILL = '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.txt", "content": "'
CALL_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": ASK},
    {"role": "assistant", "content": PREFILL},
]


def chat_body(messages: list[dict[str, Any]], max_tokens: int, tools: list[dict[str, Any]] | None) -> bytes:
    """A request body with the keys in the order goald's provider sends them."""
    body: dict[str, Any] = {"model": MODEL_NAME, "stream": True, "messages": messages, "max_tokens": max_tokens}
    body["stream_options"] = {"include_usage": True}
    if tools:
        body["tools"] = tools
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def post(port: int, path: str, body: bytes | None) -> tuple[int, list[tuple[str, str]], bytes]:
    """One request on a fresh connection: status, headers, and the body as sent (chunked framing removed)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheaders(), resp.read()
    finally:
        conn.close()


KEPT_HEADERS = ("content-type", "server", "transfer-encoding", "connection", "cache-control")


def kept(headers: list[tuple[str, str]]) -> dict[str, str]:
    return {k: v for k, v in headers if k.lower() in KEPT_HEADERS}


def build_of(props: Any) -> str:
    if isinstance(props, dict):
        return str(props.get("build_info") or props.get("build") or "unknown build")
    return "unknown build"


def source_of() -> str:
    marker = cache_dir() / "llama-server.source"
    return marker.read_text().strip() if marker.exists() else "unknown sdist"


def tool_args(body: bytes) -> tuple[str, str | None, bool]:
    """The arguments of the first tool call of a stream, joined; its finish reason; whether an error event came."""
    args, finish, error = "", None, False
    for obj in sse_objects(body):
        error = error or "error" in obj
        for choice in obj.get("choices") or []:
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                args += (call.get("function") or {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return args, finish, error


def sse_header(lines: list[str], body: bytes, status: int, headers: list[tuple[str, str]]) -> bytes:
    head = [
        *lines,
        f": HTTP {status}, headers {json.dumps(kept(headers))}. The request's body, as sent:",
        ": " + body.decode(),
    ]
    return ("\n".join(head) + "\n\n").encode()


def record_cut_tool_call(port: int, out: Path, origin: str) -> Path:
    """A tool call cut by the output limit: ``max_tokens`` 24, the arguments end mid-string, ``length``."""
    body = chat_body(CALL_MESSAGES, 24, [WRITE_FILE])
    for attempt in range(8):
        status, headers, raw = post(port, "/v1/chat/completions", body)
        args, finish, error = tool_args(raw)
        print(f"cut tool call, attempt {attempt + 1}: HTTP {status}, finish {finish}, arguments {args!r}")
        if status == 200 and finish == "length" and args and not error:
            path = out / "llama_server_cut_tool_call.captured.sse"
            lines = [
                f": goald tests/wire recording, CAPTURED by scripts/record_wire.py from {origin}",
                f": on {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}: a write_file tool call cut by the output limit",
                f": (max_tokens 24, finish_reason {finish}); the answer's start prefilled (a final assistant",
                ": message the server continues) so that the 135M model begins a call.",
            ]
            path.write_bytes(sse_header(lines, body, status, headers) + raw)
            return path
    raise SystemExit("the model never made a write_file call that the output limit cut; nothing recorded")


def record_format_error(port: int, out: Path, origin: str) -> Path | None:
    """llama-server's answer when the model's output stops matching the tool-call format mid-stream:
    HTTP 200, tool-call deltas, then an ``{"error": {"code": 500, ...}}`` event and no finish reason."""
    body = chat_body(CALL_MESSAGES, 300, [WRITE_FILE])
    for attempt in range(6):
        status, headers, raw = post(port, "/v1/chat/completions", body)
        args, finish, error = tool_args(raw)
        print(f"format error, attempt {attempt + 1}: HTTP {status}, finish {finish}, error event {error}")
        if status == 200 and error and args and finish is None:
            path = out / "llama_server_format_error_in_stream.captured.sse"
            lines = [
                f": goald tests/wire recording, CAPTURED by scripts/record_wire.py from {origin}",
                f": on {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}: a write_file call streamed, then the model's output",
                ": left the tool-call format: an error event (code 500) in the 200 stream, no finish_reason,",
                ": no usage (max_tokens 300; the answer's start prefilled as in the cut tool call).",
            ]
            path.write_bytes(sse_header(lines, body, status, headers) + raw)
            return path
    print("the model's output never left the format within 6 tries: no format-error recording")
    return None


def overflowing_body() -> bytes:
    """A streamed chat completion of about 1.3 windows of English text (~21 tokens a line with
    SmolLM2's tokenizer), tools offered."""
    filler = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog near the river bank." for i in range(120))
    messages = [{"role": "user", "content": "Summarize these lines in one sentence.\n" + filler}]
    return chat_body(messages, 256, [WRITE_FILE])


def record_refusal(port: int, out: Path, origin: str, window: int) -> Path:
    body = overflowing_body()
    status, headers, raw = post(port, "/v1/chat/completions", body)
    print(f"refusal: HTTP {status}: {raw[:300]!r}")
    if status != 400:
        raise SystemExit(f"expected a 400 refusal from a {window}-token window, got HTTP {status}")
    path = out / "llama_server_context_refusal.captured.response.json"
    record = {
        "_comment": (
            f"goald tests/wire recording, CAPTURED by scripts/record_wire.py from {origin} on"
            f" {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}: the answer to a streamed chat completion of"
            f" {len(body)} bytes (tools offered, max_tokens 256) over its {window}-token context"
        ),
        "status": status,
        "headers": kept(headers),
        "body": raw.decode(),
    }
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


def record_props(port: int, out: Path, origin: str) -> tuple[Path, Any]:
    status, headers, raw = post(port, "/props", None)
    path = out / "llama_server_props.captured.response.json"
    record = {
        "_comment": (
            f"goald tests/wire recording, CAPTURED by scripts/record_wire.py from {origin} on"
            f" {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}: GET /props (goald reads default_generation_settings.n_ctx)"
        ),
        "status": status,
        "headers": kept(headers),
        "body": raw.decode(),
    }
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path, json.loads(raw)


def record_tokenize(port: int, out: Path, origin: str) -> Path:
    """A chat completion and the server's own count of its prompt and its answer (``/apply-template``
    then ``/tokenize``), as goald's provider asks them for a call that reported no usage."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {
            "role": "user",
            "content": "Here are my notes on how bread is baked; read them and reply with one short sentence. "
            + " ".join(f"Note {k}: bread is a subject many people find interesting for reason {k}." for k in range(6)),
        },
    ]
    body = chat_body(messages, 48, [WRITE_FILE])
    status, headers, raw = post(port, "/v1/chat/completions", body)
    if status != 200:
        raise SystemExit(f"tokenize: the chat completion answered HTTP {status}: {raw[:300]!r}")
    text, usage = "", None
    for obj in sse_objects(raw):
        usage = obj.get("usage") or usage
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                text += (fn.get("name") or "") + (fn.get("arguments") or "")
    exchanges: list[dict[str, Any]] = []

    def ask(path: str, request: bytes) -> Any:
        st, hd, answer = post(port, path, request)
        exchanges.append(
            {"path": path, "request": request.decode(), "status": st, "headers": kept(hd), "body": answer.decode()}
        )
        if st != 200:
            raise SystemExit(f"tokenize: {path} answered HTTP {st}: {answer[:300]!r}")
        return json.loads(answer)

    prompt = ask("/apply-template", body)["prompt"]
    counted = ask("/tokenize", json.dumps({"content": prompt, "add_special": True, "parse_special": True}).encode())
    answered = ask("/tokenize", json.dumps({"content": text, "add_special": False, "parse_special": False}).encode())
    print(
        f"tokenize: server usage {usage}; /tokenize counts the prompt {len(counted['tokens'])},"
        f" the answer {len(answered['tokens'])}"
    )
    path = out / "llama_server_tokenize.captured.json"
    record = {
        "_comment": (
            f"goald tests/wire recording, CAPTURED by scripts/record_wire.py from {origin} on"
            f" {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}: a streamed chat completion (max_tokens 48, tools"
            " offered) and the server's own count of its prompt (/apply-template of the same body, then"
            " /tokenize with special tokens) and of its answer's text (/tokenize)"
        ),
        "chat": {"request": body.decode(), "status": status, "headers": kept(headers), "body": raw.decode()},
        "exchanges": exchanges,
    }
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


def record_keep_alive(port: int, out: Path, origin: str) -> Path:
    """A streamed answer on a kept-alive connection, then the connection left idle until the server
    closes it, then a second request on it: what goald's provider meets when it reuses a pooled
    connection the server has let go (``Server disconnected without sending a response``)."""
    body = chat_body([{"role": "user", "content": "Say hi."}], 8, None)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    try:
        sock.sendall(head + body)
        reader = sock.makefile("rb")
        status_line = reader.readline().decode("latin-1").strip()
        headers: list[tuple[str, str]] = []
        while (line := reader.readline().decode("latin-1").rstrip("\r\n")) != "":
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
        while True:  # the chunked body, to its last chunk
            size = int(reader.readline().split(b";")[0].strip() or b"0", 16)
            reader.read(size + 2)
            if size == 0:
                break
        answered = time.monotonic()
        sock.settimeout(120)
        closed_by_server = sock.recv(1) == b""  # blocks until the server lets the idle connection go
        idle = time.monotonic() - answered
        second: str
        try:
            sock.sendall(head + body)
            got = sock.recv(65536)
            second = "answered" if got else "closed without a response"
        except OSError as exc:
            second = f"refused: {exc.strerror or exc}"
    finally:
        sock.close()
    path = out / "llama_server_keep_alive_close.captured.json"
    record = {
        "_comment": (
            f"Recorded {datetime.now(UTC):%Y-%m-%d} by scripts/record_wire.py from {origin}: a streamed chat"
            " completion on a kept-alive connection, the connection then left idle until the server closed it,"
            " then a second request on the same connection."
        ),
        "status_line": status_line,
        "headers": {k: v for k, v in headers if k.lower() in (*KEPT_HEADERS, "keep-alive")},
        "closed_by_server_when_idle": closed_by_server,
        "idle_seconds_before_close": round(idle, 1),
        "second_request_on_it": second,
    }
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


RECORDINGS = ("props", "cut", "refusal", "format-error", "tokenize", "keep-alive")


def record_llama_cpp_python(python: str, gguf: Path, out: Path, ctx: int) -> Path:
    """llama-cpp-python's server (``python -m llama_cpp.server``) answering a streamed request whose
    prompt overflows its ``n_ctx``: what it sends, as sent."""
    import os
    import subprocess

    port = free_port()
    log = cache_dir() / "record_wire.llama-cpp-python.log"
    argv = [
        python, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL_NAME,
        "--n_ctx", str(ctx), "--n_threads", "2", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with open(log, "ab") as sink:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"llama_cpp.server exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if http_json(f"http://127.0.0.1:{port}/v1/models", timeout=2)[0] == 200:
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"llama_cpp.server not ready within 300 s: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        version = subprocess.run(
            [python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
            capture_output=True,
            text=True,
            env=dict(os.environ),
            check=False,
        ).stdout.strip()
        body = overflowing_body()
        status, headers, raw = post(port, "/v1/chat/completions", body)
        print(f"llama-cpp-python {version}: HTTP {status}, headers {kept(headers)}, body {raw[:300]!r}")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    names = {k.lower() for k, _ in headers}
    path = out / "llama_cpp_python_empty_200.captured.response.json"
    record = {
        "_comment": (
            f"goald tests/wire recording, CAPTURED by scripts/record_wire.py from llama-cpp-python {version}'s"
            f" server (python -m llama_cpp.server, the package from its sdist on the llama.cpp library built"
            f" from the same sources), model {gguf.name}, --n_ctx {ctx}, on {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}:"
            f" the answer to a streamed chat completion of {len(body)} bytes (tools offered, max_tokens 256)"
            f" over its {ctx}-token context"
        ),
        "status": status,
        "headers": {k.lower(): v for k, v in headers if k.lower() in (*KEPT_HEADERS, "x-accel-buffering")},
        "chunked": "transfer-encoding" in names,
        "body": raw.decode(),
    }
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "wire", help="where to write (default tests/wire)")
    ap.add_argument("--ctx", type=int, default=2048, help="the server's context size (default 2048)")
    ap.add_argument("--only", action="append", choices=RECORDINGS, help="record only this (repeatable; default: all)")
    ap.add_argument(
        "--llama-cpp-python",
        metavar="PYTHON",
        help="record llama-cpp-python's server instead, run by this Python (LLAMA_CPP_LIB_PATH: its library)",
    )
    args = ap.parse_args()
    found = artifacts()
    if isinstance(found, str):
        print(found, file=sys.stderr)
        return 2
    binary, gguf = found
    if args.llama_cpp_python:
        print(f"wrote {record_llama_cpp_python(args.llama_cpp_python, gguf, args.out, args.ctx)}")
        return 0
    log = cache_dir() / "record_wire.llama-server.log"
    started = time.monotonic()
    template = tool_template()
    if template is None:
        print(
            f"no {TOOL_TEMPLATE} in the llama.cpp sources of the cache: run scripts/build_llama_server.sh",
            file=sys.stderr,
        )
        return 2
    extra = ["--chat-template-file", str(template)]
    with LlamaServer(binary, gguf, ctx=args.ctx, log=log, extra=extra) as server:
        print(f"llama-server ready on {server.url} in {time.monotonic() - started:.1f}s (log {log})")
        only = set(args.only or RECORDINGS)
        written: list[Path] = []
        if "props" in only:
            props_path, props = record_props(server.port, args.out, "llama-server")
            written.append(props_path)
        else:
            props = json.loads(post(server.port, "/props", None)[2])
        origin = (
            f"llama.cpp llama-server {build_of(props)} (from {source_of()}), model {gguf.name}, -c {args.ctx},"
            f" --chat-template-file {TOOL_TEMPLATE}"
        )
        if "props" in only:
            # The props file's comment names the build too.
            rec = json.loads(props_path.read_text())
            rec["_comment"] = rec["_comment"].replace("from llama-server", f"from {origin}")
            props_path.write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
        if "cut" in only:
            written.append(record_cut_tool_call(server.port, args.out, origin))
        if "refusal" in only:
            written.append(record_refusal(server.port, args.out, origin, args.ctx))
        if "format-error" in only and (extra_path := record_format_error(server.port, args.out, origin)) is not None:
            written.append(extra_path)
        if "tokenize" in only:
            written.append(record_tokenize(server.port, args.out, origin))
        if "keep-alive" in only:
            written.append(record_keep_alive(server.port, args.out, origin))
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
