"""A goal's wall time binds before the call, end to end: the real daemon process, the real
``openai`` provider and SDK, and a local chat-completions server that answers after a set delay.

With a 6 s wall-time budget and ``model_call_min_seconds = 0.25``, round 1's call answers after
0.5 s and round 2's (it would answer after 60 s) starts with about 5 s left: it is cut at 6 s
(charged in full, the turn ends ``budget``) and the goal ends ``exhausted`` for its wall time. With
a minimum of 1.5 s and round 1 answering after 4.6 s, round 2's call never starts (at most 1.4 s is
left). Either way no call starts with less than the minimum left, and the overshoot (the
cancellation latency) is printed. Each case has seconds of slack whichever way a loaded machine
delays it; the cut is shown by what was (not) answered and charged, and the latency bound is only
far inside the 60 s the cut call would have taken.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from harness import Daemon, all_events, rpc, wait_goal
from providers_server import ProviderServer, Respond, oa_usage, openai_text

BUDGET = 6.0
#: A call that would still be in flight long after the budget (so only the cut can end it).
LONG_CALL = 60.0


@pytest.fixture
async def server() -> AsyncIterator[ProviderServer]:
    async with ProviderServer() as srv:
        yield srv


# (min_left, round 1's answer delay): 0.25 s after a 0.5 s round 1 leaves round 2 about 5 s of slack
# to start however late a loaded machine starts it; 1.5 s after a 4.6 s round 1 never lets it start
# (at most 1.4 s left), and round 1 still has 1.4 s of slack to end before the budget.
@pytest.mark.parametrize(("min_left", "first_call"), [(0.25, 0.5), (1.5, 4.6)])
async def test_wall_time_binds_a_call_in_flight_and_before_the_next(
    server: ProviderServer, tmp_path: Path, min_left: float, first_call: float
) -> None:
    # Round 1's answer comes after first_call seconds; every later one would take a minute (only the
    # cut at the end of the wall time can end such a call). More are scripted than may be used.
    for n in range(4):
        delay = first_call if n == 0 else LONG_CALL
        server.add(Respond.stream(openai_text([f"Round {n + 1} done."], usage=oa_usage(50, 4)), delay=delay))
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
    assert final["wallUsed"] < BUDGET + LONG_CALL / 2, final["wallUsed"]  # not the cut call's minute
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
    if min_left < BUDGET - first_call:
        # Round 2's call was in flight at the end of the wall time: cancelled, charged in full.
        assert len(server.requests) == 2
        cut = re.search(r"passed during the model call: it was cancelled ([\d.]+)s after", last)
        assert cut is not None, last
        latency = float(cut.group(1))
        print(
            f"\ncancellation latency at the end of the wall time: {latency * 1000:.1f} ms; "
            f"wallUsed {final['wallUsed']:.3f}s of {BUDGET}s"
        )
        assert latency < LONG_CALL / 2  # cut by the wall time, not ended by its answer
        assert len(charged) == 1 and charged[0]["tokens"] > 0
    else:
        # Too little was left for round 2's call: it was never made.
        assert len(server.requests) == 1
        assert f"less than the {min_left:g}s a model call needs to start" in last
        assert charged == []
