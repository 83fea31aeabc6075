"""A goal's timeline as HTML: each event an entry, each band (see :mod:`daemon.web.timeline`) with
its one-line summary, paged by a link to the older bands, and a band's conversation in full."""

from __future__ import annotations

import json
from typing import Any

from agent import Event
from daemon.display import describe_event, reason_text, when, who
from daemon.web.html import h
from daemon.web.timeline import Band, TimelinePage


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
