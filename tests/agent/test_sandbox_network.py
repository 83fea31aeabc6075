"""A sandbox's network, three settings: off, an allow list through the daemon's proxy, the host's.

The settings themselves (parsing, names, the stricter of two), the proxy on its own (what it lets
through, refuses and reports, its bounds), and the real sandbox (bubblewrap): with the network off
and with an allow list, a command reaches neither a TCP server on the host's loopback nor an
abstract unix socket of the host, an unlisted name is refused by the proxy (and the refusal
reported), a listed name resolving to the host's loopback is refused (DNS rebinding), and a
listed name is reached -- a local test server stands in for it through the proxy's ``hosts``,
the test's explicit word -- by Python's urllib (plain HTTP) and by curl through a CONNECT tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.server
import json
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sandboxkit import sandbox_in

from agent.sandbox import Attempt, Network, NetworkProxy, Omitted, Sandbox, SandboxUnavailable
from agent.sandbox.bridge import SOCKET
from agent.sandbox.network import host_pattern, refused_address
from goals import SandboxSpec

needs_bwrap = pytest.mark.needs_bwrap


# -- the settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "network"),
    [
        (None, Network("off")),
        (False, Network("off")),
        (True, Network("host")),
        ("off", Network("off")),
        ("host", Network("host")),
        ({"allow": ["API.GitHub.com.", "*.pypi.org", "10.0.0.5"]},
         Network("allow", ("api.github.com", "*.pypi.org", "10.0.0.5"))),
    ],
)  # fmt: skip
def test_the_three_settings_as_written(written: Any, network: Network) -> None:
    assert Network.of(written) == network
    if written is not None:
        assert Network.of(SandboxSpec.model_validate({"network": written}).network) == network


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("allow", "needs the names"),
        ("on", 'did you mean "host"'),
        ("everything", '"off", "host"'),
        (1, '"off", "host"'),
        ({"allow": ["https://pypi.org"]}, "is not a host name"),
        ({"allow": ["pypi.org:443"]}, "is not a host name"),
        ({"allow": ["*"]}, "is not a host name"),
        ({"allow": ["*.com.*"]}, "is not a host name"),
        ({"allow": ["pypi.org"], "deny": []}, "Extra inputs"),
    ],
)
def test_a_wrong_setting_is_refused_naming_the_values(written: Any, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        SandboxSpec.model_validate({"network": written})


def test_names_match_exactly_or_under_a_wildcard() -> None:
    net = Network("allow", ("api.github.com", "*.githubusercontent.com", "10.0.0.5"))
    assert net.allows("api.github.com") and net.allows("API.GITHUB.COM.")
    assert (
        not net.allows("github.com") and not net.allows("evil-api.github.com") and not net.allows("api.github.com.evil")
    )
    assert net.allows("raw.githubusercontent.com") and net.allows("a.b.githubusercontent.com")
    assert not net.allows("githubusercontent.com") and not net.allows("xgithubusercontent.com")
    assert net.allows("10.0.0.5") and not net.allows("10.0.0.6")
    assert host_pattern("[::1]") == "::1"


@pytest.mark.parametrize(
    ("a", "b", "merged"),
    [
        (Network("off"), Network("host"), Network("off")),
        (Network("host"), Network("allow", ("a.org",)), Network("allow", ("a.org",))),
        (Network("off"), Network("allow", ("a.org",)), Network("off")),
        (Network("host"), Network("host"), Network("host")),
        (Network("allow", ("*.github.com", "pypi.org")), Network("allow", ("api.github.com", "x.org")),
         Network("allow", ("api.github.com",))),
        (Network("allow", ("*.github.com",)), Network("allow", ("*.api.github.com",)),
         Network("allow", ("*.api.github.com",))),
        (Network("allow", ("a.org",)), Network("allow", ("b.org",)), Network("allow", ())),
    ],
)  # fmt: skip
def test_the_stricter_of_two_settings_wins(a: Network, b: Network, merged: Network) -> None:
    assert a.merge(b) == merged and b.merge(a) == merged


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.8.8", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("10.1.2.3", "private"),
        ("192.168.1.1", "private"),
        ("172.16.0.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("100.64.0.1", "not a public address"),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_the_proxy_connects_to_public_addresses_only(address: str, why: str | None) -> None:
    found = refused_address(address)
    assert (found is None) if why is None else (found is not None and why in found), found


# -- the proxy on its own ------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers any GET with what it was sent (request line and headers)."""

    def do_GET(self) -> None:
        body = json.dumps({"path": self.path, "headers": dict(self.headers.items())}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def web() -> Iterator[int]:
    """A local HTTP server on the host's loopback (what a listed name stands for); its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def abstract() -> Iterator[str]:
    """An abstract unix socket of the host, listening: its name (without the leading NUL)."""
    name = f"goald-test-{os.getpid()}-{id(object())}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind("\0" + name)
    sock.listen(8)
    try:
        yield name
    finally:
        sock.close()


async def _rebind(host: str, port: int) -> list[str]:
    """A resolver as a hostile DNS would answer: every name is the host's loopback."""
    return ["127.0.0.1"]


@pytest.fixture
async def proxy() -> Any:
    made = NetworkProxy(hosts={"example.test": ["127.0.0.1"]}, resolver=_rebind, header_timeout=2.0)
    yield made
    await made.stop()


async def _ask(path: Path, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.read()
    finally:
        writer.close()


async def test_plain_http_to_a_listed_name_goes_through_with_its_own_host(proxy: NetworkProxy, web: int) -> None:
    seen: list[Attempt | Omitted] = []
    gate = proxy.gate(Network("allow", ("example.test",)), seen.append)
    async with gate.hold() as path:
        assert path.exists() and oct(path.stat().st_mode & 0o777) == "0o600"
        answer = await _ask(
            path,
            f"GET http://example.test:{web}/a?b=1 HTTP/1.1\r\nHost: other.test\r\nProxy-Authorization: x\r\n"
            "Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\n\r\n".encode(),
        )
    assert not path.exists(), "the socket is removed when the command ends"
    assert answer.startswith(b"HTTP/1.0 200"), answer
    echoed = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert echoed["path"] == "/a?b=1"
    headers = {k.lower(): v for k, v in echoed["headers"].items()}
    assert headers["host"] == f"example.test:{web}"  # from the URI, never the client's own Host
    assert headers["connection"] == "close" and headers["x-keep"] == "2"
    assert "proxy-authorization" not in headers and "x-drop" not in headers
    assert seen == [Attempt("example.test", web, "GET", True, None, "127.0.0.1")]


async def test_connect_tunnels_to_a_listed_name(proxy: NetworkProxy, web: int) -> None:
    seen: list[Attempt | Omitted] = []
    async with proxy.gate(Network("allow", ("example.test",)), seen.append).hold() as path:
        request = f"CONNECT example.test:{web} HTTP/1.1\r\nHost: example.test:{web}\r\n\r\n"
        inner = "GET /tunnel HTTP/1.0\r\nHost: example.test\r\n\r\n"
        answer = await _ask(path, (request + inner).encode())
    established, _, rest = answer.partition(b"\r\n\r\n")
    assert established == b"HTTP/1.1 200 Connection established"
    assert rest.startswith(b"HTTP/1.0 200") and b'"/tunnel"' in rest
    assert seen == [Attempt("example.test", web, "CONNECT", True, None, "127.0.0.1")]


@pytest.mark.parametrize(
    ("request_line", "status", "reason"),
    [
        ("CONNECT blocked.test:443", 403,
         "blocked.test is not in the sandbox's network allow list (example.test, rebound.test, 127.0.0.1)"),
        ("GET http://blocked.test/", 403, "not in the sandbox's network allow list"),
        ("CONNECT rebound.test:443", 403,
         "rebound.test resolves to no public address (127.0.0.1 is a loopback address)"),
        ("CONNECT 127.0.0.1:22", 403, "127.0.0.1 resolves to no public address (127.0.0.1 is a loopback address)"),
        ("GET /relative", 400, "absolute http:// URI"),
        ("GET https://example.test/", 400, "https goes through CONNECT"),
        ("GET http://user:pw@example.test/", 400, "credentials"),
        ("CONNECT example.test", 400, "names no port"),
        ("CONNECT example.test:99999", 400, "not a port"),
        ("NONSENSE", 400, "not an HTTP/1.x request"),
    ],
)  # fmt: skip
async def test_what_is_refused_is_answered_and_reported(
    proxy: NetworkProxy, request_line: str, status: int, reason: str
) -> None:
    seen: list[Attempt | Omitted] = []
    gate = proxy.gate(Network("allow", ("example.test", "rebound.test", "127.0.0.1")), seen.append)
    async with gate.hold() as path:
        line = f"{request_line} HTTP/1.1" if " " in request_line else request_line
        answer = await _ask(path, f"{line}\r\n\r\n".encode())
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer
    assert reason.encode() in answer
    (attempt,) = seen
    assert isinstance(attempt, Attempt) and not attempt.allowed and reason in (attempt.reason or "")


async def test_the_proxy_is_bounded(proxy: NetworkProxy, web: int) -> None:
    proxy.max_per_gate = 2
    proxy.max_reports = 3
    seen: list[Attempt | Omitted] = []
    async with proxy.gate(Network("allow", ("example.test",)), seen.append).hold() as path:
        # A head past 64 KiB, and one that never ends (header_timeout is 2 s here).
        big = await _ask(path, b"GET http://example.test/ HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n")
        assert big.startswith(b"HTTP/1.1 431"), big[:100]
        held = [await asyncio.open_unix_connection(str(path)) for _ in range(2)]
        await asyncio.sleep(0.1)
        busy = await _ask(path, f"GET http://example.test:{web}/ HTTP/1.1\r\n\r\n".encode())
        assert busy.startswith(b"HTTP/1.1 503"), busy
        for reader, writer in held:  # closed by the head's timeout
            async with asyncio.timeout(5):
                assert await reader.read() == b""
            writer.close()
        for _ in range(4):
            await _ask(path, b"CONNECT blocked.test:443 HTTP/1.1\r\n\r\n")
    assert len([s for s in seen if isinstance(s, Attempt)]) == 3
    assert seen[-1] == Omitted(2), seen  # 1 busy + 4 refused: 3 reported, the rest counted once at the end
    assert proxy.active == 0


async def test_an_idle_tunnel_is_closed_and_stop_closes_everything(web: int) -> None:
    proxy = NetworkProxy(hosts={"example.test": ["127.0.0.1"]}, idle_timeout=0.5)
    gate = proxy.gate(Network("allow", ("example.test",)))
    async with gate.hold() as path:
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(f"CONNECT example.test:{web} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # nothing either way for 0.5 s
        writer.close()
        # A second connection, left open: stop() ends it, and the directory goes.
        reader, writer = await asyncio.open_unix_connection(str(path))
        async with asyncio.timeout(5):
            while proxy.active == 0:  # noqa: ASYNC110 - accepted, waiting for its head
                await asyncio.sleep(0.01)
        directory = proxy.directory
        await proxy.stop()
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        writer.close()
    assert not directory.exists()
    with pytest.raises(SandboxUnavailable, match="stopped"):
        async with proxy.gate(Network("allow", ("example.test",))).hold():
            pass


def test_a_gate_needs_an_allow_list_and_a_sandbox_with_one_is_not_on_the_host_network(tmp_path: Path) -> None:
    proxy = NetworkProxy()
    with pytest.raises(ValueError, match="takes no proxy"):
        proxy.gate(Network("host"))
    gate = proxy.gate(Network("allow", ("a.org",)))
    with pytest.raises(SandboxUnavailable, match="host's network"):
        Sandbox(tmp_path, network=True, proxy=gate)
    box = Sandbox(tmp_path, proxy=gate)
    argv = box.argv(["true"])
    assert "--unshare-net" in argv and argv[-7:-4] == ["-I", "-S", "-c"] and argv[-3:] == [SOCKET, "3128", "true"]
    assert box.environment()["HTTPS_PROXY"] == "http://127.0.0.1:3128" and box.environment()["NO_PROXY"] == ""
    with pytest.raises(SandboxUnavailable, match="allow list"):
        box.launcher(["true"])
    asyncio.run(proxy.stop())


# -- the real sandbox ----------------------------------------------------------------------

#: Run inside the sandbox: argv is PORT ABSTRACT-NAME; prints one JSON line of what each try got.
PROBE = r"""
import json, socket, sys, urllib.request
port, name = int(sys.argv[1]), sys.argv[2]
def attempt(fn):
    try:
        return fn()
    except Exception as exc:
        return "error: %s: %s" % (type(exc).__name__, exc)
def tcp():
    socket.create_connection(("127.0.0.1", port), timeout=3).close()
    return "connected"
def unix():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect("\0" + name)
    s.close()
    return "connected"
def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return "%d %s" % (r.status, r.read().decode())
print("RESULT " + json.dumps({
    "tcp": attempt(tcp),
    "abstract": attempt(unix),
    "listed": attempt(lambda: get("http://example.test:%d/listed" % port)),
    "unlisted": attempt(lambda: get("http://blocked.test:%d/" % port)),
    "loopback": attempt(lambda: get("http://127.0.0.1:%d/" % port)),
    "rebound": attempt(lambda: get("http://rebound.test:%d/" % port)),
}))
"""


def _result(stdout: str) -> dict[str, str]:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            found: dict[str, str] = json.loads(line[len("RESULT ") :])
            return found
    raise AssertionError(f"no result in {stdout!r}")


@contextlib.asynccontextmanager
async def _box(workdir: Path, setting: str, seen: list[Attempt | Omitted]) -> Any:
    proxy = NetworkProxy(hosts={"example.test": ["127.0.0.1"]}, resolver=_rebind)
    try:
        if setting == "off":
            yield sandbox_in(workdir)
        else:
            gate = proxy.gate(Network("allow", ("example.test", "rebound.test")), seen.append)
            yield sandbox_in(workdir, proxy=gate)
    finally:
        await proxy.stop()


@needs_bwrap
@pytest.mark.parametrize("setting", ["off", "allow"])
async def test_from_inside_the_sandbox_only_a_listed_name_answers(
    tmp_path: Path, web: int, abstract: str, setting: str
) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    seen: list[Attempt | Omitted] = []
    async with _box(tmp_path, setting, seen) as box:
        result = await box.run(["python3", "-I", "probe.py", str(web), abstract], timeout=60)
    assert result.exit_code == 0, result
    got = _result(result.stdout)
    # The host's loopback and its abstract sockets: never, in either setting.
    assert got["tcp"].startswith("error: ConnectionRefusedError"), got
    assert got["abstract"].startswith("error: ConnectionRefusedError"), got
    if setting == "off":
        for key in ("listed", "unlisted", "loopback", "rebound"):
            assert got[key].startswith("error: URLError"), got  # no name resolves, nothing to reach
        assert seen == []
        return
    assert got["listed"].startswith("200 ") and '"/listed"' in got["listed"], got
    for key in ("unlisted", "loopback", "rebound"):
        assert got[key].startswith("error: HTTPError: HTTP Error 403"), got
    attempts = {a.host: a for a in seen if isinstance(a, Attempt)}
    assert attempts["example.test"].allowed and attempts["example.test"].address == "127.0.0.1"
    assert not attempts["blocked.test"].allowed and "not in the sandbox's network allow list" in (
        attempts["blocked.test"].reason or ""
    )
    assert not attempts["127.0.0.1"].allowed
    assert not attempts["rebound.test"].allowed and "loopback" in (attempts["rebound.test"].reason or "")


@needs_bwrap
async def test_curl_reaches_a_listed_name_through_a_connect_tunnel(tmp_path: Path, web: int) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed here")
    seen: list[Attempt | Omitted] = []
    async with _box(tmp_path, "allow", seen) as box:
        ok = await box.run(["curl", "-sS", "--proxytunnel", f"http://example.test:{web}/curl"], timeout=60)
        refused = await box.run(["curl", "-sS", "--proxytunnel", f"http://blocked.test:{web}/"], timeout=60)
    assert ok.exit_code == 0 and '"/curl"' in ok.stdout, ok
    assert refused.exit_code != 0 and "403" in refused.stderr, refused
    assert [(a.method, a.host, a.allowed) for a in seen if isinstance(a, Attempt)] == [
        ("CONNECT", "example.test", True),
        ("CONNECT", "blocked.test", False),
    ]


@needs_bwrap
async def test_the_bridge_leaves_the_command_as_it_was(tmp_path: Path) -> None:
    """Behind the bridge a command keeps its exit code, streams, signals and descriptors, and the
    proxy's socket is there only while it runs."""
    async with _box(tmp_path, "allow", []) as box:
        assert box.proxy is not None
        done = await box.run(["bash", "-c", "echo out; echo err >&2; ls /proc/self/fd; exit 3"], timeout=60)
        assert (done.exit_code, done.stderr) == (3, "err\n"), done
        assert done.stdout.split() == ["out", "0", "1", "2", "3"]  # 3 is ls's own listing
        missing = await box.run(["no-such-program"], timeout=60)
        assert missing.exit_code == 127 and "no-such-program" in missing.stderr, missing
        # SIGPIPE is back to its default (Python, which starts the command, ignores it).
        piped = await box.run(["bash", "-c", "yes | head -1 >/dev/null; echo ${PIPESTATUS[0]}"], timeout=60)
        assert piped.stdout.strip() == "141", piped
        # A signal that ends the command is its exit code, as without the bridge.
        killed = await box.run(["bash", "-c", "kill -TERM $$"], timeout=60)
        plain = await sandbox_in(tmp_path).run(["bash", "-c", "kill -TERM $$"], timeout=60)
        assert killed.exit_code == plain.exit_code == 143, (killed, plain)
        # A timeout's SIGTERM reaches the command, whose handler runs before the sandbox ends.
        line = "trap 'echo handled; exit 0' TERM; echo started; sleep 30 & wait"
        timed = await dataclasses.replace(box, kill_grace=5.0).run(["bash", "-c", line], timeout=1.0)
        assert timed.timed_out and timed.stdout.split() == ["started", "handled"], timed
        assert not box.proxy.path.exists()


async def test_a_killed_daemons_socket_directory_is_removed_at_first_use(outside: Path) -> None:
    tmp_path = outside  # a short path: a unix socket's is at most 107 bytes
    stale = tmp_path / "goald-proxy-999999999-abc"  # above any pid_max: no such process
    stale.mkdir()
    alive = tmp_path / f"goald-proxy-{os.getpid()}-abc"
    alive.mkdir()
    proxy = NetworkProxy(directory=tmp_path)
    async with proxy.gate(Network("allow", ("a.org",))).hold() as path:
        assert path.parent.name.startswith(f"goald-proxy-{os.getpid()}-")
    assert not stale.exists() and alive.exists()
    await proxy.stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == [alive.name]
