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

from agent import (
    AssistantMessage,
    Delivery,
    Event,
    MessageAdmitted,
    ModelFailed,
    SourceKind,
    ToolResult,
    ToolUseBlock,
    TurnEnded,
)
from goals import (
    Goal,
    GoalBlockedReported,
    GoalChanged,
    GoalClaimed,
    GoalProgressNoted,
    GoalVerified,
)

Update = (
    AgentMessageChunk | UserMessageChunk | ToolCallStart | ToolCallProgress | AgentPlanUpdate | AvailableCommandsUpdate
)

#: The ``source.ref`` of messages the ACP bridge enqueues.
ACP_SOURCE_REF = "acp"
#: The goal events that shape the plan.
GoalEvent = GoalChanged | GoalProgressNoted | GoalClaimed | GoalVerified | GoalBlockedReported
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
        if not event.type.startswith("goal/"):
            return None
        goal = event.payload
        if isinstance(goal, GoalEvent) and (self.plan is None or self.plan.goal_id != goal.goal_id):
            return goal.goal_id
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
        match event.payload:
            case MessageAdmitted() as admitted:
                return self._admitted(admitted, replay)
            case AssistantMessage() as answer:
                return self._assistant(answer, replay)
            case ToolResult() as result:
                return [self._tool_result(result)]
            case ModelFailed() | TurnEnded() as ended:
                # Text streamed by a failed attempt was discarded; the next attempt starts afresh.
                self._streamed.pop(str(ended.turn_id), None)
                return []
            case GoalChanged() | GoalProgressNoted() | GoalClaimed() | GoalVerified() | GoalBlockedReported() as goal:
                return self._goal(goal, replay)
            case _:
                return []

    # -- parts -----------------------------------------------------------------------------

    def _admitted(self, admitted: MessageAdmitted, replay: bool) -> list[Update]:
        source = admitted.source
        if source.kind is SourceKind.GOAL:
            ref = source.ref or ""
            round_no = int(ref.rpartition("#")[2]) if ref.rpartition("#")[2].isdigit() else 0
            plan = self.plan
            if plan is None or not ref.startswith(plan.goal_id + "#"):
                return []
            if round_no > plan.rounds:
                plan.rounds = round_no
                plan.steps.append(PlanStep(round_no, f"Round {round_no}", done=False))
            return self._plan_changed(replay)
        if admitted.delivery is Delivery.CONTEXT:
            return []
        if not replay and source.ref == ACP_SOURCE_REF:
            return []
        text = admitted.text
        return [UserMessageChunk(session_update="user_message_chunk", content=text_block(text))] if text else []

    def _assistant(self, answer: AssistantMessage, replay: bool) -> list[Update]:
        out: list[Update] = []
        text = answer.text
        if replay:
            if text:
                out.append(agent_text(text))
        else:
            streamed = self._streamed.pop(str(answer.turn_id), "")
            rest = text[len(streamed) :] if text.startswith(streamed) else text
            if rest and not answer.interrupted:
                out.append(agent_text(rest))
        for block in answer.content:
            if not isinstance(block, ToolUseBlock):
                continue
            out.append(
                ToolCallStart(
                    session_update="tool_call",
                    tool_call_id=block.id,
                    title=tool_title(block.name, block.input),
                    kind=tool_kind(block.name),
                    status="in_progress",
                    raw_input=block.input,
                )
            )
        return out

    def _tool_result(self, result: ToolResult) -> Update:
        return ToolCallProgress(
            session_update="tool_call_update",
            tool_call_id=result.tool_use_id,
            status="failed" if result.is_error else "completed",
            content=[ContentToolCallContent(type="content", content=text_block(result.content))],
        )

    def _goal(self, goal: GoalEvent, replay: bool) -> list[Update]:
        plan = self.plan
        if plan is None or goal.goal_id != plan.goal_id:
            return []
        round_no = plan.rounds
        match goal:
            case GoalChanged():
                plan.status = goal.status.value
                plan.reason = goal.reason
                if plan.status in ("completed", "failed", "cancelled", "exhausted"):
                    for step in plan.steps:
                        step.done = True
                return self._plan_changed(replay)
            case GoalProgressNoted():
                line = goal.note
            case GoalClaimed():
                line = f"completion claimed: {goal.summary}"
            case GoalVerified():
                line = "verification passed" if goal.passed else "verification failed: the claim is refused"
            case GoalBlockedReported():
                line = f"blocked: {goal.reason}"
        plan.steps.append(PlanStep(round_no, f"Round {round_no}: {line}", done=True))
        return self._plan_changed(replay)

    def _plan_changed(self, replay: bool) -> list[Update]:
        if replay:
            self._plan_dirty = True
            return []
        assert self.plan is not None
        return [self.plan.update()]
