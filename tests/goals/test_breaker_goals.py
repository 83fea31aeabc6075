"""The circuit breaker and goals: an outage makes goals wait; it never counts toward pausing them.

While a provider's breaker is open, calls wait for it (``GuardedModel``); errors that still end
turns during an outage (calls made while it was opening, failed probes) are recorded on their
``model/error`` event as ``breakerOpen``, and the goal engine does not count such an interval toward
``max_model_errors``: it waits a short backoff and goes on. One overnight outage must not leave
every goal paused.

The end-to-end test runs several goals through a real :class:`Runtime` and :class:`GoalEngine`
on a real SQLite file, with the real :class:`OpenAIModel` (and the official SDK inside it) behind
a :class:`GuardedModel`, against the local OpenAI-compatible SSE server of ``providers_server``:
the server fails for a while, then recovers. The last test does the same through a real daemon
(``goald serve``) and reads the breaker as ``daemon/health`` reports it over the control socket:
every configured provider from the start (closed, with its limits), ``open`` during the outage,
``closed`` after the probe.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, rpc, wait_goal
from providers_server import (
    ProviderServer,
    Recorded,
    Respond,
    is_probe,
    oa_call,
    oa_chunk,
    oa_usage,
    openai_stream,
    openai_text,
)

from agent import (
    AgentConfig,
    EventType,
    ModelError,
    ModelErrorKind,
    RetryPolicy,
    Runtime,
    SessionRow,
    SessionSetup,
    ToolRegistry,
)
from agent.models.health import GuardedModel, ProviderHealth
from agent.models.openai import OpenAIModel
from daemon.cli.status import provider_line
from daemon.client import Connection as Client
from goals import (
    Decision,
    DecisionKind,
    Goal,
    GoalEngine,
    GoalId,
    GoalSpec,
    GoalStatus,
    Interval,
    PolicyInput,
    StopReason,
    StopRules,
    decide,
    tools_for_goal_sessions,
)
from goals.model import Budgets, VerifyCommand

NOW = datetime(2025, 6, 1, 3, 0, tzinfo=UTC)
RULES = StopRules(max_model_errors=2, error_backoff_seconds=30, error_backoff_max_seconds=3600)


def goal(**kw: Any) -> Goal:
    base: dict[str, Any] = {
        "id": GoalId("goal_01J00000000000000000000000"),
        "title": "t",
        "objective": "o",
        "status": GoalStatus.ACTIVE,
        "session_id": "ses_01J00000000000000000000000",
        "guard_id": "grd_01J00000000000000000000000",
        "budgets": Budgets(),
        "verify": [],
        "rules": RULES,
        "continuation_id": "msg_01J00000000000000000000000",
        "continuation_round": 1,
        "rounds": 0,
        "active_since": NOW,
        "created_at": NOW,
        "updated_at": NOW,
    }
    return Goal.model_validate({**base, **kw})


def error_interval(*, breaker_open: bool, kind: str = "server", answers: int = 0) -> Interval:
    return Interval(
        end_seq=10,
        continuation_fate="admitted",
        turns=1,
        answers=answers,
        last_end_reason="error",
        last_error_kind=kind,
        last_error=f"{kind}: upstream down",
        breaker_open=breaker_open,
    )


# -- the rule, pure ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("streak", "breaker_open", "kind", "answers", "expected", "streak_after", "wait_seconds"),
    [
        # An outage: the goal waits the base backoff, its error streak untouched.
        (0, True, "server", 0, DecisionKind.WAIT, 0, 30),
        (1, True, "server", 0, DecisionKind.WAIT, 1, 30),
        (1, True, "timeout", 0, DecisionKind.WAIT, 1, 30),
        (1, True, "server", 1, DecisionKind.WAIT, 1, 30),
        # A provider's failure before any model answer is not the goal's either (the round runs again).
        (0, False, "server", 0, DecisionKind.WAIT, 0, 30),
        (1, False, "connection", 0, DecisionKind.WAIT, 1, 30),
        # The same error after the model answered, without an open breaker, is the goal's own:
        # counted, and the M-th pauses.
        (0, False, "server", 1, DecisionKind.WAIT, 1, 30),
        (1, False, "server", 1, DecisionKind.PAUSE, 2, None),
        # An authentication error pauses at once, outage or not.
        (0, True, "auth", 0, DecisionKind.PAUSE, 0, None),
    ],
)
def test_an_outage_interval_is_not_counted(
    streak: int,
    breaker_open: bool,
    kind: str,
    answers: int,
    expected: DecisionKind,
    streak_after: int,
    wait_seconds: int | None,
) -> None:
    interval = error_interval(breaker_open=breaker_open, kind=kind, answers=answers)
    decision = decide(PolicyInput(goal(error_streak=streak), interval, NOW))
    assert decision.kind is expected
    assert decision.goal.error_streak == streak_after
    # Before any model answer (and not an authentication error) the round is not counted.
    infra = answers == 0 and kind != "auth"
    assert (decision.goal.rounds, decision.goal.infra_streak) == ((0, 1) if infra else (1, 0))
    assert decision.goal.memory.last_error == f"{kind}: upstream down"
    if wait_seconds is not None:
        assert decision.goal.not_before == NOW + timedelta(seconds=wait_seconds)
    if expected is DecisionKind.PAUSE:
        reason = decision.goal.status_reason or ""
        assert reason.startswith(StopReason.AUTH_ERROR if kind == "auth" else StopReason.MODEL_ERROR)


def test_a_hundred_outage_intervals_pause_nothing() -> None:
    g = goal(error_streak=1)
    for n in range(100):
        now = NOW + timedelta(minutes=n)
        decision = decide(PolicyInput(g, error_interval(breaker_open=True).model_copy(update={"end_seq": n}), now))
        assert decision.kind is DecisionKind.WAIT
        g = decision.goal
    assert (g.status, g.error_streak) == (GoalStatus.ACTIVE, 1)
    # After the outage, a good round clears the streak and the goal goes on.
    ok = Interval(end_seq=200, continuation_fate="admitted", turns=1, last_end_reason="end_turn")
    decision = decide(PolicyInput(g, ok, NOW + timedelta(hours=3)))
    assert (decision.kind, decision.goal.error_streak) == (DecisionKind.CONTINUE, 0)


def test_the_health_line() -> None:
    # ok, failing (N in a row, last: ...), or open: never "ok" while calls fail.
    health = ProviderHealth("openai", failure_threshold=2, cooldown=60)
    assert provider_line("openai", health.snapshot()) == "openai ok"
    health.record_failure(ModelError(ModelErrorKind.SERVER, "boom"))
    assert provider_line("openai", health.snapshot()) == "openai failing (1 in a row, last: server: boom)"
    health.record_failure(ModelError(ModelErrorKind.SERVER, "boom again"))
    assert provider_line("openai", health.snapshot()) == (
        "openai open; probe in 60s; 0 call(s) waiting; last error: server: boom again"
    )
    health.record_success()
    assert provider_line("openai", health.snapshot()) == "openai ok"


# -- an outage through a real runtime, engine and provider ------------------------------------------


class OutageServer(ProviderServer):
    """The local provider server, answering by state instead of a fixed script.

    While ``down`` every request gets a 500. Once up, a goal's agent is told to claim completion
    (``goal_complete``), and after the tool result it ends its turn with a line of text.
    """

    def __init__(self) -> None:
        super().__init__()
        self.down = True
        self.failed = 0
        self.answered = 0

    async def _read_request(self, reader: asyncio.StreamReader) -> Recorded | None:
        request = await super()._read_request(reader)
        if request is not None and not is_probe(request):  # a window probe is answered apart
            # Scripted here, taken by this same request right after (no await in between).
            self.add(self._respond(request))
        return request

    def _respond(self, request: Recorded) -> Respond:
        if self.down:
            self.failed += 1
            return Respond.json(500, {"error": {"message": "down for maintenance", "type": "server_error"}})
        self.answered += 1
        if request.body["messages"][-1]["role"] == "tool":
            return Respond.stream(openai_text(["Claimed."], usage=oa_usage(30, 2)))
        claim = json.dumps({"summary": "done after the outage", "evidence": "the provider answered"})
        return Respond.stream(
            openai_stream(
                [
                    oa_chunk(role="assistant", content=""),
                    oa_chunk(tool_calls=[oa_call(0, id=f"call_{self.answered}", name="goal_complete", args=claim)]),
                    oa_chunk(finish="tool_calls"),
                    oa_chunk(no_choices=True, usage=oa_usage(30, 5)),
                ]
            )
        )


GOALS = 3
OUTAGE_ERRORS = 2  # error-ended intervals each goal lives through: enough to pause it, were they counted


async def test_an_outage_makes_goals_wait_and_every_goal_continues_when_it_ends(db_path: Path, tmp_path: Path) -> None:
    async with OutageServer() as server:
        inner = OpenAIModel("gpt-test", base_url=server.url + "/v1", api_key="sk-test-1234", timeout=10)
        health = ProviderHealth("openai", failure_threshold=2, cooldown=0.02, max_cooldown=0.05)
        model = GuardedModel(inner, health)
        # Two attempts per model step, a few milliseconds apart: turns end in errors quickly.
        agent_config = AgentConfig(retry=RetryPolicy(max_attempts=2, base_delay=0.005, jitter=0))

        def resolve(row: SessionRow) -> SessionSetup:
            return SessionSetup(
                model=model, tools=ToolRegistry(tools_for_goal_sessions(row.config)), config=agent_config
            )

        outage_waits: Counter[str] = Counter()
        counted: list[tuple[str, DecisionKind, int, GoalStatus]] = []
        finished: set[str] = set()
        waiters_seen: list[int] = []
        recovered = asyncio.Event()
        all_done = asyncio.Event()

        def observe(inp: PolicyInput, decision: Decision) -> None:
            # (The engine logs and swallows a listener's exceptions: record, assert afterwards.)
            g = decision.goal
            if g.error_streak or g.status not in (GoalStatus.ACTIVE, GoalStatus.COMPLETED):
                counted.append((g.id, decision.kind, g.error_streak, g.status))
            if inp.interval.last_end_reason == "error":
                outage_waits[g.id] += 1
                if not inp.interval.breaker_open or decision.kind is not DecisionKind.WAIT:
                    counted.append((g.id, decision.kind, g.error_streak, g.status))
            if g.status is GoalStatus.COMPLETED:
                finished.add(g.id)
                if len(finished) == GOALS:
                    all_done.set()
            # The server comes back once every goal has lived through its error-ended intervals,
            # at a moment when a session is waiting for the breaker.
            if (
                server.down
                and len(outage_waits) == GOALS
                and min(outage_waits.values()) >= OUTAGE_ERRORS
                and health.breaker.waiting
            ):
                waiters_seen.append(health.breaker.waiting)
                server.down = False
                recovered.set()

        try:
            async with Runtime.open(db_path, resolver=resolve) as rt:
                async with GoalEngine.running(rt, timer_interval=0.02) as engine:
                    engine.add_decision_listener(observe)
                    rules = StopRules(max_model_errors=OUTAGE_ERRORS, error_backoff_seconds=0.02, stall_rounds=50)
                    goals = []
                    for n in range(GOALS):
                        workdir = tmp_path / f"goal{n}"
                        workdir.mkdir()
                        goals.append(
                            await engine.create(
                                GoalSpec(
                                    objective=f"task {n}",
                                    workdir=str(workdir),
                                    rules=rules,
                                    verify=[VerifyCommand(cmd="true")],
                                )
                            )
                        )
                    async with asyncio.timeout(60):
                        await recovered.wait()
                        assert health.state in ("open", "half_open")
                        await all_done.wait()
                    final = [await engine.get(g.id) for g in goals]
                    events = {g.id: await rt.store.events_after(g.session_id, 0) for g in goals}
        finally:
            await model.aclose()
        server.assert_done()

    # Nothing was ever counted or paused: every decision kept the streak at 0, the goal active.
    assert counted == []
    assert waiters_seen and waiters_seen[0] >= 1
    for g in final:
        assert (g.status, g.status_reason, g.error_streak) == (GoalStatus.COMPLETED, "verified", 0)
        assert g.result_summary == "done after the outage"
        assert outage_waits[g.id] >= OUTAGE_ERRORS
        evs = events[g.id]
        ended_in_error = [e for e in evs if e.type == EventType.TURN_END and e.data["reason"] == "error"]
        assert len(ended_in_error) >= OUTAGE_ERRORS
        errors = [e.data for e in evs if e.type == EventType.MODEL_ERROR]
        # The error that ended each such turn came while the breaker was open.
        last_of_turn = {d["turnId"]: d for d in errors}
        assert all(last_of_turn[e.data["turnId"]]["breakerOpen"] for e in ended_in_error)
        assert [e.data["reason"] for e in evs if e.type == EventType.TURN_END][-1] == "end_turn"
    # The breaker tripped, kept later calls waiting, and closed on the probe after the outage.
    snapshot = health.snapshot()
    assert snapshot["state"] == "closed" and snapshot["breaker"]["trips"] >= 1
    assert provider_line("openai", snapshot) == "openai ok"
    all_errors = [e for evs in events.values() for e in evs if e.type == EventType.MODEL_ERROR]
    assert len(all_errors) == server.failed == health.failures
    assert server.answered == 2 * GOALS


# -- the breaker as ``daemon/health`` shows it, over the socket of a real daemon ---------------------


async def test_daemon_health_shows_every_provider_from_start_and_the_breaker_open_then_closed(
    tmp_path: Path,
) -> None:
    cooldown = 3.0  # long enough that the breaker is still open when the test asks, right after it opened
    flaky = {
        "kind": "openai",
        "api_key_env": "BREAKER_TEST_API_KEY",
        "requests_per_minute": 600,
        "max_concurrent_calls": 4,
        "failure_threshold": 2,
        "breaker_cooldown_seconds": cooldown,
        "breaker_max_cooldown_seconds": cooldown,
    }
    spare = {"kind": "anthropic", "api_key_env": "BREAKER_TEST_API_KEY", "tokens_per_minute": 50_000}
    async with OutageServer() as server:
        providers = {"flaky": {**flaky, "base_url": server.url + "/v1"}, "spare": spare, **TEST_MODELS["providers"]}
        d = Daemon(tmp_path / "state", config={"providers": providers})
        try:
            d.start(extra_env={"BREAKER_TEST_API_KEY": "sk-breaker-test-1234"})
            # Before any session used a model: every configured HTTP provider, breaker closed, its limits.
            at_start = (await rpc(d.socket_path, "daemon/health"))["providers"]
            assert sorted(at_start) == ["flaky", "spare"]  # a scripted provider has no breaker
            for name, conf in (("flaky", flaky), ("spare", spare)):
                snap = at_start[name]
                assert (snap["provider"], snap["state"], snap["calls"], snap["failures"]) == (name, "closed", 0, 0)
                assert snap["breaker"]["failureThreshold"] == conf.get("failure_threshold", 5)
                assert snap["limiter"]["requestsPerMinute"] == conf.get("requests_per_minute")
                assert snap["limiter"]["tokensPerMinute"] == conf.get("tokens_per_minute")
                assert snap["limiter"]["maxConcurrent"] == conf.get("max_concurrent_calls")

            created = await rpc(d.socket_path, "goal/create", {"objective": "finish", "model": "flaky:gpt-test"})
            async with await Client.connect(d.socket_path) as client:
                await client.call("session/subscribe", {"sessionId": created["sessionId"], "afterSeq": 0})
                async with asyncio.timeout(60):
                    while True:
                        note = await client.next_notification()
                        event = note["params"]["event"] if note["method"] == "session.event" else {}
                        if event.get("type") == EventType.MODEL_ERROR and event["data"]["breakerOpen"]:
                            break
                # The outage as the daemon reports it: the breaker open, the session's retry waiting on it.
                during = (await rpc(d.socket_path, "daemon/health"))["providers"]
                server.down = False
            goal = await wait_goal(d.socket_path, created["goalId"], {"completed", "paused", "failed"})
            after = (await rpc(d.socket_path, "daemon/health"))["providers"]
            assert d.terminate() == 0
            log = d.stderr_path.read_text(errors="replace")  # the whole log, not its tail
        finally:
            d.close()
        server.assert_done()

    opened = during["flaky"]
    assert opened["state"] == "open", opened
    assert opened["breaker"]["trips"] == 1 and opened["breaker"]["consecutiveFailures"] == 2
    assert 0 < opened["breaker"]["retryIn"] <= cooldown
    assert opened["failures"] == 2 and "server" in opened["lastError"]
    assert provider_line("flaky", opened).startswith("flaky open; probe in ")
    # The outage ended: one probe closed the breaker and the goal went on to complete, never paused.
    assert (goal["status"], goal["errorStreak"]) == ("completed", 0)
    closed = after["flaky"]
    assert closed["state"] == "closed" and closed["breaker"]["consecutiveFailures"] == 0
    assert closed["breaker"]["trips"] == 1
    assert closed["failures"] == server.failed == 2
    assert closed["calls"] == server.failed + server.answered
    assert provider_line("flaky", closed) == "flaky ok"
    # The journal has the opening at warning (with the cause) and the closing at info.
    opening = [line for line in log.splitlines() if "circuit breaker opened" in line]
    assert len(opening) == 1 and "WARNING" in opening[0] and "provider flaky" in opening[0], opening
    assert any("INFO" in line and "provider flaky: circuit breaker closed" in line for line in log.splitlines())
    # The provider no goal used is there all along, untouched.
    assert after["spare"]["state"] == "closed" and after["spare"]["calls"] == 0
