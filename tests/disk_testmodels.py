"""Scripted models for the disk tests, loaded inside a daemon they start
(``script = "disk_testmodels:models"``; the harness puts ``tests/`` on the daemon's path).

``filler`` fills the disk its work directory is on through ``shell`` (``dd`` until the file system is
full), then says what came back. ``steady`` works round after round: each round one short ``shell``
command appends a line to ``log.txt``, then it says the round is done (each call takes 0.2 s).
"""

from __future__ import annotations

from typing import Any

#: Writes until the file system is full (dd then fails with "No space left on device").
FILL = "dd if=/dev/zero of=big bs=1M; echo dd-exit=$?; ls -l big"
#: One line of work per round.
APPEND = "echo round >> log.txt && wc -l < log.txt"


def models(name: str) -> Any:
    from agent import Reply, ScriptedModel, ToolCall, ToolResultBlock

    def since_last_user(request: Any) -> list[str]:
        """The tool results after the last user message (this round's)."""
        last = max((i for i, m in enumerate(request.messages) if m.role == "user"), default=-1)
        return [b.content for m in request.messages[last + 1 :] for b in m.content if isinstance(b, ToolResultBlock)]

    if name == "filler":

        def filler(request: Any) -> Reply:
            seen = [b.content for m in request.messages for b in m.content if isinstance(b, ToolResultBlock)]
            if not seen:
                return Reply.call("shell", command=FILL, timeout_seconds=120)
            return Reply.say("the disk is full now")

        return ScriptedModel(filler, name="filler", record=False)
    if name == "steady":

        def steady(request: Any) -> Reply:
            if not since_last_user(request):
                return Reply(tool_calls=[ToolCall("shell", {"command": APPEND, "timeout_seconds": 30})], delay=0.2)
            return Reply.say("round done", delay=0.2)

        return ScriptedModel(steady, name="steady", record=False)
    return None
