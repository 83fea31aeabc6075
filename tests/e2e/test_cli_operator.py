"""End-to-end: the operator's view, through the ``goald`` command against a real daemon process.

``goal show`` is a describe view that says why a goal stopped in plain words (after a provider's
401, after a verification whose program is missing, after a cost cap on a model without prices);
``goal list`` is a table with a header and filters; ``goald status`` names the process, its files,
its providers' state with their last error and the next schedule fire. Goals are addressed by key
too, deleted when ended, and resumed in bulk; a closed pipe ends the CLI quietly; completion
scripts parse. Waiting is on events or goal changes, always with a time limit.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, all_events, child_env, goald_argv, rpc, wait_goal
from providers_server import ProviderServer, Respond
from sandboxkit import NO_BWRAP

from daemon import __version__
from daemon.client import Connection as Client

LIMIT = 30.0
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
#: A provider whose models have no prices, beside the priced ``test`` one.
UNPRICED = {"kind": "scripted", "script": "goald_testmodels:slow"}


async def add_goal(d: Daemon, objective: str, *options: str, model: str = "test:worker") -> str:
    code, out, err = await d.acli("goal", "add", objective, "--model", model, *options)
    assert code == 0, err
    return out.split()[0]


async def wait_event(d: Daemon, session_id: str, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The first event of the session (from its start) for which ``match`` holds; raises on timeout."""
    async with await Client.connect(d.socket_path) as client:
        await client.call("session/subscribe", {"sessionId": session_id, "afterSeq": 0})
        async with asyncio.timeout(LIMIT):
            while True:
                note = await client.next_notification()
                if note["method"] == "session.event" and match(note["params"]["event"]):
                    return dict(note["params"]["event"])


def field(out: str, name: str) -> str:
    """The value of a ``name:`` line of the describe view."""
    m = re.search(rf"^{name}:\s+(.*)$", out, re.M)
    assert m is not None, f"no {name}: line in\n{out}"
    return m[1]


# -- the describe view says why ------------------------------------------------------------------


async def test_after_a_401_show_says_authentication_failed_with_the_providers_text_and_status_too(
    tmp_path: Path,
) -> None:
    body = {"error": {"message": "Incorrect API key provided: sk-te****", "type": "invalid_request_error"}}
    async with ProviderServer() as server:
        server.add(*[Respond.json(401, body) for _ in range(2)])
        oa = {"kind": "openai", "api_key_env": "OPERATOR_TEST_KEY", "base_url": server.url + "/v1"}
        d = Daemon(tmp_path / "state", config={"providers": {"oa": oa, **TEST_MODELS["providers"]}})
        try:
            d.start(extra_env={"OPERATOR_TEST_KEY": "sk-test-operator"})
            a = await add_goal(d, "Summarize the logs", "--key", "summary", model="oa:gpt-test")
            b = await add_goal(d, "Summarize the other logs", model="oa:gpt-test")
            held = await add_goal(d, "Notes [rounds=50 hold_round=1 hold=20]")
            await asyncio.to_thread(d.calls.wait, "worker round=1 step=0")
            assert (await d.acli("goal", "pause", held))[0] == 0
            for gid in (a, b):
                g = await wait_goal(d.socket_path, gid, {"paused", "failed", "completed"}, LIMIT)
                assert (g["status"], g["statusReason"]) == ("paused", "auth_error")

            code, out, err = await d.acli("goal", "show", "summary")  # by key
            assert code == 0, err
            assert field(out, "goal").startswith(f"{a}  (key summary)")
            assert field(out, "status") == "paused (authentication failed)"
            why = field(out, "why")
            assert "401" in why and "Incorrect API key provided" in why and "fix the provider's key" in why
            assert field(out, "activity") == "nothing runs until it is resumed"
            # A 401 proves the provider answers: its state is ok (the goal's why says what failed).
            assert field(out, "model") == "oa:gpt-test  (provider oa: ok)"
            assert field(out, "schedule") == "none (created directly)"
            assert re.search(r"^created:\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d \((\d+s ago|now)\)$", out, re.M)
            assert "paused (authentication failed)" in field(out, "status")
            # The last events, the pause among them, with local times and their offset.
            events = out.split("event(s):\n", 1)[1].splitlines()
            assert 1 <= len(events) <= 10 and any("active -> paused (authentication failed)" in e for e in events)

            # The status names the provider's state in a word: ok, failing (N in a row, last: ...) or open.
            code, out, err = await d.acli("status")
            assert code == 0, err
            line = next(x for x in out.splitlines() if x.strip().startswith("oa "))
            assert line.strip() == "oa ok"

            # The daemon said it at warning level, with the goal's id and key.
            log = d.stderr()
            assert re.search(rf"WARNING .*goal {a} \(summary\): active -> paused \(auth_error\)", log), log[-3000:]
            assert re.search(rf"INFO .*goal {a} \(summary\): new -> active", log)

            # Resume every goal paused for auth_error: both, and not the one paused by request.
            code, out, err = await d.acli("goal", "resume", "--all", "--reason", "auth_error", "--json")
            assert code == 0, err
            results = json.loads(out)["results"]
            assert sorted(r["goalId"] for r in results) == sorted([a, b])
            assert all(r["goal"]["status"] == "active" and r["error"] is None for r in results)
            assert (await rpc(d.socket_path, "goal/get", {"goalId": held}))["status"] == "paused"
        finally:
            d.close()


