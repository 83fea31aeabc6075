"""From goald's durable events (and streamed text) to ACP ``session/update`` notifications.

One :class:`Projector` per ACP session turns each committed event, in sequence order, into the
updates an editor shows:

* streamed model text → ``agent_message_chunk`` as it arrives; the committed assistant message
  then adds only what was not streamed (nothing, normally), so text is never shown twice;
* a tool call → ``tool_call`` (in progress), its result → ``tool_call_update`` (completed or
  failed, with the output as content);
* a goal's rounds, notes, claims, verifications and status → one ``plan`` (each plan update
  replaces the editor's whole plan);
* when replaying history (``session/load``): admitted user messages → ``user_message_chunk`` and
  assistant text in full. Goal continuations are not replayed as user text: the plan shows them.

Live, a prompt's own user message is not echoed: the editor already shows what it sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AvailableCommand,
    AvailableCommandInput,
    AvailableCommandsUpdate,
    ContentToolCallContent,
    PlanEntry,
    PlanEntryStatus,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    ToolKind,
    UnstructuredCommandInput,
    UserMessageChunk,
)

from agent import Event, EventType
from goals import GOAL_BLOCKED, GOAL_CHANGED, GOAL_CLAIM, GOAL_PROGRESS, GOAL_VERIFIED, Goal

Update = (
    AgentMessageChunk | UserMessageChunk | ToolCallStart | ToolCallProgress | AgentPlanUpdate | AvailableCommandsUpdate
)

#: The ``source.ref`` of messages the ACP bridge enqueues.
ACP_SOURCE_REF = "acp"
GOAL_EVENTS = (GOAL_CHANGED, GOAL_PROGRESS, GOAL_CLAIM, GOAL_VERIFIED, GOAL_BLOCKED)
#: At most this many plan entries besides the goal itself (the latest ones).
PLAN_TAIL = 12
_TOOL_KINDS: dict[str, ToolKind] = {
    "read_file": "read",
    "write_file": "edit",
    "edit_file": "edit",
    "list_dir": "search",
    "shell": "execute",
    "goal_progress": "think",
    "goal_complete": "think",
    "goal_blocked": "think",
}


def text_block(text: str) -> TextContentBlock:
    """An ACP text content block."""
    return TextContentBlock(type="text", text=text)


def agent_text(text: str) -> AgentMessageChunk:
    """An ``agent_message_chunk`` carrying ``text``."""
    return AgentMessageChunk(session_update="agent_message_chunk", content=text_block(text))


def goal_commands() -> AvailableCommandsUpdate:
    """The ``available_commands_update`` that advertises ``/goal``."""
    hint = "an objective to pursue unattended, or status | pause | resume | cancel"
    return AvailableCommandsUpdate(
        session_update="available_commands_update",
        available_commands=[
            AvailableCommand(
                name="goal",
                description="Start a goal on this session (/goal OBJECTIVE), or manage it "
                "(/goal status, /goal pause, /goal resume, /goal cancel)",
                input=AvailableCommandInput(root=UnstructuredCommandInput(hint=hint)),
            )
        ],
    )


def tool_kind(name: str) -> ToolKind:
    """The ACP tool kind of a goald tool (how an editor may show it)."""
    return _TOOL_KINDS.get(name, "other")


def tool_title(name: str, args: dict[str, Any]) -> str:
    """A short title for a tool call: its name and what it works on."""
    path = args.get("path")
    if isinstance(path, str):
        return f"{name} {path}"
    if name == "goal_progress" and isinstance(args.get("note"), str):
        return f"goal_progress: {args['note'][:80]}"
    return name


def _texts(content: list[dict[str, Any]]) -> str:
    return "".join(str(b.get("text", "")) for b in content if b.get("type") == "text")


@dataclass
class PlanStep:
    """One line of a goal's plan: a round, or something that happened in one."""

    round_no: int
    text: str
    #: A note, claim or verdict is done when it happens; a round when the next starts or the goal stops.
    done: bool


@dataclass
class GoalPlan:
    """What the plan shows of a session's goal, built from its events."""

    goal_id: str
    title: str
    status: str = "active"
    reason: str | None = None
    rounds: int = 0
    steps: list[PlanStep] = field(default_factory=list)

    def entries(self) -> list[PlanEntry]:
        """The plan: the goal first, then its latest rounds and notes."""
        head = f"Goal: {self.title}"
        head_status: PlanEntryStatus = "in_progress"
        if self.status != "active":
            head += f" ({self.status}: {self.reason})" if self.reason else f" ({self.status})"
            head_status = "completed" if self.status == "completed" else "pending"
        out = [PlanEntry(content=head, priority="high", status=head_status)]
        for step in self.steps[-PLAN_TAIL:]:
            status: PlanEntryStatus = "completed"
            if not step.done and step.round_no == self.rounds:
                status = "in_progress" if self.status == "active" else "pending"
            out.append(PlanEntry(content=step.text, priority="medium", status=status))
        return out

    def update(self) -> AgentPlanUpdate:
        """The ``plan`` update for the current state."""
        return AgentPlanUpdate(session_update="plan", entries=self.entries())


