"""End-to-end: the daemon stopped mid-work (SIGTERM, or ``kill -9``) and started again.

The real ``goald serve`` runs as a subprocess (``harness.py``) and is driven only through the CLI
and its socket. What must hold: a goal resumes by itself after the restart and completes, with
nothing done twice (each continuation admitted once, one per round; each message admitted once);
an idempotency key keeps naming the first goal, across the restart too; SIGTERM ends the process
with 0 within the configured grace period; and a message whose ``session/prompt`` was answered
with a ``messageId`` before the SIGTERM is admitted exactly once after the restart.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from typing import Any

import pytest
from harness import all_events, continuation_ids, rpc, spend_of, wait_goal

from daemon.client import Connection as Client

TERMINAL = {"completed", "failed", "cancelled", "paused", "exhausted"}
LIMIT = 30.0


def assert_each_message_has_one_fate(events: list[dict[str, Any]]) -> Counter[str]:
    """Every queued message is admitted or cancelled exactly once; returns admissions by id."""
    queued = [e["data"]["messageId"] for e in events if e["type"] == "message/queued"]
    admitted = Counter(e["data"]["messageId"] for e in events if e["type"] == "message/admitted")
    cancelled = Counter(e["data"]["messageId"] for e in events if e["type"] == "message/cancelled")
    assert len(queued) == len(set(queued)), "a message was queued twice"
    assert all(n == 1 for n in admitted.values()), f"admitted more than once: {admitted}"
    fates = admitted + cancelled
    assert all(fates[m] == 1 for m in queued), f"a message without exactly one fate: {fates}"
    assert set(fates) <= set(queued)
    return admitted


def assert_turns_closed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every turn that started ended exactly once; returns the turn/end data in order."""
    started = [e["data"]["turnId"] for e in events if e["type"] == "turn/start"]
    ended = [e["data"] for e in events if e["type"] == "turn/end"]
    assert sorted(started) == sorted(d["turnId"] for d in ended)
    assert len(started) == len(set(started))
    return ended


# -- 2. a goal resumes by itself after a restart ------------------------------------------------


@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
async def test_a_goal_resumes_by_itself_after_a_restart_and_nothing_is_duplicated(start_daemon: Any, how: str) -> None:
    # Round 2's first model call would take a minute: the stop surely lands while it is in flight.
    d = start_daemon(shutdown_grace_seconds=0.5)
    add = ["goal", "add", "Write four rounds [rounds=4 delay=0.05 hold_round=2 hold=60]", "--model", "test:worker"]
    add += ["--verify", "test -f round4.txt", "--idempotency-key", "nightly-2025-01-06"]
    created = await d.acli_json(*add)
    gid, sid = created["goalId"], created["sessionId"]
    # The same key again (over the socket this time) is the same goal, not a second one.
    again = await rpc(
        d.socket_path,
        "goal/create",
        {"objective": "Write four rounds", "model": "test:worker", "idempotencyKey": "nightly-2025-01-06"},
    )
    assert again == created

    # Mid-goal: round 2's first model call is in flight (the model announces each call it starts).
    await asyncio.to_thread(d.calls.wait, "worker round=2 step=0", LIMIT)
    assert d.proc is not None
    if how == "sigterm":
        # The grace period (0.5 s) runs out, so the turn is ended, as interrupted, and the process exits 0.
        started = time.monotonic()
        assert await asyncio.to_thread(d.terminate, LIMIT) == 0
        # Not the minute of the held call: the grace cut it (the bound is far inside that minute,
        # not a speed check a loaded machine could fail; the turn's "interrupted" end is checked below).
        assert time.monotonic() - started < 30
    else:
        await asyncio.to_thread(d.kill)
        assert d.socket_path.exists(), "kill -9 leaves the socket file behind"
        code, _, err = await d.acli("status")
        assert code == 69 and "no goald daemon answers" in err

    d.start()
    # Nobody asks it to continue: the restarted daemon resumes the goal by itself.
    final = await wait_goal(d.socket_path, gid, TERMINAL, LIMIT)
    assert (final["status"], final["statusReason"]) == ("completed", "verified")
    # The key still names the first goal after the restart.
    assert await d.acli_json(*add) == created
    assert [g["id"] for g in await d.acli_json("goal", "list")] == [gid]

    events = await all_events(d.socket_path, sid)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    admitted = assert_each_message_has_one_fate(events)
    mine = continuation_ids(events, gid)
    assert len(mine) == 5 and all(admitted[m] == 1 for m in mine)
    # Round 2, cut short by the restart, is not counted: it runs again with the same number
    # (docs/architecture.md#infrastructure-trouble-is-not-the-goals).
    assert (final["rounds"], final["infraRounds"]) == (4, 1) and sum(admitted[m] for m in mine) == 5
    refs = [e["data"]["source"]["ref"] for e in events if e["type"] == "message/admitted"]
    assert refs == [f"{gid}#1", f"{gid}#2", f"{gid}#2/retry1", f"{gid}#3", f"{gid}#4"]
    # Exactly one turn was cut short: round 2's, by the restart.
    ends = assert_turns_closed(events)
    assert [d_["reason"] for d_ in ends] == ["end_turn", "interrupted", "end_turn", "end_turn", "end_turn"]
    cut = ends[1]["error"]
    assert cut == ("the daemon is shutting down" if how == "sigterm" else "the process ended during the turn")
    # The model call cut short has an unknown outcome: it is charged in full, once, to that turn;
    # the goal's counters add up the events, that charge included.
    charged = [e["data"] for e in events if e["type"] == "model/charged"]
    assert [c["turnId"] for c in charged] == [ends[1]["turnId"]] and charged[0]["tokens"] > 0
    # Charged (the call may have been billed), and shown apart.
    assert final["interruptedTokens"] == charged[0]["tokens"]
    assert final["tokens"] == sum(spend_of(e)[0] for e in events)
    assert final["cost"] == pytest.approx(sum(spend_of(e)[1] for e in events))


