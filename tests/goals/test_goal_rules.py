"""The goal engine's stop rules on a real SQLite file: proof of completion, stalls, model errors.

Verification commands are real ``bash`` subprocesses in the goal's real work directory; each one
also appends a line to a log *outside* the work directory, so the tests count how often a check
really ran without disturbing the work directory's fingerprint. The only stand-in is the shipped
scripted model, driven by a rule that reads the round number from its continuation ("Round N").
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from goalkit import goal_runtime, wait_status

from agent import (
    EventType,
    ModelErrorKind,
    ModelRequest,
    Reply,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolCall,
)
from goals import (
    GOAL_VERIFIED,
    Budgets,
    Decision,
    DecisionKind,
    Goal,
    GoalSpec,
    GoalStatus,
    PolicyInput,
    StopRules,
    VerifyCommand,
    fingerprint,
)

REFUSED = "Your last completion claim was refused; the verification said:"
UNCHANGED = "(the work directory has not changed since the last failed check)"
WARNING = "Warning: no progress"


def _text(msg: Any) -> str:
    return "".join(b.text for b in msg.content if isinstance(b, TextBlock))


def where_am_i(request: ModelRequest) -> tuple[int, int, str]:
    """(round, model steps already taken in it, the continuation's text) from a model request."""
    msgs = list(request.messages)
    for i in range(len(msgs) - 1, -1, -1):
        text = _text(msgs[i]) if msgs[i].role == "user" else ""
        found = re.search(r"\bRound (\d+)\b", text)
        if found:
            return int(found.group(1)), sum(1 for m in msgs[i + 1 :] if m.role == "assistant"), text
    raise AssertionError("no continuation in the request")


def call(name: str, **args: Any) -> Reply:
    return Reply(tool_calls=[ToolCall(name, args)])


async def continuations(rt: Runtime, goal: Goal) -> list[dict[str, Any]]:
    """The goal's continuation inbox rows, oldest first, with their text."""
    rows = await rt.store.read(
        lambda conn: conn.execute(
            "SELECT * FROM inbox WHERE session_id=? AND source_kind='goal' ORDER BY queued_seq", (goal.session_id,)
        ).fetchall()
    )
    return [{**dict(r), "text": "".join(b.get("text", "") for b in json.loads(r["content"]))} for r in rows]


async def session_events(rt: Runtime, goal: Goal) -> list[Any]:
    return await rt.store.events_after(goal.session_id, 0, limit=100_000)


def checker(runs: Path, script: str) -> VerifyCommand:
    """A verification command that logs each run to ``runs`` (outside the work directory)."""
    return VerifyCommand(cmd=f"echo run >> {shlex.quote(str(runs))}\n{script}", timeout=30)


def run_count(runs: Path) -> int:
    return len(runs.read_text().splitlines()) if runs.exists() else 0


# -- 4. completion with proof -----------------------------------------------------------------------


async def test_a_refused_claim_feeds_the_next_round_and_fixed_work_completes(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    runs = tmp_path / "runs.log"
    seen: dict[int, str] = {}

    def rule(request: ModelRequest) -> Reply:
        n, step, text = where_am_i(request)
        seen[n] = text
        answer = "41" if n == 1 else "42"
        if step == 0:
            return call("write_file", path="answer.txt", content=answer)
        if step == 1:
            return call("goal_complete", summary=f"answered {answer}", evidence="answer.txt holds it")
        return Reply.say("claimed")

    model = ScriptedModel(rule, name="proof")
    async with goal_runtime(db_path, model) as (rt, engine, _):
        goal = await engine.create(
            GoalSpec(
                objective="Put the answer (42) in answer.txt.",
                workdir=str(workdir),
                verify=[checker(runs, 'echo "answer is $(cat answer.txt)"; test "$(cat answer.txt)" = 42')],
                rules=StopRules(max_refused_claims=3, stall_rounds=5),
            )
        )
        changed = await wait_status(rt, goal, GoalStatus.COMPLETED)
        await engine.settled()
        final = await engine.get(goal.id)
        rows = await continuations(rt, goal)
        events = await session_events(rt, goal)
    model.assert_done()

    assert final.status is GoalStatus.COMPLETED and final.status_reason == "verified" == changed["reason"]
    assert final.rounds == 2 and final.refused_claims == 1
    assert final.result_summary == "answered 42"
    # The check ran once per claim: refused, then passed.
    assert run_count(runs) == 2
    verified = [e.data for e in events if e.type == GOAL_VERIFIED]
    assert [(v["passed"], v["reused"]) for v in verified] == [(False, False), (True, False)]
    assert verified[0]["results"][0]["exit_code"] == 1
    # The refusal's output reached round 2's continuation (the model saw it), and no other.
    assert REFUSED not in seen[1]
    assert REFUSED in seen[2] and "answer is 41" in seen[2] and "(exit 1)" in seen[2]
    assert [r["source_ref"] for r in rows] == [f"{goal.id}#1", f"{goal.id}#2"]
    assert (workdir / "answer.txt").read_text() == "42"


async def test_k_refusals_pause_unverified_and_an_unchanged_workdir_is_not_rechecked(
    db_path: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    runs = tmp_path / "runs.log"
    seen: dict[int, str] = {}
    answers = {1: "41", 3: "forty"}  # round 2 claims again without touching anything

    def rule(request: ModelRequest) -> Reply:
        n, step, text = where_am_i(request)
        seen[n] = text
        steps = ([call("write_file", path="answer.txt", content=answers[n])] if n in answers else []) + [
            call("goal_complete", summary=f"done in round {n}", evidence="trust me"),
            Reply.say("claimed"),
        ]
        return steps[step]

    model = ScriptedModel(rule, name="refused")
    async with goal_runtime(db_path, model) as (rt, engine, _):
        goal = await engine.create(
            GoalSpec(
                objective="Put the answer (42) in answer.txt.",
                workdir=str(workdir),
                verify=[checker(runs, 'echo "answer is $(cat answer.txt)"; test "$(cat answer.txt)" = 42')],
                rules=StopRules(max_refused_claims=3, stall_rounds=5),
            )
        )
        changed = await wait_status(rt, goal, GoalStatus.PAUSED)
        await engine.settled()
        final = await engine.get(goal.id)
        rows = await continuations(rt, goal)
        events = await session_events(rt, goal)
        queued = [r for r in rows if r["fate"] == "queued"]
    model.assert_done()

    assert final.status is GoalStatus.PAUSED and final.status_reason == "unverified" == changed["reason"]
    assert final.rounds == 3 and final.refused_claims == 3
    # Three claims, but the check ran twice: round 2 changed nothing, so its result was reused.
    assert run_count(runs) == 2
    verified = [e.data for e in events if e.type == GOAL_VERIFIED]
    assert [(v["passed"], v["reused"]) for v in verified] == [(False, False), (False, True), (False, False)]
    assert "answer is 41" in verified[1]["results"][0]["output_tail"]
    assert REFUSED in seen[2] and "answer is 41" in seen[2] and UNCHANGED not in seen[2]
    assert REFUSED in seen[3] and UNCHANGED in seen[3]
    # Paused after the third refusal: no fourth continuation.
    assert [r["source_ref"] for r in rows] == [f"{goal.id}#{i}" for i in (1, 2, 3)] and not queued


# -- 5. stalls --------------------------------------------------------------------------------------


@pytest.mark.parametrize("behaviour", ["talks", "lists"])
async def test_a_model_that_makes_no_progress_is_paused_stalled(behaviour: str, db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("nothing yet\n")
    n_stall = 2
    rounds_called: list[int] = []

    def rule(request: ModelRequest) -> Reply:
        n, step, _ = where_am_i(request)
        rounds_called.append(n)
        if behaviour == "lists" and step == 0:
            return call("list_dir", path=".")
        return Reply.say("Still thinking about the best approach.")

    model = ScriptedModel(rule, name=f"stall-{behaviour}")
    decisions: list[tuple[PolicyInput, Decision]] = []
    async with goal_runtime(db_path, model) as (rt, engine, _):
        engine.add_decision_listener(lambda inp, d: decisions.append((inp, d)))
        goal = await engine.create(
            GoalSpec(
                objective="Improve notes.txt.",
                workdir=str(workdir),
                budgets=Budgets(max_rounds=20),
                rules=StopRules(stall_rounds=n_stall),
            )
        )
        changed = await wait_status(rt, goal, GoalStatus.PAUSED)
        await engine.settled()
        final = await engine.get(goal.id)
        rows = await continuations(rt, goal)
    model.assert_done()

    # Neither talk nor the same list_dir every round is progress: N+1 rounds pause the goal.
    productive = 0
    expected_rounds = productive + n_stall + 1
    assert final.status is GoalStatus.PAUSED and final.status_reason == "stalled" == changed["reason"]
    assert final.rounds == expected_rounds and final.stall_streak == n_stall + 1
    assert sorted(set(rounds_called)) == list(range(1, expected_rounds + 1))
    assert model.call_count == expected_rounds * (2 if behaviour == "lists" else 1)
    assert [d.goal.stall_streak for _, d in decisions] == [0] * productive + list(range(1, n_stall + 2))
    # The N-th unproductive round's successor carried the warning; the earlier ones did not.
    warned = [WARNING in r["text"] for r in rows]
    assert warned == [False] * (expected_rounds - 1) + [True]
    assert all(r["fate"] == "admitted" for r in rows)


async def test_a_model_that_changes_files_every_round_is_never_stalled(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()

    def rule(request: ModelRequest) -> Reply:
        n, step, _ = where_am_i(request)
        # The same tool and path every round, but the content (so the work directory) changes.
        if step == 0:
            return call("write_file", path="log.txt", content="entry\n" * n)
        return Reply.say(f"logged {n} entries")

    model = ScriptedModel(rule, name="busy")
    decisions: list[tuple[PolicyInput, Decision]] = []
    async with goal_runtime(db_path, model) as (rt, engine, _):
        engine.add_decision_listener(lambda inp, d: decisions.append((inp, d)))
        goal = await engine.create(
            GoalSpec(
                objective="Keep a log.",
                workdir=str(workdir),
                budgets=Budgets(max_rounds=6),
                rules=StopRules(stall_rounds=1),
            )
        )
        changed = await wait_status(rt, goal, GoalStatus.EXHAUSTED)
        await engine.settled()
        final = await engine.get(goal.id)
        rows = await continuations(rt, goal)
    model.assert_done()

    assert final.status is GoalStatus.EXHAUSTED and final.status_reason == "round_limit" == changed["reason"]
    assert final.rounds == 6 and final.stall_streak == 0
    assert [d.kind for _, d in decisions] == [DecisionKind.CONTINUE] * 5 + [DecisionKind.EXHAUST]
    assert all(d.goal.stall_streak == 0 for _, d in decisions)
    assert not any(WARNING in r["text"] for r in rows)


# -- the work directory's fingerprint: data, never configuration ----------------------------------


def git(repo: Path, *args: str) -> None:
    """Run git in ``repo`` with a fixed identity (the caller clears the user's and system's config)."""
    subprocess.run(
        ["git", "-c", "user.name=goald test", "-c", "user.email=test@goald.invalid", "-c", "commit.gpgsign=false",
         *args],
        cwd=repo, check=True, capture_output=True, timeout=60,
    )  # fmt: skip


@pytest.fixture
def plain_git(monkeypatch: pytest.MonkeyPatch) -> None:
    """git without the user's or the system's configuration (the test's own git, to make commits)."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("plain_git")
def test_the_fingerprint_sees_every_git_step_as_plain_data(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    seen: dict[str, str | None] = {"no commit yet, one untracked file": fingerprint(repo)}
    git(repo, "add", "a.txt")
    seen["staged (the index changed)"] = fingerprint(repo)
    git(repo, "commit", "-q", "-m", "first")
    committed = fingerprint(repo)
    seen["first commit"] = committed

    # Nothing changes: the same fingerprint, however often it is taken.
    assert fingerprint(repo) == fingerprint(repo) == committed
    # Touched but not changed: the content is what counts, so it is no change.
    st = (repo / "a.txt").stat()
    os.utime(repo / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert fingerprint(repo) == committed

    (repo / "a.txt").write_text("two, longer\n")
    seen["a tracked file modified"] = fingerprint(repo)
    assert fingerprint(repo) == seen["a tracked file modified"]
    (repo / "sub").mkdir()
    (repo / "sub" / "c.txt").write_text("deeper\n")
    seen["a new file in a new directory"] = fingerprint(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "second")
    seen["committed"] = fingerprint(repo)
    assert fingerprint(repo) == seen["committed"]
    git(repo, "commit", "-q", "--allow-empty", "-m", "third")
    seen["an empty commit: only the ref and the logs moved"] = fingerprint(repo)

    assert all(fp is not None for fp in seen.values())
    assert len(set(seen.values())) == len(seen), seen


def test_the_fingerprint_runs_nothing_opens_nothing_and_follows_no_link(tmp_path: Path) -> None:
    """A planted ``.git`` with every config-driven execution path of git set, a FIFO where HEAD
    belongs, and links out of the directory: the fingerprint is taken (quickly: the FIFO is never
    opened), no planted command runs, and nothing behind a link is read."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    marker = tmp_path / "pwned"
    hook = f"touch {marker}"
    dotgit = work / ".git"
    (dotgit / "hooks").mkdir(parents=True)
    (dotgit / "config").write_text(
        f"[core]\n\tfsmonitor = {hook}\n\thooksPath = hooks\n\tpager = {hook}\n\tsshCommand = {hook}\n"
        f'[filter "x"]\n\tclean = {hook}\n\tsmudge = {hook}\n\tprocess = {hook}\n'
        f'[diff "x"]\n\ttextconv = {hook}\n'
    )
    (dotgit / "hooks" / "post-index-change").write_text(f"#!/bin/sh\n{hook}\n")
    (dotgit / "hooks" / "post-index-change").chmod(0o755)
    os.mkfifo(dotgit / "HEAD")
    (work / ".gitattributes").write_text("* filter=x diff=x\n")
    (work / "root").symlink_to("/")
    (work / "out").symlink_to(outside)
    first = fingerprint(work)
    (outside / "big.txt").write_text("changes behind a link are not the work directory's\n")
    assert fingerprint(work) == first
    (work / "a.txt").write_text("one\n")
    second = fingerprint(work)
    assert None not in (first, second) and first != second
    assert not marker.exists()


def test_the_fingerprint_reads_at_most_its_bound(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "a").mkdir(parents=True)
    (work / "b").mkdir()
    for i in range(30):
        (work / "a" / f"{i:02}").write_text("x")
        (work / "b" / f"{i:02}").write_text("x")
    small = fingerprint(work, max_entries=20)
    # Past the bound (in the fixed order, ``b`` comes after ``a``'s entries): not seen.
    (work / "b" / "00").write_text("longer")
    assert fingerprint(work, max_entries=20) == small
    # Within it: seen.
    (work / "a" / "00").write_text("longer")
    assert fingerprint(work, max_entries=20) != small
    assert fingerprint(work) != fingerprint(work, max_entries=20)
    assert fingerprint(tmp_path / "missing") is None
    (tmp_path / "file").write_text("not a directory")
    assert fingerprint(tmp_path / "file") is None


# -- 6. model errors ----------------------------------------------------------------------------------


async def test_model_errors_back_off_then_pause_and_resume_works(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    provider = {"down": True}

    def rule(request: ModelRequest) -> Reply:
        _, step, _ = where_am_i(request)
        if provider["down"]:
            # A malformed answer (the model's, not the infrastructure's: the provider answered),
            # which the driver retries at once (retry_after=0) before the turn gives up.
            return Reply.fail(ModelErrorKind.MALFORMED, "503 overloaded", retry_after=0.0)
        if step == 0:
            return call("goal_complete", summary="done after the outage", evidence="it answered")
        return Reply.say("done")

    model = ScriptedModel(rule, name="flaky")
    decisions: list[tuple[PolicyInput, Decision]] = []
    m, base = 3, 0.02
    async with goal_runtime(db_path, model) as (rt, engine, _):
        engine.add_decision_listener(lambda inp, d: decisions.append((inp, d)))
        goal = await engine.create(
            GoalSpec(
                objective="Answer once the provider is back.",
                workdir=str(workdir),
                rules=StopRules(max_model_errors=m, error_backoff_seconds=base, error_backoff_max_seconds=10),
            )
        )
        paused = await wait_status(rt, goal, GoalStatus.PAUSED)
        await engine.settled()
        held = await engine.get(goal.id)
        calls_while_down = model.call_count
        rows_then = await continuations(rt, goal)
        events = await session_events(rt, goal)

        provider["down"] = False
        resumed = await engine.resume(goal.id)
        done = await wait_status(rt, goal, GoalStatus.COMPLETED, after=paused["seq"])
        await engine.settled()
        final = await engine.get(goal.id)
        rows = await continuations(rt, goal)
    model.assert_done()

    # M failing rounds, each after the driver's own retries (4 attempts), then paused model_error.
    assert held.status is GoalStatus.PAUSED and held.status_reason == paused["reason"]
    assert held.status_reason == "model_error: malformed: 503 overloaded"
    assert held.error_streak == m and held.rounds == m and calls_while_down == 4 * m
    errors = [e.data for e in events if e.type == EventType.MODEL_ERROR]
    assert [(e["attempt"], e["retrying"]) for e in errors] == [(1, True), (2, True), (3, True), (4, False)] * m
    ends = [e.data for e in events if e.type == EventType.TURN_END]
    assert [(e["reason"], e["errorKind"]) for e in ends] == [("error", "malformed")] * m

    # The backoff grows: base, then twice that; each next round was queued only once it was due.
    kinds = [d.kind for _, d in decisions]
    assert kinds[: 2 * m - 1] == [DecisionKind.WAIT, DecisionKind.CONTINUE] * (m - 1) + [DecisionKind.PAUSE]
    waits = [(inp, d) for inp, d in decisions[: 2 * m] if d.kind is DecisionKind.WAIT]
    assert [d.goal.not_before - inp.now for inp, d in waits] == [timedelta(seconds=base * 2**i) for i in range(m - 1)]
    queued_at = {
        e.data["messageId"]: datetime.fromisoformat(e.at) for e in events if e.type == EventType.MESSAGE_QUEUED
    }
    for (_, wait), row in zip(waits, rows_then[1:], strict=True):
        assert wait.goal.not_before is not None and queued_at[row["id"]] >= wait.goal.not_before
    assert [r["source_ref"] for r in rows_then] == [f"{goal.id}#{i}" for i in range(1, m + 1)]

    # Resumed, the streak starts over, the next round is issued at once and completes.
    assert resumed.status is GoalStatus.ACTIVE and resumed.error_streak == 0 and resumed.not_before is None
    assert done["reason"] == "no_verification"
    assert final.status is GoalStatus.COMPLETED and final.rounds == m + 1 and final.error_streak == 0
    assert [r["source_ref"] for r in rows] == [f"{goal.id}#{i}" for i in range(1, m + 2)]


async def test_a_provider_failing_before_any_answer_spends_no_round_and_the_round_runs_again(
    db_path: Path, tmp_path: Path
) -> None:
    # docs/architecture.md#infrastructure-trouble-is-not-the-goals: a round whose turn failed before
    # any model answer (the provider unreachable, then overloaded) is not counted and runs again
    # with the same number; one round of budget is enough for a goal that lived through K of them.
    workdir = tmp_path / "work"
    workdir.mkdir()
    failures = [ModelErrorKind.CONNECTION, ModelErrorKind.SERVER, ModelErrorKind.CONNECTION]
    provider = {"down": True}
    texts: list[str] = []

    def rule(request: ModelRequest) -> Reply:
        _, step, _ = where_am_i(request)
        if provider["down"]:
            failed = sum(1 for i, _ in decisions if i.interval.last_end_reason == "error")
            return Reply.fail(failures[min(failed, len(failures) - 1)], "no answer", retry_after=0.0)
        if step == 0:
            return call("goal_complete", summary="done after the outage", evidence="it answered")
        return Reply.say("done")

    model = ScriptedModel(rule, name="unreachable")
    decisions: list[tuple[PolicyInput, Decision]] = []

    def observe(inp: PolicyInput, decision: Decision) -> None:
        decisions.append((inp, decision))
        if decision.continuation is not None:
            texts.append(decision.continuation)
        if sum(1 for i, _ in decisions if i.interval.last_end_reason == "error") >= len(failures):
            provider["down"] = False

    async with goal_runtime(db_path, model) as (rt, engine, _):
        engine.add_decision_listener(observe)
        goal = await engine.create(
            GoalSpec(
                objective="Answer once the provider is back.",
                workdir=str(workdir),
                budgets=Budgets(max_rounds=1),
                # One counted model error would pause it: none is counted.
                rules=StopRules(max_model_errors=1, error_backoff_seconds=0.02, error_backoff_max_seconds=10),
            )
        )
        await wait_status(rt, goal, GoalStatus.COMPLETED)
        await engine.settled()
        final = await engine.get(goal.id)
        rows = await continuations(rt, goal)
    model.assert_done()

    assert (final.status, final.rounds, final.error_streak) == (GoalStatus.COMPLETED, 1, 0)
    assert (final.infra_rounds, final.infra_streak) == (len(failures), 0)
    # Each failing interval waited the base backoff (never counted), then the same round ran again.
    waits = [d for i, d in decisions if i.interval.last_end_reason == "error"]
    assert [d.kind for d in waits] == [DecisionKind.WAIT] * len(failures)
    assert all(d.goal.memory.cause and d.goal.memory.cause.startswith("provider: ") for d in waits)
    refs = [r["source_ref"] for r in rows]
    assert refs == [f"{goal.id}#1"] + [f"{goal.id}#1/retry{k}" for k in range(1, len(failures) + 1)]
    assert all("Round 1 of 1" in t and "This round is run again" in t for t in texts)
    assert final.memory.cause is None


async def test_an_authentication_error_pauses_at_once_and_resume_works(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    key = {"valid": False}

    def rule(request: ModelRequest) -> Reply:
        _, step, _ = where_am_i(request)
        if not key["valid"]:
            return Reply.fail(ModelErrorKind.AUTH, "401 invalid api key")
        if step == 0:
            return call("goal_complete", summary="done with a valid key", evidence="it answered")
        return Reply.say("done")

    model = ScriptedModel(rule, name="auth")
    async with goal_runtime(db_path, model) as (rt, engine, _):
        goal = await engine.create(
            GoalSpec(
                objective="Answer with a valid key.",
                workdir=str(workdir),
                rules=StopRules(max_model_errors=5, error_backoff_seconds=0.01),
            )
        )
        paused = await wait_status(rt, goal, GoalStatus.PAUSED)
        await engine.settled()
        held = await engine.get(goal.id)
        calls_then = model.call_count
        events = await session_events(rt, goal)

        key["valid"] = True
        await engine.resume(goal.id)
        await wait_status(rt, goal, GoalStatus.COMPLETED, after=paused["seq"])
        await engine.settled()
        final = await engine.get(goal.id)
    model.assert_done()

    # One attempt (authentication is never retried), one round, paused at once.
    assert held.status is GoalStatus.PAUSED and held.status_reason == "auth_error" == paused["reason"]
    assert calls_then == 1 and held.rounds == 1 and held.not_before is None
    assert held.memory.last_error == "auth: 401 invalid api key"
    assert [e.data["retrying"] for e in events if e.type == EventType.MODEL_ERROR] == [False]
    assert final.status is GoalStatus.COMPLETED and final.rounds == 2
    assert final.result_summary == "done with a valid key"
