"""End-to-end: the ``goald`` command against the real daemon, run as a subprocess.

Each test starts its own ``goald serve`` on a state directory in ``tmp_path`` (see ``harness.py``)
and drives it only through the CLI: goal actions on a live goal, ``send``, schedules, ids by
prefix, ``--json`` on every listing, ``goald demo``, and ``goal show --watch`` / ``goal logs
--follow`` on a pipe and on a terminal (a pseudo-terminal). Goals use ``test:worker`` from
``goald_testmodels``, whose per-call latency the objective states. Waiting is on an event or a
process exit, always with a time limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from harness import Daemon, all_events, child_env, goald_argv, wait_events, wait_goal

LIMIT = 30.0
EXIT_USAGE, EXIT_NOT_FOUND, EXIT_CONFLICT = 2, 3, 4


async def add_goal(d: Daemon, objective: str, *options: str) -> tuple[str, str]:
    """``goald goal add`` with ``test:worker``: ``(goal id, session id)``."""
    created = await d.acli_json("goal", "add", objective, "--model", "test:worker", *options)
    return created["goalId"], created["sessionId"]


async def show(d: Daemon, goal: str) -> dict[str, Any]:
    """``goald goal show GOAL --json``."""
    result: dict[str, Any] = await d.acli_json("goal", "show", goal)
    return result


def found(pattern: str, text: str) -> str:
    """The first group of ``pattern`` (multi-line) in ``text``; fails the test if it is not there."""
    match = re.search(pattern, text, re.M)
    assert match is not None, f"no {pattern!r} in:\n{text}"
    return match[1]


def common_prefix(a: str, b: str) -> str:
    """The longest common prefix of two ids."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


# -- goal pause | resume | edit | cancel on a live goal -----------------------------------------


async def test_pause_edit_resume_a_live_goal_and_goal_show_follows_each_step(daemon: Daemon) -> None:
    d = daemon
    gid, sid = await add_goal(
        d, "Write notes [rounds=50 delay=0.2]", "--title", "notes", "--max-rounds", "60", "--max-tokens", "5000000"
    )
    await asyncio.to_thread(d.calls.wait, "worker round=1")

    code, out, err = await d.acli("goal", "pause", gid[:-6])  # a unique prefix is enough
    assert code == 0, err
    assert out.startswith(gid) and " paused (by request) " in out
    g = await show(d, gid)
    assert (g["status"], g["statusReason"]) == ("paused", "by_request")
    code, _, err = await d.acli("goal", "pause", gid)
    assert code == EXIT_CONFLICT and "cannot become paused" in err

    # Edit while paused: the new objective (two rounds in all) and round limit; the token budget
    # that was not named stays.
    code, out, err = await d.acli(
        "goal", "edit", gid, "--objective", "Write notes [rounds=2]", "--title", "two rounds", "--max-rounds", "40"
    )
    assert code == 0, err
    assert "rounds" in out and "/ 40" in out and "two rounds" in out
    g = await show(d, gid)
    assert (g["objective"], g["title"], g["status"]) == ("Write notes [rounds=2]", "two rounds", "paused")
    assert (g["budgets"]["maxRounds"], g["budgets"]["maxTokensTotal"]) == (40, 5_000_000)

    # Resume: the next round reads the edited objective, which asks for two rounds in all.
    resumed = await d.acli_json("goal", "resume", gid)
    assert resumed["status"] == "active" and resumed["statusReason"] is None
    final = await wait_goal(d.socket_path, gid, {"completed", "failed", "paused", "exhausted"}, LIMIT)
    assert final["status"] == "completed"
    g = await show(d, gid)
    assert g["status"] == "completed" and g["rounds"] >= 2 and g["tokens"] > 0

    # An ended goal cannot move again: exit 4, and nothing changes.
    for action in ("pause", "resume", "cancel"):
        code, _, err = await d.acli("goal", action, gid)
        assert code == EXIT_CONFLICT, (action, err)
        assert "a goal that is completed cannot become" in err
    assert await show(d, gid) == g
    events = await all_events(d.socket_path, sid)
    changes = [(e["data"]["from"], e["data"]["status"]) for e in events if e["type"] == "goal/changed"]
    assert changes == [(None, "active"), ("active", "paused"), ("paused", "active"), ("active", "completed")]