async def test_a_refused_verification_with_a_missing_program_shows_command_not_found(daemon: Daemon) -> None:
    d = daemon
    gid = await add_goal(d, "Write notes [rounds=1]", "--verify", "sh -c 'nosuchprog --check'")
    g = await rpc(d.socket_path, "goal/get", {"goalId": gid})
    await wait_event(d, g["sessionId"], lambda e: e["type"] == "goal/verified" and not e["data"]["passed"])
    code, out, err = await d.acli("goal", "show", gid)
    assert code == 0, err
    assert "last verification refused the completion claim:" in out
    assert "$ sh -c 'nosuchprog --check' -> exit 127 (command not found)" in out
    assert re.search(r"^    \| .*nosuchprog.*not found", out, re.M), out
    assert field(out, "verify") == "$ sh -c 'nosuchprog --check'"
    # The JSON keys are camelCase, the last verification's too.
    shown = await d.acli_json("goal", "show", gid)
    assert shown["lastVerification"][0]["exitCode"] == 127 and "outputTail" in shown["lastVerification"][0]


async def test_a_cost_cap_on_a_model_without_prices_shows_why_it_is_exhausted(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "state", config={"providers": {"free": UNPRICED, **TEST_MODELS["providers"]}})
    try:
        d.start()
        # Created without a cap (a cap on it is refused at add), the cap set while paused.
        gid = await add_goal(d, "Write notes [rounds=50 hold_round=1 hold=20]", model="free:worker")
        await asyncio.to_thread(d.calls.wait, "worker round=1 step=0")
        assert (await d.acli("goal", "pause", gid))[0] == 0
        code, _, err = await d.acli("goal", "edit", gid, "--max-cost", "1")
        assert code == 0, err
        assert (await d.acli("goal", "resume", gid))[0] == 0
        g = await wait_goal(d.socket_path, gid, {"exhausted", "completed", "failed"}, LIMIT)
        assert (g["status"], g["statusReason"]) == ("exhausted", "cost_budget")
        code, out, err = await d.acli("goal", "show", gid)
        assert code == 0, err
        assert field(out, "status") == "exhausted (cost budget spent)"
        why = field(out, "why")
        assert "the model has no price" in why and "free:worker" in why and "prices" in why
        assert field(out, "cost") == "0.0000 of 1.0000 used, 1.0000 left"
    finally:
        d.close()


# -- goal list, status, schedules ------------------------------------------------------------


