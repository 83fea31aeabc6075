"""How goals and events look on the wire (camelCase, JSON-ready)."""

from __future__ import annotations

from typing import TypedDict

from pydantic.alias_generators import to_camel

from agent import Event
from goals import Goal

#: A JSON object as the protocol sends it.
JsonObject = dict[str, object]


class Empty(TypedDict):
    """An empty answer (``{}``)."""


def goal_view(goal: Goal) -> JsonObject:
    """A goal as the protocol shows it."""
    data = goal.model_dump(mode="json", exclude={"memory"})
    out = {to_camel(k): v for k, v in data.items()}
    out["budgets"] = {to_camel(k): v for k, v in data["budgets"].items()}
    out["rules"] = {to_camel(k): v for k, v in data["rules"].items()}
    out["sandbox"] = {to_camel(k): v for k, v in data["sandbox"].items()}
    mem = goal.memory
    out["notes"] = mem.notes
    out["lastVerification"] = [r.model_dump(mode="json") for r in mem.verify_results]
    out["lastError"] = mem.last_error
    return out


def event_view(event: Event) -> JsonObject:
    """An event as the protocol shows it."""
    return {"type": event.type, "data": event.data, "at": event.at}
