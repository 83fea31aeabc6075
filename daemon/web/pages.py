"""The status page's HTML, rendered on the server from the control protocol's answers.

Every page is complete HTML that works without JavaScript: tables, filters, paging, the goal's
describe view, the timeline (with links for older rounds and each band's conversation) and the
action forms. ``static/app.js`` adds the live updates, the in-place paging and the actions
without a reload. Everything is escaped here (:func:`h`), whatever the model or a person wrote.

The data arrives in the protocol's shapes (camelCase ``goal/list``, ``goal/describe``,
``schedule/list``, ``daemon/health``) and is read with ``.get``: a field the daemon adds later
shows up where it is generic (the daemon page lists every health field) and is ignored elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from agent import Event
from daemon import __version__
from daemon.display import (
    age,
    breaker_words,
    describe_event,
    exit_text,
    parse_time,
    reason_text,
    span,
    status_text,
    when,
)
from daemon.web.timeline import Band, TimelinePage, who

#: How token counts and costs are written.
TOKENS, COST = "{:,.0f}", "{:.4f}"
#: The order a goals table is sorted in: what needs a person first.
ATTENTION = {"failed": 0, "paused": 1, "exhausted": 2, "active": 3, "completed": 4, "cancelled": 5}
STATUSES = ("active", "paused", "completed", "failed", "cancelled", "exhausted")


def h(value: object) -> str:
    """``value`` as escaped text (``-`` for ``None``)."""
    return "-" if value is None else escape(str(value), quote=True)


def layout(title: str, body: str, *, page: str, token: str, read_only: bool, csrf: str, extra: str = "") -> str:
    """A whole page."""
    nav = "".join(
        f'<a href="{href}"{" class=here" if name == page else ""}>{label}</a>'
        for name, href, label in (
            ("goals", "/", "Goals"),
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


def status_cell(g: Mapping[str, Any]) -> str:
    """The status with its reason, as everywhere else (``paused (by request)``)."""
    return f'<span class="status st-{h(g.get("status"))}">{h(status_text(dict(g)))}</span>'


def attention_order(goals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Paused, failed and exhausted goals first, then the active ones; most recently moved first within each."""
    by_time = sorted(goals, key=lambda g: str(g.get("lastActivity") or g.get("updatedAt") or ""), reverse=True)
    return sorted(by_time, key=lambda g: ATTENTION.get(str(g.get("status")), 9))


