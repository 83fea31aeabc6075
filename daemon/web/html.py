"""The status page's HTML pieces shared by every page: escaping, the frame, budget bars, refusals.

Every page is complete HTML rendered on the server that works without JavaScript; ``static/app.js``
adds the live updates, the in-place paging and the actions without a reload. Everything is
escaped here (:func:`h`), whatever the model or a person wrote.

The data arrives in the protocol's shapes (camelCase ``goal/list``, ``goal/describe``,
``schedule/list``, ``daemon/health``). Goals are read back into a typed
:class:`~daemon.rpc.views.GoalView` (a field the daemon adds later is ignored); the daemon page
lists every health field, so one the daemon adds later shows up there.
The pages themselves: :mod:`~daemon.web.goals_view` (the goals table), :mod:`~daemon.web.goal_view`
(one goal), :mod:`~daemon.web.timeline_view` (its bands and conversations),
:mod:`~daemon.web.system_view` (schedules and the daemon).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from html import escape
from typing import Any

from daemon import __version__
from daemon.display import age, parse_time, status_text
from goals import Goal

#: How token counts and costs are written.
TOKENS, COST = "{:,.0f}", "{:.4f}"


def h(value: object) -> str:
    """``value`` as escaped text (``-`` for ``None``)."""
    return "-" if value is None else escape(str(value), quote=True)


def layout(title: str, body: str, *, page: str, token: str, read_only: bool, csrf: str, extra: str = "") -> str:
    """A whole page."""
    nav = "".join(
        f'<a href="{href}"{" class=here" if name == page else ""}>{label}</a>'
        for name, href, label in (
            ("goals", "/", "Goals"),
            ("questions", "/questions", "Questions"),
            ("schedules", "/schedules", "Schedules"),
            ("daemon", "/daemon", "Daemon"),
        )
    )
    who_line = f"{h(token)}" + (" (read-only)" if read_only else "")
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<meta name="csrf" content="{h(csrf)}"><title>{h(title)} · goald</title>'
        '<link rel="stylesheet" href="/static/style.css"><script src="/static/app.js" defer></script>'
        f'{extra}</head><body data-page="{h(page)}"><header><strong>goald</strong><nav>{nav}</nav>'
        f'<span class="me">{who_line}</span><span id="live-state" class="live-state"></span></header>'
        f"<main>{body}</main><footer>goald {h(__version__)}</footer></body></html>"
    )


def bar(used: float, limit: float | None, fmt: str) -> str:
    """A budget bar: the share of ``limit`` used (a plain figure when there is no limit)."""
    text = fmt.format(used) + (f" / {fmt.format(limit)}" if limit else "")
    if not limit:
        return f'<span class="figure">{h(text)}</span>'
    share = max(0.0, min(1.0, used / limit))
    level = "hot" if share >= 0.9 else "warm" if share >= 0.6 else "ok"
    return (
        f'<div class="bar {level}" title="{h(text)}"><span style="width:{share * 100:.1f}%"></span></div>'
        f'<span class="figure">{h(text)}</span>'
    )


def rel(value: Any) -> str:
    """A relative time (``3m ago``, ``in 1m20s``) that the page's script keeps current as time
    passes (``time.rel``: the same words as :func:`daemon.display.age`), even in a row that does not move."""
    dt = parse_time(value)
    if dt is None:
        return "-"
    return f'<time class="rel" datetime="{h(dt.isoformat(timespec="milliseconds"))}">{h(age(dt))}</time>'


def status_cell(g: Goal) -> str:
    """The status with its reason, as everywhere else (``paused (by request)``)."""
    return f'<span class="status st-{h(g.status.value)}">{h(status_text(g))}</span>'


def kv(rows: Iterable[tuple[str, str]]) -> str:
    """Rows of a two-column table (heading, HTML)."""
    return '<table class="kv">' + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def used_text(used: float, limit: float | None, fmt: str) -> str:
    """``12 of 100 used, 88 left`` (or ``12 (no limit)``), escaped."""
    if not limit:
        return h(f"{fmt.format(used)} (no limit)")
    return h(f"{fmt.format(used)} of {fmt.format(limit)} used, {fmt.format(max(limit - used, 0))} left")


def refusal(status: int, title: str, text: str) -> str:
    """The page of a refused request: says what to do, shows nothing of the daemon's state."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>goald: "
        f"{h(title)}</title></head><body><h1>{status} {h(title)}</h1><p>{h(text)}</p></body></html>"
    )


def parse_epoch(value: Any) -> float:
    """An ISO time as seconds since the epoch (now when absent)."""
    dt = parse_time(value)
    return (dt or now_utc()).timestamp()


def now_utc() -> datetime:
    """The current time (UTC)."""
    return datetime.now(UTC)
