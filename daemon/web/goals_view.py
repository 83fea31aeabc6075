"""The goals table: sorted by what needs a person first, filtered, paged; one row per goal
(re-rendered alone by the table's live stream)."""

from __future__ import annotations

from urllib.parse import urlencode

from daemon.rpc.views import GoalView
from daemon.web.html import TOKENS, bar, h, rel, status_cell

#: The order a goals table is sorted in: what needs a person first.
ATTENTION = {"waiting": 0, "failed": 1, "paused": 2, "exhausted": 3, "active": 4, "completed": 5, "cancelled": 6}
STATUSES = ("active", "waiting", "paused", "completed", "failed", "cancelled", "exhausted")


def attention_order(goals: list[GoalView]) -> list[GoalView]:
    """Paused, failed and exhausted goals first, then the active ones; most recently moved first within each."""
    by_time = sorted(goals, key=lambda g: g.updated_at, reverse=True)
    return sorted(by_time, key=lambda g: ATTENTION.get(g.status.value, 9))


def goals_page(
    goals: list[GoalView], *, status: str | None, schedule: str | None, page: int, per_page: int, total: int
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
    # In a cluster each goal carries its ``node`` (who drives it): one more column.
    nodes = ("node",) if any(g.in_cluster for g in goals) else ()
    head = "".join(
        f"<th>{c}</th>"
        for c in ("status", "key", "title", "model", *nodes, "round", "age", "last activity", "tokens", "cost")
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


def goal_row(g: GoalView) -> str:
    """One row of the goals table."""
    b = g.budgets
    rounds = f"{g.rounds}" + (f" / {b.max_rounds}" if b.max_rounds else "")
    return (
        f'<tr data-goal="{h(g.id)}" data-status="{h(g.status.value)}">'
        f"<td>{status_cell(g)}</td><td>{h(g.key)}</td>"
        f'<td><a href="/goals/{h(g.id)}">{h(g.title)}</a></td><td>{h(g.model)}</td>'
        f"{_node_cell(g)}<td>{h(rounds)}</td><td>{rel(g.created_at)}</td><td>{rel(g.updated_at)}</td>"
        f"<td>{bar(float(g.tokens), b.max_tokens_total, TOKENS)}</td>"
        f"<td>{bar(g.cost, b.max_cost, '{:.4f}')}</td></tr>"
    )


def _node_cell(g: GoalView) -> str:
    """The node that drives the goal's session, in a cluster (no cell otherwise); "-" when none holds it now."""
    if not g.in_cluster:
        return ""
    return f'<td class="node">{h(g.node or "-")}</td>'
