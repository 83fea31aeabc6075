"""The continuation message a goal enqueues to keep its agent going.

Its first part (the goal's id, the quoted objective and the standing instructions) is the same
from round to round, so providers' prompt caches can reuse it; what changes (round, budget left,
notes, the last verification output, a stall warning) comes after. The objective is quoted with
``<``, ``>`` and ``&`` escaped, so multi-line or tag-like text cannot close the quote and pose as
instructions.
"""

from __future__ import annotations

from datetime import datetime

from goals.model import Goal

INSTRUCTIONS = (
    "You are working toward this goal unattended; no person is watching. Work in steps, use your "
    "tools, and check your own progress. After meaningful progress call goal_progress(note). Call "
    "goal_complete(summary, evidence) only when the objective is met and you can show evidence "
    "(its verification commands will be run). If you truly cannot proceed, call goal_blocked(reason)."
)


def quote(text: str) -> str:
    """Escape text so it cannot break out of the ``<objective>`` element."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def stable_part(goal: Goal) -> str:
    """The part that does not change from round to round."""
    # The title defaults to the objective's first line, so it is quoted like the objective.
    title = quote(" ".join(goal.title.split()))
    return f"[goal {goal.id}] {title}\n<objective>\n{quote(goal.objective)}\n</objective>\n\n{INSTRUCTIONS}"


def _budget_left(goal: Goal, now: datetime) -> str:
    b = goal.budgets
    parts = []
    if b.max_tokens_total is not None:
        parts.append(f"{max(b.max_tokens_total - goal.tokens, 0):,} tokens")
    if b.max_cost is not None:
        parts.append(f"{max(b.max_cost - goal.cost, 0.0):.4f} cost units")
    if b.max_wall_seconds is not None:
        parts.append(f"{max(b.max_wall_seconds - goal.wall_used, 0.0):.0f} s of wall time")
    if b.deadline is not None:
        parts.append(f"{max((b.deadline - now).total_seconds(), 0.0):.0f} s until the deadline")
    return ", ".join(parts) if parts else "no limit set"


#: Added when the previous turn ended ``max_tokens``: its answer was cut and its tool calls not run.
ANSWER_CUT = (
    "Your last answer was cut off by the output limit (max_tokens), and any tool call in it was not run. "
    "Keep each answer and each tool call small: write a large file in several smaller writes or appends."
)


#: Added when the round is run again after the infrastructure's trouble (the turn was interrupted,
#: or the provider could not be reached): the round was not counted.
RERUN = (
    "This round is run again: its last attempt was cut short by trouble outside your work (goald stopped "
    "or the model's provider could not be reached), and it is not counted. Check what your earlier tool "
    "calls did before repeating them."
)


def render(
    goal: Goal,
    round_no: int,
    now: datetime,
    *,
    stall_warning: bool = False,
    answer_cut: bool = False,
    rerun: bool = False,
) -> str:
    """The whole continuation text for round ``round_no`` (``answer_cut``: the last turn ended
    ``max_tokens``; ``rerun``: the round is run again after the infrastructure's trouble)."""
    of = f" of {goal.budgets.max_rounds}" if goal.budgets.max_rounds else ""
    lines = [stable_part(goal), "", "---", f"Round {round_no}{of}. Budget left: {_budget_left(goal, now)}."]
    if goal.memory.notes:
        lines.append("Latest progress notes:")
        lines.extend(f"- {quote(n)}" for n in goal.memory.notes[-5:])
    if goal.memory.verify_output:
        lines.append("Your last completion claim was refused; the verification said:")
        lines.append(goal.memory.verify_output)
    if stall_warning:
        lines.append(
            f"Warning: no progress in the last {goal.stall_streak} round(s): nothing changed in the work "
            "directory (or in the output of the goal's progress command); progress notes alone do not count. "
            "Change approach, or the goal will be paused as stalled."
        )
    if answer_cut:
        lines.append(ANSWER_CUT)
    if rerun:
        lines.append(RERUN)
    lines.append("Verify where things stand, then continue.")
    return "\n".join(lines)