async def test_goal_list_is_a_table_with_filters_and_schedules_say_how_their_goal_ended(daemon: Daemon) -> None:
    d = daemon
    done = await add_goal(d, "Notes [rounds=1]", "--key", "first", "--max-rounds", "5")
    await wait_goal(d.socket_path, done, {"completed"}, LIMIT)
    live = await add_goal(d, "Notes [rounds=50 hold_round=1 hold=20]", "--key", "second")
    at = (datetime.now(UTC) + timedelta(seconds=4)).isoformat()
    sched = await d.acli_json(
        "schedule", "add", "--at", at, "--key", "once", "--model", "test:worker", "--timezone", "Europe/Berlin",
        "Scheduled notes [rounds=1]",
    )  # fmt: skip
    await wait_event(d, sched["sessionId"], lambda e: e["type"] == "schedule/run" and e["data"]["outcome"] == "fired")
    fired = (await d.acli_json("goal", "list", "--schedule", "once"))[0]["id"]
    await wait_goal(d.socket_path, fired, {"completed"}, LIMIT)

    code, out, err = await d.acli("goal", "list")
    assert code == 0, err
    lines = out.splitlines()
    header = ["ID", "KEY", "STATUS", "REASON", "ACTIVITY", "AGE", "ROUNDS", "TOKENS", "COST", "MODEL", "LAST", "ERROR"]
    assert lines[0].split() == header
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {done, live, fired}
    first = (
        r"  first\s+completed\s+unverified: no verification\s+-\s+\d+s ago\s+1/5\s+[\d,]+\s+[\d.]+\s+test:worker"
        r"\s+-$"  # LAST ERROR: none behind a completion
    )
    assert re.search(first, rows[done]), rows[done]
    # What the active goal is doing: its round's turn is running (the model holds round 1).
    assert re.search(r"  second\s+active\s+-\s+turn running\s+", rows[live]), rows[live]

    for args, want in (
        (("--status", "active"), {live}),
        (("--status", "completed"), {done, fired}),
        (("--schedule", sched["id"]), {fired}),
        (("--since", "1h"), {done, live, fired}),
        (("--since", (datetime.now(UTC) + timedelta(hours=1)).isoformat()), set()),
    ):
        listed = await d.acli_json("goal", "list", *args)
        assert {g["id"] for g in listed} == want, args
    code, _, err = await d.acli("goal", "list", "--since", "yesterday")
    assert code == 2 and "--since 'yesterday'" in err

    # The describe view names the schedule that started the goal.
    code, out, _ = await d.acli("goal", "show", fired)
    assert field(out, "schedule") == f"{sched['id']} (key once)"
    # schedule runs: how the goal it started ended; schedule list in the schedule's zone, no microseconds.
    code, out, err = await d.acli("schedule", "runs", "once")
    assert code == 0, err
    assert f"-> {fired}: completed (unverified: no verification)" in out
    code, out, _ = await d.acli("schedule", "add", "--cron", "0 3 * * *", "--timezone", "Europe/Berlin", "Nightly")
    nxt = re.search(r"next (\S+ \S+) \((in [^)]+)\)", out)
    assert nxt is not None, out
    assert re.fullmatch(r"\d{4}-\d\d-\d\d 03:00:00\+0[12]:00", nxt[1]) and nxt[2].startswith("in ")
    code, out, _ = await d.acli("--utc", "schedule", "list")
    assert re.search(r"next \d{4}-\d\d-\d\d 0[12]:00:00\+00:00 \(in ", out), out


