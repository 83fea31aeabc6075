"""The sandbox's network through the real daemon: an allow list, its proxy, its events; and the
warning ``goald config check`` prints for ``"host"``.

``goald serve`` (as root here: its commands run as the sandbox user) with ``sandbox_network =
{allow = ["example.test"]}`` and ``sandbox_network_hosts`` mapping ``example.test`` to this test's
HTTP server on ``127.0.0.1`` (the operator's explicit word: the one way a private address is
reached). The scripted model asks for the listed name and an unlisted one through the proxy and
tries the host's loopback directly: the listed name answers, the rest are refused, and both
attempts through the proxy are ``sandbox/network`` events of the goal's session, with the call
that made them.
"""

from __future__ import annotations

import asyncio
import http.server
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, all_events, rpc, wait_goal

pytestmark = pytest.mark.needs_bwrap


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def web() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def proxy_dirs(pid: int) -> list[Path]:
    """The network proxy's sockets' directories of the daemon ``pid``."""
    return list(Path(tempfile.gettempdir()).glob(f"goald-proxy-{pid}-*"))


async def test_an_allow_list_through_the_daemons_proxy(tmp_path: Path, web: int) -> None:
    config: dict[str, Any] = {
        "providers": {**TEST_MODELS["providers"], "net": {"kind": "scripted", "script": "network_testmodels:models"}},
        "sandbox_network": {"allow": ["example.test"]},
        "sandbox_network_hosts": {"example.test": ["127.0.0.1"]},
    }
    d = Daemon(tmp_path / "state", config=config)
    try:
        d.start(extra_env={"NET_TEST_PORT": str(web)})
        goal = await rpc(
            d.socket_path, "goal/create", {"objective": "fetch", "model": "net:fetcher", "budgets": {"maxRounds": 1}}
        )
        await wait_goal(d.socket_path, goal["goalId"], {"completed", "paused", "exhausted"}, 60)
        events = await all_events(d.socket_path, goal["sessionId"])
        assert d.proc is not None
        pid = d.proc.pid
        assert len(proxy_dirs(pid)) == 1
        d.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(d.proc.wait, 30) == 0
    finally:
        d.close()
    # The proxy stopped with the daemon: its sockets' directory is gone.
    assert proxy_dirs(pid) == []
    (result,) = [e["data"]["content"] for e in events if e["type"] == "tool/result"]
    assert f"GOT http://example.test:{web}/daemon 204" in result, result
    assert f"ERR http://blocked.test:{web}/ HTTP Error 403" in result, result
    assert "LOOPBACK refused" in result, result
    (call,) = [e["data"]["toolUseId"] for e in events if e["type"] == "tool/result"]
    network = [e["data"] for e in events if e["type"] == "sandbox/network"]
    assert [(n["host"], n["port"], n["allowed"]) for n in network] == [
        ("example.test", web, True),
        ("blocked.test", web, False),
    ], network
    assert network[0]["address"] == "127.0.0.1" and all(n["toolUseId"] == call for n in network)
    assert "not in the sandbox's network allow list (example.test)" in network[1]["reason"]


@pytest.mark.parametrize(
    ("network", "says"),
    [
        ("host", ["sandbox_network: the host's network (unsafe): its commands reach the host's loopback"]),
        (True, ["sandbox_network: the host's network (unsafe)", 'sandbox_network: true is read as "host"']),
        ({"allow": ["pypi.org"]}, []),
        ("off", []),
    ],
)
def test_config_check_warns_of_the_hosts_network(tmp_path: Path, network: Any, says: list[str]) -> None:
    d = Daemon(tmp_path / "state", config={"sandbox_network": network})
    try:
        done = d.cli("config", "check")
    finally:
        d.close()
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "network" in line]
    assert len(warnings) == len(says), done.stderr
    for line, want in zip(warnings, says, strict=True):
        assert line.startswith(f"goald: warning: {want}"), line
    if network == "host":
        assert "abstract unix sockets" in warnings[0] and "the status page" in warnings[0]
