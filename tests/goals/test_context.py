"""Context compaction on a real SQLite file with the shipped scripted model (tokens = bytes / 4).

A goal of many rounds, each adding a large tool output, runs on a model whose window is 4,000
tokens: the view is compacted (summaries, durable ``context/compacted`` events) so every prompt
stays under the window, the objective is in every prompt, and no prompt holds a tool result
without its call or a call without its result. Summary calls are charged to the goal's budget, and
a budget that cannot pay for one ends the goal ``exhausted``. When the summary call fails, large
tool results are elided first, then the oldest turns dropped, and the goal goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from context_models import DUMP_CHARS, dump_tool, objective, pairing_errors, rule_for, small_model
from goalkit import goal_runtime

from agent import (
    ContextCompacted,
    ConvMessage,
    EventType,
    ModelRegistry,
    ModelRequest,
    Reply,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from agent.context import DROPPED_NOTE, SUMMARY_HEADER, ContextPolicy, Entry, choose_cut, load_view, plan_fallback
from agent.models.base import message_bytes
from goals import (
    GOAL_CHANGED,
    Budgets,
    Goal,
    GoalSpec,
    GoalStatus,
    StopRules,
)

WINDOW = 4000
PATIENT = StopRules(stall_rounds=1000, max_model_errors=5, error_backoff_seconds=0.01)


async def wait_ended(rt: Runtime, goal: Goal, within: float = 100.0) -> dict[str, Any]:
    """The data of the goal's first ``goal/changed`` event to a final status."""
    final = {GoalStatus.COMPLETED, GoalStatus.EXHAUSTED, GoalStatus.FAILED, GoalStatus.PAUSED, GoalStatus.CANCELLED}
    async with asyncio.timeout(within):
        async with contextlib.aclosing(rt.store.hub.subscribe(rt.store, goal.session_id, 0)) as events:
            async for event in events:
                if event.type == GOAL_CHANGED and GoalStatus(event.data["status"]) in final:
                    return event.data
    raise AssertionError("unreachable")


async def compactions(rt: Runtime, session_id: str) -> list[ContextCompacted]:
    events = await rt.store.events_after(session_id, 0, limit=100_000, types=(EventType.CONTEXT_COMPACTED,))
    return [e.payload for e in events if isinstance(e.payload, ContextCompacted)]


def text_of(messages: list[ConvMessage]) -> str:
    parts = []
    for m in messages:
        for b in m.content:
            parts.append(b.text if isinstance(b, TextBlock) else b.content if isinstance(b, ToolResultBlock) else "")
    return "\n".join(parts)


async def run_goal(db_path: Path, tmp_path: Path, model: ScriptedModel, rounds: int, **budgets: Any) -> Any:
    workdir = tmp_path / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    async with goal_runtime(db_path, model, extra_tools=[dump_tool()]) as (rt, engine, _):
        goal = await engine.create(
            GoalSpec(
                objective=objective(rounds),
                workdir=str(workdir),
                budgets=Budgets(max_rounds=rounds + 5, **budgets),
                rules=PATIENT,
            )
        )
        changed = await wait_ended(rt, goal, within=110.0)
        await engine.settled()
        final = await engine.get(goal.id)
        done = await compactions(rt, goal.session_id)
        _, view = await load_view(rt.store, goal.session_id)
        live = rt.live_agents.get(goal.session_id)
        live_view = live.view() if live is not None else None
        rows = await rt.store.read(
            lambda conn: [
                dict(r)
                for r in conn.execute("SELECT * FROM model_calls WHERE session_id=? ORDER BY rowid", (goal.session_id,))
            ]
        )
    return changed, final, done, [e.msg for e in view], live_view, rows


def check_prompts(model: ScriptedModel, goal_objective: str) -> int:
    """Every recorded turn prompt: under the window, holding the objective, calls and results paired."""
    seen_summary = 0
    for call in model.calls:
        request = call.request
        tokens = model.prompt_tokens(request)
        assert tokens <= WINDOW, f"a prompt of {tokens} tokens was sent to a {WINDOW}-token window"
        messages = list(request.messages)
        if request.purpose == "summary":
            continue
        assert goal_objective in text_of(messages), "the objective is missing from a prompt"
        assert not pairing_errors(messages), pairing_errors(messages)
        if messages and SUMMARY_HEADER in text_of(messages[:1]):
            seen_summary += 1
    return seen_summary