async def test_status_names_the_process_its_files_goals_providers_and_the_next_fire(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "state", config=TEST_MODELS)
    try:
        d.start()
        assert (await d.acli("schedule", "add", "--every", "3600", "--key", "hourly", "Check"))[0] == 0
        await add_goal(d, "Notes [rounds=50 hold_round=1 hold=20]")
        code, out, err = await d.acli("status")
        assert code == 0, err
        assert d.proc is not None
        assert re.match(rf"goald {re.escape(__version__)}  pid {d.proc.pid}  serving, up \d+s\n", out), out
        assert field(out, "config") == str(d.config_path)
        assert field(out, "state dir") == str(d.state_dir)
        assert re.fullmatch(
            rf"{re.escape(str(d.state_dir / 'goald.db'))} \(\d+\.\d (KiB|MiB)\)", field(out, "database")
        )
        assert field(out, "goals").startswith("1 active; sessions running: ")
        assert re.fullmatch(r"[01] of \d+ in use, 0 turn\(s\) waiting for one", field(out, "slots"))
        assert re.fullmatch(r"hourly at \S+ \S+ \(in (59m|1h|\d+m\d*s?)\)", field(out, "next fire")), out
        health = await d.acli_json("status")
        assert health["pid"] == d.proc.pid and health["databaseBytes"] > 0 and health["nextFire"]["key"] == "hourly"
        assert health["storeConnections"] == 1 and health["storeRoundTrips"] is None  # a SQLite file
    finally:
        d.close()


# -- addressing, delete, resume --all ------------------------------------------------------------


async def test_goals_by_key_an_ambiguous_prefix_lists_the_candidates_and_delete_asks_first(daemon: Daemon) -> None:
    d = daemon
    a = await add_goal(d, "Notes [rounds=1]", "--key", "alpha")
    b = await add_goal(d, "Notes [rounds=1]")
    for gid in (a, b):
        await wait_goal(d.socket_path, gid, {"completed"}, LIMIT)
    shared = a[: next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)]
    code, _, err = await d.acli("goal", "show", shared)
    assert code == 2 and f"goal id prefix {shared!r} is ambiguous: it matches " in err
    assert a in err and b in err and "key alpha" in err
    code, _, err = await d.acli("goal", "show", "nosuchkey")
    assert code == EXIT_NOT_FOUND and "no goal with key 'nosuchkey'" in err

    live = await add_goal(d, "Notes [rounds=50 hold_round=1 hold=20]", "--key", "busy")
    code, _, err = await d.acli("goal", "delete", "busy", "--yes")
    assert code == EXIT_CONFLICT and "cancel it before deleting it" in err
    sid = (await rpc(d.socket_path, "goal/get", {"goalId": "alpha"}))["sessionId"]
    assert await all_events(d.socket_path, sid)

    # Asked first: "n" (or no answer) keeps it.
    for answer in ("n\n", ""):
        done = await asyncio.to_thread(d.cli, "goal", "delete", "alpha", input=answer)
        assert done.returncode == 1 and "[y/N]" in done.stderr and "not deleted" in done.stderr
    assert (await rpc(d.socket_path, "goal/get", {"goalId": "alpha"}))["id"] == a
    done = await asyncio.to_thread(d.cli, "goal", "delete", "alpha", input="y\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"deleted {a} and 1 session(s)\n"
    code, _, err = await d.acli("goal", "show", a)
    assert code == EXIT_NOT_FOUND
    code, _, err = await d.acli("send", sid, "hello")
    assert code == EXIT_NOT_FOUND and f"no session {sid}" in err
    # --yes for scripts.
    code, out, err = await d.acli("goal", "delete", b, "--yes")
    assert code == 0 and out.startswith(f"deleted {b}"), err
    listed = await d.acli_json("goal", "list")
    assert [g["id"] for g in listed] == [live]


# -- conventions: a closed pipe, completion, help -----------------------------------------------


def test_a_closed_pipe_ends_the_cli_quietly(daemon: Daemon, tmp_path: Path) -> None:
    d = daemon
    for i in range(3):
        added = d.cli("goal", "add", f"Notes {i} [rounds=50 hold_round=1 hold=20]", "--model", "test:worker")
        assert added.returncode == 0, added.stderr
    goald = " ".join([*goald_argv(), "--config", str(d.config_path)])
    script = (
        f'{goald} goal list 2>{tmp_path}/err1 | head -1; echo "rc=${{PIPESTATUS[0]}}"\n'
        # A reader that is gone before the first byte: the write itself fails with EPIPE.
        f'{goald} goal list 2>{tmp_path}/err2 | (exec 0<&-; exit 0); echo "rc=${{PIPESTATUS[0]}}"\n'
    )
    done = subprocess.run(["bash", "-c", script], env=child_env(), capture_output=True, text=True, timeout=LIMIT)
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "KEY", "STATUS"], done.stdout
    assert lines[1:] == ["rc=0", "rc=0"], (done.stdout, done.stderr)
    assert (tmp_path / "err1").read_text() == "" and (tmp_path / "err2").read_text() == ""


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts(shell: str, tmp_path: Path) -> None:
    done = subprocess.run([*goald_argv(), "completion", shell], env=child_env(), capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == ""
    script = tmp_path / f"goald.{shell}"
    script.write_text(done.stdout)
    if shell == "fish":
        assert "complete -c goald -n __fish_use_subcommand -a goal" in done.stdout
        assert "-l max-cost" in done.stdout
        return
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if shell == "bash":
        # Sourced, it completes actions and a flag's choices.
        probe = (
            f'source {script}; COMP_WORDS=(goald goal l); COMP_CWORD=2; _goald; echo "${{COMPREPLY[*]}}";'
            ' COMP_WORDS=(goald goal list --status pa); COMP_CWORD=4; _goald; echo "${COMPREPLY[*]}"'
        )
        out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True).stdout.splitlines()
        assert out == ["list logs", "paused"]


