"""What a goal is doing now, and why it stopped: the ``goal/describe`` answer.

Everything here is read, nothing is written. The activity of an active goal is derived from
state the daemon already keeps, in this order: its session's open turn (a turn is running; if
its provider's circuit is open, the turn is waiting for the provider), a session that is running
with no turn open (its turn waits for a slot when every slot is taken, else it is starting), the
goal's ``not_before`` (a backoff after a model error, or a retry of a failed evaluation), a goal
the engine holds back (the disk holding the store is under its watermark: ``waiting_disk``, with
the figures), and otherwise an idle session whose next round is being decided.

The last error is the goal's remembered model error, else the last turn that ended with an error
among the session's recent events (a spend guard's refusal such as "cost budget set but the model
has no price" is only there): the reason of an ``exhausted`` or ``paused`` goal in plain words.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agent import AgentStatus, Event, EventType
from daemon.ports import HostPort
from daemon.rpc.context import runtime, scheduler
from daemon.rpc.views import JsonObject, event_view, goal_view, verify_view
from goals import Goal, GoalStatus, schedule_of

#: How far back the last error of a turn is looked for.
ERROR_LOOKBACK = 500


async def describe(host: HostPort, goal: Goal, n_events: int = 10) -> JsonObject:
    """The goal, its activity, last error, refused verification, schedule and latest events."""
    rt = runtime(host)
    st = await rt.store.session_state(goal.session_id)
    back = max(n_events, ERROR_LOOKBACK)
    recent = await rt.store.events_after(goal.session_id, max(0, st.last_seq - back), limit=back)
    raw = (await host.health()).get("providers")
    providers: dict[str, Any] = raw if isinstance(raw, dict) else {}
    provider_name = (goal.model or "").partition(":")[0]
    provider = providers.get(provider_name)
    failed = [r for r in goal.memory.verify_results if not r.passed]
    return {
        "goal": goal_view(goal),
        "activity": await _activity(host, goal, provider),
        "lastError": goal.memory.last_error or _last_turn_error(recent),
        "refusedVerification": [verify_view(r) for r in failed] or None,
        "provider": {"name": provider_name, "state": provider.get("state"), "lastError": provider.get("lastError")}
        if provider is not None
        else None,
        "schedule": await _schedule(host, goal),
        "events": [{"seq": e.seq, **event_view(e)} for e in recent[-n_events:]] if n_events else [],
    }


def _last_turn_error(events: list[Event]) -> str | None:
    for e in reversed(events):
        if e.type == EventType.TURN_END and e.data.get("error"):
            return str(e.data["error"])
    return None


async def _schedule(host: HostPort, goal: Goal) -> JsonObject | None:
    sid = schedule_of(goal)
    if sid is None:
        return None
    try:
        sched = await scheduler(host).get(sid)
    except LookupError:
        return {"id": sid, "key": None, "removed": True}
    return {"id": sched.id, "key": sched.key, "removed": False}


def _at(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


async def _activity(host: HostPort, goal: Goal, provider: dict[str, Any] | None) -> JsonObject:
    """``state`` (a word), ``text`` (plain words) and ``until`` (when the wait ends, if known)."""
    round_no = goal.continuation_round or goal.rounds + 1
    match goal.status:
        case GoalStatus.PAUSED:
            return {"state": "paused", "text": "nothing runs until it is resumed", "until": None, "round": None}
        case GoalStatus.ACTIVE:
            pass
        case _:
            return {"state": "ended", "text": "nothing runs", "until": None, "round": None}
    rt = runtime(host)
    st = await rt.store.session_state(goal.session_id)
    now = datetime.now(UTC)
    if st.open_turn is not None:
        if provider is not None and provider.get("state") in ("open", "half_open"):
            breaker = provider.get("breaker") or {}
            retry = breaker.get("retryIn")
            until = _at(now + _seconds(retry)) if retry is not None else None
            text = f"round {round_no}: a turn waits for provider {provider.get('provider')} (its circuit is open)"
            return {"state": "waiting_provider", "text": text, "until": until, "round": round_no}
        text = f"round {round_no}: a turn is running"
        return {"state": "turn_running", "text": text, "until": None, "round": round_no}
    if st.status is AgentStatus.RUNNING:
        busy = 0
        for sid in rt.live_agents:
            if (await rt.store.session_state(sid)).open_turn is not None:
                busy += 1
        slots = host.settings.max_concurrent_turns
        if busy >= slots:
            text = f"round {round_no}: waiting for a turn slot (all {slots} in use)"
            return {"state": "waiting_slot", "text": text, "until": None, "round": round_no}
        return {"state": "starting", "text": f"round {round_no}: a turn is starting", "until": None, "round": round_no}
    if goal.not_before is not None and goal.not_before > now:
        text = f"backing off before round {round_no} (after a model error or a failed evaluation)"
        return {"state": "backoff", "text": text, "until": _at(goal.not_before), "round": round_no}
    held = host.engine.held.get(goal.id) if host.engine is not None else None
    if held is not None:
        text = f"waiting before round {round_no} until space is back: {held}"
        return {"state": "waiting_disk", "text": text, "until": None, "round": round_no}
    return {"state": "deciding", "text": f"deciding round {round_no}", "until": None, "round": round_no}


def _seconds(value: Any) -> timedelta:
    return timedelta(seconds=float(value))