async def test_cancel_a_running_goal_interrupts_its_turn(daemon: Daemon) -> None:
    d = daemon
    gid, sid = await add_goal(d, "Write notes [rounds=50 delay=0.1 hold_round=2 hold=20]")
    await asyncio.to_thread(d.calls.wait, "worker round=2 step=0")  # a 20 s model call is in flight

    code, out, err = await d.acli("goal", "cancel", gid)
    assert code == 0, err
    assert " cancelled (by request) " in out
    # The turn of round 2 (the second turn) ends without waiting for its 20 s model call.
    events = await wait_events(d, sid, lambda evs: sum(e["type"] == "turn/end" for e in evs) == 2, limit=10)
    g = await show(d, gid)
    assert (g["status"], g["statusReason"]) == ("cancelled", "by_request")
    assert [e["data"]["reason"] for e in events if e["type"] == "turn/end"] == ["end_turn", "cancelled"]
    code, _, err = await d.acli("goal", "resume", gid)
    assert code == EXIT_CONFLICT and "cancelled cannot become active" in err


# -- send ---------------------------------------------------------------------------------------


async def test_send_a_followup_and_a_steer_by_goal_and_session_prefix(daemon: Daemon) -> None:
    d = daemon
    gid, sid = await add_goal(d, "Write notes [rounds=50 delay=0.3]")
    await asyncio.to_thread(d.calls.wait, "worker round=1 step=0")

    # A steer through the goal (by a prefix of its id), a follow-up through the session (by a
    # prefix of its id): each answers with the message id once the enqueue is durable.
    code, out, err = await d.acli("send", gid[:-4], "Mind the March data [rounds=50 delay=0.3]", "--steer")
    assert code == 0, err
    steer = out.strip()
    assert re.fullmatch(r"msg_[0-9A-Z]{26}", steer)
    sent = await d.acli_json("send", sid[:-4], "Use March, not February [rounds=50 delay=0.3]")
    assert sent["sessionId"] == sid
    followup = sent["messageId"]

    def admitted(events: list[dict[str, Any]]) -> bool:
        ids = {e["data"]["messageId"] for e in events if e["type"] == "message/admitted"}
        return {steer, followup} <= ids

    await wait_events(d, sid, admitted)
    code, out, err = await d.acli("goal", "logs", gid[:-4], "--json")
    assert code == 0, err
    logged = [json.loads(line) for line in out.splitlines()]
    queued = {e["data"]["messageId"]: e["data"] for e in logged if e["type"] == "message/queued"}
    assert (queued[steer]["delivery"], queued[steer]["source"]["kind"]) == ("steer", "user")
    assert (queued[followup]["delivery"], queued[followup]["source"]["kind"]) == ("followup", "user")
    texts = {
        e["data"]["messageId"]: "".join(b.get("text", "") for b in e["data"]["content"])
        for e in logged
        if e["type"] == "message/admitted"
    }
    assert texts[steer] == "Mind the March data [rounds=50 delay=0.3]"
    assert texts[followup] == "Use March, not February [rounds=50 delay=0.3]"
    # The plain log says the same, one line an event.
    code, out, _ = await d.acli("goal", "logs", gid)
    assert f"queued {steer} (steer, from user)" in out and f"queued {followup} (followup, from user)" in out
    assert f"admitted {steer}: Mind the March data" in out


# -- ids by prefix ------------------------------------------------------------------------------


