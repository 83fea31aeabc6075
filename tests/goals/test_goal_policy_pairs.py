"""The policy's rule order, pinned pairwise: every fact an interval can hold, with each of the others.

:func:`goals.decide` folds every fact of an interval into the goal before it picks an outcome by
precedence, so that no rule can skip another's fact by deciding first. This table is generated:
for each pair of facts (those that can coincide in one interval), one interval holds both, and
the test checks

* the outcome, against an oracle written here from the documented precedence, and
* each fact's *mark* on the new goal, which must be there whatever won: a refused claim counted
  and its output kept (and in the next continuation, if one is issued), a blocked call counted, a
  model error counted, a round without progress counted, a superseded continuation re-issued
  with its own round number when the goal goes on.

The documented exceptions: a round that ended on a model error is judged by the error rule, so it
leaves the stall streak alone; an interval that ended on the infrastructure's trouble (``infra``: an
interrupted turn) is not a round at all, so it counts no round and no stall, only its infra streak
-- unless its claim completes the goal: the round is not run again, and counts as the round it was.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_goal_policy import CHECKS, CLAIM, FAILING, FAULT, NOW, PASSING, RULES, make_goal, make_interval

from goals import Budgets, ContinuationFate, Decision, DecisionKind, GoalStatus, PolicyInput, StopReason, decide

K = DecisionKind
SUPERSEDED = {"continuation_fate": ContinuationFate.CANCELLED, "cancel_reason": "superseded"}
N, B = RULES.stall_rounds, RULES.blocked_rounds
OVER_DISK = "disk_limit: the work directory holds 1.5 GiB, over its 1 GiB limit"


@dataclass(frozen=True)
class Fact:
    """One fact: how it is put into the inputs, and the mark it must leave on the new goal."""

    name: str
    goal: dict[str, Any] = field(default_factory=dict)
    interval: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    #: Facts it cannot share one interval with (one field holds either).
    excludes: frozenset[str] = frozenset()


FACTS = [
    Fact("claim_passes", goal={"verify": CHECKS}, interval={"claims": [CLAIM]}, inputs={"verification": PASSING},
         excludes=frozenset({"claim_fails"})),
    Fact("claim_fails", goal={"verify": CHECKS}, interval={"claims": [CLAIM]}, inputs={"verification": FAILING}),
    Fact("blocked", goal={"blocked_streak": B - 1}, interval={"blocked": ["need the key"]}),
    Fact("model_error", interval={"last_end_reason": "error", "last_error_kind": "server", "last_error": "boom"},
         excludes=frozenset({"auth_error", "guard_refused", "infra"})),
    Fact("auth_error", interval={"last_end_reason": "error", "last_error_kind": "auth", "last_error": "401"},
         excludes=frozenset({"guard_refused"})),
    Fact("guard_refused", interval={"last_end_reason": "budget", "last_error": "tokens: 10 left"},
         excludes=frozenset({"infra"})),
    # The turn was interrupted (the daemon died mid-call: its reservation charged in full).
    Fact("infra", interval={"last_end_reason": "interrupted", "last_error": "the process ended during the turn",
                            "interrupted_tokens": 50},
         excludes=frozenset({"model_error", "auth_error"})),
    # The goal has 500 tokens; the interval adds 120.
    Fact("budget_spent", goal={"budgets": Budgets(max_tokens_total=600)}),
    Fact("superseded", interval=SUPERSEDED, excludes=frozenset({"cancelled", "stall"})),
    Fact("cancelled", interval={"continuation_fate": ContinuationFate.CANCELLED, "cancel_reason": "discarded"},
         excludes=frozenset({"stall"})),
    Fact("stall", goal={"stall_streak": N}, inputs={"fingerprint": "fp-old"}),
    Fact("fault", inputs={"fault": FAULT}),
    Fact("workdir_missing", inputs={"workdir_exists": False, "fingerprint": None}),
    # The work directory holds more than the goal's disk limit (1.5 GiB of 1 GiB).
    Fact("over_disk", inputs={"disk_bytes": 3 * 2**29, "disk_limit": 2**30}),
    # A note puts a stall's pause off (by at most N rounds); it is never progress by itself.
    Fact("notes", interval={"notes": ["tried another approach"]}),
    # A paused goal only counts; a claim is kept pending, decided at resume.
    Fact("paused", goal={"status": GoalStatus.PAUSED}),
]  # fmt: skip
BY_NAME = {f.name: f for f in FACTS}


def compatible(a: Fact, b: Fact) -> bool:
    return b.name not in a.excludes and a.name not in b.excludes


PAIRS = [(a, b) for a, b in itertools.combinations(FACTS, 2) if compatible(a, b)]


def build(facts: tuple[Fact, ...]) -> PolicyInput:
    goal: dict[str, Any] = {}
    interval: dict[str, Any] = {}
    inputs: dict[str, Any] = {"fingerprint": "fp-new"}
    # In the table's order: a fact later in it (the vanished workdir) has the last word on an input.
    for fact in sorted(facts, key=FACTS.index):
        goal |= fact.goal
        interval |= fact.interval
        inputs |= fact.inputs
    return PolicyInput(goal=make_goal(**goal), interval=make_interval(**interval), now=NOW, **inputs)


def oracle(names: set[str]) -> tuple[DecisionKind, str | None]:
    """The outcome the documented precedence gives: (kind, status reason)."""
    rules: list[tuple[Callable[[], bool], DecisionKind, str | None]] = [
        (lambda: "paused" in names, K.BOOKKEEP, None),
        (lambda: "claim_passes" in names and "workdir_missing" not in names, K.COMPLETE, StopReason.VERIFIED),
        (lambda: "fault" in names, K.FAIL, FAULT),
        (lambda: "workdir_missing" in names, K.FAIL, StopReason.WORKDIR_MISSING),
        (lambda: "over_disk" in names, K.PAUSE, OVER_DISK),
        (lambda: "cancelled" in names, K.PAUSE, "continuation cancelled: discarded"),
        (lambda: "blocked" in names, K.PAUSE, "blocked: need the key"),
        (lambda: "budget_spent" in names, K.EXHAUST, StopReason.TOKEN_BUDGET),
        (lambda: "guard_refused" in names, K.EXHAUST, StopReason.TOKEN_BUDGET),
        # The round runs again at once (re-issued when a person's follow-up superseded it).
        (lambda: "infra" in names, K.REISSUE if "superseded" in names else K.CONTINUE, None),
        (lambda: "auth_error" in names, K.PAUSE, StopReason.AUTH_ERROR),
        (lambda: "model_error" in names, K.WAIT, None),
        (lambda: "stall" in names and not names & {"model_error", "auth_error", "notes"}, K.PAUSE, StopReason.STALLED),
        (lambda: "superseded" in names, K.REISSUE, None),
    ]
    for applies, kind, reason in rules:
        if applies():
            return kind, reason
    return K.CONTINUE, None


def check_marks(names: set[str], inp: PolicyInput, decision: Decision) -> None:
    """Every fact's mark is on the new goal, whatever the outcome."""
    before, after = inp.goal, decision.goal
    text = decision.continuation or ""
    if "notes" in names:
        assert "tried another approach" in after.memory.notes
    if "paused" in names:
        # Only counted; a claim is neither verified nor refused, but kept for resume.
        assert after.status is GoalStatus.PAUSED and decision.continuation is None
        assert after.refused_claims == before.refused_claims and after.result_summary != CLAIM.summary
        if names & {"claim_passes", "claim_fails"}:
            assert after.memory.pending_claim is not None
            assert after.memory.pending_claim.summary == CLAIM.summary
        else:
            assert after.memory.pending_claim is None
        assert after.tokens == before.tokens + inp.interval.tokens
        assert after.evaluated_seq == inp.interval.end_seq
        if "infra" in names:  # not a round while paused either
            assert after.rounds == before.rounds and after.infra_streak == before.infra_streak + 1
        return
    if "claim_fails" in names or ("claim_passes" in names and "workdir_missing" in names):
        assert after.refused_claims == before.refused_claims + 1
        assert after.memory.verify_output
        if decision.continuation is not None:
            assert "Your last completion claim was refused" in text
    if "claim_passes" in names and "workdir_missing" not in names:
        assert after.result_summary == CLAIM.summary
    if "blocked" in names:
        assert after.blocked_streak == before.blocked_streak + 1
    if "model_error" in names:
        assert after.error_streak == before.error_streak + 1
        assert after.memory.last_error == "boom"
    if "auth_error" in names:
        assert after.memory.last_error == "401"
    if "stall" in names and not names & {"model_error", "auth_error", "infra"}:
        assert after.stall_streak == before.stall_streak + 1
    if "infra" in names:
        admitted = not names & {"superseded", "cancelled"}
        assert after.stall_streak == before.stall_streak
        assert after.interrupted_tokens == before.interrupted_tokens + 50
        if decision.kind is K.COMPLETE:  # cut after its claim: not run again, what it was (a round?)
            assert after.rounds == before.rounds + (1 if admitted else 0)
            assert after.infra_streak == (0 if admitted else before.infra_streak)
            assert after.infra_rounds == before.infra_rounds
        else:
            assert after.rounds == before.rounds
            assert after.infra_streak == before.infra_streak + 1
            assert after.infra_rounds == before.infra_rounds + (1 if admitted else 0)
    if "superseded" in names:
        assert after.rounds == before.rounds  # not a round
        if decision.kind is K.REISSUE:
            assert decision.round == before.continuation_round
    # What every outcome carries: the interval's spend and the cursor.
    assert after.tokens == before.tokens + inp.interval.tokens
    assert after.evaluated_seq == inp.interval.end_seq


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a.name}+{b.name}" for a, b in PAIRS])
def test_two_facts_in_one_interval_are_both_decided(a: Fact, b: Fact) -> None:
    names = {a.name, b.name}
    inp = build((a, b))
    decision = decide(inp)
    kind, reason = oracle(names)
    assert decision.kind is kind, (decision.kind, decision.goal.status_reason)
    if reason is not None:
        assert decision.goal.status_reason == reason
    check_marks(names, inp, decision)


@pytest.mark.parametrize("fact", FACTS, ids=[f.name for f in FACTS])
def test_each_fact_alone(fact: Fact) -> None:
    inp = build((fact,))
    decision = decide(inp)
    kind, reason = oracle({fact.name})
    assert decision.kind is kind
    if reason is not None:
        assert decision.goal.status_reason == reason
    check_marks({fact.name}, inp, decision)
    if kind in (K.PAUSE, K.FAIL, K.COMPLETE, K.EXHAUST):
        assert decision.goal.status is not GoalStatus.ACTIVE


def test_every_pair_that_can_coincide_is_in_the_table() -> None:
    # Every pair of the facts, minus the pairs that one field cannot hold together.
    excluded = {frozenset((a.name, b)) for a in FACTS for b in a.excludes}
    assert len(PAIRS) == len(FACTS) * (len(FACTS) - 1) // 2 - len(excluded)
    assert len(PAIRS) >= 80
