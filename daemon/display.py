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

if TYPE_CHECKING:
    from rich.live import Live

    from daemon.client import Client

#: Statuses a goal never leaves.
TERMINAL = {"completed", "failed", "cancelled"}


def describe_event(kind: str, d: dict[str, Any]) -> str:
    """One plain line for an event."""
    match kind:
        case "message/queued":
            src = d.get("source", {})
            who = src.get("kind", "user") + (f" {src['ref']}" if src.get("ref") else "")
            return f"queued {d['messageId']} ({d['delivery']}, from {who})"
        case "message/admitted":
            text = "".join(b.get("text", "") for b in d.get("content", [])).replace("\n", " ")
            return f"admitted {d['messageId']}: {text[:80]}"
        case "message/cancelled":
            return f"cancelled {d['messageId']}: {d.get('reason')}"
        case "turn/start":
            return f"turn {d['turnId']} started"
        case "turn/end":
            extra = f" ({d['error']})" if d.get("error") else ""
            return f"turn ended: {d['reason']} after {d.get('steps', 0)} step(s){extra}"
        case "assistant/message":
            parts = []
            for b in d.get("content", []):
                if b.get("type") == "text" and b.get("text"):
                    parts.append(repr(b["text"][:80]))
                elif b.get("type") == "tool_use":
                    parts.append(f"calls {b['name']}({json.dumps(b.get('input'))[:60]})")
            usage = d.get("usage") or {}
            tokens = sum(int(v) for v in usage.values())
            return "assistant: " + ("; ".join(parts) or "(empty)") + (f"  [{tokens} tok]" if tokens else "")
        case "tool/result":
            content = d.get("content") or ""
            first = content.splitlines()[0] if content else ""
            return f"tool {d.get('name')} -> {'ERROR ' if d.get('isError') else ''}{first[:80]}"
        case "model/error":
            return f"model error ({d.get('kind')}, attempt {d.get('attempt')}): {d.get('message', '')[:80]}"
        case "status":
            return f"status: {d['status']}"
        case "goal/changed":
            counters = (
                f"; rounds {d['rounds']}, tokens {d['tokens']:,}, cost {d['cost']:.4f}"
                if d.get("rounds") is not None
                else ""
            )
            return (
                f"goal {d['goalId']}: {d.get('from') or 'new'} -> {d['status']}"
                + (f" ({d['reason']})" if d.get("reason") else "")
                + counters
            )
        case "goal/progress":
            return f"progress: {d.get('note')}"
        case "goal/claim":
            return f"completion claimed: {d.get('summary')}"
        case "goal/verified":
            verdict = "passed" if d.get("passed") else "FAILED: the claim is refused"
            lines = [
                f"$ {r['cmd']} -> {'timed out' if r.get('timed_out') else 'exit ' + str(r.get('exit_code'))}"
                for r in d.get("results", [])
            ]
            return f"verification {verdict}" + (f" ({'; '.join(lines)})" if lines else "")
        case "goal/blocked":
            return f"blocked: {d.get('reason')}"
        case "schedule/run":
            return f"schedule {d.get('scheduleId')}: {d.get('outcome')} ({d.get('reason')})"
        case _:
            return kind


def _budget(used: float, limit: float | None, fmt: str = "{:,.0f}") -> str:
    return fmt.format(used) + (f" / {fmt.format(limit)}" if limit is not None else "")


def goal_line(g: dict[str, Any]) -> str:
    """A one-line summary of a goal."""
    b = g.get("budgets", {})
    reason = f" ({g['statusReason']})" if g.get("statusReason") else ""
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