async def test_ids_by_unique_prefix_and_clear_errors_for_ambiguous_or_unknown_ones(daemon: Daemon) -> None:
    d = daemon
    a, ses_a = await add_goal(d, "First [rounds=1]")
    b, ses_b = await add_goal(d, "Second [rounds=1]")
    for gid in (a, b):
        await wait_goal(d.socket_path, gid, {"completed"}, LIMIT)

    shared = common_prefix(a, b)
    assert len(shared) >= len("goal_0")
    unique_a = a[: len(shared) + 1]
    assert (await show(d, unique_a))["id"] == a
    code, out, err = await d.acli("goal", "show", shared)
    assert (code, out) == (EXIT_USAGE, "") and f"goal id prefix {shared!r} is ambiguous" in err
    for action in ("pause", "resume", "cancel", "logs"):
        code, _, err = await d.acli("goal", action, shared)
        assert code == EXIT_USAGE and "ambiguous" in err, action
    code, _, err = await d.acli("goal", "show", "goal_ZZZZZZ")
    assert code == EXIT_NOT_FOUND and "no goal goal_ZZZZZZ" in err
    code, _, err = await d.acli("goal", "cancel", "goal_ZZZZZZ")
    assert code == EXIT_NOT_FOUND
    code, _, err = await d.acli("goal", "show", "report")  # neither an id nor a goal's key
    assert code == EXIT_NOT_FOUND and "no goal with key 'report'" in err

    # Sessions, as `send` takes them.
    shared_ses = common_prefix(ses_a, ses_b)
    code, _, err = await d.acli("send", shared_ses, "hello")
    assert code == EXIT_USAGE and f"session id prefix {shared_ses!r} is ambiguous" in err
    code, _, err = await d.acli("send", "ses_ZZZZZZ", "hello")
    assert code == EXIT_NOT_FOUND and "no session ses_ZZZZZZ" in err
    # (Goal b has completed: a message to its session reopens it, or is refused.)
    sent = await d.acli_json("send", ses_b[: len(shared_ses) + 1], "hello [rounds=1]", "--reopen")
    assert sent["sessionId"] == ses_b

    # Schedules: by unique prefix, or by key.
    one = await d.acli_json("schedule", "add", "--cron", "0 3 * * *", "--key", "one", "Refresh")
    two = await d.acli_json("schedule", "add", "--cron", "0 4 * * *", "--key", "two", "Refresh")
    shared_sch = common_prefix(one["id"], two["id"])
    code, _, err = await d.acli("schedule", "runs", shared_sch)
    assert code == EXIT_USAGE and f"schedule id prefix {shared_sch!r} is ambiguous" in err
    code, _, err = await d.acli("schedule", "rm", "sch_ZZZZZZ")
    assert code == EXIT_NOT_FOUND and "no schedule sch_ZZZZZZ" in err
    assert await d.acli_json("schedule", "runs", two["id"][: len(shared_sch) + 1]) == []
    code, _, err = await d.acli("schedule", "rm", one["id"][: len(shared_sch) + 1])
    assert code == 0, err
    assert [s["id"] for s in await d.acli_json("schedule", "list")] == [two["id"]]


# -- schedules ----------------------------------------------------------------------------------


async def test_schedule_add_list_runs_rm_plain_and_json(daemon: Daemon) -> None:
    d = daemon
    code, out, err = await d.acli(
        "schedule", "add", "--cron", "0 3 * * *", "--timezone", "Europe/Berlin", "--key", "nightly", "Refresh"
    )
    assert code == 0, err
    nightly_id = out.split()[0]
    assert re.fullmatch(r"sch_[0-9A-Z]{26}", nightly_id)
    assert "  nightly  cron 0 3 * * * Europe/Berlin  no  next 20" in out and out.rstrip().endswith("last never fired")

    fast = await d.acli_json(
        "schedule", "add", "--every", "1", "--key", "fast", "--model", "test:worker", "--max-rounds", "3",
        "Quick notes [rounds=1]",
    )  # fmt: skip
    assert (fast["key"], fast["trigger"]["kind"], fast["trigger"]["seconds"]) == ("fast", "interval", 1.0)
    assert fast["goal"]["budgets"] == {"max_rounds": 3} and fast["goal"]["model"] == "test:worker"

    def fired(events: list[dict[str, Any]]) -> bool:
        return any(e["type"] == "schedule/run" and e["data"]["outcome"] == "fired" for e in events)

    started = time.monotonic()
    await wait_events(d, fast["sessionId"], fired, limit=15)
    assert time.monotonic() - started < 15

    runs = await d.acli_json("schedule", "runs", "fast")  # by key
    first = [r for r in runs if r["outcome"] == "fired"][-1]
    assert first["scheduleId"] == fast["id"] and first["goalId"].startswith("goal_")
    made = await show(d, first["goalId"])
    assert (made["objective"], made["budgets"]["maxRounds"], made["model"]) == (
        "Quick notes [rounds=1]",
        3,
        "test:worker",
    )
    code, out, err = await d.acli("schedule", "runs", fast["id"], "--limit", "1")
    assert code == 0, err
    assert len(out.splitlines()) == 1 and re.search(r"  (fired|skipped_concurrency|error|missed|coalesced)  ", out)
    # Every run so far: the schedule fires each second, so by now the default's newest N may no
    # longer reach back to the first fire on a slow machine.
    code, out, _ = await d.acli("schedule", "runs", fast["id"], "--limit", "10000")
    assert "  fired  " in out and f"-> {first['goalId']}" in out

    listed = {s["key"]: s for s in await d.acli_json("schedule", "list")}
    assert set(listed) == {"nightly", "fast"}
    assert listed["nightly"]["nextFireAt"] is not None and listed["nightly"]["lastOutcome"] is None
    assert listed["fast"]["lastOutcome"] is not None
    code, out, _ = await d.acli("schedule", "list")
    header, *lines = out.splitlines()
    assert header == "ID  KEY  TRIGGER  SUSPENDED  NEXT  LAST"
    assert len(lines) == 2 and {line.split()[0] for line in lines} == {nightly_id, fast["id"]}
    fast_line = next(line for line in lines if line.startswith(fast["id"]))
    assert "  fast  interval every 1s UTC  no  " in fast_line and "last never fired" not in fast_line

    code, out, err = await d.acli("schedule", "rm", "fast")
    assert (code, out) == (0, f"removed schedule {fast['id']} (fast); its runs and goals stay\n"), err
    assert [s["key"] for s in await d.acli_json("schedule", "list")] == ["nightly"]
    for args in (("rm", "fast"), ("runs", fast["id"])):
        code, _, err = await d.acli("schedule", *args)
        assert code == EXIT_NOT_FOUND, (args, err)
    # A bad cron expression is refused (exit 2, the field named) and adds nothing.
    code, _, err = await d.acli("schedule", "add", "--cron", "61 * * * *", "Refresh")
    assert code == EXIT_USAGE and "minute field: 61 is out of range 0-59" in err
    assert len(await d.acli_json("schedule", "list")) == 1


