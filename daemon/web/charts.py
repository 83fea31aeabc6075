"""The burn-down chart: a goal's tokens and cost left of its budgets over time, drawn as SVG.

The series is the running sum of what each event charged (:func:`goals.facts.charged`, the same
sum the goal's counters keep), read forward from the store in pages of the charging kinds only
(parsed on the store's thread, so a first drawing of a long goal does not hold the event loop) and
cached per goal with the sequence number it reached: a chart opened again, or redrawn live, reads
only the events since. The cache keeps at most ``MAX_POINTS`` points per goal (neighbours are
merged as it fills: the chart stays as wide as the page, not as long as the goal) and at most
``MAX_GOALS`` goals, so its memory is bounded whatever runs.

Drawn on the server (no chart library to ship): two polylines, tokens and cost. With a budget the
chart is a burn-down: each line is the share of its budget that is left, the axis in percent. A
goal without any budget has nothing to run out of, so the chart is a usage chart instead: the lines
rise with what was used, the axis reads in tokens (not percent of anything) and the heading says
"used so far (no budget)"; a kind without a budget beside one with is drawn as usage and says
so. A line that fell to the floor would look like a budget running out; only a budget's does.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from html import escape

from agent import Store, read_events
from agent.db import Conn
from goals.facts import charged

#: Event kinds that charge tokens or cost.
CHARGING = ("assistant/message", "model/error", "model/charged", "context/compacted")
MAX_POINTS = 400
MAX_GOALS = 64
#: Charging events read (and parsed on the store's thread) per read: short reads, so writers wait little.
PAGE = 2000


@dataclass
class Series:
    """A goal's cumulative spend: points ``(time, tokens, cost)`` and how far the events were read."""

    seq: int = 0
    tokens: int = 0
    cost: float = 0.0
    points: list[tuple[float, int, float]] = field(default_factory=list)

    def add(self, at: float, tokens: int, cost: float) -> None:
        """One charging event."""
        self.tokens += tokens
        self.cost += cost
        self.points.append((at, self.tokens, self.cost))
        if len(self.points) > MAX_POINTS:
            # Keep every other point (and the newest): the shape stays, the length halves.
            self.points = self.points[:-1:2] + self.points[-1:]


class BurnCache:
    """Series per goal, extended on demand, least recently used goals dropped."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._series: OrderedDict[str, Series] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    async def series(self, goal_id: str, session_id: str) -> Series:
        """The goal's series up to its session's latest event."""
        lock = self._locks.setdefault(goal_id, asyncio.Lock())
        async with lock:
            s = self._series.pop(goal_id, None) or Series()
            self._series[goal_id] = s
            while len(self._series) > MAX_GOALS:
                old, _ = self._series.popitem(last=False)
                self._locks.pop(old, None)
            while True:
                read, last, charges = await self.store.read(partial(_charges, session_id, s.seq))
                for at, tokens, cost in charges:
                    s.add(at, tokens, cost)
                s.seq = max(s.seq, last)
                if read < PAGE:
                    return s


def _charges(session_id: str, after: int, conn: Conn) -> tuple[int, int, list[tuple[float, int, float]]]:
    """One page of charges, parsed on the store's thread (not on the event loop): how many events
    were read, the last sequence number, and ``(time, tokens, cost)`` of each that charged."""
    events = read_events(conn, session_id, after, limit=PAGE, types=CHARGING)
    out = []
    for e in events:
        tokens, cost = charged(e.payload)
        if tokens or cost:
            out.append((_epoch(e.at), tokens, cost))
    return len(events), (events[-1].seq if events else after), out


def _epoch(at: str) -> float:
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def burn_svg(
    series: Series,
    *,
    max_tokens: int | None,
    max_cost: float | None,
    start: float,
    now: float,
    width: int = 720,
    height: int = 240,
) -> str:
    """The chart as an SVG document."""
    pad_l, pad_r, pad_t, pad_b = 48, 16, 28, 34
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    t0 = min([start, *(p[0] for p in series.points[:1])])
    t1 = max(now, t0 + 1.0)
    top_tokens = float(max_tokens) if max_tokens else float(max(series.tokens, 1))
    top_cost = float(max_cost) if max_cost else max(series.cost, 1e-9)

    def x(t: float) -> float:
        return pad_l + w * (t - t0) / (t1 - t0)

    def y(share: float) -> float:
        return pad_t + h * (1.0 - max(0.0, min(1.0, share)))

    def line(values: list[tuple[float, float]], budget: bool) -> str:
        # Burn-down against a budget: the share left; without one: the share of the largest value used.
        pts = [(t0, 1.0 if budget else 0.0)]
        pts += [(t, (1.0 - v) if budget else v) for t, v in values]
        pts.append((t1, pts[-1][1]))
        return " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)

    tok = line([(t, n / top_tokens) for t, n, _ in series.points], bool(max_tokens))
    cst = line([(t, c / top_cost) for t, _, c in series.points], bool(max_cost))
    budget = bool(max_tokens or max_cost)
    tok_label = f"tokens {series.tokens:,}" + (f" of {max_tokens:,}" if max_tokens else " used (no budget)")
    cost_label = f"cost {series.cost:.4f}" + (f" of {max_cost:g}" if max_cost else " used (no budget)")
    axis = "share of budget left" if budget else "used so far (no budget)"

    def level(share: float) -> str:
        # A burn-down's axis is the share left; a usage chart's is the tokens used.
        return f"{int(share * 100)}%" if budget else f"{top_tokens * share:,.0f}"

    span = t1 - t0
    marks = [t0 + span * i / 4 for i in range(5)]
    ticks = "".join(f'<text x="{x(t):.1f}" y="{height - 10}" class="tick">{escape(_ago(t1 - t))}</text>' for t in marks)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        f' role="img" aria-label="{"burn-down" if budget else "usage"} of tokens and cost" class="burn"'
        f' data-mode="{"budget" if budget else "usage"}">'
        "<style>.tick{font:11px sans-serif;fill:#666;text-anchor:middle}.lab{font:12px sans-serif}"
        ".grid{stroke:#ddd;stroke-width:1}</style>"
        f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>'
        + "".join(
            f'<line class="grid" x1="{pad_l}" x2="{pad_l + w}" y1="{y(s):.1f}" y2="{y(s):.1f}"/>'
            f'<text x="{pad_l - 6}" y="{y(s) + 4:.1f}" class="tick" style="text-anchor:end">{level(s)}</text>'
            for s in (0.0, 0.5, 1.0)
        )
        + f'<polyline id="burn-tokens" points="{tok}" fill="none" stroke="#1f6feb" stroke-width="2"/>'
        f'<polyline id="burn-cost" points="{cst}" fill="none" stroke="#d97706" stroke-width="2"'
        f' stroke-dasharray="{"5 3" if max_cost or not budget else "1 3"}"/>'
        f'<text x="{pad_l}" y="16" class="lab" fill="#1f6feb">{escape(tok_label)}</text>'
        f'<text x="{pad_l + w / 2:.0f}" y="16" class="lab" fill="#d97706">{escape(cost_label)}</text>'
        f'<text x="{pad_l + w}" y="16" class="lab" style="text-anchor:end" fill="#666">{escape(axis)}</text>'
        f"{ticks}</svg>"
    )


def _ago(seconds: float) -> str:
    s = int(seconds)
    if s <= 0:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit} ago"
    return f"{s}s ago"
