"""Scripted goal agents for the goal engine's end-to-end tests, loaded *inside* a test's daemon.

The test's daemon config names this module as a scripted provider::

    [providers.gs]
    kind = "scripted"
    script = "goal_scripts:models"

and goals then use ``gs:planter`` or ``gs:busy``. Each model reads the round number from its
continuation ("Round N") and its settings from the goal's objective: a ``[rounds=N]`` directive
and, for ``planter``, a ``marker: PATH`` line.

``planter`` has only ``write_file`` (and the goal tools). In round 1 it plants a repository whose
configuration would run ``touch MARKER`` through every config-driven execution path git has
(``core.fsmonitor``, ``core.hooksPath``, ``core.pager``, ``core.sshCommand``, a filter driver, a
diff driver) and ``.git/HEAD``; in every round it "commits": it rewrites ``.git/refs/heads/main``
with a new commit id of the same length, and nothing else. Its progress note is the same every
round, so only the work directory's fingerprint can show its progress. In the last round it
claims completion.

``busy`` does busy-work: each round it lists the directory and notes progress in new words;
nothing in the work directory ever changes.

``rewriter`` does busy-work that touches a file: each round it rewrites ``notes.txt`` with the
same bytes (``write_file`` replaces the file: a new inode, a new modification time) and notes
progress in new words; with ``[change]`` in the objective it writes new bytes each round.

``sleeper`` runs ``sleep 30`` in ``shell`` with a timeout of 60 s, then says it slept.

``remote`` does the same as ``busy``, and its real work is outside the work directory: each round it moves a
"remote branch head", a file named by a ``remote: PATH`` line of the objective (written from the
model's own process, as a remote system would change). A goal's ``progress`` command can read it.
"""

from __future__ import annotations

import re
from pathlib import Path

from agent import ModelRequest, Reply, ScriptedModel, TextBlock, ToolCall

_ROUND = re.compile(r"Round (\d+)")
_ROUNDS = re.compile(r"\[rounds=(\d+)\]")
_MARKER = re.compile(r"marker: (\S+)")


def _last_user(request: ModelRequest) -> tuple[str, int]:
    last = max((i for i, m in enumerate(request.messages) if m.role == "user"), default=-1)
    if last < 0:
        return "", 0
    text = "".join(b.text for b in request.messages[last].content if isinstance(b, TextBlock))
    return text, sum(1 for m in request.messages[last + 1 :] if m.role == "assistant")


def _round(text: str) -> int:
    found = _ROUND.search(text)
    return int(found.group(1)) if found else 1


def plants(marker: str) -> dict[str, str]:
    """The files ``planter`` writes in round 1: a repository that runs ``touch MARKER`` if git reads it."""
    hook = f"touch {marker}"
    return {
        ".git/HEAD": "ref: refs/heads/main\n",
        # With an object directory, git takes the directory for a repository (and runs fsmonitor).
        ".git/objects/info/keep": "keep\n",
        ".git/config": (
            "[core]\n"
            "\trepositoryformatversion = 0\n"
            "\tbare = false\n"
            f"\tfsmonitor = {hook}\n"
            "\thooksPath = .githooks\n"
            f"\tpager = {hook}\n"
            f"\tsshCommand = {hook}\n"
            '[filter "x"]\n'
            f"\tclean = {hook}\n"
            f"\tsmudge = {hook}\n"
            f"\tprocess = {hook}\n"
            '[diff "x"]\n'
            f"\ttextconv = {hook}\n"
            f"\tcommand = {hook}\n"
        ),
        ".githooks/post-index-change": f"#!/bin/sh\n{hook}\n",
        ".githooks/pre-commit": f"#!/bin/sh\n{hook}\n",
        ".gitattributes": "* filter=x diff=x\n",
        "README": "planted\n",
    }


def _planter(request: ModelRequest) -> Reply:
    text, step = _last_user(request)
    round_no = _round(text)
    rounds = int(m.group(1)) if (m := _ROUNDS.search(text)) else 3
    if step == 0:
        calls = []
        if round_no == 1:
            marker = _MARKER.search(text)
            assert marker is not None, "the objective names no marker"
            calls = [ToolCall("write_file", {"path": p, "content": c}) for p, c in plants(marker.group(1)).items()]
        commit = f"{round_no:040x}"
        calls.append(ToolCall("write_file", {"path": ".git/refs/heads/main", "content": commit + "\n"}))
        return Reply(text=f"Round {round_no}: committing.", tool_calls=calls)
    if step == 1:
        if round_no >= rounds:
            claim = {"summary": f"{rounds} commits", "evidence": ".git/refs/heads/main"}
            return Reply(tool_calls=[ToolCall("goal_complete", claim)])
        return Reply(tool_calls=[ToolCall("goal_progress", {"note": "committed my work"})])
    return Reply.say(f"Round {round_no} finished.")


def _busy(request: ModelRequest) -> Reply:
    text, step = _last_user(request)
    round_no = _round(text)
    if step == 0:
        return Reply(tool_calls=[ToolCall("list_dir", {"path": "."})])
    if step == 1:
        note = f"reviewed the layout again, pass {round_no}: considering approach {round_no * 7 % 11}"
        return Reply(tool_calls=[ToolCall("goal_progress", {"note": note})])
    return Reply.say(f"Round {round_no}: still thinking.")


def _rewriter(request: ModelRequest) -> Reply:
    """Each round rewrites ``notes.txt`` (identical bytes, or new ones if the objective says
    ``[change]``) and notes progress in new words."""
    text, step = _last_user(request)
    round_no = _round(text)
    if step == 0:
        content = f"draft {round_no}\n" if "[change]" in text else "the same draft\n"
        return Reply(tool_calls=[ToolCall("write_file", {"path": "notes.txt", "content": content})])
    if step == 1:
        note = f"refined the notes, pass {round_no}: angle {round_no * 7 % 11}"
        return Reply(tool_calls=[ToolCall("goal_progress", {"note": note})])
    return Reply.say(f"Round {round_no}: rewrote the notes.")


def _sleeper(request: ModelRequest) -> Reply:
    """Runs ``sleep 30`` in ``shell`` (with a 60 s timeout of its own), then says what came back."""
    _, step = _last_user(request)
    if step == 0:
        return Reply(tool_calls=[ToolCall("shell", {"command": "sleep 30", "timeout_seconds": 60})])
    return Reply.say("slept")


_REMOTE = re.compile(r"remote: (\S+)")


def _remote(request: ModelRequest) -> Reply:
    text, step = _last_user(request)
    if step == 0:
        found = _REMOTE.search(text)
        assert found is not None, "the objective names no remote"
        Path(found.group(1)).write_text(f"{_round(text):040x}\n")
    return _busy(request)


def models(name: str) -> ScriptedModel | None:
    """The model called ``name`` (``planter``, ``busy``, ``rewriter``, ``sleeper`` or ``remote``); None for
    any other name."""
    rules = {"planter": _planter, "busy": _busy, "rewriter": _rewriter, "sleeper": _sleeper, "remote": _remote}
    rule = rules.get(name)
    return ScriptedModel(rule, name=name, record=False) if rule is not None else None