def goals_page(
    goals: list[dict[str, Any]], *, status: str | None, schedule: str | None, page: int, per_page: int, total: int
) -> str:
    """The goals table (one page of it) with its filters."""
    options = "".join(
        f'<option value="{s}"{" selected" if s == status else ""}>{s}</option>' for s in ("", *STATUSES)
    ).replace('<option value="">', '<option value="">any status')
    filters = (
        '<form class="filters" method="get" action="/">'
        f'<label>status <select name="status">{options}</select></label> '
        f'<label>schedule <input name="schedule" value="{h(schedule or "")}" placeholder="key or id" size=14></label> '
        "<button>filter</button></form>"
    )
    rows = "".join(goal_row(g) for g in goals)
    head = "".join(
        f"<th>{c}</th>" for c in ("status", "key", "title", "model", "round", "age", "last activity", "tokens", "cost")
    )
    pages = max(1, -(-total // per_page))
    nav = ""
    if pages > 1:
        q = {k: v for k, v in (("status", status), ("schedule", schedule)) if v}
        links = []
        if page > 1:
            links.append(f'<a href="/?{urlencode({**q, "page": page - 1})}">newer page</a>')
        links.append(f"page {page} of {pages}")
        if page < pages:
            links.append(f'<a href="/?{urlencode({**q, "page": page + 1})}">next page</a>')
        nav = '<p class="pager">' + " · ".join(links) + "</p>"
    empty = "" if goals else '<p class="empty">No goals match.</p>'
    return (
        f"<h1>Goals <small>{total} shown by attention</small></h1>{filters}"
        f'<table id="goals" class="goals"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{empty}{nav}'
    )


def goal_row(g: Mapping[str, Any]) -> str:
    """One row of the goals table."""
    b = g.get("budgets") or {}
    gid = str(g.get("id"))
    rounds = f"{g.get('rounds', 0)}" + (f" / {b['maxRounds']}" if b.get("maxRounds") else "")
    last = g.get("lastActivity") or g.get("updatedAt")
    return (
        f'<tr data-goal="{h(gid)}" data-status="{h(g.get("status"))}">'
        f"<td>{status_cell(g)}</td><td>{h(g.get('key'))}</td>"
        f'<td><a href="/goals/{h(gid)}">{h(g.get("title"))}</a></td><td>{h(g.get("model"))}</td>'
        f"<td>{h(rounds)}</td><td>{h(age(g.get('createdAt')))}</td><td>{h(age(last))}</td>"
        f"<td>{bar(float(g.get('tokens') or 0), b.get('maxTokensTotal'), TOKENS)}</td>"
        f"<td>{bar(float(g.get('cost') or 0.0), b.get('maxCost'), '{:.4f}')}</td></tr>"
    )


def _kv(rows: Iterable[tuple[str, str]]) -> str:
    return '<table class="kv">' + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def used_text(used: float, limit: float | None, fmt: str) -> str:
    """``12 of 100 used, 88 left`` (or ``12 (no limit)``), escaped."""
    if not limit:
        return h(f"{fmt.format(used)} (no limit)")
    return h(f"{fmt.format(used)} of {fmt.format(limit)} used, {fmt.format(max(limit - used, 0))} left")


def actions(g: Mapping[str, Any], csrf: str, read_only: bool) -> str:
    """Pause, resume, cancel and send: forms that post with the CSRF token (none for a read-only token)."""
    if read_only:
        return '<p class="note">This token is read-only: it cannot pause, resume, cancel or send.</p>'
    gid = h(g.get("id"))
    status = str(g.get("status"))
    hidden = f'<input type="hidden" name="csrf" value="{h(csrf)}">'

    def button(action: str, enabled: bool) -> str:
        dis = "" if enabled else " disabled"
        return (
            f'<form method="post" action="/goals/{gid}/{action}" class="act">{hidden}'
            f'<button id="btn-{action}" name="do" value="{action}"{dis}>{action}</button></form>'
        )

    send = (
        f'<form method="post" action="/goals/{gid}/send" class="act send">{hidden}'
        '<input name="text" id="send-text" placeholder="a message to the goal\'s agent" required size=40>'
        '<label><input type="checkbox" name="resume" value="1"> and resume</label>'
        '<button id="btn-send">send</button></form>'
    )
    return (
        '<div class="actions" id="actions">'
        + button("pause", status == "active")
        + button("resume", status == "paused")
        + button("cancel", status in ("active", "paused"))
        + send
        + '<span id="action-result" class="result"></span></div>'
    )


def goal_page(
    d: Mapping[str, Any], timeline: str, *, csrf: str, read_only: bool, last_seq: int, flash: str | None = None
) -> str:
    """One goal: describe data, actions, burn-down chart, timeline."""
    g: Mapping[str, Any] = d.get("goal") or {}
    b = g.get("budgets") or {}
    act = d.get("activity") or {}
    gid = str(g.get("id"))
    prov = d.get("provider")
    model = h(g.get("model"))
    if prov:
        model += h(f"  (provider {prov.get('name')}: {breaker_words(prov.get('state'))})")
        if prov.get("lastError"):
            model += f'<br><span class="err">{h(str(prov["lastError"])[:300])}</span>'
    sched = d.get("schedule")
    sched_text = (
        h(f"{sched.get('key') or sched.get('id')}") + (" (removed since)" if sched.get("removed") else "")
        if sched
        else "none (created directly)"
    )
    verify = g.get("verify") or []
    last = g.get("lastVerification") or []
    results = "".join(
        f'<div class="verify {"good" if r.get("passed") else "bad"}">$ {h(r.get("cmd"))} → {h(exit_text(r))}'
        + (
            f"<pre>{h(_tail(r.get('outputTail') or r.get('output') or ''))}</pre>"
            if r.get("outputTail") or r.get("output")
            else ""
        )
        + "</div>"
        for r in last
    )
    why = d.get("lastError")
    until = f" until {h(when(act['until']))} ({h(age(act['until']))})" if act.get("until") else ""
    rows = [
        ("objective", f'<div class="objective">{h(g.get("objective"))}</div>'),
        ("status", f'<span id="goal-status" class="status st-{h(g.get("status"))}">{h(status_text(dict(g)))}</span>'),
        *([("why", f'<span class="err">{h(why)}</span>')] if why and g.get("status") != "active" else []),
        ("activity", f'<span id="goal-activity">{h(act.get("text"))}{until}</span>'),
        ("model", model),
        (
            "rounds",
            f'<span id="goal-rounds">{used_text(float(g.get("rounds") or 0), b.get("maxRounds"), TOKENS)}</span>',
        ),
        (
            "tokens",
            f'<span id="goal-tokens">{used_text(float(g.get("tokens") or 0), b.get("maxTokensTotal"), TOKENS)}</span>',
        ),
        ("cost", f'<span id="goal-cost">{used_text(float(g.get("cost") or 0.0), b.get("maxCost"), "{:.4f}")}</span>'),
        *(
            [("wall time", h(f"{span(g.get('wallUsed') or 0)} of {span(b['maxWallSeconds'])}"))]
            if b.get("maxWallSeconds")
            else []
        ),
        *([("deadline", h(f"{when(b['deadline'])} ({age(b['deadline'])})"))] if b.get("deadline") else []),
        ("work directory", f"<code>{h(g.get('workdir'))}</code>"),
        ("schedule", sched_text),
        ("verification", "<br>".join(f"<code>$ {h(v.get('cmd'))}</code>" for v in verify) or "none (unverified)"),
        *([("last verification", results)] if results else []),
        *([("result", h(g.get("resultSummary")))] if g.get("resultSummary") else []),
        ("created", h(f"{when(g.get('createdAt'))} ({age(g.get('createdAt'))})")),
        ("session", f"<code>{h(g.get('sessionId'))}</code>"),
    ]
    note = f'<p class="flash">{h(flash)}</p>' if flash else ""
    return (
        f'<article id="goal" data-goal="{h(gid)}" data-session="{h(g.get("sessionId"))}" data-last-seq="{last_seq}">'
        f"<h1>{h(g.get('title'))} <small>{h(g.get('key') or gid)}</small></h1>{note}"
        + actions(g, csrf, read_only)
        + _kv(rows)
        + '<h2>Burn-down</h2><figure class="chart">'
        f'<img id="burn" src="/goals/{h(gid)}/burn.svg" alt="tokens and cost left of the budget over time"'
        " width=720 height=240>"
        "</figure><h2>Timeline</h2>" + timeline + "</article>"
    )


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(str(text).splitlines()[-lines:])


def entry(e: Event) -> str:
    """One event as a timeline entry."""
    d = e.data
    cls = e.type.replace("/", "-")
    tone = ""
    if (e.type == "tool/result" and d.get("is_error")) or e.type == "model/error":
        tone = " bad"
    elif e.type == "goal/verified":
        tone = " good" if d.get("passed") else " bad"
    elif e.type == "turn/end" and d.get("reason") not in ("end_turn", None):
        tone = " warn"
    text = describe_event(e.type, d)
    if e.type == "model/error" and d.get("retrying"):
        text += " (retrying)"
    if e.type == "message/admitted" and "no progress" in json.dumps(d.get("content") or "")[:4000].lower():
        tone = " warn"
        text = "stall warning · " + text
    by = (
        who(d.get("source") or d)
        if e.type in ("message/queued", "message/admitted", "goal/changed", "goal/edited")
        else ""
    )
    by_html = f' <span class="by">by {h(by)}</span>' if by else ""
    return (
        f'<li class="ev {h(cls)}{tone}" data-seq="{e.seq}"><span class="seq">{e.seq}</span>'
        f'<time datetime="{h(e.at)}">{h(when(e.at))}</time> {h(text[:400])}{by_html}</li>'
    )


def band_summary(band: Band) -> str:
    """A band's one-line summary: what caused it, turns, tool calls and their outcome, errors, verification."""
    turns = sum(1 for e in band.events if e.type == "turn/start")
    tools = [e for e in band.events if e.type == "tool/result"]
    failed = sum(1 for e in tools if e.data.get("is_error"))
    errors = sum(1 for e in band.events if e.type == "model/error")
    parts = [band.label]
    if turns:
        parts.append(f"{turns} turn(s)")
    if tools:
        parts.append(f"{len(tools)} tool call(s)" + (f", {failed} failed" if failed else ""))
    if errors:
        parts.append(f"{errors} model error(s)")
    for e in band.events:
        if e.type == "goal/verified":
            parts.append("verification " + ("passed" if e.data.get("passed") else "refused"))
        elif e.type == "goal/changed":
            by = who(e.data)
            parts.append(
                f"→ {e.data.get('status')}"
                + (f" ({reason_text(e.data.get('reason'))})" if e.data.get("reason") else "")
                + (f" by {by}" if by else "")
            )
    if band.open:
        parts.append("running")
    return " · ".join(parts)


def band_html(gid: str, band: Band) -> str:
    """One band: its summary, entries, and a link to its conversation (loaded on demand)."""
    entries = "".join(entry(e) for e in band.events)
    conv = f"/goals/{h(gid)}/conversation?after={band.first_seq - 1}&upto={band.last_seq}"
    opened = " open" if band.open else ""
    return (
        f'<details class="band" data-first="{band.first_seq}" data-last="{band.last_seq}"'
        f' data-open="{"1" if band.open else "0"}"{opened}><summary>{h(band_summary(band))}</summary>'
        f'<ol class="entries">{entries}</ol><a class="conv" href="{conv}">the conversation</a>'
        '<div class="conv-body"></div></details>'
    )


def timeline_html(gid: str, page: TimelinePage) -> str:
    """A page of bands, and the link to the older ones."""
    bands = "".join(band_html(gid, b) for b in page.bands)
    older = (
        f'<a id="older" class="older" href="/goals/{h(gid)}/timeline?before={page.before}">older rounds</a>'
        if page.before is not None
        else '<p class="start">the start of the kept history</p>'
    )
    return f'<div class="bands">{bands}</div>{older}'


def timeline_section(gid: str, page: TimelinePage) -> str:
    """The timeline as it first appears on a goal's page."""
    empty = "" if page.bands else '<p class="empty">No events yet.</p>'
    return f'<section id="timeline">{empty}{timeline_html(gid, page)}</section>'


def conversation(events: list[Event]) -> str:
    """A band's conversation in full: messages, answers, tool calls with their input and results."""
    out = []
    for e in events:
        d = e.data
        if e.type == "message/admitted":
            out.append(f'<div class="msg user"><b>in</b> <pre>{h(_text(d.get("content")))}</pre></div>')
        elif e.type == "assistant/message":
            body = _text(d.get("content"))
            calls = "".join(
                f"<div class=call>calls <code>{h(c.get('name'))}</code>"
                f" <pre>{h(json.dumps(c.get('input'), indent=1)[:4000])}</pre></div>"
                for c in d.get("content") or []
                if isinstance(c, dict) and c.get("type") == "tool_use"
            )
            out.append(f'<div class="msg model"><b>model</b> <pre>{h(body)}</pre>{calls}</div>')
        elif e.type == "tool/result":
            tone = " bad" if d.get("is_error") else ""
            out.append(
                f'<div class="msg tool{tone}"><b>{h(d.get("name"))}</b>'
                f" <pre>{h(str(d.get('content') or '')[:4000])}</pre></div>"
            )
        elif e.type in ("model/error", "goal/verified", "goal/changed", "goal/claim", "goal/blocked", "goal/progress"):
            out.append(f'<div class="msg note">{h(describe_event(e.type, d))}</div>')
    return '<div class="conversation">' + ("".join(out) or "<p>No messages in this band.</p>") + "</div>"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text") or ""))
    return "\n".join(parts)[:8000]


def schedules_page(schedules: list[dict[str, Any]], runs: Mapping[str, list[dict[str, Any]]]) -> str:
    """Schedules: the next fire in the schedule's zone and relative, and the last runs with their goals."""
    if not schedules:
        return "<h1>Schedules</h1><p class=empty>No schedules.</p>"
    rows = []
    for s in schedules:
        nxt = s.get("nextFireAt")
        zone = str(s.get("timezone") or "UTC")
        try:
            local = (
                datetime.fromisoformat(str(nxt)).astimezone(ZoneInfo(zone)).isoformat(sep=" ", timespec="seconds")
                if nxt
                else None
            )
        except (ValueError, KeyError):
            local = str(nxt)
        trig = s.get("trigger") or {}
        trigger = (
            " ".join(f"{k}={v}" for k, v in trig.items() if v is not None) if isinstance(trig, dict) else str(trig)
        )
        last = "".join(
            f"<li><time>{h(when(r.get('scheduledFor')))}</time> {h(r.get('outcome'))} ({h(r.get('reason'))})"
            + (f' → <a href="/goals/{h(r["goalId"])}">{h(r["goalId"])}</a>' if r.get("goalId") else "")
            + "</li>"
            for r in runs.get(str(s.get("id")), [])
        )
        rows.append(
            f'<tr data-schedule="{h(s.get("id"))}"><td>{h(s.get("key") or s.get("id"))}</td>'
            f"<td><code>{h(trigger)}</code></td>"
            f"<td>{h(local)} {h(zone)}<br><small>{h(age(nxt) if nxt else 'never')}</small></td>"
            f"<td><ol class=runs>{last or '<li>none yet</li>'}</ol></td></tr>"
        )
    return (
        "<h1>Schedules</h1><table class=schedules><thead><tr><th>schedule</th><th>trigger</th>"
        "<th>next fire (its zone)</th><th>last runs</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def daemon_page(health: Mapping[str, Any], *, loop_lag: float, live_pages: int) -> str:
    """The daemon: version, uptime, providers with their breakers, slots, database size, loop lag,
    and every other field of its health."""
    providers = health.get("providers") or {}
    prov_rows = "".join(
        f"<tr><td>{h(name)}</td><td>{h(breaker_words(p.get('state')) if isinstance(p, dict) else p)}</td>"
        f"<td>{h(str(p.get('lastError') or '')[:300] if isinstance(p, dict) else '')}</td></tr>"
        for name, p in providers.items()
    )
    db = health.get("databaseBytes")
    main_rows = [
        ("status", h(health.get("status"))),
        ("version", h(health.get("version"))),
        ("uptime", h(span(float(health.get("uptimeSeconds") or 0)))),
        ("pid", h(health.get("pid"))),
        ("goals", h(", ".join(f"{k} {v}" for k, v in (health.get("goals") or {}).items()) or "none")),
        ("sessions running", h(health.get("sessionsRunning"))),
        ("turn slots", h(_slots(health))),
        (
            "database",
            h(f"{health.get('databasePath')} ({_bytes(db)})" if db is not None else health.get("databasePath")),
        ),
        ("event-loop lag", f'<span id="loop-lag">{loop_lag * 1000:.1f} ms</span> (the worst of the last minute)'),
        ("live pages", h(live_pages)),
    ]
    shown = {
        "status",
        "version",
        "uptimeSeconds",
        "pid",
        "goals",
        "sessionsRunning",
        "providers",
        "databaseBytes",
        "databasePath",
    }
    rest = [(h(k), f"<code>{h(json.dumps(v, default=str)[:300])}</code>") for k, v in health.items() if k not in shown]
    return (
        "<h1>Daemon</h1>"
        + _kv(main_rows)
        + "<h2>Providers</h2>"
        + (
            "<table class=providers><thead><tr><th>provider</th><th>breaker</th><th>last error</th></tr></thead>"
            f"<tbody>{prov_rows}</tbody></table>"
            if prov_rows
            else "<p class=empty>No provider has been used yet.</p>"
        )
        + "<h2>Everything else</h2>"
        + _kv(rest)
    )


def _slots(health: Mapping[str, Any]) -> str:
    slots = health.get("slots") or health.get("turnSlots")
    if isinstance(slots, dict):
        return ", ".join(f"{k} {v}" for k, v in slots.items())
    return f"{health.get('sessionsRunning', '-')} running"


def _bytes(n: Any) -> str:
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


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