# -- 4. SIGTERM during a turn -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("grace", "delay", "first_turn"),
    [
        # The model call outlasts the grace period: the turn is ended ``interrupted`` at its end.
        (1.0, 60.0, "interrupted"),
        # The model answers well within the grace period: the turn ends at that safe point by itself,
        # and the daemon exits then, not when the grace runs out.
        (30.0, 1.5, "end_turn"),
    ],
    ids=["model-outlasts-grace", "turn-ends-within-grace"],
)
async def test_sigterm_during_a_turn_exits_0_within_grace_and_loses_nothing_acknowledged(
    start_daemon: Any, grace: float, delay: float, first_turn: str
) -> None:
    d = start_daemon(shutdown_grace_seconds=grace)
    session = await rpc(d.socket_path, "session/new", {"model": "test:chat"})
    sid = session["sessionId"]
    async with await Client.connect(d.socket_path) as client:
        await client.call("session/subscribe", {"sessionId": sid, "afterSeq": 0})
        first = await client.call("session/prompt", {"sessionId": sid, "text": f"think it over [delay={delay}]"})
        await asyncio.to_thread(d.calls.wait, "chat think it over", LIMIT)
        # The turn is in its model call. Three more messages, one per delivery, are acknowledged.
        acked = []
        for delivery in ("followup", "steer", "context"):
            params = {"sessionId": sid, "text": f"also this ({delivery})", "delivery": delivery}
            acked.append((await client.call("session/prompt", params))["messageId"])

        assert d.proc is not None
        started = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(d.proc.wait, grace + 15)
        took = time.monotonic() - started
    assert code == 0
    if first_turn == "interrupted":
        # Waited out the grace, not the model call's minute (the upper bound is far inside it).
        assert grace <= took < delay / 2, f"stopped after {took:.2f}s with a grace of {grace}s"
    else:
        assert took < grace, f"stopped after {took:.2f}s although the turn ended after {delay}s"

    d.start()
    wanted = {first["messageId"], *acked}

    def all_admitted_then_idle(events: list[dict[str, Any]]) -> bool:
        done = {e["data"]["messageId"] for e in events if e["type"] == "message/admitted"}
        last_admit = max((e["seq"] for e in events if e["type"] == "message/admitted"), default=0)
        return wanted <= done and any(
            e["type"] == "status" and e["data"]["status"] == "idle" and e["seq"] > last_admit for e in events
        )

    seen: list[dict[str, Any]] = []
    async with await Client.connect(d.socket_path) as client:
        await client.call("session/subscribe", {"sessionId": sid, "afterSeq": 0})
        async with asyncio.timeout(LIMIT):
            while not all_admitted_then_idle(seen):
                note = await client.next_notification()
                if note["method"] == "session.event":
                    seen.append({"seq": note["params"]["seq"], **note["params"]["event"]})

    events = await all_events(d.socket_path, sid)
    assert [e["seq"] for e in events] == [e["seq"] for e in seen] == list(range(1, len(events) + 1))
    admitted = assert_each_message_has_one_fate(events)
    assert all(admitted[m] == 1 for m in wanted)
    ends = assert_turns_closed(events)
    assert ends[0]["reason"] == first_turn
    assert [d_["reason"] for d_ in ends[1:]] == ["end_turn"] * (len(ends) - 1)
    # The first message was admitted before the SIGTERM; the acknowledged ones only after the restart.
    restart_turns = {d_["turnId"] for d_ in ends[1:]}
    by_turn = {e["data"]["messageId"]: e["data"]["turnId"] for e in events if e["type"] == "message/admitted"}
    assert by_turn[first["messageId"]] == ends[0]["turnId"]
    assert all(by_turn[m] in restart_turns for m in acked)
    # A model call cut short by the end of the grace period is charged in full; one that ended is not.
    charged = [e["data"]["turnId"] for e in events if e["type"] == "model/charged"]
    assert charged == ([ends[0]["turnId"]] if first_turn == "interrupted" else [])
    assert (await rpc(d.socket_path, "agent/status", {"sessionId": sid}))["status"] == "idle"
