"""How the CLI shows goals and events: plain lines, a table, a describe view, or a live panel on a
terminal.

Conventions, the same in every command: times in the local zone with its offset
(``2026-05-01 14:03:07+02:00``; :func:`use_utc` for UTC), ages relative to now ("3m ago",
"in 1m20s"), and one wording of each status reason (:func:`reason_text`: ``paused (by request)``,
``completed (unverified: no verification)``), whatever the stored value's spelling. Why a goal
stands where it stands is the daemon's ``why`` (:func:`goals.why.why`, derived from the goal's
current status and the event that caused it), shown as it comes, never an error seen earlier; a
provider's state is ``ok``, ``failing (N in a row, last: ...)`` or ``open`` (:func:`provider_words`).

``goal show --watch`` and ``goal logs --follow`` read the goal again (``goal/get``) after each event
of its session rather than trusting ``goal/changed`` alone: a goal's rounds, tokens and cost move
at every decision of the engine, most of which change no status, and only the goal row knows the
budgets they count against.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
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
from daemon.rpc.views import GoalView
from goals import (
    GoalBlockedReported,
    GoalChanged,
    GoalClaimed,
    GoalCounted,
    GoalFingerprinted,
    GoalProgressNoted,
    GoalVerified,
)
from goals.model import Goal
from goals.why import reason_text as _reason_text
from goals.why import span

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
            return f"cancelled {gone.message_id}: {gone.reason}" + _asked(d)
        case TurnStarted() as started:
            return f"turn {started.turn_id} started"
        case TurnEnded() as ended:
            extra = f" ({ended.error})" if ended.error else ""
            return f"turn ended: {ended.reason.value} after {ended.steps} step(s){extra}" + _asked(d)
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
        case GoalCounted() as counted:
            return (
                f"goal {counted.goal_id} counted a turn that ran while {counted.status.value}:"
                f" rounds {counted.rounds}, tokens {counted.tokens:,}, cost {counted.cost:.4f}"
            )
        case GoalProgressNoted() as progress:
            return f"progress: {progress.note}"
        case GoalClaimed() as claim:
            return f"completion claimed: {claim.summary}"
        case GoalVerified() as verified:
            verdict = "passed" if verified.passed else "FAILED: the claim is refused"
            lines = [f"$ {r.cmd} -> {exit_text(r.model_dump())}" for r in verified.results]
            return f"verification {verdict}" + (f" ({'; '.join(lines)})" if lines else "")
        case GoalBlockedReported() as report:
            return f"blocked: {report.reason}"
        case GoalFingerprinted() as walked:
            return walked.text
        case OtherPayload(type="schedule/run", data=run):
            return f"schedule {run.get('scheduleId')}: {run.get('outcome')} ({run.get('reason')})"
        case _:
            return kind


def who(data: dict[str, Any]) -> str:
    """The person or schedule an event names as its cause (``web:NAME``, ``uid 1000``, ...), or ``""``."""
    if data.get("web"):
        return f"web:{data['web']}"
    if data.get("kind") == "schedule":
        return f"schedule {data.get('ref') or ''}".strip()
    if data.get("uid") is not None:
        return f"uid {data['uid']}" + (f" (pid {data['pid']})" if data.get("pid") is not None else "")
    return ""


def _asked(data: dict[str, Any]) -> str:
    """`` by <who>`` when a person asked for what the event records (an interrupt, a cancel)."""
    by = who(data)
    return f" by {by}" if by else ""


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


def reason_text(reason: str | None) -> str:
    """A goal's status reason in plain words: :func:`goals.why.reason_text`, the one wording."""
    return _reason_text(reason)


def status_text(g: Mapping[str, Any] | Goal) -> str:
    """``status (reason)`` of a goal, or of a goal as the protocol shows it."""
    if isinstance(g, Goal):
        status, reason = g.status.value, reason_text(g.status_reason)
    else:
        status, reason = str(g["status"]), reason_text(g.get("statusReason"))
    return f"{status} ({reason})" if reason else status