# -- --json on every listing --------------------------------------------------------------------


async def test_every_listing_prints_json_with_json(daemon: Daemon) -> None:
    d = daemon
    # Empty listings are JSON too (the plain form says so on stderr).
    assert await d.acli_json("goal", "list") == []
    assert await d.acli_json("schedule", "list") == []
    code, out, err = await d.acli("goal", "list")
    assert (code, out, err.strip()) == (0, "", "no goals")

    gid, sid = await add_goal(d, "Notes [rounds=2]", "--max-rounds", "5")
    await wait_goal(d.socket_path, gid, {"completed"}, LIMIT)
    sched = await d.acli_json("schedule", "add", "--cron", "0 3 * * *", "Refresh")

    goals = await d.acli_json("goal", "list")
    assert [(g["id"], g["status"], g["rounds"]) for g in goals] == [(gid, "completed", 2)]
    assert await d.acli_json("goal", "list", "--status", "completed") == goals
    assert await d.acli_json("goal", "list", "--status", "active") == []
    assert [s["id"] for s in await d.acli_json("schedule", "list")] == [sched["id"]]
    assert await d.acli_json("schedule", "runs", sched["id"]) == []
    health = await d.acli_json("status")
    assert health["status"] == "serving" and health["goals"]["completed"] == 1
    assert (await show(d, gid))["budgets"]["maxRounds"] == 5
    code, out, err = await d.acli("goal", "logs", gid, "--json")  # JSON lines: one event each
    assert code == 0, err
    logged = [json.loads(line) for line in out.splitlines()]
    assert [e["seq"] for e in logged] == list(range(1, len(logged) + 1))
    assert {e["sessionId"] for e in logged} == {sid} and logged[-1]["type"] == "goal/changed"
    code, out, _ = await d.acli("status")
    assert "serving" in out and "1 completed" in out


# -- goald demo ---------------------------------------------------------------------------------


