"""What a goal is doing now, and why it stands where it stands: the ``goal/describe`` answer and the
activity ``goal/list`` shows with each goal.

Everything here is read, nothing is written. The activity of an active goal is derived from
state the daemon already keeps (:func:`activity_of`, a pure function of it), in this order: its
session's open turn (a turn is running; if its provider's circuit is open, or its calls are
failing, the turn is waiting for the provider), a session that is running with no turn open (its
turn waits for a slot when every slot is taken, else it is starting), the goal's ``not_before``
(waiting for the provider before a round is run again, or a backoff after a model error or a
failed evaluation: the goal's ``memory.cause`` says which), a goal the engine holds back (the disk
holding the store is under its watermark: ``waiting_disk``, with the figures), and otherwise an
idle session whose next round is being decided.

In a cluster the answer (and each goal of ``goal/list``) also names the ``node`` whose lease holds
the goal's session (``None``: none holds it now); on SQLite there is no ``node`` key.

Why a goal stands where it stands is :func:`goals.why.why` (``why`` of the goal view and of this
answer): derived from its current status and the event that caused it, never from the last error
seen, so the reason of a goal that moved on is gone here as it is everywhere.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agent import AgentStatus, Event, SessionState
from daemon.cluster import LeaseManager
from daemon.ports import HostPort
from daemon.rpc.context import engine, runtime, scheduler
from daemon.rpc.views import JsonObject, event_view, goal_view, verify_view
from goals import Goal, GoalStatus, schedule_of
from goals.why import WAIT_INTERRUPTED, WAIT_PROVIDER


async def describe(host: HostPort, goal: Goal, n_events: int = 10) -> JsonObject:
    """The goal, its activity and why, refused verification, schedule and latest events."""
    rt = runtime(host)
    st = await rt.store.session_state(goal.session_id)
    recent = (
        await rt.store.events_after(goal.session_id, max(0, st.last_seq - n_events), limit=n_events) if n_events else []
    )
    health = await host.health()
    provider = provider_of(goal, health)
    now = datetime.now(UTC)
    activity = activity_of(goal, st, provider, slots=_slots(health), held=_held(host, goal), now=now)
    answer = describe_answer(goal, activity, provider, await _schedule(host, goal), recent, now)
    asked = goal.memory.question
    answer["question"] = (await engine(host).question(asked.id)).public() if asked is not None else None
    held = await nodes(host, [goal])
    if held is not None:
        answer["node"] = held[goal.id]
    return answer


async def nodes(host: HostPort, goals: list[Goal]) -> dict[str, str | None] | None:
    """In a cluster, the name of the node whose lease holds each goal's session, by goal id
    (``None``: no node holds it now); on SQLite ``None`` (there are no nodes)."""
    leases = runtime(host).leases
    if not isinstance(leases, LeaseManager):
        return None
    held = await leases.holders([g.session_id for g in goals]) if goals else {}
    return {g.id: held.get(g.session_id) for g in goals}


def describe_answer(
    goal: Goal,
    activity: JsonObject,
    provider: dict[str, Any] | None,
    schedule: JsonObject | None,
    events: list[Event],
    now: datetime,
) -> JsonObject:
    """The ``goal/describe`` answer from what :func:`describe` read (pure)."""
    view = goal_view(goal, now)
    failed = [r for r in goal.memory.verify_results if not r.passed]
    return {
        "goal": view,
        "why": view["why"],
        "activity": activity,
        "refusedVerification": [verify_view(r) for r in failed] or None,
        "provider": {"name": provider.get("provider"), "state": provider.get("state"), **_failing(provider)}
        if provider is not None
        else None,
        "window": window_of(goal, provider),
        "schedule": schedule,
        "events": [{"seq": e.seq, **event_view(e)} for e in events],
    }


async def activities(host: HostPort, goals: list[Goal]) -> dict[str, JsonObject]:
    """Each goal's activity, by goal id (``goal/list``): one health read, one state read per active goal."""
    rt = runtime(host)
    health = await host.health()
    now = datetime.now(UTC)
    out: dict[str, JsonObject] = {}
    for goal in goals:
        st = await rt.store.session_state(goal.session_id) if goal.status is GoalStatus.ACTIVE else None
        held = _held(host, goal)
        out[goal.id] = activity_of(goal, st, provider_of(goal, health), slots=_slots(health), held=held, now=now)
    return out


def provider_of(goal: Goal, health: dict[str, Any]) -> dict[str, Any] | None:
    """The health snapshot of ``goal``'s provider (``None``: a scripted or unknown one)."""
    providers = health.get("providers")
    if not isinstance(providers, dict):
        return None
    found = providers.get((goal.model or "").partition(":")[0])
    return found if isinstance(found, dict) else None


