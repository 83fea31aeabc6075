"""``goald goal show``: the lines of a ``goal/describe`` answer (its goal read as a :class:`GoalView`).

Every reason arrives as the daemon knows it (``why``, ``activity``, the provider's state); the
settings that differ from their defaults get a line each, named as on the wire, so a field added to
:class:`goals.GoalSpec` is shown with no edit here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic_core import to_jsonable_python

from daemon.display import age, describe_event, exit_text, provider_words, status_text, when, when_age, window_text
from daemon.rpc.views import GoalView
from goals.model import GoalSpec
from goals.why import span


def _used(used: float, limit: float | None, fmt: str) -> str:
    if limit is None:
        return f"{fmt.format(used)} (no limit)"
    return f"{fmt.format(used)} of {fmt.format(limit)} used, {fmt.format(max(limit - used, 0))} left"


def infra_lines(g: GoalView) -> list[str]:
    """The infrastructure's share of a goal, apart from its rounds and tokens (when there is any)."""
    out = []
    if g.infra_rounds or g.infra_streak:
        out.append(
            f"retries:    {g.infra_rounds} round(s) cut short by infrastructure trouble, run again, not counted"
            f" ({g.infra_streak} in a row, limit {g.rules.infra_retries})"
        )
    if g.interrupted_tokens:
        out.append(f"interrupted: {g.interrupted_tokens:,} tokens charged for interrupted calls (in the tokens above)")
    return out


def describe_lines(d: dict[str, Any]) -> list[str]:
    """The ``goald goal show`` view of a ``goal/describe`` answer (its goal read as a :class:`GoalView`)."""
    wire = d["goal"]
    g = GoalView.model_validate(wire)
    b = g.budgets
    out = [f"goal:       {g.id}" + (f"  (key {g.key})" if g.key else "")]
    out.append(f"title:      {g.title}")
    out.append(f"objective:  {g.objective}")
    out.append(f"status:     {status_text(wire)}")
    why = d.get("why", g.why)
    if why:
        out.append(f"why:        {why}")
    act = d.get("activity") or {}
    until = f" until {when(act['until'])} ({age(act['until'])})" if act.get("until") else ""
    out.append(f"activity:   {act.get('text', '-')}{until}")
    model = f"model:      {g.model or '-'}"
    prov = d.get("provider")
    if prov:
        model += f"  (provider {prov['name']}: {provider_words(prov)})"
    out.append(model)
    window = d.get("window")
    if window:
        out.append(f"window:     {window_text(window)}")
    out.append(f"rounds:     {_used(g.rounds, b.max_rounds, '{:,.0f}')}")
    out.append(f"tokens:     {_used(g.tokens, b.max_tokens_total, '{:,.0f}')}")
    out.extend(infra_lines(g))
    out.append(f"cost:       {_used(g.cost, b.max_cost, '{:.4f}')}")
    if b.max_wall_seconds is not None:
        out.append(f"wall time:  {span(g.wall_used)} of {span(b.max_wall_seconds)}")
    if b.deadline:
        out.append(f"deadline:   {when_age(b.deadline)}")
    out.append(f"created:    {when_age(g.created_at)}")
    out.append(f"updated:    {when_age(g.updated_at)}")
    out.append(f"workdir:    {g.workdir or '-'}")
    out.append(f"session:    {g.session_id}")
    if g.node_label:
        out.append(f"node label: {g.node_label} (only a node with this label runs it)")
    sched = d.get("schedule")
    if sched:
        key = f" (key {sched['key']})" if sched.get("key") else ""
        out.append(f"schedule:   {sched['id']}{key}" + (" (removed since)" if sched.get("removed") else ""))
    else:
        out.append("schedule:   none (created directly)")
    out.append("verify:     " + ("; ".join(f"$ {v.cmd}" for v in g.verify) if g.verify else "none (unverified)"))
    out.extend(setting_lines(wire))
    if g.repo and g.branch:
        ref = g.key or g.id
        out.append(
            f"base:       {g.base_commit or '-'} (the commit the branch started from; diff: goald goal diff {ref})"
        )
        out.append(f"merge:      goald goal commit {ref}, then git -C {g.repo} merge {g.branch}")
    refused = d.get("refusedVerification") or []
    if refused:
        out.append("last verification refused the completion claim:")
        for r in refused:
            out.append(f"  $ {r['cmd']} -> {exit_text(r)}")
            tail = [line for line in str(r.get("outputTail") or "").splitlines() if line.strip()][-5:]
            out.extend(f"    | {line[:200]}" for line in tail)
    if g.result_summary:
        out.append(f"result:     {g.result_summary}")
    events = d.get("events") or []
    out.append(f"last {len(events)} event(s):" if events else "events:     none")
    for ev in events:
        out.append(f"  [{ev['seq']:>5}] {when(ev['at'])} {describe_event(ev['type'], ev['data'])}")
    return out


#: The spec's fields ``goal show`` gives lines of their own (or, the idempotency key, leaves out:
#: the schedule line says where a goal came from).
_OWN_LINES = frozenset(
    {"objective", "title", "key", "budgets", "verify", "model", "workdir", "sessionId", "nodeLabel", "idempotencyKey"}
)


def setting_lines(g: Mapping[str, Any]) -> list[str]:
    """A line for each other field of the goal's spec (:class:`goals.GoalSpec`) that differs from
    its default, named as on the wire: ``tools``, ``rules``, ``progress``, ``sandbox``,
    ``keepWorkdir``, and any field added to the spec later, with no edit here. Of an object, only
    the entries that differ from the default are shown."""
    out = []
    for name, field in GoalSpec.model_fields.items():
        wire = field.alias or name
        if wire in _OWN_LINES or wire not in g:
            continue
        value = g[wire]
        default = to_jsonable_python(field.get_default(call_default_factory=True), by_alias=True)
        if isinstance(value, dict) and isinstance(default, dict):
            value = {k: v for k, v in value.items() if default.get(k, not v) != v} or None
            default = None
        if value == default:
            continue
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        out.append(f"{wire + ':':<11} {text}")
    return out


__all__ = ["describe_lines", "infra_lines", "setting_lines"]
