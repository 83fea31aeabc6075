"""The verbs an operator reaches for in the first week (issue 27, "Missing verbs and views"), each
through the real ``goald`` command and daemon (``tests/harness.py``).

``goal pause KEY --reason TEXT`` keeps the operator's words with the pause: its status reason and
event, ``goal show``, ``goal list``, ``goal/describe`` and the status page all read
``paused (by operator: TEXT)``; bad words are refused, naming the field, and change nothing; and
``goal resume --all --reason`` still filters by the paused-for reason.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, all_events, wait_goal

pytestmark = pytest.mark.e2e


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


def page_text(port: int, path: str, token: str) -> str:
    """A status page, read with the token's cookie (the first visit with ``?token=`` sets it)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", f"/?token={token}")
        resp = conn.getresponse()
        resp.read()
        cookie = (resp.getheader("Set-Cookie") or "").split(";", 1)[0]
        conn.request("GET", path, headers={"Cookie": cookie})
        resp = conn.getresponse()
        body = resp.read().decode()
        assert resp.status == 200, (resp.status, body[:500])
        return body
    finally:
        conn.close()


async def test_goal_pause_with_a_reason_keeps_the_operators_words_everywhere(tmp_path: Any) -> None:
    port = free_port()
    d = Daemon(tmp_path / "state", config=web_config(port))
    try:
        token = d.cli("web", "token", "add", "ops").stdout.strip()
        d.start()
        made = await d.acli_json(
            "goal", "add", "Write notes [rounds=50 delay=0.2]", "--key", "notes", "--max-rounds", "60"
        )  # fmt: skip
        gid = made["goalId"]
        await asyncio.to_thread(d.calls.wait, "worker round=1")

        # Bad words are refused, naming the field, and the goal stays as it was.
        for bad, named in (("   ", "the reason is blank"), ("two\nlines", "one line"), ("x" * 501, "at most 500")):
            code, _out, err = await d.acli("goal", "pause", "notes", "--reason", bad)
            assert code == 2 and "reason" in err and named in err, (bad[:10], code, err)
        assert (await d.acli_json("goal", "show", "notes"))["status"] == "active"

        words = "disk migration on the build host until 23:00"
        code, out, err = await d.acli("goal", "pause", "notes", "--reason", words)
        assert code == 0, err
        assert f"paused (by operator: {words})" in out, out
        shown = await d.acli_json("goal", "show", "notes")
        assert (shown["status"], shown["statusReason"], shown["why"]) == ("paused", f"by_operator: {words}", None)
        code, out, err = await d.acli("goal", "show", "notes")
        assert code == 0 and f"status:     paused (by operator: {words})" in out, out
        code, out, err = await d.acli("goal", "list")
        [row] = [line for line in out.splitlines() if line.startswith(gid)]
        assert f"by operator: {words}" in row, out
        changed = [e for e in await all_events(d.socket_path, made["sessionId"]) if e["type"] == "goal/changed"]
        assert changed[-1]["data"]["status"] == "paused", changed[-1]
        assert changed[-1]["data"]["reason"] == f"by_operator: {words}", changed[-1]
        assert f"paused (by operator: {words})" in await asyncio.to_thread(page_text, port, f"/goals/{gid}", token)
        assert f"paused (by operator: {words})" in await asyncio.to_thread(page_text, port, "/", token)

        # resume --all --reason is still a filter of the paused-for reason.
        code, _out, err = await d.acli("goal", "resume", "--all", "--reason", "auth_error")
        assert code == 0 and "no goals paused for auth_error" in err, err
        assert (await d.acli_json("goal", "show", "notes"))["status"] == "paused"
        code, out, err = await d.acli("goal", "resume", "--all", "--reason", "by_operator")
        assert code == 0 and out.startswith(gid), (out, err)
        resumed = await wait_goal(d.socket_path, gid, {"active"})
        assert resumed["statusReason"] is None, resumed

        # Without --reason a pause is as before: by request.
        code, out, err = await d.acli("goal", "pause", "notes")
        assert code == 0 and "paused (by request)" in out, (out, err)
    finally:
        d.close()
