"""A goal's timeline as HTML, from ``goal/timeline``'s answer: each event an entry, each band
(see :mod:`daemon.rpc.timeline`) with its one-line summary and the link to its conversation, paged
by a link to the older bands, and a band's conversation in full.

The live page renders with the same functions: a band it adds or changes is :func:`band_html`
of the same fold (:class:`~daemon.rpc.timeline.BandFold`), so it reads as it would after a reload.
Events arrive as the protocol shows them (``{seq, type, data, at}``, ``data`` as stored) and are
read through their typed payloads (a stored ``isError`` is the payload's ``is_error``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent import ToolResult, parse_payload
from daemon.display import describe_event, when, who
from daemon.web.html import h


def failed_tool(kind: str, data: dict[str, Any]) -> bool:
    """Whether an event is a tool call that failed (read through the typed payload)."""
    if kind != "tool/result":
        return False
    payload = parse_payload(kind, data)
    return isinstance(payload, ToolResult) and payload.is_error


def entry(ev: Mapping[str, Any]) -> str:
    """One event (``{seq, type, data, at}``) as a timeline entry."""
    kind, d = str(ev.get("type")), dict(ev.get("data") or {})
    cls = kind.replace("/", "-")
    tone = ""
    text = describe_event(kind, d)
    if failed_tool(kind, d):
        tone = " bad failed"
        text = "failed · " + text
    elif kind == "model/error":
        tone = " bad"
    elif kind == "goal/verified":
        tone = " good" if d.get("passed") else " bad"
    elif kind == "turn/end" and d.get("reason") not in ("end_turn", None):
        tone = " warn"
    if kind == "model/error" and d.get("retrying"):
        text += " (retrying)"
    if kind == "message/admitted" and "no progress" in json.dumps(d.get("content") or "")[:4000].lower():
        tone = " warn"
        text = "stall warning · " + text
    by = (
        who(d.get("source") or d)
        if kind in ("message/queued", "message/admitted", "goal/changed", "goal/edited")
        else ""
    )
    by_html = f' <span class="by">by {h(by)}</span>' if by else ""
    at = ev.get("at")
    return (
        f'<li class="ev {h(cls)}{tone}" data-seq="{h(ev.get("seq"))}"><span class="seq">{h(ev.get("seq"))}</span>'
        f'<time datetime="{h(at)}">{h(when(at))}</time> {h(text[:400])}{by_html}</li>'
    )


def band_html(gid: str, band: Mapping[str, Any], *, expand: bool = False, diffs: bool = False) -> str:
    """One band (as ``goal/timeline`` answers it): its summary, entries, and a link to its
    conversation (loaded on demand); shown expanded while it runs, or with ``expand``. Without
    ``events`` it is the band's frame the live page adds or updates."""
    entries = "".join(entry(e) for e in band.get("events") or [])
    first, last = int(band["firstSeq"]), int(band["lastSeq"])
    conv = f"/goals/{h(gid)}/conversation?after={first - 1}&upto={last}"
    running = bool(band.get("open"))
    changed = ""
    if diffs and band.get("round") and not running:  # a goal on a repository: what this round changed
        changed = f' · <a class="diff" href="/goals/{h(gid)}/diff?round={int(band["round"])}">what it changed</a>'
    return (
        f'<details class="band" data-first="{first}" data-last="{last}"'
        f' data-open="{"1" if running else "0"}"{" open" if running or expand else ""}>'
        f"<summary>{h(band.get('summary'))}</summary>"
        f'<ol class="entries">{entries}</ol><a class="conv" href="{conv}">the conversation</a>{changed}'
        '<div class="conv-body"></div></details>'
    )


def timeline_html(gid: str, page: Mapping[str, Any], *, newest: bool = False, diffs: bool = False) -> str:
    """A page of bands (``goal/timeline``'s answer), and the link to the older ones; with
    ``newest`` (the goal page's first page) the newest band is shown expanded; with ``diffs`` (a
    goal on a repository) each round's band links to what that round changed."""
    bands = "".join(
        band_html(gid, b, expand=newest and i == 0, diffs=diffs) for i, b in enumerate(page.get("bands") or [])
    )
    before = page.get("before")
    older = (
        f'<a id="older" class="older" href="/goals/{h(gid)}/timeline?before={h(before)}">older rounds</a>'
        if before is not None
        else '<p class="start">the start of the kept history</p>'
    )
    return f'<div class="bands">{bands}</div>{older}'


def timeline_section(gid: str, page: Mapping[str, Any], *, diffs: bool = False) -> str:
    """The timeline as it first appears on a goal's page."""
    empty = "" if page.get("bands") else '<p class="empty">No events yet.</p>'
    return f'<section id="timeline">{empty}{timeline_html(gid, page, newest=True, diffs=diffs)}</section>'


def conversation(events: list[Mapping[str, Any]]) -> str:
    """A band's conversation in full: messages, answers, tool calls with their input and results."""
    out = []
    for ev in events:
        kind, d = str(ev.get("type")), dict(ev.get("data") or {})
        if kind == "message/admitted":
            out.append(f'<div class="msg user"><b>in</b> <pre>{h(_text(d.get("content")))}</pre></div>')
        elif kind == "assistant/message":
            body = _text(d.get("content"))
            calls = "".join(
                f"<div class=call>calls <code>{h(c.get('name'))}</code>"
                f" <pre>{h(json.dumps(c.get('input'), indent=1)[:4000])}</pre></div>"
                for c in d.get("content") or []
                if isinstance(c, dict) and c.get("type") == "tool_use"
            )
            out.append(f'<div class="msg model"><b>model</b> <pre>{h(body)}</pre>{calls}</div>')
        elif kind == "tool/result":
            failed = failed_tool(kind, d)
            out.append(
                f'<div class="msg tool{" bad failed" if failed else ""}"><b>{h(d.get("name"))}</b>'
                + (" <span class=failed>failed</span>" if failed else "")
                + f" <pre>{h(str(d.get('content') or '')[:4000])}</pre></div>"
            )
        elif kind in ("model/error", "goal/verified", "goal/changed", "goal/claim", "goal/blocked", "goal/progress"):
            out.append(f'<div class="msg note">{h(describe_event(kind, d))}</div>')
    return '<div class="conversation">' + ("".join(out) or "<p>No messages in this band.</p>") + "</div>"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text") or ""))
    return "\n".join(parts)[:8000]
