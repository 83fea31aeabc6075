"""The table of "why": every view shows the reason of the goal's current status, never an old one.

A goal lives through a preceding event (a model error, an authentication error, an interruption,
a budget refusal, a refused verification, a stall, a blocked report, a disk limit, a window too
small, a resume, a completion), is moved on by a person where that event left it stopped (resumed,
reopened), and then reaches its final status through an event of its own. Each preceding event
carries a marker of its own words; for every pair, the reason shown by

* ``goald goal show`` (:func:`daemon.display.describe_lines`: its status, why and activity lines),
* ``goald goal list`` (:func:`daemon.display.goal_table`: the goal's row),
* ``goal/describe`` (:func:`daemon.rpc.activity.describe_answer`: ``why``, the goal's reason and ``why``,
  the activity),
* the status page's goal view (:func:`daemon.web.goal_view.describe_rows`: status, why, activity),
* a notification (:func:`goals.notices.goal_payload`: reason, why, summary),

is :func:`goals.why.why` of the final goal, says what the final event says, and holds no word of the
preceding event's (unless that event is what the final status came from). The goal's states come
from the real policy (:func:`goals.decide`) and a person's real resume (:func:`goals.operations.resumed`);
the views are the real render functions. The issue's three stale examples close the module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any

import pytest

from agent import AgentStatus
from agent.tx import SessionState
from daemon.cli.goal_show import describe_lines
from daemon.display import goal_table, reason_text
from daemon.rpc.activity import activity_of, describe_answer
from daemon.rpc.views import GoalView, goal_view
from daemon.web.goal_view import describe_rows
from goals import (
    Budgets,
    Claim,
    ContinuationFate,
    Goal,
    GoalId,
    GoalMemory,
    GoalStatus,
    Interval,
    PolicyInput,
    StopReason,
    StopRules,
    VerifyCommand,
    VerifyResult,
    budget_spent,
    decide,
)
from goals.budgets import with_status
from goals.notices import NOTIFIED, goal_payload
from goals.operations import resumed
from goals.why import why

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
RULES = StopRules(stall_rounds=2, blocked_rounds=2, max_model_errors=3, error_backoff_seconds=30)
CHECKS = [VerifyCommand(cmd="pytest -q", timeout=30)]
CLAIM = Claim(summary="report written", evidence="report.md exists")
PASS = [VerifyResult(cmd="pytest -q", exit_code=0, output_tail="3 passed")]


def fail(marker: str) -> list[VerifyResult]:
    return [VerifyResult(cmd="pytest -q", exit_code=1, output_tail=f"1 failed: {marker}")]


def start() -> Goal:
    """An active goal after round 2, with budgets left and verification commands."""
    return Goal(
        id=GoalId.parse("goal_" + "0" * 25 + "9"),
        title="Write the report",
        objective="Write the report",
        status=GoalStatus.ACTIVE,
        session_id="ses_" + "0" * 25 + "9",
        guard_id="grd_" + "0" * 25 + "9",
        model="oa:gpt-test",
        budgets=Budgets(max_rounds=10, max_tokens_total=10_000),
        verify=CHECKS,
        rules=RULES,
        rounds=2,
        tokens=2_000,
        active_since=T0,
        continuation_id="msg_" + "0" * 25 + "9",
        continuation_round=3,
        evaluated_seq=40,
        memory=GoalMemory(fingerprint="fp-0"),
        created_at=T0,
        updated_at=T0,
    )


@dataclass
class Life:
    """A goal moving through events, with the clock."""

    goal: Goal
    now: datetime = T0
    seq: int = 40
    fp: int = 0

    def tick(self) -> datetime:
        self.now += timedelta(minutes=1)
        return self.now

    def decide(self, *, progress: bool = True, **kw: Any) -> Goal:
        """One interval of the engine: a round (by default one that answered and made progress)."""
        inputs = {k: kw.pop(k) for k in ("verification", "fault", "disk_bytes", "disk_limit") if k in kw}
        self.seq += 10
        if progress:
            self.fp += 1
        base: dict[str, Any] = {
            "end_seq": self.seq,
            "continuation_fate": ContinuationFate.ADMITTED,
            "tokens": 100,
            "turns": 1,
            "answers": 1,
            "last_end_reason": "end_turn",
        }
        interval = Interval(**(base | kw))
        decision = decide(PolicyInput(self.goal, interval, self.tick(), fingerprint=f"fp-{self.fp}", **inputs))
        goal = decision.goal
        if decision.round is not None:
            goal = goal.model_copy(update={"continuation_round": decision.round})
        self.goal = goal.model_copy(update={"updated_at": self.now})
        return self.goal

    def set(self, **kw: Any) -> None:
        self.goal = self.goal.model_copy(update=kw)

    def person(self, status: GoalStatus, reason: str = StopReason.BY_REQUEST) -> Goal:
        self.goal = with_status(self.goal, status, reason, self.tick()).model_copy(update={"updated_at": self.now})
        return self.goal

    def resume(self) -> Goal:
        """A person's resume (an exhausted goal's budgets raised first; an ended one reopened)."""
        g = self.goal
        if g.status is GoalStatus.EXHAUSTED and budget_spent(g, self.now) is not None:
            b = g.budgets
            raised = Budgets(max_rounds=(b.max_rounds or 0) + 10, max_tokens_total=(b.max_tokens_total or 0) + 10_000)
            self.set(budgets=raised)
        reopen = not self.goal.status.live and self.goal.status is not GoalStatus.EXHAUSTED
        self.goal = resumed(self.goal, self.tick(), reopen=reopen).model_copy(update={"updated_at": self.now})
        return self.goal


@dataclass(frozen=True)
class Event:
    """A preceding event: what it does, and its own words (which must be gone once the goal moves on)."""

    name: str
    apply: Callable[[Life], object]
    marker: str


def _stall(life: Life, marker: str) -> None:
    memory = life.goal.memory.model_copy(update={"fingerprint": f"fp-{life.fp}"})
    life.set(stall_streak=RULES.stall_rounds, memory=memory)
    life.decide(progress=False)


def _blocked(life: Life, marker: str) -> None:
    life.set(blocked_streak=RULES.blocked_rounds - 1)
    life.decide(blocked=[f"{marker} need the deploy key"])


def _verification_refused(life: Life, marker: str) -> None:
    life.decide(claims=[CLAIM], verification=fail(marker))


def _resume(life: Life, marker: str) -> None:
    life.person(GoalStatus.PAUSED, f"continuation cancelled: {marker} discarded")
    life.resume()


PRECEDING = [
    Event("model error", lambda life: life.decide(last_end_reason="error", last_error_kind="malformed",
                                                  last_error="malformed: MARK1 broken answer"), "MARK1"),
    Event("auth error", lambda life: life.decide(last_end_reason="error", last_error_kind="auth",
                                                 last_error="auth: HTTP 401 MARK2 invalid key", answers=0), "MARK2"),
    Event("interruption", lambda life: life.decide(last_end_reason="interrupted",
                                                   last_error="the process ended during the turn"), "process ended"),
    Event("budget refusal", lambda life: life.decide(last_end_reason="budget",
                                                     last_error="token budget: this call may take 5269 tokens, "
                                                                "3000 left"), "5269"),
    Event("verification refused", lambda life: _verification_refused(life, "MARK5"), "MARK5"),
    Event("stalled", lambda life: _stall(life, "MARK6"), "no progress"),
    Event("blocked", lambda life: _blocked(life, "MARK7"), "MARK7"),
    Event("disk_limit", lambda life: life.decide(disk_bytes=3 * 2**29, disk_limit=2**30), "GiB"),
    Event("context_too_small", lambda life: life.decide(
        last_end_reason="error", last_error_kind="context_too_small", answers=0,
        last_error="context_too_small: MARK9 the request needs 2,253 tokens, the window holds 2,048"), "MARK9"),
    Event("resume", lambda life: _resume(life, "MARK10"), "MARK10"),
    Event("completion", lambda life: life.decide(claims=[CLAIM], verification=PASS), "verified"),
]  # fmt: skip


@dataclass(frozen=True)
class Final:
    """The event the final status comes from, the status it gives, and what its why says."""

    name: str
    apply: Callable[[Life], object]
    status: GoalStatus
    #: Words the why must hold (``()`` with ``none=True``: no why at all).
    says: tuple[str, ...] = ()
    none: bool = False
    #: The preceding event of the same kind (its generic words, e.g. "no progress", may recur).
    same: str | None = None


def _model_errors(life: Life) -> None:
    life.set(error_streak=RULES.max_model_errors - 1)
    life.decide(last_end_reason="error", last_error_kind="malformed", last_error="malformed: NOW3 bad json")


def _round_limit(life: Life) -> None:
    life.set(budgets=life.goal.budgets.model_copy(update={"max_rounds": life.goal.rounds + 1}))
    life.decide()


FINALS = [
    Final("a round ran", lambda life: life.decide(), GoalStatus.ACTIVE, none=True),
    Final("the provider is unreachable", lambda life: life.decide(
        last_end_reason="error", last_error_kind="connection", last_error="connection: NOW1 refused", answers=0),
        GoalStatus.ACTIVE, says=("waiting for the provider", "NOW1 refused", "not counted as rounds")),
    Final("a model error", lambda life: life.decide(
        last_end_reason="error", last_error_kind="malformed", last_error="malformed: NOW2 bad json"),
        GoalStatus.ACTIVE, says=("backing off after a model error", "NOW2 bad json")),
    Final("paused by a person", lambda life: life.person(GoalStatus.PAUSED), GoalStatus.PAUSED, none=True),
    Final("an authentication error", lambda life: life.decide(
        last_end_reason="error", last_error_kind="auth", last_error="auth: HTTP 401 NOW4", answers=0),
        GoalStatus.PAUSED, says=("HTTP 401 NOW4", "fix the provider's key")),
    Final("model errors in a row", _model_errors, GoalStatus.PAUSED, says=("model errors in a row", "NOW3 bad json")),
    Final("a stall", lambda life: _stall(life, "NOW5"), GoalStatus.PAUSED, says=("no progress observed",),
          same="stalled"),
    Final("blocked", lambda life: _blocked(life, "NOW6"), GoalStatus.PAUSED, says=("NOW6 need the deploy key",)),
    Final("over the disk limit", lambda life: life.decide(disk_bytes=5 * 2**30, disk_limit=2**32),
          GoalStatus.PAUSED, says=("holds 5 GiB, over its 4 GiB limit", "free space"), same="disk_limit"),
    Final("a window too small", lambda life: life.decide(
        last_end_reason="error", last_error_kind="context_too_small", answers=0,
        last_error="context_too_small: NOW7 needs 9,999 tokens"), GoalStatus.PAUSED,
        says=("NOW7 needs 9,999 tokens", "larger window")),
    Final("completed, verified", lambda life: life.decide(claims=[CLAIM], verification=PASS),
          GoalStatus.COMPLETED, none=True, same="completion"),
    Final("the round limit", _round_limit, GoalStatus.EXHAUSTED, says=("rounds used", "--max-rounds")),
    Final("a budget refusal", lambda life: life.decide(
        last_end_reason="budget", last_error="token budget: this call may take 777 tokens, 12 left"),
        GoalStatus.EXHAUSTED, says=("this call may take 777 tokens, 12 left", "--max-tokens")),
    Final("a fault", lambda life: life.decide(fault="unknown model: NOW8 gone:model"), GoalStatus.FAILED,
          says=("unknown model: NOW8 gone:model",)),
    Final("cancelled by a person", lambda life: life.person(GoalStatus.CANCELLED), GoalStatus.CANCELLED, none=True),
]  # fmt: skip


def views(goal: Goal, now: datetime) -> dict[str, str]:
    """The reason-bearing parts of every view of ``goal``, as text, by view."""
    st = SessionState(last_seq=100, status=AgentStatus.IDLE, status_seq=100, open_turn=None)
    activity = activity_of(goal, st, None, slots=None, held=None, now=now)
    d = describe_answer(goal, activity, None, None, [], now)
    lines = describe_lines(d)
    shown = {
        "goal show": "\n".join(x for x in lines if x.startswith(("status:", "why:", "activity:"))),
        "goal list": goal_table([GoalView.model_validate({**goal_view(goal, now), "activity": activity})])[1],
        "goal/describe": json.dumps(
            [d["why"], d["goal"]["why"], d["goal"]["statusReason"], d["activity"]["text"]]  # type: ignore[index]
        ),
        "status page": "\n".join(v for k, v in describe_rows(d) if k in ("status", "why", "activity")),
    }
    if goal.status in NOTIFIED:
        payload = goal_payload(goal)
        shown["notification"] = json.dumps([payload["reason"], payload["why"], payload["summary"]])
    return shown


def check(goal: Goal, now: datetime, final: Final, old: Event | None) -> None:
    assert goal.status is final.status, (final.name, goal.status, goal.status_reason)
    said = why(goal, now)
    if final.none:
        assert said is None, said
    else:
        assert said is not None
        for words in final.says:
            assert words in said, (words, said)
    shown = views(goal, now)
    # One source: goal show's why line, describe's, the goal view's, the page's, the notification's.
    lines = describe_lines(describe_answer(goal, activity_of(goal, None, None, slots=None, held=None, now=now),
                                           None, None, [], now))  # fmt: skip
    why_lines = [x.removeprefix("why:").strip() for x in lines if x.startswith("why:")]
    assert why_lines == ([said] if said else [])
    assert json.loads(shown["goal/describe"])[:2] == [said, said]
    assert escape(said or "-", quote=True) in shown["status page"]
    row = shown["goal list"]
    assert goal.status.value in row and (reason_text(goal.status_reason) or "-") in row
    if "notification" in shown:
        assert json.loads(shown["notification"])[1] == said
    if old is not None and old.name != final.same:
        for view, text in shown.items():
            assert old.marker not in text, (old.name, final.name, view, text)


@pytest.mark.parametrize("final", FINALS, ids=[f.name for f in FINALS])
@pytest.mark.parametrize("old", PRECEDING, ids=[e.name for e in PRECEDING])
def test_every_view_shows_the_current_reason(old: Event, final: Final) -> None:
    life = Life(start())
    old.apply(life)
    if life.goal.status is not GoalStatus.ACTIVE:
        life.resume()  # the goal moves on: the old reason must go with it
    final.apply(life)
    check(life.goal, life.now, final, old)


@pytest.mark.parametrize("final", FINALS, ids=[f.name for f in FINALS])
def test_each_final_event_alone(final: Final) -> None:
    life = Life(start())
    final.apply(life)
    check(life.goal, life.now, final, None)


@pytest.mark.parametrize("old", PRECEDING, ids=[e.name for e in PRECEDING])
def test_the_preceding_event_is_shown_while_it_is_current(old: Event) -> None:
    # Where the event stopped the goal (or made it wait), the views say so in its own words: the
    # table above is not passing because nothing is ever shown.
    life = Life(start())
    old.apply(life)
    said = why(life.goal, life.now)
    if life.goal.status is GoalStatus.ACTIVE and life.goal.not_before is None:
        assert said is None
    elif old.name == "completion":
        assert life.goal.status is GoalStatus.COMPLETED and said is None
    else:
        assert said is not None and old.marker in said + " " + (life.goal.status_reason or ""), (old.name, said)


# -- the three stale examples -------------------------------------------------------------


def test_completed_verified_after_an_interrupted_turn_shows_no_interruption() -> None:
    life = Life(start())
    life.decide(last_end_reason="interrupted", last_error="the process ended during the turn")
    life.decide(claims=[CLAIM], verification=PASS)
    g = life.goal
    assert (g.status, g.status_reason) == (GoalStatus.COMPLETED, StopReason.VERIFIED)
    for view, text in views(g, life.now).items():
        assert "process ended" not in text, view
    out = describe_lines(describe_answer(g, activity_of(g, None, None, slots=None, held=None, now=life.now),
                                         None, None, [], life.now))  # fmt: skip
    assert "status:     completed (verified)" in out and not any(x.startswith("why:") for x in out)


def test_an_active_goal_with_tokens_left_shows_no_old_budget_refusal() -> None:
    life = Life(start())
    life.set(budgets=Budgets(max_tokens_total=5_000))
    refusal = "token budget: this call may take 3269 tokens, 3000 left"
    life.decide(last_end_reason="budget", last_error=refusal)
    assert life.goal.status is GoalStatus.EXHAUSTED and refusal in (why(life.goal, life.now) or "")
    life.set(budgets=Budgets(max_tokens_total=life.goal.tokens + 7_299))
    life.resume()
    life.decide()
    g = life.goal
    assert g.status is GoalStatus.ACTIVE and g.budgets.max_tokens_total is not None
    assert g.budgets.max_tokens_total - g.tokens == 7_299 - 100
    assert why(g, life.now) is None
    for view, text in views(g, life.now).items():
        assert "3269" not in text and "3000 left" not in text, view


def test_a_goal_exhausted_by_its_round_limit_shows_no_old_401() -> None:
    life = Life(start())
    life.decide(last_end_reason="error", last_error_kind="auth", last_error="auth: HTTP 401", answers=0)
    assert (life.goal.status, life.goal.status_reason) == (GoalStatus.PAUSED, StopReason.AUTH_ERROR)
    assert "auth: HTTP 401" in (why(life.goal, life.now) or "")
    life.resume()
    life.set(budgets=Budgets(max_rounds=life.goal.rounds + 2))
    life.decide()
    life.decide()
    g = life.goal
    assert (g.status, g.status_reason) == (GoalStatus.EXHAUSTED, StopReason.ROUND_LIMIT)
    assert why(g, life.now) == f"{g.rounds} of {g.rounds} rounds used; raise --max-rounds to resume it"
    for view, text in views(g, life.now).items():
        assert "401" not in text, view
    # Not even as the goal's last error: the resume cleared it, and the rounds since answered.
    assert goal_view(g, life.now)["lastError"] is None