def window_of(goal: Goal, provider: dict[str, Any] | None) -> dict[str, Any] | None:
    """The context window of ``goal``'s model and where the figure came from (``contextWindow``,
    ``windowSource``), from its provider's health snapshot, as ``goald status`` lists it; ``None``
    until the daemon has made the model (its first use) or for a scripted one."""
    models = provider.get("models") if provider is not None else None
    if not isinstance(models, dict):
        return None
    found = models.get((goal.model or "").partition(":")[2])
    return found if isinstance(found, dict) and found.get("contextWindow") is not None else None


def _slots(health: dict[str, Any]) -> dict[str, Any] | None:
    slots = health.get("slots")
    return slots if isinstance(slots, dict) else None


def _failing(provider: dict[str, Any]) -> dict[str, Any]:
    """A provider's failures in a row and its last error, as the describe answer carries them."""
    breaker = provider.get("breaker") or {}
    return {"consecutiveFailures": int(breaker.get("consecutiveFailures") or 0), "lastError": provider.get("lastError")}


def _held(host: HostPort, goal: Goal) -> str | None:
    return host.engine.held.get(goal.id) if host.engine is not None else None


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


def _act(state: str, text: str, until: str | None = None, round_no: int | None = None) -> JsonObject:
    return {"state": state, "text": text, "until": until, "round": round_no}


def activity_of(
    goal: Goal,
    st: SessionState | None,
    provider: dict[str, Any] | None,
    *,
    slots: dict[str, Any] | None,
    held: str | None,
    now: datetime,
) -> JsonObject:
    """``state`` (a word), ``text`` (plain words), ``until`` (when the wait ends, if known) and
    ``round`` of what ``goal`` is doing now (see the module docstring); pure."""
    round_no = goal.continuation_round or goal.rounds + 1
    match goal.status:
        case GoalStatus.PAUSED:
            return _act("paused", "nothing runs until it is resumed")
        case GoalStatus.WAITING:
            q = goal.memory.question
            until = _at(q.deadline) if q is not None else None
            then = "its default answer is used" if q is not None and q.has_default else "it pauses"
            text = f"waiting for an answer to question {q.id if q else '?'} (nothing runs; at its deadline {then})"
            return _act("waiting_answer", text, until, round_no)
        case GoalStatus.ACTIVE if st is not None:
            pass
        case GoalStatus.ACTIVE:
            return _act("deciding", f"deciding round {round_no}", None, round_no)
        case _:
            return _act("ended", "nothing runs")
    name = provider.get("provider") if provider is not None else None
    breaker = (provider.get("breaker") or {}) if provider is not None else {}
    failures = int(breaker.get("consecutiveFailures") or 0)
    if st.open_turn is not None:
        if provider is not None and provider.get("state") in ("open", "half_open"):
            retry = breaker.get("retryIn")
            until = _at(now + timedelta(seconds=float(retry))) if retry is not None else None
            text = f"round {round_no}: a turn is waiting for provider {name} (its circuit is open)"
            return _act("waiting_provider", text, until, round_no)
        if failures:
            text = f"round {round_no}: a turn is waiting for provider {name} (failing: {failures} in a row)"
            return _act("waiting_provider", text, None, round_no)
        return _act("turn_running", f"round {round_no}: a turn is running", None, round_no)
    if st.status is AgentStatus.RUNNING:
        size = int((slots or {}).get("max") or 0)
        if size and int((slots or {}).get("inUse") or 0) >= size:
            text = f"round {round_no}: waiting for a turn slot (all {size} in use)"
            return _act("waiting_slot", text, None, round_no)
        return _act("starting", f"round {round_no}: a turn is starting", None, round_no)
    if goal.not_before is not None and goal.not_before > now:
        code = (goal.memory.cause or "").partition(": ")[0]
        until = _at(goal.not_before)
        if code == WAIT_PROVIDER:
            who = f"provider {name}" if name else "its provider"
            text = f"round {round_no}: waiting for {who}, then the round runs again (not counted)"
            return _act("waiting_provider", text, until, round_no)
        if code == WAIT_INTERRUPTED:
            text = f"round {round_no}: waiting after {goal.infra_streak} interrupted turns in a row, then it runs again"
            return _act("backoff", text, until, round_no)
        text = f"backing off before round {round_no} (after a model error or a failed evaluation)"
        return _act("backoff", text, until, round_no)
    if held is not None:
        return _act("waiting_disk", f"waiting before round {round_no} until space is back: {held}", None, round_no)
    return _act("deciding", f"deciding round {round_no}", None, round_no)