@pytest.mark.parametrize("rounds", [30, pytest.param(200, marks=pytest.mark.soak)])
async def test_a_long_goal_compacts_and_completes(db_path: Path, tmp_path: Path, rounds: int) -> None:
    model = small_model(WINDOW)
    changed, final, done, view, live_view, rows = await run_goal(db_path, tmp_path, model, rounds)
    assert final.status is GoalStatus.COMPLETED, (changed, final.status_reason)
    # The whole history would be far over the window: it had to be compacted, several times.
    assert rounds * DUMP_CHARS // 4 > 4 * WINDOW
    assert len(done) >= 3, len(done)
    assert all(c.mode == "summary" and c.summary and c.usage is not None for c in done)
    assert [c.through_seq for c in done] == sorted(c.through_seq for c in done)
    assert check_prompts(model, objective(rounds)) > 0
    assert not model.unexpected
    # The view the live driver holds is the one a restart rebuilds.
    assert live_view is None or live_view == view
    # Every file was written, so no round lost its work to a compaction.
    assert {f"r{n}.txt" for n in range(1, rounds)} <= {p.name for p in (tmp_path / "work").iterdir()}
    # No request was ever refused for length: the estimate kept ahead of the window.
    assert not [r for r in rows if r["error_class"] == "context_length"]


async def test_summary_calls_are_charged_to_the_goal(db_path: Path, tmp_path: Path) -> None:
    model = small_model(WINDOW)
    _, final, done, *_, rows = await run_goal(db_path, tmp_path, model, 12)
    assert final.status is GoalStatus.COMPLETED
    assert done, "the goal should have compacted"
    summary_ids = {c.call_id for c in done}
    summary_rows = [r for r in rows if r["id"] in summary_ids]
    assert len(summary_rows) == len(done) and all(r["state"] == "settled" for r in summary_rows)
    summary_tokens = sum(c.usage.total for c in done if c.usage is not None)
    assert summary_tokens > 0
    charged = sum(r["input_tokens"] + r["output_tokens"] for r in rows)
    # The goal's counter is every call's reported usage, the summaries' included.
    assert final.tokens == charged


async def test_a_budget_that_cannot_pay_for_a_summary_exhausts_the_goal(db_path: Path, tmp_path: Path) -> None:
    # A first run finds how many tokens the goal spends up to its first summary call.
    probe = small_model(WINDOW)
    *_, rows = await run_goal(db_path, tmp_path / "probe", probe, 12)
    first_summary = next(i for i, c in enumerate(probe.calls) if c.request.purpose == "summary")
    spent_before = sum(r["input_tokens"] + r["output_tokens"] for r in rows[:first_summary])
    # Enough for every call before it, not for the summary's reservation.
    model = small_model(WINDOW)
    changed, final, done, *_ = await run_goal(
        tmp_path / "b.db", tmp_path / "budget", model, 12, max_tokens_total=spent_before + 300
    )
    assert final.status is GoalStatus.EXHAUSTED, (changed, final.status_reason)
    assert final.status_reason == "token_budget"
    assert not done, "no compaction could be paid for"
    assert final.tokens <= spent_before + 300
    # No over-long prompt was sent instead: every call made stayed under the window.
    assert all(model.prompt_tokens(c.request) <= WINDOW for c in model.calls)
    assert all(c.request.purpose == "turn" for c in model.calls)


async def test_fallback_elides_then_drops_when_the_summary_fails(db_path: Path, tmp_path: Path) -> None:
    model = small_model(WINDOW, summaries="fail")
    changed, final, done, view, *_ = await run_goal(db_path, tmp_path, model, 20)
    assert final.status is GoalStatus.COMPLETED, (changed, final.status_reason)
    assert done and all(c.mode in ("elided", "dropped") and c.usage is None for c in done)
    # Elided first: every fallback elided large tool results before it dropped a turn, and what it
    # elided and kept stays elided in the view (head and tail, with the marker).
    assert all(c.elided for c in done)
    assert "characters elided to fit the context window" in text_of(view)
    assert any(c.mode == "dropped" for c in done)
    # One note of every message dropped so far (counted in, never appended: issue 25).
    dropped = sum(c.messages for c in done if c.mode == "dropped")
    assert text_of(view).count("earlier message(s) were left out") == 1
    assert DROPPED_NOTE.format(n=dropped) in text_of(view)
    assert check_prompts(model, objective(20)) >= 0
    assert [c for c in model.calls if c.request.purpose == "summary"], "the summary should have been tried"


