"""How the CLI shows goals and events: plain lines, or a live panel on a terminal.

``goal show --watch`` and ``goal logs --follow`` read the goal again (``goal/get``) after each event
of its session rather than trusting ``goal/changed`` alone: a goal's rounds, tokens and cost move
at every decision of the engine, most of which change no status, and only the goal row knows the
budgets they count against.
"""

from __future__ import annotations

import json
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any

from agent import (
    AssistantMessage,
    MessageAdmitted,
    MessageCancelled,
    MessageQueued,
    ModelFailed,
    OtherPayload,
    StatusChanged,
    TextBlock,
    ToolResult,
    ToolUseBlock,
    TurnEnded,
    TurnStarted,
    parse_payload,
)
from goals import GoalBlockedReported, GoalChanged, GoalClaimed, GoalProgressNoted, GoalVerified

if TYPE_CHECKING:
    from rich.live import Live

    from daemon.client import Connection as Client

#: Statuses a goal never leaves.
TERMINAL = {"completed", "failed", "cancelled"}


def describe_event(kind: str, d: dict[str, Any]) -> str:
    """One plain line for an event, from its kind and stored data (read through its typed payload)."""
    match parse_payload(kind, d):
        case MessageQueued() as queued:
            src = queued.source
            who = src.kind.value + (f" {src.ref}" if src.ref else "")
            return f"queued {queued.message_id} ({queued.delivery.value}, from {who})"
        case MessageAdmitted() as admitted:
            text = admitted.text.replace("\n", " ")
            return f"admitted {admitted.message_id}: {text[:80]}"
        case MessageCancelled() as gone:
            return f"cancelled {gone.message_id}: {gone.reason}"
        case TurnStarted() as started:
            return f"turn {started.turn_id} started"
        case TurnEnded() as ended:
            extra = f" ({ended.error})" if ended.error else ""
            return f"turn ended: {ended.reason.value} after {ended.steps} step(s){extra}"
        case AssistantMessage() as answer:
            return "assistant: " + _answer(answer)
        case ToolResult() as result:
            first = result.content.splitlines()[0] if result.content else ""
            return f"tool {result.name} -> {'ERROR ' if result.is_error else ''}{first[:80]}"
        case ModelFailed() as failed:
            return f"model error ({failed.kind}, attempt {failed.attempt}): {failed.message[:80]}"
        case StatusChanged() as status:
            return f"status: {status.status.value}"
        case GoalChanged() as changed:
            return _goal_changed(changed)
        case GoalProgressNoted() as progress:
            return f"progress: {progress.note}"
        case GoalClaimed() as claim:
            return f"completion claimed: {claim.summary}"
        case GoalVerified() as verified:
            verdict = "passed" if verified.passed else "FAILED: the claim is refused"
            lines = [
                f"$ {r.cmd} -> {'timed out' if r.timed_out else 'exit ' + str(r.exit_code)}" for r in verified.results
            ]
            return f"verification {verdict}" + (f" ({'; '.join(lines)})" if lines else "")
        case GoalBlockedReported() as report:
            return f"blocked: {report.reason}"
        case OtherPayload(type="schedule/run", data=run):
            return f"schedule {run.get('scheduleId')}: {run.get('outcome')} ({run.get('reason')})"
        case _:
            return kind


def _answer(answer: AssistantMessage) -> str:
    parts = []
    for b in answer.content:
        if isinstance(b, TextBlock) and b.text:
            parts.append(repr(b.text[:80]))
        elif isinstance(b, ToolUseBlock):
            parts.append(f"calls {b.name}({json.dumps(b.input)[:60]})")
    tokens = answer.usage.total if answer.usage is not None else 0
    return ("; ".join(parts) or "(empty)") + (f"  [{tokens} tok]" if tokens else "")


def _goal_changed(changed: GoalChanged) -> str:
    counters = (
        f"; rounds {changed.rounds}, tokens {changed.tokens or 0:,}, cost {changed.cost or 0.0:.4f}"
        if changed.rounds is not None
        else ""
    )
    before = changed.from_.value if changed.from_ is not None else "new"
    return (
        f"goal {changed.goal_id}: {before} -> {changed.status.value}"
        + (f" ({reason_text(changed.reason)})" if changed.reason else "")
        + counters
    )


