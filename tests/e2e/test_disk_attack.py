"""One ``dd`` inside a goal's sandbox against the disk the store lives on (issue 24, "Disk"): a real
``goald serve``, real bubblewrap, a scripted attacker.

The test mounts a 64 MiB tmpfs as the state directory, with the work directories on it (the default
layout: ``<state>/work``), and runs two goals: ``steady`` appends a line per round through the shell;
``filler`` runs ``dd if=/dev/zero of=big bs=1M`` until the file system is full. Settings: each goal's
work directory may hold 16 MiB (``sandbox_max_disk_mb``), the watermark is 8 MiB free and the
store's reserve 8 MiB (``[storage]``). Pins:

* the store records the attacking command's result (its ``tool/result`` event, ``No space left``);
* the attacking goal ends paused ``disk_limit`` with the figures in plain words;
* the other goal stays active: it waits with the reason (its activity says it waits for space, with
  the figures), and it was never counted against (no stall, no error); a person's message to it
  runs a turn whose shell call is answered ``not run: the disk holding goald's store (...) has ...
  free, under the 8 MiB watermark``;
* the daemon stays up, writes (``daemon/health``) and stops cleanly on SIGTERM;
* the store released its reserve to record it all (the file is gone; it comes back with space).

Needs root (to mount the tmpfs) and bubblewrap; skips with the reason otherwise.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clusterkit import until
from diskkit import mounted_tmpfs
from harness import Daemon, all_events, rpc, wait_events

LIMIT = 90.0
CONFIG: dict[str, Any] = {
    "providers": {"disk": {"kind": "scripted", "script": "disk_testmodels:models"}},
    "sandbox_max_disk_mb": 16,
    "storage": {"min_free_mb": 8, "reserve_mb": 8},
}


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs mounted for the test (skips unless root and mount works); unmounted after."""
    if shutil.which("bwrap") is None:
        pytest.skip("the attack runs through the sandbox: bubblewrap is not installed")
    with mounted_tmpfs(tmp_path / "small", 64, "0755") as mount:
        yield mount


def _results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "tool/result"]


async def test_dd_filling_the_store_disk_is_recorded_and_pauses_only_its_goal(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    state = small_tmpfs / "state"
    d = Daemon(state, config=CONFIG)
    d.stderr_path = tmp_path / "stderr.log"  # the log must not share the full file system
    reserve = state / "store.reserve"
    try:
        d.start()
        sock = d.socket_path
        assert reserve.is_file() and reserve.stat().st_blocks * 512 >= 8 * 1024 * 1024  # real blocks
        steady = await rpc(
            sock,
            "goal/create",
            {"objective": "Keep the log going.", "model": "disk:steady", "budgets": {"maxRounds": 500}},
        )
        # The steady goal works (a round's shell call ran) before the attack starts.
        await wait_events(d, steady["sessionId"], lambda ev: any("exit code: 0" in r["content"] for r in _results(ev)))
        filler = await rpc(sock, "goal/create", {"objective": "Fill the disk.", "model": "disk:filler"})

        # The attacker ends paused disk_limit, with the figures.
        async def paused() -> dict[str, Any] | None:
            g = await rpc(sock, "goal/get", {"goalId": filler["goalId"]})
            return g if g["status"] != "active" else None

        attacker = await until(paused, "the attacking goal stopped", LIMIT)

        # The other goal waits for space, with the reason, active and never counted against.
        async def waiting() -> dict[str, Any] | None:
            seen = await rpc(sock, "goal/describe", {"goalId": steady["goalId"]})
            return seen if seen["activity"]["state"] == "waiting_disk" else None

        described = await until(waiting, "the steady goal waits for space", LIMIT)
        # A person's message to it runs one turn: its shell call is not run, and the result says why.
        await rpc(sock, "session/prompt", {"sessionId": steady["sessionId"], "text": "Add one more line."})
        steady_events = await wait_events(
            d, steady["sessionId"], lambda ev: any(r["content"].startswith("not run: ") for r in _results(ev))
        )
        health = await rpc(sock, "daemon/health")
        filler_events = await all_events(sock, filler["sessionId"])
        assert d.proc is not None and d.proc.poll() is None  # nothing crashed
        code = d.terminate(30)
    finally:
        d.close()

    # The attacking command's own result is in the store.
    dd = _results(filler_events)
    assert len(dd) == 1 and dd[0]["name"] == "shell", dd
    assert "No space left on device" in dd[0]["content"], dd[0]["content"]
    assert attacker["status"] == "paused", attacker
    reason = attacker["statusReason"]
    assert reason.startswith("disk_limit: the work directory holds ") and reason.endswith(", over its 16 MiB limit")

    # The other goal: active, waiting with the reason; its refused call says why; nothing counted.
    goal = described["goal"]
    assert goal["status"] == "active" and goal["stallStreak"] == 0 and goal["errorStreak"] == 0, goal
    assert "until space is back: the disk holding goald's store" in described["activity"]["text"]
    assert "under the 8 MiB watermark" in described["activity"]["text"]
    refused = [r for r in _results(steady_events) if r["content"].startswith("not run: ")]
    assert refused and "the disk holding goald's store" in refused[0]["content"], _results(steady_events)[-3:]
    assert refused[0]["content"].endswith("under the 8 MiB watermark")

    # The store wrote throughout (its reserve given back for it), and the daemon stopped cleanly.
    assert health["storage"]["ok"], health
    assert code == 0
    assert "reserve" in d.stderr_path.read_text()
    assert not reserve.exists()
