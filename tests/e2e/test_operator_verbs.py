"""The verbs an operator reaches for in the first week (issue 27, "Missing verbs and views"), each
through the real ``goald`` command and daemon (``tests/harness.py``).

``goal pause KEY --reason TEXT`` keeps the operator's words with the pause: its status reason and
event, ``goal show``, ``goal list``, ``goal/describe`` and the status page all read
``paused (by operator: TEXT)``; bad words are refused, naming the field, and change nothing; and
``goal resume --all --reason`` still filters by the paused-for reason.

``goal list --watch`` draws the table again as goals change (a new table per change when stdout is
not a terminal, in place on one) and ends on Ctrl-C with exit 0; its LAST ERROR column is the error
behind each goal's current status only: a 401 while paused for it, nothing once resumed.

``goal logs KEY --tail N --since WHEN`` follows journalctl's and kubectl logs' conventions: the
latest N events, events since an age or an ISO instant, both together, and with ``--follow``.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import select
import signal
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, all_events, child_env, goald_argv, wait_goal
from providers_server import ProviderServer, Respond

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


LIMIT = 60.0


async def next_table(out: asyncio.StreamReader) -> list[str]:
    """The next drawing of ``goal list --watch`` on a pipe: its lines up to the blank one after it."""
    lines: list[str] = []
    async with asyncio.timeout(LIMIT):
        while (line := (await out.readline()).decode()) != "\n":
            assert line, f"the watcher's output ended after {lines}"
            lines.append(line.rstrip("\n"))
    return lines


async def test_goal_list_watch_draws_a_table_per_change_and_ends_on_ctrl_c(daemon: Daemon) -> None:
    d = daemon
    watcher = await asyncio.create_subprocess_exec(
        *goald_argv(), "--config", str(d.config_path), "goal", "list", "--watch",
        env=child_env(), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert watcher.stdout is not None and watcher.stderr is not None
        assert await next_table(watcher.stdout) == ["no goals"]
        made = await d.acli_json("goal", "add", "Watched [rounds=2]", "--model", "test:worker", "--key", "watched")
        statuses: list[str] = []
        while "completed" not in statuses:
            header, *rows = await next_table(watcher.stdout)
            assert header.split()[:3] == ["ID", "KEY", "STATUS"] and header.endswith("LAST ERROR"), header
            [row] = rows
            cells = row.split()
            assert cells[:2] == [made["goalId"], "watched"], row
            statuses.append(cells[2])
        assert statuses[0] == "active" and statuses[-1] == "completed", statuses
        assert len(statuses) >= 2  # drawn again as it changed, not once at the start only

        watcher.send_signal(signal.SIGINT)  # Ctrl-C
        async with asyncio.timeout(LIMIT):
            code = await watcher.wait()
        assert code == 0, (code, (await watcher.stderr.read()).decode())
    finally:
        if watcher.returncode is None:
            watcher.kill()
            await watcher.wait()


def read_until(fd: int, wanted: list[str], limit: float = LIMIT) -> str:
    """What a terminal shows until every one of ``wanted`` appeared (raise on timeout)."""
    seen = b""
    end = time.monotonic() + limit
    while not all(w in seen.decode(errors="replace") for w in wanted):
        left = end - time.monotonic()
        assert left > 0, f"waited for {wanted} in {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            seen += os.read(fd, 4096)
    return seen.decode(errors="replace")


async def test_goal_list_watch_redraws_in_place_on_a_terminal(daemon: Daemon) -> None:
    d = daemon
    master, slave = os.openpty()
    watcher = await asyncio.create_subprocess_exec(
        *goald_argv(), "--config", str(d.config_path), "goal", "list", "--watch",
        env=child_env(), stdin=asyncio.subprocess.DEVNULL, stdout=slave, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    os.close(slave)
    try:
        shown = await asyncio.to_thread(read_until, master, ["no goals"])
        assert shown.startswith("\x1b[H\x1b[2J") and "goald goal list --watch: 0 goal(s)" in shown, shown
        await d.acli_json("goal", "add", "On a terminal [rounds=1]", "--model", "test:worker", "--key", "tty")
        shown = await asyncio.to_thread(read_until, master, ["tty", "completed"])
        assert "\x1b[H\x1b[2J" in shown and "goald goal list --watch: 1 goal(s)" in shown, shown
        watcher.send_signal(signal.SIGINT)
        async with asyncio.timeout(LIMIT):
            assert await watcher.wait() == 0
    finally:
        os.close(master)
        if watcher.returncode is None:
            watcher.kill()
            await watcher.wait()


async def test_goal_list_last_error_is_the_current_status_error_only(tmp_path: Any) -> None:
    body = {"error": {"message": "Incorrect API key provided: sk-te****", "type": "invalid_request_error"}}
    async with ProviderServer() as server:
        server.add(Respond.json(401, body))
        oa = {"kind": "openai", "api_key_env": "OPERATOR_TEST_KEY", "base_url": server.url + "/v1"}
        d = Daemon(tmp_path / "state", config={"providers": {"oa": oa, **TEST_MODELS["providers"]}})
        try:
            d.start(extra_env={"OPERATOR_TEST_KEY": "sk-test-operator"})
            made = await d.acli_json("goal", "add", "Summarize the logs", "--model", "oa:gpt-test", "--key", "logs")
            g = await wait_goal(d.socket_path, made["goalId"], {"paused", "failed", "completed"}, LIMIT)
            assert (g["status"], g["statusReason"]) == ("paused", "auth_error"), g
            assert "401" in g["statusError"] and "Incorrect API key provided" in g["statusError"], g
            code, out, err = await d.acli("goal", "list")
            assert code == 0, err
            header, row = out.splitlines()
            column = header.index("LAST ERROR")
            full = g["statusError"]
            assert row[column:].strip() == (full if len(full) <= 60 else full[:59] + "…"), (row, full)

            # Resumed, the 401 is gone with the status it explained: the provider's next failure
            # (every later request is answered 500 'unscripted request') is the only error shown.
            resumed = await d.acli_json("goal", "resume", "logs")
            assert resumed["status"] == "active" and resumed["statusError"] is None, resumed
            code, out, err = await d.acli("goal", "list")
            header, row = out.splitlines()
            cell = row[header.index("LAST ERROR") :].strip()
            assert "401" not in cell and "Incorrect API key" not in cell, out
            assert cell == "-" or "HTTP 500" in cell, out
            code, out, err = await d.acli("goal", "cancel", "logs")
            assert code == 0, err
            code, out, err = await d.acli("goal", "list")
            header, row = out.splitlines()
            assert row[header.index("LAST ERROR") :].strip() == "-", out  # cancelled: no error behind it
        finally:
            d.close()


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


async def test_goal_logs_tail_and_since(daemon: Daemon) -> None:
    d = daemon
    made = await d.acli_json("goal", "add", "Logs [rounds=2]", "--model", "test:worker", "--key", "logs")
    await wait_goal(d.socket_path, made["goalId"], {"completed"})
    code, out, err = await d.acli("goal", "logs", "logs", "--json")
    assert code == 0, err
    every = json_lines(out)
    assert len(every) > 6 and [e["seq"] for e in every] == list(range(1, len(every) + 1)), every

    for tail in ("3", "1", "0", str(len(every) + 5)):
        code, out, err = await d.acli("goal", "logs", "logs", "--tail", tail, "--json")
        assert code == 0, err
        assert json_lines(out) == every[len(every) - min(int(tail), len(every)) :], tail
    code, text, err = await d.acli("goal", "logs", "logs", "-n", "2")
    assert code == 0 and len(text.splitlines()) == 2 and text.splitlines()[-1].startswith(f"[{len(every):>5}]"), text

    middle = every[len(every) // 2]["at"]
    for since, want in (
        ("10m", every),
        (middle, [e for e in every if datetime.fromisoformat(e["at"]) >= datetime.fromisoformat(middle)]),
        ((datetime.now(UTC) + timedelta(hours=1)).isoformat(), []),
    ):
        code, out, err = await d.acli("goal", "logs", "logs", "--since", since, "--json")
        assert code == 0, err
        assert json_lines(out) == want, since
    assert 0 < len(json_lines((await d.acli("goal", "logs", "logs", "--since", middle, "--json"))[1])) < len(every)
    code, out, err = await d.acli("goal", "logs", "logs", "--since", "10m", "--tail", "2", "--json")
    assert code == 0 and json_lines(out) == every[-2:], out

    for bad, named in ((("--since", "yesterday"), "--since 'yesterday'"), (("--tail", "-1"), "--tail must be")):
        code, out, err = await d.acli("goal", "logs", "logs", *bad)
        assert code == 2 and named in err and out == "", (bad, code, err)


async def test_goal_logs_tail_with_follow_starts_at_the_tail_and_ends_with_the_goal(daemon: Daemon) -> None:
    d = daemon
    made = await d.acli_json(
        "goal", "add", "Followed [rounds=3 delay=0.3]", "--model", "test:worker", "--key", "followed"
    )  # fmt: skip
    await asyncio.to_thread(d.calls.wait, "worker round=2")
    code, out, err = await d.acli("goal", "logs", "followed", "--tail", "2", "--follow", "--json", limit=LIMIT)
    assert code == 0, err  # it ended with the goal
    printed = json_lines(out)
    seqs = [e["seq"] for e in printed]
    assert seqs[0] > 1 and seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs  # from the tail on, no gap
    last = printed[-1]
    assert last["type"] == "goal/changed" and last["data"]["status"] == "completed", last
    code, out, err = await d.acli("goal", "logs", "followed", "--json")
    every = json_lines(out)
    assert every[-len(printed) :] == printed and len(every) > len(printed) + 2, (len(every), len(printed))
    assert made["goalId"] == last["data"]["goalId"]
