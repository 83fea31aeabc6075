"""What an operator trips over in the first week (issue 27, "Traps"), each through the real ``goald``
command and daemon (``tests/harness.py``).

A past ``--deadline`` is refused at ``goal add`` and ``goal edit``, naming the field (it would
exhaust the goal at once); the deadline a goal already has is kept by an edit of another budget.
``goal export`` takes a goal key and an id prefix, as its help and every other goal verb do.
A SIGHUP after ``goals_file`` was added to the configuration loads it, and the reload is logged.
A webhook whose signing secret has no value fails ``config check --strict`` and ``serve``, naming
the field; one whose secret goes away while serving fails each notification once, not for hours.
A token budget smaller than one call's reservation is said so (at ``goal add`` and ``schedule add``
as a warning naming the figure and the fix, and as the exhausted goal's reason), and counts no round.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sqlite3
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from harness import TEST_MODELS, Daemon, child_env, goald_argv, toml_text, wait_goal

pytestmark = pytest.mark.e2e


async def test_a_past_deadline_is_refused_at_goal_add_and_goal_edit(daemon: Daemon) -> None:
    d = daemon
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat(timespec="seconds")
    code, out, err = await d.acli("goal", "add", "x", "--model", "scripted:demo", "--deadline", past)
    assert code == 2, (code, out, err)
    assert "budgets.deadline" in err and "already past" in err, err
    assert (await d.acli_json("goal", "list")) == []  # nothing was written

    future = (datetime.now(UTC) + timedelta(days=1)).isoformat(timespec="seconds")
    made = await d.acli_json("goal", "add", "x", "--model", "scripted:demo", "--key", "later", "--deadline", future)
    code, out, err = await d.acli("goal", "edit", "later", "--deadline", past)
    assert code == 2, (code, out, err)
    assert "budgets.deadline" in err and "already past" in err, err
    kept = await d.acli_json("goal", "show", made["goalId"])
    assert datetime.fromisoformat(kept["budgets"]["deadline"]) == datetime.fromisoformat(future)


async def test_goal_export_takes_a_key_and_an_id_prefix(daemon: Daemon) -> None:
    d = daemon
    made = await d.acli_json("goal", "add", "x [rounds=1]", "--model", "test:worker", "--key", "rounds")
    goal_id = made["goalId"]
    await wait_goal(d.socket_path, goal_id, {"completed"})
    for ref in ("rounds", goal_id[:12], goal_id):
        code, out, err = await d.acli("goal", "export", ref)
        assert code == 0, (ref, code, err)
        assert json.loads(out)["goal"]["id"] == goal_id, ref
    code, _out, err = await d.acli("goal", "export", "nosuchkey")
    assert code == 3 and "no goal with key 'nosuchkey'" in err, (code, err)


def reload_status(d: Daemon) -> str:
    """The STATUS= of the READY=1 that ends a reload (systemd's reload protocol)."""
    d.wait_message("RELOADING=1")
    while True:
        fields = d.next_message(30, waiting_for="READY=1 after the reload").split("\n")
        if "READY=1" in fields:
            return next((f for f in fields if f.startswith("STATUS=")), "")


async def test_a_reload_that_adds_goals_file_loads_it_and_says_so(daemon: Daemon) -> None:
    d = daemon
    assert d.proc is not None
    goals = d.state_dir.parent / "goals.toml"
    goals.write_text('[[goal]]\nkey = "declared"\nobjective = "x [rounds=1]"\nmodel = "test:worker"\n')
    config = {"state_dir": str(d.state_dir), "log_level": "DEBUG", **TEST_MODELS, "goals_file": str(goals)}
    d.config_path.write_text(toml_text(config))
    d.proc.send_signal(signal.SIGHUP)
    status = await asyncio.to_thread(reload_status, d)
    assert "reloaded 1 goal(s), 0 schedule(s)" in status, status
    keys = [g["key"] for g in await d.acli_json("goal", "list")]
    assert keys == ["declared"], keys
    log = d.stderr()
    assert f"reload: goals_file is now {goals} (was None)" in log
    assert f"reload: applied {goals}: 1 goal(s), 0 schedule(s)" in log


def webhook_config(d: Daemon, secret: dict[str, str]) -> None:
    config = {"state_dir": str(d.state_dir), "log_level": "DEBUG", **TEST_MODELS}
    config["notify"] = {"retry_first_seconds": 0.05, "retry_max_seconds": 0.2, "group_window_seconds": 0}
    sink = '[[notify.sinks]]\ntype = "webhook"\nname = "ops"\nurl = "http://127.0.0.1:9/hook"\n'
    secret_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in secret.items())
    d.config_path.write_text(toml_text(config) + sink + f"secret = {{ {secret_toml} }}\n")