def test_goald_demo_completes_and_says_where_its_state_and_events_are(tmp_path: Path) -> None:
    # Exactly the README's command; its temporary state directory lands under tmp_path.
    done = subprocess.run(
        [*goald_argv(), "demo"],
        env=child_env({"TMPDIR": str(tmp_path)}),
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    state = Path(found(r"^state directory: (.+)$", out))
    database = Path(found(r"^database \(goals, events, inbox, turns\): (.+)$", out))
    assert state.parent == tmp_path and database.parent == state
    goal_id = found(r"goald goal logs (goal_[0-9A-Z]{26})$", out)
    assert re.search(rf"^{goal_id}  completed \(verified\)  rounds 3  ", out, re.M)
    assert "verification FAILED: the claim is refused" in out and "verification passed" in out
    assert "Summary: 1200 orders, 31 refunds." in out
    # The state is where it says: the goal and every event it showed.
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        status, session_id = conn.execute("SELECT status, session_id FROM goals WHERE id=?", (goal_id,)).fetchone()
        seqs = [r[0] for r in conn.execute("SELECT seq FROM events WHERE session_id=? ORDER BY seq", (session_id,))]
    conn.close()
    shown = [int(s) for s in re.findall(r"^  \[\s*(\d+)\] ", out, re.M)]
    # Every event of the goal's session, in order, from its creation to the last one stored.
    assert status == "completed" and len(shown) > 10 and shown == seqs and shown[0] == 1


# -- goal show --watch, goal logs --follow ------------------------------------------------------

GOAL_LINE = re.compile(
    r"^(?P<id>goal_\w+)  (?P<status>\w+)(?: \((?P<reason>[^)]*)\))?  rounds (?P<rounds>\d+) / 10  "
    r"tokens (?P<tokens>[\d,]+) / 1,000,000  cost (?P<cost>[\d.]+) / 5\.0000  watched$"
)
BUDGETS = ("--max-rounds", "10", "--max-tokens", "1000000", "--max-cost", "5", "--title", "watched")


def goal_lines_of(out: str, gid: str) -> list[dict[str, Any]]:
    """The goal lines in ``out``, parsed (each must show the counters against the budgets)."""
    found = []
    for line in out.splitlines():
        if line.startswith(gid):
            m = GOAL_LINE.match(line)
            assert m is not None, line
            found.append({**m.groupdict(), "line": line})
    return found


def assert_final(line: dict[str, Any], g: dict[str, Any]) -> None:
    """A goal line agrees with ``goal show --json`` of the ended goal."""
    assert (line["status"], line["reason"], int(line["rounds"])) == ("completed", "verified", 3)
    assert int(line["tokens"].replace(",", "")) == g["tokens"] > 0
    assert line["cost"] == f"{g['cost']:.4f}" and g["cost"] > 0


async def watched(d: Daemon, paused: str | None, *watchers: tuple[str, ...]) -> list[tuple[int, str, str]]:
    """Run each ``goald`` watcher over the rest of a goal, however slowly the CLI starts.

    Every watcher is started and read until its first line (so it is watching) before the goal goes
    on: with ``paused`` (a goal id) the goal is paused first and resumed once all watch; without, the
    goal itself must be slow enough at its start (a held first call). Returns each watcher's ``(exit
    code, stdout, stderr)`` when it ends with the goal. Starting a watcher on a running goal instead
    races the goal: under load the CLI can start after the rounds the test expects to see.
    """
    if paused is not None:
        code, _, err = await d.acli("goal", "pause", paused)
        assert code == 0, err
        await wait_goal(d.socket_path, paused, {"paused"})
    procs = [
        await asyncio.create_subprocess_exec(
            *goald_argv(),
            "--config",
            str(d.config_path),
            *argv,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for argv in watchers
    ]
    try:
        async with asyncio.timeout(LIMIT):
            firsts = [await proc.stdout.readline() for proc in procs if proc.stdout is not None]
            assert all(firsts), "a watcher ended before its first line"
            if paused is not None:
                code, _, err = await d.acli("goal", "resume", paused)
                assert code == 0, err
            ends = [await proc.communicate() for proc in procs]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    return [
        (proc.returncode or 0, (first + out).decode(), err.decode())
        for proc, first, (out, err) in zip(procs, firsts, ends, strict=True)
    ]


async def test_goal_show_watch_prints_a_line_per_change_until_the_goal_ends(daemon: Daemon) -> None:
    d = daemon
    # The first round's call is slow (8 s), so the watchers start while the goal is at round 0 however
    # slowly the CLI starts; a pause would not do here: a watch ends when the goal stops.
    gid, _ = await add_goal(
        d, "Notes [rounds=3 delay=0.5 hold_round=1 hold=8]", *BUDGETS, "--verify", "test -f round3.txt"
    )
    (code, out, err), (jcode, jout, jerr) = await watched(
        d, None, ("goal", "show", gid, "--watch"), ("goal", "show", gid, "--watch", "--json")
    )
    assert code == 0, err
    g = await show(d, gid)
    lines = goal_lines_of(out, gid)
    assert len(lines) == len(out.splitlines()) >= 3
    assert [x["line"] for x in lines] == [x["line"] for i, x in enumerate(lines) if i == 0 or x != lines[i - 1]]
    assert lines[0]["status"] == "active" and int(lines[0]["rounds"]) == 0
    rounds = [int(x["rounds"]) for x in lines]
    tokens = [int(x["tokens"].replace(",", "")) for x in lines]
    assert rounds == sorted(rounds) and tokens == sorted(tokens) and tokens[0] < tokens[-1]
    assert_final(lines[-1], g)
    # With --json: the goal as one JSON object a line, each change once, the last the ended goal.
    assert jcode == 0, jerr
    changes = [json.loads(line) for line in jout.splitlines()]
    assert len(changes) >= 2 and changes[0]["status"] == "active" and changes[-1] == g


async def test_goal_logs_follow_shows_events_and_the_goal_against_its_budget_until_it_ends(daemon: Daemon) -> None:
    d = daemon
    gid, sid = await add_goal(d, "Notes [rounds=3 delay=0.5]", *BUDGETS, "--verify", "test -f round3.txt")
    (code, out, err), (jcode, jout, jerr) = await watched(
        d, gid, ("goal", "logs", gid, "--follow"), ("goal", "logs", gid, "-f", "--json")
    )
    assert code == 0, err
    events = await all_events(d.socket_path, sid)
    g = await show(d, gid)
    # Every event once, in order; between them the goal each time its line changes.
    event_lines = [line for line in out.splitlines() if line.startswith("[")]
    assert [int(line[1:6]) for line in event_lines] == [e["seq"] for e in events]
    assert event_lines[-1].endswith(
        f"goal {gid}: active -> completed (verified); rounds 3, tokens {g['tokens']:,}, cost {g['cost']:.4f}"
    )
    lines = goal_lines_of(out, gid)
    assert len(event_lines) + len(lines) == len(out.splitlines())
    assert [int(x["rounds"]) for x in lines] == sorted(int(x["rounds"]) for x in lines)
    assert {int(x["rounds"]) for x in lines} >= {2, 3} and lines[0]["status"] == "paused"
    assert_final(lines[-1], g)
    # --json: the events only, one JSON object a line.
    assert jcode == 0, jerr
    assert [(e["seq"], e["type"]) for e in map(json.loads, jout.splitlines())] == [
        (e["seq"], e["type"]) for e in events
    ]

    # Following a goal that has already ended prints its events and the goal, and returns.
    code, out, err = await d.acli("goal", "logs", gid, "--follow", limit=10)
    assert code == 0, err
    assert out.splitlines()[-1] == lines[-1]["line"]


def run_on_a_terminal(argv: list[str], limit: float = LIMIT) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as its stdout: ``(exit code, what it wrote)``."""
    master, slave = pty.openpty()
    env = child_env({"TERM": "xterm-256color", "COLUMNS": "200", "LINES": "40"})
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + limit
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{argv[-3:]} still runs after {limit}s")
            ready, _, _ = select.select([master], [], [], left)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(limit)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("command", [("show", "--watch"), ("logs", "--follow")])
def test_on_a_terminal_the_goal_is_a_live_display(daemon: Daemon, command: tuple[str, str]) -> None:
    d = daemon
    created = d.cli_json("goal", "add", "Notes [rounds=2 delay=0.3]", "--model", "test:worker", *BUDGETS)
    gid = created["goalId"]
    action, flag = command
    code, out = run_on_a_terminal([*goald_argv(), "--config", str(d.config_path), "goal", action, gid, flag])
    assert code == 0, out
    # rich's live display: the cursor hidden while it redraws the panel in place, shown again at the end.
    assert "\x1b[?25l" in out and "\x1b[?25h" in out[out.rindex("\x1b[?25l") :]
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
    assert re.search(
        rf"{gid}  completed(?: \([^)]*\))?  rounds 2 / 10  tokens [\d,]+ / 1,000,000  cost [\d.]+ / 5\.0000", plain
    )
    assert f"session {created['sessionId']}" in plain
    if action == "logs":
        assert f"goal {gid}: active -> completed" in plain


async def test_goal_add_and_schedule_add_take_a_tool_allowlist(daemon: Daemon) -> None:
    d = daemon
    gid, _ = await add_goal(d, "Notes [rounds=1]", "--tool", "read_file", "--tool", "shell:git *")
    assert (await show(d, gid))["tools"] == ["read_file", "shell:git *"]
    sched = await d.acli_json(
        "schedule", "add", "--cron", "0 3 * * *", "--key", "tooled", "--tool", "list_dir", "Look around"
    )
    assert sched["goal"]["tools"] == ["list_dir"]
    # A malformed pattern is refused naming the field, and nothing is made.
    code, out, err = await d.acli("goal", "add", "Bad tools", "--model", "test:worker", "--tool", "")
    assert code == 2 and "tools" in err and out == ""
    assert [g["id"] for g in await d.acli_json("goal", "list")] == [gid]
