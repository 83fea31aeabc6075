"""Scripted models for the shell policy's end-to-end test, loaded inside the test's daemon
(``script = "shell_policy_testmodels:models"``; the harness puts ``tests/`` on the daemon's path).

``bypasser`` tries the issue's bypass of a ``shell:ls *`` rule through ``shell``: :data:`BYPASS`
(with prompt expansion, ``${_@P}`` re-expands the previous command's last argument, a command
substitution that writes ``id``'s output to ``X``), then six other expansions that make bash run
``id`` behind an ``ls`` (:data:`EXPANSIONS`, each writing its own file). Then it runs the allowed
``ls -la``, claims completion, and says it is done.
"""

from __future__ import annotations

from typing import Any

#: The bypass of issue 24: ``X`` holds ``id``'s output if bash ran it.
BYPASS = "ls -d '$(touch X; id > X)'; ls ${_@P}"
#: Other expansions that run ``id`` behind ``ls``: (tool use id, command line, the file it writes,
#: the construct the policy names).
EXPANSIONS = (
    ("tu_cmdsub", "ls $(id > X1)", "X1", "command substitution"),
    ("tu_backticks", "ls `id > X2`", "X2", "command substitution"),
    # (waiting for the substitution, so that the control's file is written before the command ends)
    ("tu_procsub", "ls <(id > X3); wait $!", "X3", "process substitution"),
    ("tu_default", "ls ${x:=$(id > X4)}", "X4", "parameter expansion"),
    ("tu_arith", "ls $((a[$(id > X5)]))", "X5", "arithmetic expansion"),
    ("tu_heredoc", "ls <<E\n$(id > X6)\nE", "X6", "a here-document with expansion"),
)
#: A command ``shell:ls *`` allows.
ALLOWED = "ls -la"


def models(name: str) -> Any:
    from agent import Reply, ScriptedModel, ToolCall, ToolResultBlock

    if name != "bypasser":
        return None

    def bypasser(request: Any) -> Reply:
        seen = [b for m in request.messages for b in m.content if isinstance(b, ToolResultBlock)]
        if not seen:
            return Reply(tool_calls=[ToolCall("shell", {"command": BYPASS}, id="tu_bypass")])
        if len(seen) <= len(EXPANSIONS):
            call_id, line, _, _ = EXPANSIONS[len(seen) - 1]
            return Reply(tool_calls=[ToolCall("shell", {"command": line}, id=call_id)])
        if len(seen) == len(EXPANSIONS) + 1:
            return Reply(tool_calls=[ToolCall("shell", {"command": ALLOWED}, id="tu_allowed")])
        if len(seen) == len(EXPANSIONS) + 2:
            claim = {"summary": "listed the directory", "evidence": "ls -la ran"}
            return Reply(tool_calls=[ToolCall("goal_complete", claim, id="tu_done")])
        return Reply.say("done")

    return ScriptedModel(bypasser, name="bypasser", record=False)
