"""A goal's rounds as bands on a timeline, read a page at a time, newest first.

A band is an idle-to-idle interval of the goal's session: every event after one ``status: idle``
up to and including the next (the last band may still be running). That is the design's
"round" when the goal's own continuation was admitted in it, and otherwise an interval a person
(a follow-up) or the daemon (a pause, a resume) caused; each band is labelled by what caused it.

Why pages by sequence number and not by round number: no index maps rounds to events, and a
goal with 10,000 rounds must open quickly. A page reads backwards from a sequence number in
windows through the store's own :func:`~agent.store.read_events` until it holds the bands it
needs (at most ``max_scan`` events: a pathological round is cut, and the cursor says where to go
on), all in one read on the store's thread. The cursor of the next page is the first sequence
number of the oldest band shown, so pages never overlap and never skip an event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent import Event, first_kept_seq, read_events
from agent.db import Conn
from daemon.display import who

#: Events read per window when scanning backwards.
WINDOW = 400


@dataclass
class Band:
    """One idle-to-idle interval: its events in order, and what caused it."""

    events: list[Event] = field(default_factory=list)
    #: The band has not ended with an idle status yet (the running round).
    open: bool = False

    @property
    def first_seq(self) -> int:
        """The band's first sequence number."""
        return self.events[0].seq

    @property
    def last_seq(self) -> int:
        """The band's last sequence number."""
        return self.events[-1].seq

    @property
    def round(self) -> int | None:
        """The goal round whose continuation this band admitted, if any."""
        for e in self.events:
            if e.type == "message/admitted":
                src = e.data.get("source") or {}
                if src.get("kind") == "goal" and "#" in str(src.get("ref") or ""):
                    try:
                        return int(str(src["ref"]).rsplit("#", 1)[1])
                    except ValueError:
                        return None
        return None

    @property
    def label(self) -> str:
        """What caused the band, in a few words."""
        n = self.round
        if n is not None:
            return f"round {n}"
        for e in self.events:
            if e.type == "message/admitted":
                return f"message from {who(e.data.get('source') or {}) or 'a person'}"
        for e in self.events:
            if e.type == "goal/changed":
                by = who(e.data)
                return f"{e.data.get('status')}" + (f" by {by}" if by else "")
        return "session events"


def is_idle(event: Event) -> bool:
    """Whether ``event`` ends a band (a whole-agent idle status)."""
    return event.type == "status" and event.data.get("status") == "idle"


@dataclass
class TimelinePage:
    """Bands newest first, and where the next (older) page starts."""

    bands: list[Band]
    #: Pass as ``before`` for the older bands; ``None``: this page reaches the first kept event.
    before: int | None


def split_bands(events: list[Event]) -> list[Band]:
    """``events`` (in order) cut after each idle status; the last band is open unless it ended idle."""
    bands: list[Band] = [Band()]
    for e in events:
        bands[-1].events.append(e)
        if is_idle(e):
            bands.append(Band())
    if not bands[-1].events:
        bands.pop()
    elif not is_idle(bands[-1].events[-1]):
        bands[-1].open = True
    return bands


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


def events_between(conn: Conn, session_id: str, after: int, upto: int, limit: int) -> list[Event]:
    """The events of one band (its conversation), at most ``limit``."""
    return read_events(conn, session_id, after, upto=upto, limit=limit)