def test_an_unset_signing_secret_fails_config_check_strict_and_serve(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "state")
    try:
        webhook_config(d, {"env": "GOALD_TEST_UNSET_SIGNING_KEY"})
        env = child_env()
        env.pop("GOALD_TEST_UNSET_SIGNING_KEY", None)
        argv = [*goald_argv(), "--config", str(d.config_path)]
        checked = subprocess.run([*argv, "config", "check"], env=env, capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stderr  # a warning without --strict
        assert (
            "notify.sinks[0].secret: environment variable GOALD_TEST_UNSET_SIGNING_KEY has no value" in checked.stderr
        )
        strict = subprocess.run(
            [*argv, "config", "check", "--strict"], env=env, capture_output=True, text=True, check=False
        )
        assert strict.returncode == 78 and "notify.sinks[0].secret" in strict.stderr, strict.stderr
        served = subprocess.run([*argv, "serve"], env=env, capture_output=True, text=True, check=False, timeout=60)
        assert served.returncode == 78, served.stderr
        assert (
            "invalid configuration: notify.sinks[0].secret: environment variable GOALD_TEST_UNSET_SIGNING_KEY"
            in served.stderr
        )
        assert not d.socket_path.exists()
    finally:
        d.close()


def deliveries(state: Path) -> list[tuple[str, int, str | None]]:
    conn = sqlite3.connect(f"file:{state / 'goald.db'}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT state, attempts, last_error FROM outbox_deliveries").fetchall()
    finally:
        conn.close()


async def test_a_signing_secret_gone_while_serving_fails_once_not_for_hours(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "signing").write_text("not-a-real-key")
    d = Daemon(tmp_path / "state")
    try:
        webhook_config(d, {"credential": "signing"})
        d.start(extra_env={"CREDENTIALS_DIRECTORY": str(creds)})
        (creds / "signing").unlink()
        goal = await d.acli_json("goal", "add", "x [rounds=1]", "--model", "test:worker")
        await wait_goal(d.socket_path, goal["goalId"], {"completed"})
        deadline = time.monotonic() + 30
        while not (rows := deliveries(d.state_dir)) or any(state != "failed" for state, _, _ in rows):
            assert time.monotonic() < deadline, rows  # old code: pending, retried for 16 hours
            await asyncio.sleep(0.05)
        for _state, attempts, error in rows:
            assert attempts == 1 and error is not None and "credential 'signing'" in error, rows
        log = d.stderr()
        assert log.count("failed, not retried (a configuration error") == len(rows), log
        assert "attempt 1 failed" not in log
    finally:
        d.close()


async def test_goal_edit_of_an_exhausted_goal_names_the_next_command(daemon: Daemon) -> None:
    d = daemon
    made = await d.acli_json(
        "goal", "add", "x [rounds=2]", "--model", "test:worker", "--key", "tight", "--max-rounds", "1"
    )
    await wait_goal(d.socket_path, made["goalId"], {"exhausted"})
    code, _out, err = await d.acli("goal", "edit", "tight", "--max-rounds", "5")
    assert code == 0, err
    assert "note: goal tight is still exhausted" in err and "`goald goal resume tight`" in err, err
    code, _out, err = await d.acli("goal", "resume", "tight")
    assert code == 0, err
    await wait_goal(d.socket_path, made["goalId"], {"completed"})


async def test_a_token_budget_below_one_call_says_so_and_counts_no_round(daemon: Daemon) -> None:
    d = daemon
    code, _out, err = await d.acli(
        "goal", "add", "x [rounds=1]", "--model", "test:worker", "--key", "tiny", "--max-tokens", "500"
    )  # fmt: skip
    assert code == 0, err
    warned = re.search(r"warning: token budget of 500 cannot pay for one call, which reserves at least ([\d,]+)", err)
    assert warned is not None and int(warned.group(1).replace(",", "")) > 500, err
    assert f"raise --max-tokens well above {warned.group(1)} (a round makes several calls)" in err, err
    code, _out, err = await d.acli(
        "schedule", "add", "--cron", "0 3 1 1 *", "--key", "yearly", "--model", "test:worker", "--max-tokens", "500",
        "Yearly [rounds=1]",
    )  # fmt: skip
    assert code == 0 and "warning: token budget of 500 cannot pay for one call" in err, err

    # 3,000 is above the lower bound known at add time (no warning), below the first call's reservation.
    code, out, err = await d.acli(
        "goal", "add", "x [rounds=1]", "--model", "test:worker", "--key", "small", "--max-tokens", "3000"
    )  # fmt: skip
    assert code == 0 and "warning" not in err, err
    goal = await wait_goal(d.socket_path, out.split()[0], {"exhausted"})
    assert goal["statusReason"] == "token_budget_too_small", goal
    assert goal["rounds"] == 0 and goal["tokens"] == 0, goal  # no call was made: not a round
    why = re.fullmatch(
        r"token budget of 3,000 cannot pay for one call, which reserves up to ([\d,]+) tokens \(the prompt's upper"
        r" bound plus the model's max_tokens\): raise --max-tokens well above \1 \(a round makes several calls\),"
        r" then resume it",
        goal["why"],
    )
    assert why is not None and int(why.group(1).replace(",", "")) > 3000, goal["why"]
    code, out, err = await d.acli("goal", "show", "small")
    assert code == 0, err
    assert "status:     exhausted (token budget too small for one call)" in out, out
    assert "token budget spent" not in out, out
    code, out, err = await d.acli("goal", "list")
    assert code == 0 and "token budget too small for one call" in out, out

    # The fix the words name works: a budget well above the figure they give pays for the rounds.
    raised = 20 * int(why.group(1).replace(",", ""))
    code, _out, err = await d.acli("goal", "edit", "small", "--max-tokens", str(raised))
    assert code == 0, err
    code, _out, err = await d.acli("goal", "resume", "small")
    assert code == 0, err
    ended = await wait_goal(d.socket_path, goal["id"], {"completed", "exhausted"})
    assert ended["status"] == "completed" and ended["tokens"] > 0 and ended["rounds"] == 1, ended


def test_a_goals_file_budget_below_one_call_is_a_warning_of_config_check_and_serve(tmp_path: Path) -> None:
    goals = tmp_path / "goals.toml"
    goals.write_text(
        '[[goal]]\nkey = "tiny"\nobjective = "x [rounds=1]"\nmodel = "test:worker"\n'
        "budgets = { max_tokens_total = 500 }\n"
        '[[schedule]]\nkey = "nightly"\ntrigger = { kind = "cron", expr = "0 3 * * *" }\n'
        'goal = { objective = "y", model = "test:worker", budgets = { max_tokens_total = 400 } }\n'
    )
    d = Daemon(tmp_path / "state", config={**TEST_MODELS, "goals_file": str(goals)})
    try:
        checked = d.cli("config", "check")
        assert checked.returncode == 0, checked.stderr  # a warning; --strict refuses it
        for entry, field, budget in (("goal 'tiny'", "budgets", 500), ("schedule 'nightly'", "goal.budgets", 400)):
            want = (
                f"goald: warning: goals file {goals}: {entry}: {field}.max_tokens_total: token budget of {budget}"
                " cannot pay for one call, which reserves at least"
            )
            assert want in checked.stderr, checked.stderr
        assert d.cli("config", "check", "--strict").returncode == 78
        d.start()
        log = d.stderr()
        assert f"configuration: goals file {goals}: goal 'tiny': budgets.max_tokens_total: token budget of 500" in log
    finally:
        d.close()
