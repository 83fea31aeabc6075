"""``goald demo``: the main job on the embedded defaults.

A temporary state directory, SQLite in it, and the shipped scripted model: a session does a few
turns of real file work in its work directory through the file tools, while the demo prints the
session's durable events as they commit. At the end it says where the state and events are.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from agent import (
    Event,
    EventType,
    ModelRegistry,
    ModelRequest,
    Reply,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolCall,
    ToolRegistry,
    file_tools,
)

DEMO_PROMPTS = [
    "Start a notes file for the nightly report: list what is in the work directory, then write notes.md.",
    "Add a summary line to notes.md and check the file.",
]


def demo_model() -> ScriptedModel:
    """A scripted model that does real file work, step by step, for the demo prompts."""
    plan: dict[int, list[Reply]] = {
        0: [
            Reply(text="Let me look at the work directory first.", tool_calls=[ToolCall("list_dir", {"path": "."})]),
            Reply(
                text="Writing the notes file.",
                tool_calls=[
                    ToolCall("write_file", {"path": "notes.md", "content": "# Nightly report\n\n- data: fresh\n"})
                ],
            ),
            Reply.say("notes.md is written with a header and one item."),
        ],
        1: [
            Reply(
                text="Adding the summary.",
                tool_calls=[
                    ToolCall("edit_file", {"path": "notes.md", "old": "- data: fresh\n",
                                           "new": "- data: fresh\n\nSummary: all inputs current.\n"})
                ],
            ),
            Reply(text="Checking the result.", tool_calls=[ToolCall("read_file", {"path": "notes.md"})]),
            Reply.say("Done: notes.md now ends with a summary line."),
        ],
    }
    progress: dict[int, int] = {}

    def rule(request: ModelRequest) -> Reply:
        users = [m for m in request.messages if m.role == "user"]
        turn = len(users) - 1
        step = progress.get(turn, 0)
        progress[turn] = step + 1
        replies = plan.get(turn, [])
        return replies[step] if step < len(replies) else Reply.say("Nothing more to do.")

    return ScriptedModel(rule, name="demo")


def describe(event: Event) -> str:
    """One plain line for an event."""
    d: dict[str, Any] = event.data
    match event.type:
        case EventType.MESSAGE_QUEUED:
            return f"queued {d['messageId']} ({d['delivery']})"
        case EventType.MESSAGE_ADMITTED:
            text = "".join(b.get("text", "") for b in d["content"])
            return f"admitted {d['messageId']}: {text[:70]}"
        case EventType.TURN_START:
            return f"turn {d['turnId']} started"
        case EventType.TURN_END:
            return f"turn ended: {d['reason']} after {d['steps']} step(s)"
        case EventType.ASSISTANT_MESSAGE:
            parts = []
            for b in d["content"]:
                if b["type"] == "text" and b["text"]:
                    parts.append(repr(b["text"][:70]))
                elif b["type"] == "tool_use":
                    parts.append(f"calls {b['name']}({json.dumps(b['input'])[:60]})")
            return "assistant: " + "; ".join(parts)
        case EventType.TOOL_RESULT:
            first = d["content"].splitlines()[0] if d["content"] else ""
            return f"tool {d['name']} -> {'ERROR ' if d['isError'] else ''}{first[:70]}"
        case EventType.STATUS:
            return f"status: {d['status']}"
        case _:
            return event.type


async def run_demo(state_dir: Path | None, out: TextIO, *, print_line: Callable[[str], None] | None = None) -> int:
    """Run the demo session; returns an exit code."""
    state = state_dir or Path(tempfile.mkdtemp(prefix="goald-demo-"))
    state.mkdir(parents=True, exist_ok=True)
    workdir = state / "work"
    workdir.mkdir(exist_ok=True)
    db = state / "goald.db"
    emit = print_line or (lambda line: print(line, file=out, flush=True))
    model = demo_model()
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    async with Runtime.open(db, models=registry, tools=lambda row: ToolRegistry(list(file_tools()))) as rt:
        sid = await rt.create_session(workdir=workdir)
        emit(f"session {sid} on {model.spec}, work directory {workdir}")
        rt.store.hub.add_listener(lambda e: emit(f"  [{e.seq:>3}] {describe(e)}") if e.session_id == sid else None)
        agent = await rt.agent(sid)
        for prompt in DEMO_PROMPTS:
            emit(f"> {prompt}")
            await agent.followup(prompt)
            await asyncio.wait_for(agent.when_idle(), 60)
    notes = workdir / "notes.md"
    emit("")
    emit(f"notes.md:\n{notes.read_text() if notes.exists() else '(missing)'}")
    emit(f"state directory: {state}")
    emit(f"database (events, inbox, turns): {db}")
    return 0 if notes.exists() and "Summary" in notes.read_text() else 1


def text_of(blocks: list[Any]) -> str:
    """Text of content blocks."""
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))
