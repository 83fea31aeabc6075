"""How goals and events look on the wire (camelCase, JSON-ready).

Every key the protocol writes is camelCase, nested ones too (budgets, rules, sandbox, the last
verification). Event payloads are the exception: ``data`` is sent as it is stored, so that a
client reads the same JSON from ``session/events`` as a subscriber got live and as old rows hold.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import TypedDict

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel as _to_camel

from agent import Event
from goals import Goal, VerifyResult
from goals.why import status_error, why

#: A JSON object as the protocol sends it.
JsonObject = dict[str, object]


class Empty(TypedDict):
    """An empty answer (``{}``)."""


#: Field names are few and fixed: convert each once (a list of 1,000 goals converted ~50,000).
to_camel = lru_cache(maxsize=1024)(_to_camel)


def goal_view(goal: Goal, now: datetime | None = None) -> JsonObject:
    """A goal as the protocol shows it, with ``why``: the reason its status has, in plain words
    (:func:`goals.why.why`, the one source every view shows), as of ``now``."""
    out: JsonObject = goal.model_dump(mode="json", by_alias=True, exclude={"memory"})
    mem = goal.memory
    out["notes"] = mem.notes
    #: Calls the operator approved for this goal (``goald goal revoke`` removes one).
    out["approvals"] = mem.approvals
    out["lastVerification"] = [verify_view(r) for r in mem.verify_results]
    out["lastError"] = mem.last_error
    out["why"] = why(goal, now or datetime.now(UTC))
    out["statusError"] = status_error(goal, now or datetime.now(UTC))  # goal list's LAST ERROR
    return out


class GoalView(Goal):
    """A goal view (:func:`goal_view`, as ``goal/get``, ``goal/list`` and ``goal/describe`` send it)
    read back into a model: what a client reads as ``view.session_id`` and ``view.budgets.max_rounds``
    rather than as a dict's ``g["sessionId"]``. Every field of :class:`~goals.Goal` (its memory
    aside, which the view leaves out) and the view's own keys; keys a newer daemon adds are ignored."""

    model_config = ConfigDict(extra="ignore")

    notes: list[str] = Field(default_factory=list)
    approvals: list[str] = Field(default_factory=list)
    #: The last verification's results, as the view sends them (camelCase).
    last_verification: list[JsonObject] = Field(default_factory=list)
    last_error: str | None = None
    why: str | None = None
    #: What it is doing now (``goal/list``'s goals carry it; :mod:`daemon.rpc.activity`).
    activity: JsonObject | None = None
    #: In a cluster (``goal/list``, ``goal/describe``): the node that drives the goal's session,
    #: ``None`` when none holds it now. Outside a cluster the answer has no such key.
    node: str | None = None
    #: ``goal list``'s LAST ERROR: why an ended or paused goal failed, in a line (:func:`goals.why.status_error`).
    status_error: str | None = None

    @property
    def in_cluster(self) -> bool:
        """Whether the answer came from a cluster's node (it named the goal's ``node``, maybe none)."""
        return "node" in self.model_fields_set


def _camel(data: dict[str, object]) -> JsonObject:
    return {to_camel(k): v for k, v in data.items()}


def verify_view(result: VerifyResult) -> JsonObject:
    """One verification command's result as the protocol shows it (camelCase)."""
    return _camel(result.model_dump(mode="json"))


def event_view(event: Event) -> JsonObject:
    """An event as the protocol shows it."""
    return {"type": event.type, "data": event.data, "at": event.at}
