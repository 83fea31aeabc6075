"""The status page's access control against a real daemon: no token, no data; no cross-site
change; no open address by accident; tokens stored hashed.

Plain HTTP (``http.client``, no redirects followed), so each answer is seen as it is sent.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, all_events


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def web_config(port: int, **web: Any) -> dict[str, Any]:
    return {
        **TEST_MODELS,
        "default_model": "test:worker",
        "web": {"enabled": True, "listen": f"127.0.0.1:{port}", **web},
    }


def request(
    port: int, method: str, path: str, *, headers: dict[str, str] | None = None, body: str | None = None
) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        # A live stream answers 200 and stays open: read only its beginning.
        data = resp.read(4096) if resp.getheader("Content-Type", "").startswith("text/event-stream") else resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data.decode(errors="replace")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, int, str, str]]:
    """A daemon with the page on, a read-write token ``alice``, and one running goal: one for the
    module (a daemon's start is most of each test's time). The tests that use it leave the goal
    active and ``alice`` in place; one that removes a token adds its own first."""
    port = free_port()
    d = Daemon(tmp_path_factory.mktemp("web_access") / "state", config=web_config(port))
    token = d.cli("web", "token", "add", "alice").stdout.strip()
    d.start()
    out = d.cli("goal", "add", "Secret objective [rounds=400 delay=0.2]", "--title", "Secret title", "--key", "hush")
    assert out.returncode == 0, out.stderr
    gid = out.stdout.split()[0]
    yield d, port, token, gid
    d.close()


def login(port: int, token: str) -> str:
    """The cookie a first visit with ``?token=`` sets."""
    status, headers, _ = request(port, "GET", f"/?token={token}")
    assert status == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    return cookie.split(";", 1)[0]


def test_without_the_token_every_page_and_endpoint_answers_401_and_shows_no_goal_data(
    page: tuple[Daemon, int, str, str],
) -> None:
    d, port, _token, gid = page
    paths = [
        "/",
        "/?status=active",
        f"/goals/{gid}",
        "/goals/hush",
        f"/goals/{gid}/timeline?before=100",
        f"/goals/{gid}/conversation?after=0&upto=50",
        f"/goals/{gid}/burn.svg",
        f"/goals/{gid}/live",
        f"/goals/{gid}/state",
        "/schedules",
        "/daemon",
        "/static/app.js",
        "/static/style.css",
        "/no/such/page",
    ]
    forged = [
        {},
        {"Cookie": "goald_web=alice.0000"},
        {"Cookie": "goald_web=alice"},
        {"Authorization": "Bearer gwt_not-a-token"},
    ]
    for path in paths:
        for headers in forged:
            status, _, body = request(port, "GET", path, headers=headers)
            assert status == 401, (path, headers, status)
            assert gid not in body and "Secret" not in body and "hush" not in body
        status, _, body = request(port, "GET", path + ("&" if "?" in path else "?") + "token=gwt_wrong")
        assert status == 401 and "Secret" not in body
    for action in ("pause", "resume", "cancel", "send"):
        status, _, body = request(
            port,
            "POST",
            f"/goals/{gid}/{action}",
            body="text=hi",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert status == 401 and "Secret" not in body
    assert d.cli_json("goal", "show", gid)["status"] == "active"


def test_a_cross_site_post_or_one_without_the_csrf_token_is_refused_and_changes_nothing(
    page: tuple[Daemon, int, str, str],
) -> None:
    d, port, token, gid = page
    cookie = login(port, token)
    status, _, html = request(port, "GET", f"/goals/{gid}", headers={"Cookie": cookie})
    assert status == 200 and "Secret title" in html
    found = re.search(r'name="csrf" content="([0-9a-f]+)"', html)
    assert found is not None
    csrf = found.group(1)
    form = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie}
    refused = [
        # A form on another site that posts here (the browser names its origin).
        {**form, "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
        {**form, "Origin": "http://evil.example"},
        {**form, "Sec-Fetch-Site": "same-site"},
        {**form, "Origin": "null"},
    ]
    for headers in refused:
        status, _, body = request(port, "POST", f"/goals/{gid}/pause", headers=headers, body=f"csrf={csrf}")
        assert status == 403, headers
        assert "another site" in body or "cannot change" in body
    # From the page's own origin but without (or with a wrong) CSRF token.
    own = {**form, "Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
    for body in ("", "csrf=" + "0" * 64):
        status, _, text = request(port, "POST", f"/goals/{gid}/pause", headers=own, body=body)
        assert status == 403 and "CSRF" in text
    assert d.cli_json("goal", "show", gid)["status"] == "active"

    # A read-only token sees the page, and cannot act even with its own CSRF token.
    viewer = login(port, d.cli("web", "token", "add", "viewer", "--read-only").stdout.strip())
    status, _, html = request(port, "GET", f"/goals/{gid}", headers={"Cookie": viewer})
    assert status == 200 and "read-only" in html and 'id="btn-pause"' not in html
    viewer_csrf = re.search(r'name="csrf" content="([0-9a-f]+)"', html)
    assert viewer_csrf is not None
    status, _, _ = request(
        port, "POST", f"/goals/{gid}/pause", headers={**own, "Cookie": viewer}, body=f"csrf={viewer_csrf.group(1)}"
    )
    assert status == 403
    assert d.cli_json("goal", "show", gid)["status"] == "active"

    # The page's own form: done, and recorded with the token's name as the caller.
    status, headers, _ = request(port, "POST", f"/goals/{gid}/pause", headers=own, body=f"csrf={csrf}")
    assert status == 303 and headers["location"].startswith(f"/goals/{gid}")
    shown = d.cli_json("goal", "show", gid)
    assert shown["status"] == "paused" and shown["statusReason"] == "by_request"
    events = asyncio.run(all_events(d.socket_path, shown["sessionId"]))
    changed = [e["data"] for e in events if e["type"] == "goal/changed" and e["data"]["status"] == "paused"]
    assert changed and changed[-1].get("web") == "alice"

    # A message from the page: the socket's session/prompt, its source naming the token.
    status, _, answer = request(
        port,
        "POST",
        f"/goals/{gid}/send",
        headers={**own, "Accept": "application/json"},
        body=f"csrf={csrf}&text=Use+the+March+data&resume=1",
    )
    assert status == 200, answer
    mid = json.loads(answer)["result"]["messageId"]
    events = asyncio.run(all_events(d.socket_path, shown["sessionId"]))
    queued = [e["data"] for e in events if e["type"] == "message/queued" and e["data"]["messageId"] == mid]
    assert queued and queued[0]["source"] == {"kind": "user", "web": "alice"}
    resumed = [e["data"] for e in events if e["type"] == "goal/changed" and e["data"].get("from") == "paused"]
    assert resumed and resumed[0]["status"] == "active" and resumed[0].get("web") == "alice"  # --resume, by alice


def test_binding_every_address_without_allow_remote_is_refused_at_start(tmp_path: Path) -> None:
    port = free_port()
    d = Daemon(tmp_path / "state", config=web_config(port) | {"web": {"enabled": True, "listen": f"0.0.0.0:{port}"}})
    try:
        d.start(wait_ready=False)
        assert d.proc is not None
        assert d.proc.wait(60) == 78
        err = d.stderr()
        assert "web" in err and "0.0.0.0" in err and "allow_remote" in err
        assert not (tmp_path / "state" / "goald.db").exists()  # refused before the store was opened
        with socket.socket() as s:  # and nothing listens there
            assert s.connect_ex(("127.0.0.1", port)) != 0
    finally:
        d.close()


def test_tokens_are_stored_hashed_in_a_private_file_and_named_once(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "state", config=web_config(free_port()))
    try:
        first = d.cli("web", "token", "add", "alice")
        assert first.returncode == 0 and first.stdout.strip().startswith("gwt_")
        secret = first.stdout.strip()
        again = d.cli("web", "token", "add", "alice")
        assert again.returncode == 2 and "exists" in again.stderr
        bad = d.cli("web", "token", "add", "no spaces")
        assert bad.returncode == 2 and "token name" in bad.stderr
        d.cli("web", "token", "add", "bob", "--read-only")
        path = tmp_path / "state" / "web-tokens.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert secret not in path.read_text()
        listed = json.loads(d.cli("web", "token", "list", "--json").stdout)
        assert [(t["name"], t["readOnly"]) for t in listed] == [("alice", False), ("bob", True)]
        assert d.cli("web", "token", "remove", "alice").returncode == 0
        gone = d.cli("web", "token", "remove", "alice")
        assert gone.returncode == 2 and "no token" in gone.stderr
        assert [t["name"] for t in json.loads(d.cli("web", "token", "list", "--json").stdout)] == ["bob"]
    finally:
        d.close()


def test_a_removed_token_s_cookie_stops_working_at_once(page: tuple[Daemon, int, str, str]) -> None:
    d, port, _token, gid = page
    cookie = login(port, d.cli("web", "token", "add", "carol").stdout.strip())
    assert request(port, "GET", "/", headers={"Cookie": cookie})[0] == 200
    assert d.cli("web", "token", "remove", "carol").returncode == 0
    status, _, body = request(port, "GET", "/", headers={"Cookie": cookie})
    assert status == 401 and gid not in body
