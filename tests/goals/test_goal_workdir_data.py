"""The daemon reads a work directory as data, never as configuration (end to end).

A real ``goald serve`` (bubblewrap as the sandbox) runs a goal whose model has only ``write_file``.
In round 1 the model plants a git repository whose ``.git/config`` would run ``touch MARKER``
through ``core.fsmonitor``, a hooks path, a filter driver, a diff driver, the pager and
``core.sshCommand``, with ``.gitattributes`` sending every file through those drivers, and a
``.git/HEAD``. Every round it "commits" (rewrites ``.git/refs/heads/main`` with a new id of the
same length) and notes the same words. The goal runs its rounds with a stall threshold of one:

* no planted command ever runs: the marker, outside the work directory, is never created, while
  the daemon (root here) could have created it had it run git there;
* the fingerprint still sees progress: with N = 1, a single round without an observed change
  would put a warning into the next continuation, and the goal reaches its last round with no
  warning, no stall streak, and completes.

Everything lives under ``/var/tmp`` (a sandbox's private ``/tmp`` would hide paths under the host's
``/tmp`` from the command anyway, which would prove nothing about the sandbox).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from goal_scripts import plants
from harness import Daemon, all_events, rpc, wait_goal

pytestmark = pytest.mark.needs_bwrap

ROUNDS = 4
CONFIG: dict[str, Any] = {"providers": {"gs": {"kind": "scripted", "script": "goal_scripts:models"}}}


@pytest.fixture
def var_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="goald-data-", dir="/var/tmp"))
    path.chmod(0o711)  # a root daemon's sandbox user passes through to the work directories here
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_a_planted_git_config_runs_nothing_and_commits_count_as_progress(var_tmp: Path) -> None:
    marker = var_tmp / "pwned"
    d = Daemon(var_tmp / "state", config=CONFIG)
    try:
        d.start()
        created = await rpc(
            d.socket_path,
            "goal/create",
            {
                "objective": f"Commit your work each round. [rounds={ROUNDS}]\nmarker: {marker}",
                "model": "gs:planter",
                "tools": ["write_file"],
                "stall_rounds": 1,
                # Verification runs in the sandbox, in the planted repository: git reads the
                # planted config there, and still nothing of it can reach the marker.
                "verify": [{"cmd": "git status >/dev/null 2>&1; git diff >/dev/null 2>&1; test -s README",
                            "timeout": 60}],
            },
        )  # fmt: skip
        goal = await wait_goal(d.socket_path, created["goalId"], {"completed", "paused", "failed", "exhausted"}, 90)
        events = await all_events(d.socket_path, created["sessionId"])
    finally:
        d.close()

    workdir = Path(created["workdir"])
    assert goal["status"] == "completed", (goal, d.stderr())
    assert goal["rounds"] == ROUNDS and goal["stallStreak"] == 0
    # The plants are really there (the model could write them), and so is the last commit.
    for path, content in plants(str(marker)).items():
        assert (workdir / path).read_text() == content
    assert (workdir / ".git/refs/heads/main").read_text() == f"{ROUNDS:040x}\n"
    # Progress came from the work directory alone: the note never changed, and no round warned.
    continuations = [
        "".join(b.get("text", "") for b in e["data"].get("content", []))
        for e in events
        if e["type"] == "message/admitted"
    ]
    assert len(continuations) == ROUNDS
    assert not any("Warning: no progress" in text for text in continuations)
    assert goal["notes"] == ["committed my work"]
    assert not marker.exists(), "a command planted in the work directory ran"
    verified = [e for e in events if e["type"] == "goal/verified"]
    assert verified and verified[-1]["data"]["passed"] is True, json.dumps(verified)[-2000:]

    # The control: the plant is live. git run in (a copy of) the work directory, outside any
    # sandbox, as the old fingerprint did, runs the planted command at once.
    copy = var_tmp / "copy"
    shutil.copytree(workdir, copy, symlinks=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(var_tmp), "GIT_CONFIG_NOSYSTEM": "1"}
    git = await asyncio.create_subprocess_exec(
        "git", "status", "--porcelain", cwd=copy, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    async with asyncio.timeout(60):
        await git.wait()
    assert marker.exists(), "the planted configuration did not run under git: the test proves nothing"