#: How a reason reads where its enum value alone would mislead (``completed (no_verification)``).
_REASON_TEXT = {"no_verification": "unverified: no verification"}


def reason_text(reason: str) -> str:
    """A goal's status reason as the CLI shows it."""
    return _REASON_TEXT.get(reason, reason)


def _budget(used: float, limit: float | None, fmt: str = "{:,.0f}") -> str:
    return fmt.format(used) + (f" / {fmt.format(limit)}" if limit is not None else "")


def goal_line(g: dict[str, Any]) -> str:
    """A one-line summary of a goal."""
    b = g.get("budgets", {})
    reason = f" ({reason_text(g['statusReason'])})" if g.get("statusReason") else ""
    return (
        f"{g['id']}  {g['status']}{reason}  rounds {_budget(g['rounds'], b.get('maxRounds'))}  "
        f"tokens {_budget(g['tokens'], b.get('maxTokensTotal'))}  cost {_budget(g['cost'], b.get('maxCost'), '{:.4f}')}"
        f"  {g['title']}"
    )


def goal_lines(g: dict[str, Any]) -> list[str]:
    """A goal in detail."""
    lines = [goal_line(g), f"session {g['sessionId']}  workdir {g.get('workdir')}", f"objective: {g['objective']}"]
    for note in g.get("notes", [])[-5:]:
        lines.append(f"note: {note}")
    for r in g.get("lastVerification", []):
        lines.append(f"verify: $ {r['cmd']} -> exit {r['exit_code']}")
    if g.get("resultSummary"):
        lines.append(f"result: {g['resultSummary']}")
    return lines


class GoalDisplay:
    """A goal's status, reason, rounds, tokens and cost against its budgets, shown as they change.

    Live (on a terminal): a rich panel that is redrawn in place, with event lines printed above it.
    Otherwise plain lines: a goal line (or, with ``as_json``, the goal as one JSON line) each time
    it differs from the last one shown, so a pipe or a log file gets one line per change.
    """

    def __init__(self, *, live: bool, as_json: bool = False) -> None:
        self._as_json = as_json
        self._last: str | None = None
        self._live: Live | None = None
        if live:
            # rich loads only for a live panel: ``goald run``, the demo and ACP import this module too.
            from rich.console import Console
            from rich.live import Live
            from rich.text import Text

            self._live = Live(Text(""), console=Console(), refresh_per_second=8)

    def __enter__(self) -> GoalDisplay:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.stop()

    def event(self, line: str) -> None:
        """Print one event line (above the panel when live)."""
        if self._live is not None:
            from rich.text import Text

            self._live.console.print(Text(line))
        else:
            print(line, flush=True)

    def goal(self, g: dict[str, Any]) -> None:
        """Show the goal as it is now (a line only if it changed, when plain)."""
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text("\n".join(goal_lines(g))), refresh=True)
            return
        line = json.dumps(g, sort_keys=True, default=str) if self._as_json else goal_line(g)
        if line != self._last:
            print(line, flush=True)
            self._last = line


async def watch_goal(client: Client, g: dict[str, Any], *, as_json: bool = False) -> int:
    """Follow a goal until it stops being active: a live panel on a terminal, else a line per change."""
    await client.call("session/subscribe", {"sessionId": g["sessionId"]})
    # Read again once subscribed: a change between the caller's read and the subscription would
    # otherwise go unseen (and a goal that ended in between would be watched forever).
    g = await client.call("goal/get", {"goalId": g["id"]})
    with GoalDisplay(live=sys.stdout.isatty() and not as_json, as_json=as_json) as view:
        while True:
            view.goal(g)
            if g["status"] != "active":
                return 0
            note = await client.next_notification()
            if note.get("method") == "session.event":
                g = await client.call("goal/get", {"goalId": g["id"]})