def test_every_flag_has_help_and_units_are_named() -> None:
    done = subprocess.run([*goald_argv(), "goal", "add", "--help"], env=child_env(), capture_output=True, text=True)
    text = " ".join(done.stdout.split())
    assert "--max-cost AMOUNT total cost, in the currency of the provider's prices" in text
    assert "--verify-timeout SECONDS time limit of each --verify command" in text
    from daemon.cli.parser import build_parser

    missing = []

    def walk(p: Any, path: str) -> None:
        for action in p._actions:
            if action.choices and isinstance(action.choices, dict):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif not action.help:
                missing.append(f"{path} {action.option_strings or action.dest}")

    walk(build_parser(), "goald")
    assert missing == []


# -- the demo's closing lines --------------------------------------------------------------------


def test_the_demos_printed_commands_work_in_a_fresh_shell_and_stop_cleanly(tmp_path: Path) -> None:
    done = subprocess.run(
        [*goald_argv(), "demo", "--plain"],
        env=child_env({"TMPDIR": str(tmp_path)}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    said = "note: the demo runs its commands in the sandbox (bubblewrap"
    if NO_BWRAP is not None:
        said = 'sandbox = "none" is the demo\'s own setting'
    assert said in done.stderr and "WARNING" not in done.stderr
    tail = done.stdout.split("look again (", 1)[1].splitlines()[1:]
    commands = [line.strip() for line in tail if line.startswith("  ")]
    assert len(commands) == 5 and commands[-1].startswith("kill $GOALD_PID")
    assert commands[1].split()[0].startswith("/"), commands  # the full path of goald
    goal_id = re.search(r"goal logs (goal_\w+)$", commands[3])
    assert goal_id is not None
    # A fresh shell: a bare environment (no PYTHONPATH, goald not on PATH), then wait for the daemon's exit.
    script = "\n".join([*commands, 'wait $GOALD_PID; echo "daemon exit=$?"'])
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    shell = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0, shell.stderr
    out = shell.stdout
    assert f"goal {goal_id[1]}: active -> completed (verified)" in out
    assert out.rstrip().endswith("daemon exit=0"), out
    log = Path(re.search(r"^state directory: (.+)$", done.stdout, re.M)[1]) / "serve.log"  # type: ignore[index]
    assert "daemon stopped" in log.read_text()