def _entry(seq: int, role: str, text: str = "", *, use: str | None = None, result: str | None = None) -> Entry:
    if use is not None:
        return Entry(seq, ConvMessage(role="assistant", content=[ToolUseBlock(id=use, name="dump", input={})]))
    if result is not None:
        return Entry(seq, ConvMessage(role="tool", content=[ToolResultBlock(tool_use_id=result, content=text)]))
    return Entry(seq, ConvMessage(role=role, content=[TextBlock(text=text)]))  # type: ignore[arg-type]


def _round(seq: int, n: int, out: int) -> list[Entry]:
    return [
        _entry(seq, "user", f"Round {n}"),
        _entry(seq + 1, "assistant", use=f"c{n}"),
        _entry(seq + 2, "tool", "y" * out, result=f"c{n}"),
        _entry(seq + 3, "assistant", f"round {n} done"),
    ]


def test_fallback_plan_elides_before_it_drops() -> None:
    policy = ContextPolicy(elide_over=1000, elide_keep=100)
    view = [e for n in range(4) for e in _round(10 * n + 1, n, 3000)]
    total = sum(message_bytes(e.msg) for e in view)
    # Eliding the large results is enough: nothing is dropped.
    enough = plan_fallback(view, total - 3 * 2500, policy)
    assert enough.cut is None and enough.elided == ["c0", "c1", "c2"]
    # Not enough: everything large is elided, then the oldest rounds go, never past the newest user
    # message and never between a call and its result.
    tight = plan_fallback(view, 700, policy)
    assert tight.elided == ["c0", "c1", "c2", "c3"]
    assert tight.cut is not None and view[tight.cut].msg.role != "tool"
    assert tight.cut <= max(i for i, e in enumerate(view) if e.msg.role == "user")


def test_the_cut_never_splits_a_call_from_its_result() -> None:
    view = [e for n in range(3) for e in _round(10 * n + 1, n, 500)]
    for keep in range(0, 3000, 50):
        cut = choose_cut(view, keep)
        assert cut is not None and view[cut].msg.role != "tool" and cut <= 8


async def test_a_refused_window_calibrates_compacts_and_retries(db_path: Path, tmp_path: Path) -> None:
    # A provider that reports half the prompt tokens it counts: goald's estimate runs low, so the
    # provider refuses prompts as too long. Each refusal calibrates, compacts, and retries once.
    inner = rule_for("ok")

    def rule(request: ModelRequest) -> Reply:
        reply: Reply = inner(request)
        reply.usage = Usage(input_tokens=max(1, request.prompt_bytes // 8), output_tokens=10)
        return reply

    model = ScriptedModel(rule, name="underreports", max_tokens=256, context_window=WINDOW)
    changed, final, done, *_, rows = await run_goal(db_path, tmp_path, model, 20)
    assert final.status is GoalStatus.COMPLETED, (changed, final.status_reason)
    refused = [r for r in rows if r["error_class"] == "context_length"]
    assert refused, "the provider should have refused a prompt"
    assert done
    async with Runtime.open(db_path, models=ModelRegistry({model.spec: model}, default=model.spec)) as rt:
        session = final.session_id
        events = await rt.store.events_after(session, 0, limit=100_000)
    errors = [e.data for e in events if e.type == EventType.MODEL_ERROR]
    assert errors and all(e["kind"] == "context_length" and e["retrying"] for e in errors)
    # No turn ended on it: each refusal was followed by a compaction and a successful retry.
    assert not [e for e in events if e.type == EventType.TURN_END and e.data["reason"] == "error"]
    assert len(errors) == len(refused)
