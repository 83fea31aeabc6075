"""``goald eval run``: two scripted models of different skill on three tasks, N=3, through a real
daemon; the report's figures are the goals' own counters; a ``kill -9`` of the daemon in the middle
and a restart complete the remaining runs without repeating finished ones.

``test:worker`` does a task in its rounds and claims completion (verified by the task's check);
``test:lazy`` changes nothing and stalls. Each run is a goal on its own worktree of a repository the
test makes with the real git.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
from harness import Daemon, child_env, goald_argv, rpc

pytestmark = [pytest.mark.e2e]

ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": "/nonexistent", "PATH": "/usr/bin:/bin"}


def make_repo(path: Path) -> None:
    path.mkdir()
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "start"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(path), *args], env=ENV, check=True
        )


SUITE = """
name = "smoke"
models = ["test:worker", "test:lazy"]
runs = 3
concurrency = 3
{tasks}
"""
TASK = """
[[tasks]]
name = "r{r}"
objective = "Write {r} round file(s). [rounds={r}]"
repo = "repo"
verify = ["test -f round{r}.txt"]
stall_rounds = 2
[tasks.budgets]
maxRounds = 6
"""


async def _eval(d: Daemon, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *goald_argv(), "--config", str(d.config_path), "eval", *args,
        env=child_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _finished(d: Daemon) -> dict[str, dict[str, object]]:
    goals = (await rpc(d.socket_path, "goal/list", {}))["goals"]
    return {g["key"]: g for g in goals if str(g["key"]).startswith("eval:") and g["status"] not in ("active",)}


async def test_an_eval_of_two_models_survives_kill_9_and_reports_the_goals_own_figures(
    daemon: Daemon, tmp_path: Path
) -> None:
    d = daemon
    make_repo(tmp_path / "repo")
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE.format(tasks="".join(TASK.format(r=r) for r in (1, 2, 3))))

    first = await _eval(d, "run", str(suite))
    async with asyncio.timeout(120):
        while True:  # watching the daemon's goals from outside, until some runs ended
            before = await _finished(d)
            if len(before) >= 4:
                break
            await asyncio.sleep(0.1)
    d.kill()  # kill -9 in the middle of the evaluation
    out, err = await first.communicate()
    assert first.returncode != 0, out  # its daemon went away under it
    d.start()

    second = await _eval(d, "run", str(suite), "--out", str(tmp_path / "out"))
    async with asyncio.timeout(300):
        out, err = await second.communicate()
    assert second.returncode == 0, err.decode()
    text = out.decode()
    assert "found already (not repeated)" in text
    after = await _finished(d)
    assert len(after) == 18  # 3 tasks x 2 models x 3 runs, one goal each
    for key, goal in before.items():  # a run finished before the kill was not run again
        assert after[key]["id"] == goal["id"] and after[key]["rounds"] == goal["rounds"]
        assert after[key]["status"] == goal["status"]

    report = json.loads((tmp_path / "out" / "smoke.report.json").read_text())
    rows = {r["model"]: r for r in report["models"]}
    worker, lazy = rows["test:worker"], rows["test:lazy"]
    assert (worker["verified"], worker["runs"], lazy["verified"], lazy["stalled"]) == (9, 9, 0, 9)
    for row in (worker, lazy):
        for run in row["goals"]:
            goal = await rpc(d.socket_path, "goal/get", {"goalId": run["goalId"]})
            assert goal["status"] == run["status"]
    verified = [await rpc(d.socket_path, "goal/get", {"goalId": g["goalId"]}) for g in worker["goals"]]
    assert sorted(worker["rounds"]) == sorted(g["rounds"] for g in verified)
    assert sorted(worker["tokens"]) == sorted(g["tokens"] for g in verified)
    for g in verified:
        # A task of r rounds takes r; one less when the kill cut its last round after its claim: that
        # round's claim was verified, and a round the infrastructure cut is not counted.
        r = int(str(g["key"]).split(":")[2][1:])
        assert r - 1 <= g["rounds"] <= r and (g["rounds"] == r or g["infraRounds"] >= 1), g
    md = (tmp_path / "out" / "smoke.report.md").read_text()
    assert "| test:worker | 9/9 | " in md and "| test:lazy | 0/9 | - | - | - | - | 9 | 0 |" in md, md
    print(md)


async def test_a_task_may_start_from_a_directory_each_run_its_own_copy(daemon: Daemon, tmp_path: Path) -> None:
    d = daemon
    start = d.state_dir / "work" / "task-start"
    (start / "src").mkdir(parents=True)
    (start / "src" / "data.txt").write_text("input\n")
    suite = tmp_path / "dirs.toml"
    suite.write_text(
        'name = "dirs"\nmodels = ["test:worker"]\nruns = 2\nconcurrency = 2\n'
        f'[[tasks]]\nname = "copy"\nobjective = "One round. [rounds=1]"\ndirectory = "{start}"\n'
        'verify = ["test -f round1.txt && test -f src/data.txt"]\n'
    )
    proc = await _eval(d, "run", str(suite))
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "| test:worker | 2/2 |" in out.decode()
    workdirs = [
        Path((await rpc(d.socket_path, "goal/get", {"goalId": f"eval:dirs:copy:test:worker:{n}"}))["workdir"])
        for n in (1, 2)
    ]
    assert workdirs[0] != workdirs[1] and start not in workdirs
    assert not await asyncio.to_thread((start / "round1.txt").exists)  # the start itself is untouched
    with pytest.raises(Exception, match="startFrom '/etc' is outside the allowed work-directory roots"):
        await rpc(d.socket_path, "goal/create", {"objective": "x", "model": "test:worker", "startFrom": "/etc"})