# -- times -----------------------------------------------------------------------------------

_UTC = [False]


def use_utc(on: bool) -> None:
    """Show times in UTC (``--utc``) rather than the local zone."""
    _UTC[0] = on


def parse_time(value: str | datetime | None) -> datetime | None:
    """An ISO 8601 time as an aware datetime (naive ones are UTC)."""
    if value is None or value == "":
        return None
    dt = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def when(value: str | datetime | None, tz: Any = None) -> str:
    """A time in the local zone (or ``tz``, or UTC with ``--utc``) with its offset, to the second."""
    dt = parse_time(value)
    if dt is None:
        return "-"
    zone = UTC if _UTC[0] else tz
    return dt.astimezone(zone).isoformat(sep=" ", timespec="seconds")


def age(value: str | datetime | None, now: datetime | None = None) -> str:
    """How long ago (``3m ago``) or how far ahead (``in 1m20s``) a time is."""
    dt = parse_time(value)
    if dt is None:
        return "-"
    delta = ((now or datetime.now(UTC)) - dt).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"{span(delta)} ago" if delta > 0 else f"in {span(delta)}"


def when_age(value: str | datetime | None, tz: Any = None) -> str:
    """A time and its age: ``2026-05-01 14:03:07+02:00 (3m ago)``."""
    return "-" if parse_time(value) is None else f"{when(value, tz)} ({age(value)})"


def _budget(used: float, limit: float | None, fmt: str = "{:,.0f}") -> str:
    return fmt.format(used) + (f" / {fmt.format(limit)}" if limit is not None else "")


def goal_line(g: Goal | Mapping[str, Any]) -> str:
    """A one-line summary of a goal: the engine's, or a goal view (read as a :class:`GoalView`)."""
    if not isinstance(g, Goal):
        g = GoalView.model_validate(g)
    b = g.budgets
    return (
        f"{g.id}  {status_text(g)}  rounds {_budget(g.rounds, b.max_rounds)}  "
        f"tokens {_budget(g.tokens, b.max_tokens_total)}  cost {_budget(g.cost, b.max_cost, '{:.4f}')}"
        f"  {g.title}"
    )


def goal_lines(g: GoalView) -> list[str]:
    """A goal in a few lines (the live panel of ``--watch`` and ``logs --follow``)."""
    lines = [goal_line(g), f"session {g.session_id}  workdir {g.workdir}", f"objective: {g.objective}"]
    for note in g.notes[-5:]:
        lines.append(f"note: {note}")
    for r in g.last_verification:
        lines.append(f"verify: $ {r['cmd']} -> {exit_text(r)}")
    if g.result_summary:
        lines.append(f"result: {g.result_summary}")
    return lines


def window_text(window: Mapping[str, Any]) -> str:
    """A model's context window and where the figure came from: ``16,384 tokens (server /props)``."""
    return f"{int(window['contextWindow']):,} tokens ({window.get('windowSource') or 'default'})"


def exit_text(r: dict[str, Any]) -> str:
    """How a command ended, in words where the code alone says little (127: command not found)."""
    if r.get("out_of_time") or r.get("outOfTime"):
        timed_out = r.get("timed_out") or r.get("timedOut")
        return "stopped: the goal's time ran out" if timed_out else "not run: the goal's time ran out"
    if r.get("timed_out") or r.get("timedOut"):
        return "timed out"
    code = r.get("exit_code", r.get("exitCode"))
    meaning = {126: "not executable", 127: "command not found"}.get(code) if isinstance(code, int) else None
    return f"exit {code}" + (f" ({meaning})" if meaning else "")


#: The columns of ``goald goal list``.
TABLE_HEADER = (
    "ID", "KEY", "STATUS", "REASON", "ACTIVITY", "AGE", "ROUNDS", "TOKENS", "COST", "MODEL", "LAST ERROR"
)  # fmt: skip
#: The LAST ERROR cell's width at most (the whole text: ``goal list --json``'s statusError).
ERROR_CELL = 60

