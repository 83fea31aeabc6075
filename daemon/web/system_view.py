"""The schedules page (next fires, last runs) and the daemon page (its health, every field)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from daemon.display import provider_words, when
from daemon.web.html import h, kv, rel
from goals.why import span


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
            f"<td>{h(local)} {h(zone)}<br><small>{rel(nxt) if nxt else 'never'}</small></td>"
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
        f"<tr><td>{h(name)}</td><td>{h(provider_words(p) if isinstance(p, dict) else p)}</td>"
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
        "slots",
        "providers",
        "databaseBytes",
        "databasePath",
    }
    rest = [(h(k), h(plain(v)[:300])) for k, v in health.items() if k not in shown]
    return (
        "<h1>Daemon</h1>"
        + kv(main_rows)
        + "<h2>Providers</h2>"
        + (
            "<table class=providers><thead><tr><th>provider</th><th>breaker</th><th>last error</th></tr></thead>"
            f"<tbody>{prov_rows}</tbody></table>"
            if prov_rows
            else "<p class=empty>No provider has been used yet.</p>"
        )
        + "<h2>Everything else</h2>"
        + kv(rest)
    )


def plain(value: Any) -> str:
    """A health field in plain words, never raw JSON: ``none`` for null, ``yes``/``no`` for a
    boolean, ``key: value`` pairs for an object (``{"ok": true}`` reads ``ok: yes``), a list comma
    separated."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {plain(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list | tuple):
        return ", ".join(plain(v) for v in value) or "none"
    return str(value)


def _slots(health: Mapping[str, Any]) -> str:
    slots = health.get("slots")
    if isinstance(slots, dict) and {"max", "inUse", "waiting"} <= slots.keys():
        return f"{slots['inUse']} of {slots['max']} in use, {slots['waiting']} turn(s) waiting for one"
    return f"{health.get('sessionsRunning', '-')} running"


def _bytes(n: Any) -> str:
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
