"""Progress is what the daemon can observe (end to end: a real daemon, bubblewrap, scripted models).

* A busy-work model (each round it lists the directory and notes "progress" in new words; nothing
  changes) is paused ``stalled`` within 2N+1 rounds: its notes put the pause at N+1 off, by N
  rounds at most, never indefinitely.
* A goal whose real work is outside its work directory (here a "remote branch head" the model moves
  each round) and that has a ``progress`` command reading it keeps going until its round limit,
  never warned. The command runs in the goal's own sandbox: the remote lies under ``/var/tmp``,
  which the sandbox does not show, except through the goal's ``sandbox.readOnlyPaths`` (so the
  goal's sandbox settings reach its progress command).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Daemon, all_events, rpc, wait_goal

pytestmark = pytest.mark.needs_bwrap

N = 2
CONFIG: dict[str, Any] = {"providers": {"gs": {"kind": "scripted", "script": "goal_scripts:models"}}}
ENDED = {"completed", "paused", "failed", "exhausted", "cancelled"}


@pytest.fixture
def var_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="goald-progress-", dir="/var/tmp"))
    path.chmod(0o711)  # a root daemon's sandbox user passes through to the paths shown from here
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def warned(events: list[dict[str, Any]]) -> list[bool]:
    """For each admitted continuation, whether it carried the stall warning."""
    texts = ["".join(b.get("text", "") for b in e["data"].get("content", [])) for e in events
             if e["type"] == "message/admitted"]  # fmt: skip
    return ["Warning: no progress" in t for t in texts]


async def test_busy_work_is_stalled_and_observed_remote_progress_is_not(var_tmp: Path) -> None:
    remote = var_tmp / "remote"
    remote.mkdir()
    head = remote / "head"
    head.write_text("0" * 40 + "\n")
    d = Daemon(var_tmp / "state", config=CONFIG)
    try:
        d.start()
        busy = await rpc(
            d.socket_path,
            "goal/create",
            {"objective": "Improve the layout.", "model": "gs:busy", "stallRounds": N, "budgets": {"maxRounds": 20}},
        )
        rounds = 6
        working = await rpc(
            d.socket_path,
            "goal/create",
            {
                "objective": f"Push your work to the remote each round.\nremote: {head}",
                "model": "gs:remote",
                "stallRounds": N,
                "budgets": {"maxRounds": rounds},
                "progress": {"cmd": f"cat {head}", "timeout": 30},
                "sandbox": {"readOnlyPaths": [str(remote)]},
            },
        )
        stalled = await wait_goal(d.socket_path, busy["goalId"], ENDED, 90)
        kept = await wait_goal(d.socket_path, working["goalId"], ENDED, 90)
        busy_events = await all_events(d.socket_path, busy["sessionId"])
        working_events = await all_events(d.socket_path, working["sessionId"])
    finally:
        d.close()

    # Busy-work: paused stalled within 2N+1 rounds, having been warned from round N on.
    assert stalled["status"] == "paused" and stalled["statusReason"] == "stalled", stalled
    assert stalled["rounds"] <= 2 * N + 1
    assert len(stalled["notes"]) == stalled["rounds"]  # a new note every round, and still stalled
    assert warned(busy_events) == [r > N for r in range(1, stalled["rounds"] + 1)]
    # Observed progress: the progress command's output changed every round; never warned.
    assert (kept["status"], kept["statusReason"]) == ("exhausted", "round_limit"), kept["lastError"]
    assert kept["rounds"] == rounds and kept["stallStreak"] == 0
    assert not any(warned(working_events))
    assert head.read_text() == f"{rounds:040x}\n"
    assert kept["sandbox"]["readOnlyPaths"] == [str(remote)]
