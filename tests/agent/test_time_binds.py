"""A goal's wall time binds before the call, end to end: the real daemon process, the real
``openai`` provider and SDK, and a local chat-completions server whose every answer takes 2 s.

With a 3 s wall-time budget, round 1's call runs from about 0 s to 2 s and round 2's starts at
about 2 s. With ``model_call_min_seconds = 0.25`` round 2's call may start (about 1 s is left), is
cut at 3 s (charged in full, the turn ends ``budget``) and the goal ends ``exhausted`` for its wall
time at about 3 s. With a minimum of 1.5 s round 2's call never starts. Either way no call starts
with less than the minimum left, and the overshoot (the cancellation latency) is printed.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from harness import Daemon, all_events, rpc, wait_goal
from providers_server import ProviderServer, Respond, oa_usage, openai_text

BUDGET = 3.0
CALL = 2.0


@pytest.fixture
async def server() -> AsyncIterator[ProviderServer]:
    async with ProviderServer() as srv:
        yield srv


# 0.25 s leaves round 2 about 0.75 s of slack to start (a loaded machine starts it late); 1.5 s never lets it.
@pytest.mark.parametrize("min_left", [0.25, 1.5])
async def test_wall_time_binds_a_call_in_flight_and_before_the_next(
    server: ProviderServer, tmp_path: Path, min_left: float
) -> None:
    # Every answer takes 2 s before its first byte; more are scripted than may be used.
    for n in range(4):
        server.add(Respond.stream(openai_text([f"Round {n + 1} done."], usage=oa_usage(50, 4)), delay=CALL))
    provider = {"kind": "openai", "base_url": server.url + "/v1", "api_key_env": "TIME_TEST_API_KEY"}
    d = Daemon(tmp_path / "state", config={"model_call_min_seconds": min_left, "providers": {"local": provider}})
    try:
        d.start(extra_env={"TIME_TEST_API_KEY": "sk-time-test"})
        goal = await rpc(
            d.socket_path,
            "goal/create",
            {"objective": "Say a round is done.", "model": "local:gpt-test", "budgets": {"maxWallSeconds": BUDGET}},
        )
        final = await wait_goal(d.socket_path, goal["goalId"], {"exhausted", "paused", "failed", "completed"}, 30)
        events = await all_events(d.socket_path, goal["sessionId"])
    finally:
        d.close()

    assert (final["status"], final["statusReason"]) == ("exhausted", "wall_time"), final
    assert final["wallUsed"] <= BUDGET + 0.5, final["wallUsed"]
    start = datetime.fromisoformat(final["createdAt"])  # active since it was created
    end = start + timedelta(seconds=BUDGET)
    # No call started with less than the minimum left.
    lefts = [(end - r.at).total_seconds() for r in server.requests]
    assert all(left >= min_left for left in lefts), lefts
    turn_ends = [e["data"] for e in events if e["type"] == "turn/end"]
    charged = [e["data"] for e in events if e["type"] == "model/charged"]
    answers = [e["data"] for e in events if e["type"] == "assistant/message"]
    assert [t["reason"] for t in turn_ends] == ["end_turn", "budget"]
    assert [a["content"] for a in answers] == [[{"type": "text", "text": "Round 1 done."}]]
    last = turn_ends[-1]["error"]
    if min_left < BUDGET - CALL:
        # Round 2's call was in flight at the end of the wall time: cancelled, charged in full.
        assert len(server.requests) == 2
        cut = re.search(r"passed during the model call: it was cancelled ([\d.]+)s after", last)
        assert cut is not None, last
        latency = float(cut.group(1))
        print(
            f"\ncancellation latency at the end of the wall time: {latency * 1000:.1f} ms; "
            f"wallUsed {final['wallUsed']:.3f}s of {BUDGET}s"
        )
        assert latency < 0.5
        assert len(charged) == 1 and charged[0]["tokens"] > 0
    else:
        # Too little was left for round 2's call: it was never made.
        assert len(server.requests) == 1
        assert f"less than the {min_left:g}s a model call needs to start" in last
        assert charged == []
