"""A goal on a git repository, through a real daemon: its worktree and branch, ``goal diff`` per
round and overall (equal to what git itself counts), two goals on one repository at once, and a
``.git``-level attack written by the model that runs nothing while goald records, diffs and commits.

The repository is made by the test with the real ``git``; the goals run the shipped scripted
provider's ``worker`` (writes ``round<r>.txt`` each round) and ``gitattack`` (replaces the
worktree's ``.git`` by one whose config names an fsmonitor, hooks, a clean filter and a textconv,
and applies them to every file through ``.gitattributes``) models.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from harness import TEST_MODELS, Daemon, rpc, wait_goal

pytestmark = [pytest.mark.e2e, pytest.mark.needs_bwrap]

ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": "/nonexistent", "PATH": "/usr/bin:/bin"}


def run_git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=ENV, check=True)
    return done.stdout


def make_repo(path: Path) -> str:
    path.mkdir()
    run_git(path, "init", "-q", "-b", "main")
    (path / "a.txt").write_text("the start\n")
    (path / "README").write_text("a repository of the test's\n")
    run_git(path, "add", "-A")
    run_git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    return run_git(path, "rev-parse", "HEAD").strip()


def git_numstat(repo: Path, base: str, workdir: Path, tmp: Path) -> dict[str, tuple[str, str]]:
    """What git itself counts between ``base`` and the files of ``workdir`` (copied, without its ``.git``)."""
    copy = tmp / "copy"
    subprocess.run(["git", "clone", "-q", str(repo), str(copy)], check=True, env=ENV)
    run_git(copy, "checkout", "-q", base)
    for item in copy.iterdir():
        if item.name != ".git":
            shutil.rmtree(item) if item.is_dir() else item.unlink()
    for item in workdir.iterdir():
        if item.name != ".git":
            shutil.copytree(item, copy / item.name) if item.is_dir() else shutil.copy2(item, copy / item.name)
    run_git(copy, "add", "-A")
    out = run_git(copy, "diff", "--cached", "--numstat", base)
    shutil.rmtree(copy)
    return {line.split("\t")[2]: (line.split("\t")[0], line.split("\t")[1]) for line in out.splitlines()}


async def test_a_goal_on_a_repository_works_on_its_branch_and_diffs_like_git(daemon: Daemon, tmp_path: Path) -> None:
    d = daemon
    repo = tmp_path / "repo"
    base = make_repo(repo)
    one = await d.acli_json(
        "goal", "add", "Write three rounds. [rounds=3]", "--model", "test:worker", "--key", "wt1", "--repo", str(repo)
    )
    two = await d.acli_json(
        "goal", "add", "Write two rounds. [rounds=2]", "--model", "test:worker", "--key", "wt2", "--repo", str(repo)
    )
    assert (one["branch"], one["baseCommit"]) == ("goald/wt1", base)
    assert two["branch"] == "goald/wt2" and one["workdir"] != two["workdir"]
    done = await wait_goal(d.socket_path, one["goalId"], {"completed"})
    await wait_goal(d.socket_path, two["goalId"], {"completed"})
    assert done["rounds"] == 3 and done["baseCommit"] == base and done["branch"] == "goald/wt1"
    workdir = Path(one["workdir"])
    assert (workdir / ".git").read_text().startswith("gitdir: ")  # a worktree of the repository
    branches = run_git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/goald/").split()
    assert branches == ["goald/wt1", "goald/wt2"]
    code, shown, err = await d.acli("goal", "show", "wt1")
    assert f"repo:       {repo}" in shown and "branch:     goald/wt1" in shown, shown
    assert f"git -C {repo} merge goald/wt1" in shown, shown

    whole = await d.acli_json("goal", "diff", "wt1", "--stat")
    assert (whole["from"], whole["to"]) == ("base", "round-3")
    ours = {f["path"]: (str(f["added"]), str(f["removed"])) for f in whole["files"]}
    theirs = await asyncio.to_thread(git_numstat, repo, base, workdir, tmp_path)
    assert ours == theirs == {f"round{r}.txt": ("1", "0") for r in (1, 2, 3)}
    code, text, err = await d.acli("goal", "diff", "wt1")
    assert code == 0, err
    assert "diff --git a/round2.txt b/round2.txt\nnew file mode 100644\n--- /dev/null\n+++ b/round2.txt\n" in text
    assert "+round 2\n" in text
    per_round = await d.acli_json("goal", "diff", "wt1", "--round", "2")
    assert (per_round["from"], per_round["to"]) == ("round-1", "round-2")
    assert [f["path"] for f in per_round["files"]] == ["round2.txt"]
    other = await d.acli_json("goal", "diff", "wt2", "--stat")
    assert sorted(f["path"] for f in other["files"]) == ["round1.txt", "round2.txt"]

    committed = await d.acli_json("goal", "commit", "wt1")
    assert committed["branch"] == "goald/wt1" and committed["checkpoint"] == "round-3"
    assert run_git(repo, "rev-parse", "goald/wt1").strip() == committed["commit"]
    assert run_git(repo, "show", "goald/wt1:round3.txt") == "round 3\n"
    assert run_git(repo, "rev-parse", "goald/wt1^").strip() == base
    assert run_git(repo, "rev-parse", "main").strip() == base  # the operator's branch is untouched

    # A replay on another model starts from the same base commit, not from where wt1 ended.
    again = await d.acli_json("goal", "replay", "wt1", "--model", "test:asker", "--key", "again", "--max-rounds", "5")
    assert again["baseCommit"] == base and again["branch"] == "goald/again"
    replayed = await wait_goal(d.socket_path, again["goalId"], {"waiting"})
    assert replayed["replayOf"] == one["goalId"] and replayed["objective"] == "Write three rounds. [rounds=3]"
    assert replayed["budgets"]["maxRounds"] == 5 and replayed["model"] == "test:asker"
    fresh = Path(again["workdir"])
    assert sorted(await asyncio.to_thread(os.listdir, fresh)) == [".git", "README", "a.txt"]  # none of wt1's rounds
    code, shown, err = await d.acli("goal", "show", "again")
    assert f"replayOf:   {one['goalId']}" in shown, shown
    code, _out, err = await d.acli("goal", "replay", "nonesuch")
    assert code != 0 and "nonesuch" in err, err

    code, _out, err = await d.acli("goal", "diff", "wt1", "--round", "9")
    assert code != 0 and "round 9 of goal wt1 was not recorded (recorded: base, round-1, round-2, round-3)" in err
    code, _out, err = await d.acli("goal", "add", "x", "--model", "test:worker", "--repo", str(tmp_path / "nope"))
    assert code != 0 and "repo" in err, err


async def test_a_git_attack_in_the_worktree_runs_nothing_as_goald_records_diffs_and_commits(
    daemon: Daemon, tmp_path: Path
) -> None:
    d = daemon
    repo = tmp_path / "repo"
    base = make_repo(repo)
    created = await d.acli_json(
        "goal", "add", "Change a.txt.", "--model", "test:gitattack", "--key", "evil", "--repo", str(repo)
    )
    done = await wait_goal(d.socket_path, created["goalId"], {"completed"})
    workdir = Path(created["workdir"])
    assert (workdir / ".git").is_dir() and "fsmonitor" in (workdir / ".git" / "config").read_text()
    diffed = await d.acli_json("goal", "diff", "evil")
    assert sorted(f["path"] for f in diffed["files"]) == [".gitattributes", "a.txt"]  # .git is git's, not the work's
    assert "-the start\n+changed by the goal\n" in diffed["text"]
    committed = await d.acli_json("goal", "commit", "evil")
    tree = run_git(repo, "ls-tree", "-r", "--name-only", committed["commit"]).split()
    assert tree == [".gitattributes", "README", "a.txt"]
    assert run_git(repo, "show", f"{committed['commit']}:a.txt") == "changed by the goal\n"
    assert run_git(repo, "rev-parse", f"{committed['commit']}^").strip() == base
    assert done["status"] == "completed"
    pwned = [p for root in (workdir, repo, tmp_path, d.state_dir) for p in root.rglob("PWNED*")]
    assert pwned == [], pwned


async def test_a_schedule_whose_template_names_a_repository_fires_each_goal_on_its_own_worktree(
    daemon: Daemon, tmp_path: Path
) -> None:
    d = daemon
    repo = tmp_path / "repo"
    base = make_repo(repo)
    await rpc(
        d.socket_path,
        "schedule/add",
        {
            "key": "nightly",
            "trigger": {"kind": "cron", "expr": "0 3 * * *"},
            "goal": {"objective": "Write a round. [rounds=1]", "model": "test:worker", "repo": str(repo)},
        },
    )
    runs = [await rpc(d.socket_path, "schedule/run", {"scheduleId": "nightly"}) for _ in range(2)]
    assert all(r["goalId"] for r in runs), runs
    goals = [await wait_goal(d.socket_path, str(r["goalId"]), {"completed"}) for r in runs]
    assert len({g["branch"] for g in goals}) == 2 and all(g["branch"].startswith("goald/nightly/") for g in goals)
    assert all(g["baseCommit"] == base for g in goals)
    for g in goals:
        assert (Path(str(g["workdir"])) / ".git").read_text().startswith("gitdir: ")
        diffed = await rpc(d.socket_path, "goal/diff", {"goalId": g["id"], "stat": True})
        assert [f["path"] for f in diffed["files"]] == ["round1.txt"]


async def test_the_status_page_shows_what_each_round_changed(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    d = Daemon(tmp_path / "state", config={**TEST_MODELS, "web": {"enabled": True, "listen": f"127.0.0.1:{port}"}})
    token = d.cli("web", "token", "add", "alice").stdout.strip()
    d.start()
    try:
        repo = tmp_path / "repo"
        make_repo(repo)
        made = await d.acli_json("goal", "add", "Two rounds. [rounds=2]", "--model", "test:worker", "--repo", str(repo))
        await wait_goal(d.socket_path, made["goalId"], {"completed"})

        def get(path: str) -> str:
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                return str(resp.read().decode())

        page = await asyncio.to_thread(get, f"/goals/{made['goalId']}")
        assert f'href="/goals/{made["goalId"]}/diff?round=1">what it changed</a>' in page
        round2 = await asyncio.to_thread(get, f"/goals/{made['goalId']}/diff?round=2")
        assert "round-1 → round-2" in round2 and "round2.txt" in round2 and "round1.txt" not in round2
        whole = await asyncio.to_thread(get, f"/goals/{made['goalId']}/diff")
        assert "base → round-2" in whole and "+round 1" in whole and "+round 2" in whole
    finally:
        d.close()


async def test_a_goal_declared_on_a_repository_in_the_goals_file(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    base = make_repo(repo)
    goals = tmp_path / "goals.toml"
    goals.write_text(
        f'[[goal]]\nkey = "declared"\nobjective = "One round. [rounds=1]"\nmodel = "test:worker"\nrepo = "{repo}"\n'
        f'branch = "goald/from-file"\n'
    )
    d = Daemon(tmp_path / "state", config={**TEST_MODELS, "goals_file": str(goals)})
    d.start()
    try:
        done = await wait_goal(d.socket_path, "declared", {"completed"})
        assert (done["branch"], done["baseCommit"]) == ("goald/from-file", base)
        diffed = await rpc(d.socket_path, "goal/diff", {"goalId": "declared", "stat": True})
        assert [f["path"] for f in diffed["files"]] == ["round1.txt"]
        assert d.cli("reload").returncode == 0  # applied again: the goal exists, no second worktree
        listed = run_git(repo, "worktree", "list", "--porcelain").count("worktree ")
        assert listed == 2  # the repository's own and the goal's
    finally:
        d.close()


async def test_commit_on_complete_leaves_the_final_tree_on_the_branch(daemon: Daemon, tmp_path: Path) -> None:
    d = daemon
    repo = tmp_path / "repo"
    base = make_repo(repo)
    made = await d.acli_json(
        "goal", "add", "Two rounds. [rounds=2]", "--model", "test:worker", "--key", "auto",
        "--repo", str(repo), "--commit-on-complete",
    )  # fmt: skip
    await wait_goal(d.socket_path, made["goalId"], {"completed"})

    def committed() -> bool:
        return run_git(repo, "rev-parse", "goald/auto").strip() != base

    async with asyncio.timeout(30):
        while True:  # the commit follows the completion, off its transaction: watched from outside
            if await asyncio.to_thread(committed):
                break
            await asyncio.sleep(0.05)
    assert run_git(repo, "ls-tree", "-r", "--name-only", "goald/auto").split() == [
        "README", "a.txt", "round1.txt", "round2.txt",
    ]  # fmt: skip
    assert run_git(repo, "rev-parse", "goald/auto^").strip() == base


async def test_a_goal_not_on_a_repository_is_replayed_from_the_start_goald_recorded(daemon: Daemon) -> None:
    d = daemon
    start = d.state_dir / "work" / "mine"
    start.mkdir(parents=True)
    (start / "data.csv").write_text("a,b\n1,2\n")
    (start / "tools").mkdir()
    (start / "tools" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (start / "tools" / "run.sh").chmod(0o755)
    first = await d.acli_json(
        "goal", "add", "One round. [rounds=1]", "--model", "test:worker", "--key", "plain", "--workdir", str(start)
    )
    await wait_goal(d.socket_path, first["goalId"], {"completed"})
    assert (start / "round1.txt").exists()
    code, out, err = await d.acli("goal", "replay", "plain", "--model", "test:asker", "--key", "plain-again")
    assert code == 0, err
    assert "replays plain from its recorded start (2 file(s))" in out, out
    again = await wait_goal(d.socket_path, "plain-again", {"waiting"})
    fresh = Path(str(again["workdir"]))
    assert again["replayOf"] == first["goalId"] and fresh != start
    listed = await asyncio.to_thread(lambda: sorted(str(p.relative_to(fresh)) for p in fresh.rglob("*")))
    assert listed == ["data.csv", "tools", "tools/run.sh"]
    assert (fresh / "data.csv").read_text() == "a,b\n1,2\n" and os.access(fresh / "tools" / "run.sh", os.X_OK)