class Projector:
    """Turns one session's events and streamed text into ACP updates (see the module docstring)."""

    def __init__(self) -> None:
        self._streamed: dict[str, str] = {}
        self.plan: GoalPlan | None = None
        self._plan_dirty = False

    def wants_goal(self, event: Event) -> str | None:
        """The goal id whose row the projector needs before it can take ``event``, if any."""
        goal_id = event.data.get("goalId")
        known = self.plan is not None and self.plan.goal_id == goal_id
        if event.type in GOAL_EVENTS and isinstance(goal_id, str) and not known:
            return goal_id
        return None

    def seed_goal(self, goal: Goal) -> None:
        """Start the plan of ``goal`` (the session's goal changed, or the first one appeared)."""
        self.plan = GoalPlan(goal_id=goal.id, title=" ".join(goal.title.split()), status="active")

    def delta(self, turn_id: str, text: str) -> list[Update]:
        """Streamed model text (live only)."""
        if not text:
            return []
        self._streamed[turn_id] = self._streamed.get(turn_id, "") + text
        return [agent_text(text)]

    def flush_plan(self) -> list[Update]:
        """The plan update held back while replaying, if the plan changed."""
        if self._plan_dirty and self.plan is not None:
            self._plan_dirty = False
            return [self.plan.update()]
        return []

    def event(self, event: Event, *, replay: bool) -> list[Update]:
        """The updates for one committed event (``replay``: history for ``session/load``)."""
        d = event.data
        match event.type:
            case EventType.MESSAGE_ADMITTED:
                return self._admitted(d, replay)
            case EventType.ASSISTANT_MESSAGE:
                return self._assistant(d, replay)
            case EventType.TOOL_RESULT:
                return [self._tool_result(d)]
            case EventType.MODEL_ERROR:
                # Text streamed by a failed attempt was discarded; the next attempt starts afresh.
                self._streamed.pop(str(d.get("turnId")), None)
                return []
            case EventType.TURN_END:
                self._streamed.pop(str(d.get("turnId")), None)
                return []
            case _ if event.type in GOAL_EVENTS:
                return self._goal(event.type, d, replay)
            case _:
                return []

    # -- parts -----------------------------------------------------------------------------

    def _admitted(self, d: dict[str, Any], replay: bool) -> list[Update]:
        source = d.get("source") or {}
        if source.get("kind") == "goal":
            ref = str(source.get("ref") or "")
            round_no = int(ref.rpartition("#")[2]) if ref.rpartition("#")[2].isdigit() else 0
            plan = self.plan
            if plan is None or not ref.startswith(plan.goal_id + "#"):
                return []
            if round_no > plan.rounds:
                plan.rounds = round_no
                plan.steps.append(PlanStep(round_no, f"Round {round_no}", done=False))
            return self._plan_changed(replay)
        if d.get("delivery") == "context":
            return []
        if not replay and source.get("ref") == ACP_SOURCE_REF:
            return []
        text = _texts(d.get("content") or [])
        return [UserMessageChunk(session_update="user_message_chunk", content=text_block(text))] if text else []

    def _assistant(self, d: dict[str, Any], replay: bool) -> list[Update]:
        out: list[Update] = []
        text = _texts(d.get("content") or [])
        if replay:
            if text:
                out.append(agent_text(text))
        else:
            streamed = self._streamed.pop(str(d.get("turnId")), "")
            rest = text[len(streamed) :] if text.startswith(streamed) else text
            if rest and not d.get("interrupted"):
                out.append(agent_text(rest))
        for block in d.get("content") or []:
            if block.get("type") != "tool_use":
                continue
            args = block.get("input") or {}
            out.append(
                ToolCallStart(
                    session_update="tool_call",
                    tool_call_id=str(block["id"]),
                    title=tool_title(str(block.get("name")), args if isinstance(args, dict) else {}),
                    kind=tool_kind(str(block.get("name"))),
                    status="in_progress",
                    raw_input=args,
                )
            )
        return out

    def _tool_result(self, d: dict[str, Any]) -> Update:
        content = str(d.get("content") or "")
        return ToolCallProgress(
            session_update="tool_call_update",
            tool_call_id=str(d.get("toolUseId")),
            status="failed" if d.get("isError") else "completed",
            content=[ContentToolCallContent(type="content", content=text_block(content))],
        )

    def _goal(self, kind: str, d: dict[str, Any], replay: bool) -> list[Update]:
        plan = self.plan
        if plan is None or d.get("goalId") != plan.goal_id:
            return []
        round_no = plan.rounds
        if kind == GOAL_CHANGED:
            plan.status = str(d.get("status"))
            plan.reason = d.get("reason")
            if plan.status in ("completed", "failed", "cancelled", "exhausted"):
                for step in plan.steps:
                    step.done = True
        else:
            if kind == GOAL_PROGRESS:
                line = str(d.get("note"))
            elif kind == GOAL_CLAIM:
                line = f"completion claimed: {d.get('summary')}"
            elif kind == GOAL_VERIFIED:
                line = "verification passed" if d.get("passed") else "verification failed: the claim is refused"
            else:
                line = f"blocked: {d.get('reason')}"
            plan.steps.append(PlanStep(round_no, f"Round {round_no}: {line}", done=True))
        return self._plan_changed(replay)

    def _plan_changed(self, replay: bool) -> list[Update]:
        if replay:
            self._plan_dirty = True
            return []
        assert self.plan is not None
        return [self.plan.update()]