#: An active goal's activity (``goal/list``'s ``activity.state``) in a table cell.
_ACTIVITY_WORDS = {
    "turn_running": "turn running",
    "waiting_provider": "waiting for provider",
    "waiting_slot": "waiting for a slot",
    "starting": "turn starting",
    "backoff": "backoff",
    "waiting_disk": "waiting for disk space",
    "deciding": "deciding",
}


def activity_cell(act: dict[str, Any] | None) -> str:
    """What a goal is doing, in a few words (``backoff until 12:03``); ``-`` when nothing runs."""
    if not act or act.get("state") not in _ACTIVITY_WORDS:
        return "-"
    words = _ACTIVITY_WORDS[str(act["state"])]
    until = parse_time(act.get("until"))
    if until is None:
        return words
    return f"{words} until {until.astimezone(UTC if _UTC[0] else None).strftime('%H:%M')}"


def goal_table(goals: list[GoalView]) -> list[str]:
    """Goals as a table with a header line (columns as wide as their widest cell)."""
    rows = [TABLE_HEADER] + [
        (
            g.id,
            g.key or "-",
            g.status.value,
            reason_text(g.status_reason) or "-",
            activity_cell(g.activity),
            age(g.created_at),
            str(g.rounds) + (f"/{g.budgets.max_rounds}" if g.budgets.max_rounds else ""),
            f"{g.tokens:,}",
            f"{g.cost:.4f}",
            g.model or "-",
            _cell(g.status_error, ERROR_CELL),
        )
        for g in goals
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    right = {6, 7, 8}
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]


def _cell(text: object, width: int) -> str:
    """``text`` in at most ``width`` characters (cut with ``…``); ``-`` when there is none."""
    words = " ".join(str(text or "").split())
    if not words:
        return "-"
    return words if len(words) <= width else words[: width - 1] + "…"


def provider_words(p: Mapping[str, Any]) -> str:
    """A provider's state: ``ok``, ``failing (N in a row, last: ...)`` (calls fail, its circuit still
    closed) or ``open`` (calls wait for its circuit breaker). ``p`` is its health snapshot, or the
    provider of a ``goal/describe`` answer."""
    state = p.get("state")
    failures = p.get("consecutiveFailures", (p.get("breaker") or {}).get("consecutiveFailures"))
    last = " ".join(str(p.get("lastError") or "").split())[:120]
    match state:
        case "closed" if failures:
            return f"failing ({failures} in a row, last: {last or 'no error text'})"
        case "closed":
            return "ok"
        case "open":
            return "open"
        case "half_open":
            return "open (one probe call in flight)"
        case _:
            return str(state or "unknown")


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

            self._live.update(Text("\n".join(goal_lines(GoalView.model_validate(g)))), refresh=True)
            return
        line = json.dumps(g, sort_keys=True, default=str) if self._as_json else goal_line(g)
        if line != self._last:
            print(line, flush=True)
            self._last = line


async def watch_goal(client: Client, ref: str, *, as_json: bool = False) -> int:
    """Follow a goal until it stops being active: a live panel on a terminal, else a line per change."""
    first = GoalView.model_validate(await client.call("goal/get", {"goalId": ref}))
    await client.call("session/subscribe", {"sessionId": first.session_id})
    # Read again once subscribed: a change between the first read and the subscription would
    # otherwise go unseen (and a goal that ended in between would be watched forever).
    g = await client.call("goal/get", {"goalId": first.id})
    with GoalDisplay(live=sys.stdout.isatty() and not as_json, as_json=as_json) as view:
        while True:
            view.goal(g)
            if g["status"] != "active":
                return 0
            note = await client.next_notification()
            if note.get("method") == "session.event":
                g = await client.call("goal/get", {"goalId": first.id})
