"""``goal/timeline``: a goal's rounds as bands, read a page at a time, newest first.

A band is an interval of the goal's session from the event that woke it to its idle, with the
goal's decision about that interval: the events after a ``status: idle`` that the evaluation of
that idle wrote (``goal/verified``, ``goal/fingerprint``, ``goal/counted``, the daemon's own
``goal/changed``, a verification's ``sandbox/network``) belong to the band that idle ended, so a
refused verification is shown on the round whose claim it refused, and a goal that came to rest
(paused, completed) has no trailing band of its own. Anything else after an idle (the next
continuation, a person's message, a person's pause or resume) begins the next band. A band is a
"round" when the goal's own continuation was admitted in it, and otherwise an interval a person
(a follow-up) or the daemon caused; each band is labelled by what caused it. A band is ``open``
(running) only while its session is running: it holds a ``status: running`` with no idle after it.

The summary of a band is a fold over its events (:class:`BandFold`), so the page's read here and
the live page's stream (:mod:`daemon.web.live`, event by event) say the same of the same events.

Why pages by sequence number and not by round number: no index maps rounds to events, and a
goal with 10,000 rounds must open quickly. A page reads backwards from a sequence number in
windows through the store's own :func:`~agent.eventlog.read_events` until it holds the bands it
needs (at most ``max_scan`` events: a pathological round is cut, and the cursor says where to go
on), all in one read on the store's thread. The cursor of the next page is the first sequence
number of the oldest band shown, so pages never overlap and never skip an event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from agent import Event, ToolResult, first_kept_seq, parse_payload, read_events
from agent.db import Conn
from daemon.display import reason_text, who
from daemon.ports import HostPort
from daemon.rpc.context import engine, runtime
from daemon.rpc.params import GoalRef
from daemon.rpc.protocol import Dispatcher, Peer
from daemon.rpc.views import JsonObject, event_view

#: Events read per window when scanning backwards.
WINDOW = 400
#: Kinds the evaluation of an idle writes after it: they belong to the band that idle ended.
DECISION_TAIL = ("goal/verified", "goal/fingerprint", "goal/counted", "sandbox/network")
_ROUND_REF = re.compile(r"#(\d+)(/retry\d+)?$")


class GoalTimeline(GoalRef):
    """``goal/timeline``: up to ``limit`` bands that end below ``before`` (newest first)."""

    #: A sequence number: bands that end below it (absent: the newest bands).
    before: int | None = Field(default=None, ge=1)
    limit: int = Field(default=10, ge=1, le=100)
    #: Include each band's events (without them, only the summaries).
    events: bool = True


def is_idle(event: Event) -> bool:
    """Whether ``event`` is a whole-agent idle status (it ends a band's running part)."""
    return event.type == "status" and event.data.get("status") == "idle"


def _round_of(data: dict[str, Any]) -> tuple[int, bool] | None:
    """The goal round a ``message/admitted`` of the goal's continuation runs (and whether it is run again)."""
    src = data.get("source") or {}
    if src.get("kind") != "goal":
        return None
    found = _ROUND_REF.search(str(src.get("ref") or ""))
    return (int(found.group(1)), found.group(2) is not None) if found else None


@dataclass
class BandFold:
    """What a band's summary says, folded event by event (the same for a page read and a live stream)."""

    first_seq: int = 0
    last_seq: int = 0
    #: An idle ended the band's running part: only its decision's events may follow.
    ended: bool = False
    #: The latest status in the band is ``running``.
    running: bool = False
    round: int | None = None
    rerun: bool = False
    admitted_from: str | None = None
    changed_to: str | None = None
    turns: int = 0
    tool_calls: int = 0
    failed_tool_calls: int = 0
    model_errors: int = 0
    outcomes: list[str] = field(default_factory=list)

    def begins_next(self, e: Event) -> bool:
        """Whether ``e`` begins the next band instead of joining this one (see the module docstring)."""
        if not self.ended:
            return False
        if e.type in DECISION_TAIL:
            return False
        # A goal/changed without a caller is the daemon's own decision at that idle.
        return not (e.type == "goal/changed" and not who(e.data) and e.data.get("uid") is None)

    def add(self, e: Event) -> None:
        """Fold one event (in order)."""
        if not self.first_seq:
            self.first_seq = e.seq
        self.last_seq = e.seq
        d = e.data
        match e.type:
            case "status":
                self.running = d.get("status") == "running"
                if not self.running:
                    self.ended = True
            case "turn/start":
                self.turns += 1
            case "tool/result":
                self.tool_calls += 1
                payload = parse_payload(e.type, d)
                if isinstance(payload, ToolResult) and payload.is_error:
                    self.failed_tool_calls += 1
            case "model/error":
                self.model_errors += 1
            case "message/admitted" if self.admitted_from is None and self.round is None:
                found = _round_of(d)
                if found is not None:
                    self.round, self.rerun = found
                else:
                    self.admitted_from = who(d.get("source") or {}) or "a person"
            case "goal/verified":
                self.outcomes.append("verification " + ("passed" if d.get("passed") else "refused"))
            case "goal/changed":
                by = who(d)
                if self.changed_to is None:
                    self.changed_to = f"{d.get('status')}" + (f" by {by}" if by else "")
                self.outcomes.append(
                    f"→ {d.get('status')}"
                    + (f" ({reason_text(d.get('reason'))})" if d.get("reason") else "")
                    + (f" by {by}" if by else "")
                )

    @property
    def label(self) -> str:
        """What caused the band, in a few words."""
        if self.round is not None:
            return f"round {self.round}" + (" (run again)" if self.rerun else "")
        if self.admitted_from is not None:
            return f"message from {self.admitted_from}"
        return self.changed_to or "session events"

    @property
    def summary(self) -> str:
        """The band's one line: what caused it, turns, tool calls and their outcome, errors,
        verification and status changes, and ``running`` while it runs."""
        parts = [self.label]
        if self.turns:
            parts.append(f"{self.turns} turn(s)")
        if self.tool_calls:
            failed = f", {self.failed_tool_calls} failed" if self.failed_tool_calls else ""
            parts.append(f"{self.tool_calls} tool call(s){failed}")
        if self.model_errors:
            parts.append(f"{self.model_errors} model error(s)")
        parts += self.outcomes
        if self.running:
            parts.append("running")
        return " · ".join(parts)

    def view(self, events: list[Event] | None) -> JsonObject:
        """The band as ``goal/timeline`` answers it (``events``: its events, or ``None`` to leave them out)."""
        out: JsonObject = {
            "firstSeq": self.first_seq,
            "lastSeq": self.last_seq,
            "open": self.running,
            "round": self.round,
            "label": self.label,
            "turns": self.turns,
            "toolCalls": self.tool_calls,
            "failedToolCalls": self.failed_tool_calls,
            "modelErrors": self.model_errors,
            "outcomes": list(self.outcomes),
            "summary": self.summary,
        }
        if events is not None:
            out["events"] = [{"seq": e.seq, **event_view(e)} for e in events]
        return out


@dataclass
class Band:
    """One band's events in order, and their fold."""

    events: list[Event] = field(default_factory=list)
    fold: BandFold = field(default_factory=BandFold)

    @property
    def first_seq(self) -> int:
        """The band's first sequence number."""
        return self.events[0].seq

    @property
    def last_seq(self) -> int:
        """The band's last sequence number."""
        return self.events[-1].seq


def split_bands(events: list[Event]) -> list[Band]:
    """``events`` (in order) cut into bands (see the module docstring)."""
    bands: list[Band] = []
    for e in events:
        if not bands or bands[-1].fold.begins_next(e):
            bands.append(Band())
        bands[-1].events.append(e)
        bands[-1].fold.add(e)
    return bands


@dataclass
class TimelinePage:
    """Bands newest first, and where the next (older) page starts."""

    bands: list[Band]
    #: Pass as ``before`` for the older bands; ``None``: this page reaches the first kept event.
    before: int | None


def bands_before(conn: Conn, session_id: str, before: int, count: int, *, max_scan: int = 20_000) -> TimelinePage:
    """Up to ``count`` bands that end below ``before`` (newest first), on the store's thread."""
    floor = first_kept_seq(conn, session_id)
    if floor is None or before <= floor:
        return TimelinePage([], None)
    collected: list[Event] = []
    hi = before - 1
    while hi >= floor and len(collected) < max_scan:
        lo = max(floor - 1, hi - WINDOW)
        collected = read_events(conn, session_id, lo, upto=hi, limit=WINDOW) + collected
        hi = lo
        bands = split_bands(collected)
        complete = len(bands) - (1 if hi >= floor else 0)  # the oldest may lack its start
        if complete >= count:
            break
    bands = split_bands(collected)
    if hi >= floor and len(bands) > 1:
        bands = bands[1:]  # begun below the window: the next page reads it whole
    shown = bands[-count:] if count > 0 else []
    if not shown:
        return TimelinePage([], None)
    first = shown[0].first_seq
    return TimelinePage(list(reversed(shown)), first if first > floor else None)


def timeline_answer(goal_id: str, session_id: str, page: TimelinePage, *, events: bool = True) -> JsonObject:
    """``goal/timeline``'s answer from a page of bands (pure)."""
    return {
        "goalId": goal_id,
        "sessionId": session_id,
        "bands": [b.fold.view(b.events if events else None) for b in page.bands],
        "before": page.before,
        "lastSeq": page.bands[0].last_seq if page.bands else 0,
    }


def register(d: Dispatcher, host: HostPort) -> None:
    """Add ``goal/timeline`` to ``d``."""

    @d.method("goal/timeline", GoalTimeline)
    async def goal_timeline(p: GoalTimeline, peer: Peer) -> JsonObject:
        goal = await engine(host).get(p.goal_id)
        rt = runtime(host)
        before = p.before if p.before is not None else (await rt.store.session_state(goal.session_id)).last_seq + 1
        page = await rt.store.read(lambda conn: bands_before(conn, goal.session_id, before, p.limit))
        return timeline_answer(goal.id, goal.session_id, page, events=p.events)
