"""One goal's page: what ``goal/describe`` says, the action forms, the burn-down chart and the
timeline (rendered by :mod:`daemon.web.timeline_view`).

Its "why" is the describe answer's (:func:`goals.why.why`, the one source every view shows), kept
current by the live page with the status; rounds re-run for the infrastructure's trouble and the
tokens charged for interrupted calls are shown apart from the rounds and tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from daemon.display import exit_text, provider_words, status_text, when
from daemon.rpc.views import GoalView
from daemon.web.html import TOKENS, h, kv, rel, used_text
from daemon.web.questions_view import question_block
from goals.why import span


def actions(g: GoalView, csrf: str, read_only: bool) -> str:
    """Pause, resume, cancel and send: forms that post with the CSRF token (none for a read-only token)."""
    if read_only:
        return '<p class="note">This token is read-only: it cannot pause, resume, cancel or send.</p>'
    gid = h(g.id)
    status = g.status.value
    hidden = f'<input type="hidden" name="csrf" value="{h(csrf)}">'

    def button(action: str, enabled: bool) -> str:
        dis = "" if enabled else " disabled"
        return (
            f'<form method="post" action="/goals/{gid}/{action}" class="act">{hidden}'
            f'<button id="btn-{action}" name="do" value="{action}"{dis}>{action}</button></form>'
        )

    # A message runs on a live goal (a paused one may be resumed with it); an ended goal's session
    # refuses one (-32002), so the page offers none (``goald send --reopen`` resumes it first).
    live = status in ("active", "paused", "waiting")
    resume = '<label id="send-resume"><input type="checkbox" name="resume" value="1"> and resume</label>'
    send = (
        f'<form method="post" action="/goals/{gid}/send" class="act send" id="send-form">{hidden}'
        '<input name="text" id="send-text" placeholder="a message to the goal\'s agent" required size=40>'
        + (resume if status == "paused" else "")
        + '<button id="btn-send">send</button></form>'
        if live
        else f'<span class="note" id="send-none">{h(status)}: the goal takes no message</span>'
    )
    return (
        '<div class="actions" id="actions">'
        + button("pause", status == "active")
        + button("resume", status == "paused")
        + button("cancel", status in ("active", "paused", "waiting"))
        + send
        + '<span id="action-result" class="result"></span></div>'
    )


def goal_page(
    d: Mapping[str, Any], timeline: str, *, csrf: str, read_only: bool, last_seq: int, flash: str | None = None
) -> str:
    """One goal: describe data, actions, burn-down chart, timeline."""
    g = GoalView.model_validate(d["goal"])
    gid = str(g.id)
    note = f'<p class="flash">{h(flash)}</p>' if flash else ""
    budget = bool(g.budgets.max_tokens_total or g.budgets.max_cost)
    chart = "Burn-down" if budget else "Usage (no budget)"
    alt = "tokens and cost left of the budget over time" if budget else "tokens and cost used over time"
    return (
        f'<article id="goal" data-goal="{h(gid)}" data-session="{h(g.session_id)}" data-last-seq="{last_seq}">'
        f"<h1>{h(g.title)} <small>{h(g.key or gid)}</small></h1>{note}"
        + actions(g, csrf, read_only)
        + question_block(d.get("question"), gid, csrf, read_only)
        + kv(describe_rows(d, g))
        + f"<h2>{chart}</h2>"
        + '<figure class="chart">'
        f'<img id="burn" src="/goals/{h(gid)}/burn.svg" alt="{alt}"'
        " width=720 height=240>"
        "</figure><h2>Timeline</h2>" + timeline + "</article>"
    )


def describe_rows(d: Mapping[str, Any], g: GoalView | None = None) -> list[tuple[str, str]]:
    """The goal's facts as (heading, HTML) rows: what ``goald goal describe`` shows (``g``: its goal,
    read as a :class:`GoalView`, if the caller has read it already)."""
    g = g if g is not None else GoalView.model_validate(d["goal"])
    act = d.get("activity") or {}
    results = _verification_results(g.last_verification)
    why = d.get("why") or g.why
    until = f" until {h(when(act['until']))} ({rel(act['until'])})" if act.get("until") else ""
    return [
        ("objective", f'<div class="objective">{h(g.objective)}</div>'),
        ("status", f'<span id="goal-status" class="status st-{h(g.status.value)}">{h(status_text(d["goal"]))}</span>'),
        ("why", f'<span id="goal-why" class="err">{h(why or "-")}</span>'),
        ("activity", f'<span id="goal-activity">{h(act.get("text"))}{until}</span>'),
        ("model", _model_cell(g, d.get("provider"))),
        *_budget_rows(g),
        ("work directory", f"<code>{h(g.workdir)}</code>"),
        ("schedule", _schedule_cell(d.get("schedule"))),
        ("verification", "<br>".join(f"<code>$ {h(v.cmd)}</code>" for v in g.verify) or "none (unverified)"),
        *([("last verification", results)] if results else []),
        *([("result", h(g.result_summary))] if g.result_summary else []),
        ("created", f"{h(when(g.created_at))} ({rel(g.created_at)})"),
        ("session", f"<code>{h(g.session_id)}</code>"),
        *([("node", _node_text(d.get("node"), g.status.value))] if "node" in d else []),
    ]


def _node_text(node: str | None, status: str) -> str:
    """The node that drives the goal's session (a cluster's lease holder), or why none does."""
    if node:
        return f'<span id="goal-node">{h(node)}</span>'
    why = "none now: a node with room takes it at its next heartbeat" if status == "active" else "none"
    return f'<span id="goal-node">{h(why)}</span>'


def _budget_rows(g: GoalView) -> list[tuple[str, str]]:
    """Rounds, tokens and cost used of their budgets; wall time and deadline when the goal has them."""
    b = g.budgets
    return [
        ("rounds", f'<span id="goal-rounds">{used_text(float(g.rounds), b.max_rounds, TOKENS)}</span>'),
        ("tokens", f'<span id="goal-tokens">{used_text(float(g.tokens), b.max_tokens_total, TOKENS)}</span>'),
        ("cost", f'<span id="goal-cost">{used_text(float(g.cost), b.max_cost, "{:.4f}")}</span>'),
        *([("wall time", h(f"{span(g.wall_used)} of {span(b.max_wall_seconds)}"))] if b.max_wall_seconds else []),
        *([("deadline", f"{h(when(b.deadline))} ({rel(b.deadline)})")] if b.deadline else []),
        *_infra_rows(g),
    ]


def _infra_rows(g: GoalView) -> list[tuple[str, str]]:
    """The infrastructure's share, apart: rounds re-run (not counted) and tokens charged for
    interrupted calls (in the tokens above), when there are any."""
    rows = []
    if g.infra_rounds or g.infra_streak:
        text = (
            f"{g.infra_rounds} round(s) cut short, run again, not counted"
            f" ({g.infra_streak} in a row, limit {g.rules.infra_retries})"
        )
        rows.append(("infra retries", f'<span id="goal-infra">{h(text)}</span>'))
    if g.interrupted_tokens:
        rows.append(
            ("interrupted calls", h(f"{g.interrupted_tokens:,} tokens charged for interrupted calls (in the tokens)"))
        )
    return rows


def _model_cell(g: GoalView, prov: Mapping[str, Any] | None) -> str:
    """The model, with its provider's state (``ok``, ``failing (N in a row, last: ...)``, ``open``)."""
    model = h(g.model)
    if prov:
        model += h(f"  (provider {prov.get('name')}: {provider_words(prov)})")
    return model


def _schedule_cell(sched: Mapping[str, Any] | None) -> str:
    if not sched:
        return "none (created directly)"
    return h(f"{sched.get('key') or sched.get('id')}") + (" (removed since)" if sched.get("removed") else "")


def _verification_results(last: list[dict[str, Any]]) -> str:
    """The last verification's commands, each with its exit and the tail of its output."""
    return "".join(
        f'<div class="verify {"good" if _passed(r) else "bad"}">$ {h(r.get("cmd"))} → {h(exit_text(r))}'
        + (
            f"<pre>{h(_tail(r.get('outputTail') or r.get('output') or ''))}</pre>"
            if r.get("outputTail") or r.get("output")
            else ""
        )
        + "</div>"
        for r in last
    )


def _passed(r: Mapping[str, Any]) -> bool:
    """Whether a verification result passed (exit 0 in time): the view carries the fields, not ``passed``."""
    if "passed" in r:
        return bool(r["passed"])
    code = r.get("exitCode", r.get("exit_code"))
    return code == 0 and not (r.get("timedOut") or r.get("timed_out"))


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(str(text).splitlines()[-lines:])
