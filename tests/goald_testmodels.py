"""Deterministic models with latency, loaded *inside* a daemon started by an end-to-end test.

The test's daemon config names this module as a scripted provider::

    [providers.test]
    kind = "scripted"
    script = "goald_testmodels:slow"

and goals or sessions then use ``test:worker`` or ``test:chat``. The harness puts ``tests/`` on the
child's ``PYTHONPATH`` so the daemon can import it.

Behaviour is steered by a directive in the text the model reads, e.g. ``[rounds=3 delay=0.2]``
in a goal's objective or a prompt, so one model serves every test and each test states its timing
where it creates the work. A directive's ``delay`` is the model's latency per call (the model
being slow, never a test waiting for things to settle).

``worker`` (a goal's agent), in round ``r`` of ``rounds``: writes ``round<r>.txt`` in the work
directory, then notes progress with ``goal_progress`` (or, in the last round, claims completion
with ``goal_complete``), then ends the turn with a line of text: three model calls per round.
With ``fail_round=n`` round ``n``'s write aims outside the work directory (a tool call that fails).
With ``hold_round=n hold=s`` the first call of round ``n`` takes ``s`` seconds instead (a call
that is surely in flight when a test stops the daemon during that round); not when the round is
run again after such a stop (its continuation says so), which answers at once.

``chat`` answers each message with one line after ``delay`` seconds.

``asker`` (a goal that needs its operator): round 1 asks ``ask_operator`` "Which database should
the report read?" with the options sqlite and postgres (``default=1``: sqlite is its default;
``timeout=s``: its timeout) and ends its turn; the turn that brings the answer announces ``asker
heard=<answer>`` (taking ``hold=s`` seconds, unless the round is run again), writes it to
``heard.txt`` and claims completion.

When the daemon's environment names a datagram socket in ``TESTMODELS_CALLS_SOCKET`` (the
harness binds one per daemon), each call announces itself there as it starts, e.g.
``worker round=2 step=0``: a test can wait until a model call is surely in flight.
"""

from __future__ import annotations

import os
import re
import socket

from agent import ModelRequest, Reply, ScriptedModel, TextBlock, ToolCall

_DIRECTIVE = re.compile(r"\[((?:\s*[a-z_]+=[0-9.]+)+)\s*\]")
_ROUND = re.compile(r"Round (\d+)")
CALLS_ENV = "TESTMODELS_CALLS_SOCKET"
#: What a goal's continuation says when its round runs again after infrastructure trouble.
RERUN = "This round is run again"


def announce(text: str) -> None:
    """Tell the test (if it listens) that a model call starts; never blocks, never raises."""
    path = os.environ.get(CALLS_ENV)
    if not path:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        try:
            sock.sendto(text.encode()[:2048], path)
        except OSError:
            pass


def directives(text: str) -> dict[str, float]:
    """The ``key=value`` pairs of the first ``[...]`` directive in ``text``."""
    found = _DIRECTIVE.search(text)
    if found is None:
        return {}
    pairs = (item.split("=", 1) for item in found.group(1).split())
    return {key: float(value) for key, value in pairs}


def _last_user(request: ModelRequest) -> tuple[str, int]:
    """The text of the last user message and how many assistant messages followed it."""
    last = max((i for i, m in enumerate(request.messages) if m.role == "user"), default=-1)
    if last < 0:
        return "", 0
    text = "".join(b.text for b in request.messages[last].content if isinstance(b, TextBlock))
    steps = sum(1 for m in request.messages[last + 1 :] if m.role == "assistant")
    return text, steps


def _worker(request: ModelRequest) -> Reply:
    text, step = _last_user(request)
    conf = directives(text)
    delay = conf.get("delay", 0.0)
    rounds = int(conf.get("rounds", 1))
    found = _ROUND.search(text)
    round_no = int(found.group(1)) if found else 1
    announce(f"worker round={round_no} step={step}")
    if step == 0:
        if round_no == int(conf.get("hold_round", 0)) and RERUN not in text:
            delay = conf.get("hold", delay)
        # With fail_round=n the write of round n aims outside the work directory: a failed tool call.
        path = "../outside.txt" if round_no == int(conf.get("fail_round", 0)) else f"round{round_no}.txt"
        write = ToolCall("write_file", {"path": path, "content": f"round {round_no}\n"})
        return Reply(text=f"Round {round_no}: writing round{round_no}.txt.", tool_calls=[write], delay=delay)
    if step == 1:
        if round_no >= rounds:
            claim = {"summary": f"all {rounds} rounds written", "evidence": f"round{round_no}.txt exists"}
            return Reply(tool_calls=[ToolCall("goal_complete", claim)], delay=delay)
        return Reply(tool_calls=[ToolCall("goal_progress", {"note": f"round {round_no} written"})], delay=delay)
    if step == 2:
        return Reply.say(f"Round {round_no} finished.", delay=delay)
    return Reply.say("Nothing more this round.")


def _chat(request: ModelRequest) -> Reply:
    text, _ = _last_user(request)
    announce(f"chat {text[:200]}")
    return Reply.say(f"ack: {text[:40]}", delay=directives(text).get("delay", 0.0))


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
ASKED = "Which database should the report read?"


def _heard(request: ModelRequest) -> str | None:
    """The answer to the asker's question in any message of the session (``None``: not answered yet)."""
    heard = None
    for m in request.messages:
        if m.role != "user":
            continue
        text = "".join(b.text for b in m.content if isinstance(b, TextBlock))
        if "your question q_" in text:
            found = _ANSWER.search(text)
            heard = found.group(1) if found else "(withdrawn)"
    return heard


def _asker(request: ModelRequest) -> Reply:
    text, step = _last_user(request)
    conf = directives(text)
    heard = _heard(request)
    if heard is not None:
        if step == 0:
            announce(f"asker heard={heard}")
            delay = conf.get("hold", 0.0) if RERUN not in text else 0.0
            return Reply(tool_calls=[ToolCall("write_file", {"path": "heard.txt", "content": heard})], delay=delay)
        if step == 1:
            claim = {"summary": f"the operator said {heard}", "evidence": "heard.txt"}
            return Reply(tool_calls=[ToolCall("goal_complete", claim)])
        return Reply.say("Done.")
    announce(f"asker step={step}")
    if step == 0:
        args: dict[str, object] = {"question": ASKED, "options": ["sqlite", "postgres"]}
        if conf.get("default"):
            args["default"] = "sqlite"
        if "timeout" in conf:
            args["timeout_seconds"] = conf["timeout"]
        return Reply(tool_calls=[ToolCall("ask_operator", args)])
    return Reply.say("I asked the operator; waiting for the answer.")


def _runner(request: ModelRequest) -> Reply:
    """Runs ``echo one >> log.txt`` in the shell; when the policy asks about it, ends the turn; once
    the operator approved it, runs it again and claims completion; denied, claims completion too."""
    text, step = _last_user(request)
    announce(f"runner step={step}")
    line = {"command": "echo one >> log.txt"}
    if "approved" in text and "The operator" in text:
        if step == 0:
            return Reply(tool_calls=[ToolCall("shell", line)])
        if step == 1:
            return Reply(tool_calls=[ToolCall("goal_complete", {"summary": "logged", "evidence": "log.txt"})])
        return Reply.say("Done.")
    if step == 0:
        return Reply(tool_calls=[ToolCall("shell", line)])
    return Reply.say("The command needs an approval; waiting.")


#: What ``gitattack`` runs in its sandbox: the worktree's ``.git`` replaced by a directory whose
#: config names an fsmonitor, a hooks path with a hook, a clean filter and a diff textconv, each of
#: which would leave a ``PWNED*`` file where it ran; attributes that apply them to every file; a change.
GIT_ATTACK = (
    "rm -f .git && mkdir -p .git/hooks && "
    "printf '[core]\\n\\tfsmonitor = touch PWNED-fsmonitor\\n\\thooksPath = .git/hooks\\n"
    '[filter "evil"]\\n\\tclean = touch PWNED-filter\\n\\tsmudge = touch PWNED-smudge\\n'
    '[diff "evil"]\\n\\ttextconv = touch PWNED-textconv\\n\' > .git/config && '
    "printf '#!/bin/sh\\ntouch PWNED-hook\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && "
    "cp .git/hooks/pre-commit .git/hooks/post-checkout && "
    "echo '* filter=evil diff=evil' > .gitattributes && echo 'changed by the goal' > a.txt"
)


def _gitattack(request: ModelRequest) -> Reply:
    _text, step = _last_user(request)
    announce(f"gitattack step={step}")
    if step == 0:
        return Reply(tool_calls=[ToolCall("shell", {"command": GIT_ATTACK})])
    if step == 1:
        return Reply(tool_calls=[ToolCall("goal_complete", {"summary": "changed a.txt", "evidence": "a.txt"})])
    return Reply.say("Done.")


def _lazy(request: ModelRequest) -> Reply:
    """A weaker model: reads the objective, says it will look into it, and changes nothing (it stalls)."""
    _text, step = _last_user(request)
    announce(f"lazy step={step}")
    return Reply.say("I will look into it next round.")


def slow(name: str) -> ScriptedModel | None:
    """The model called ``name`` (``worker``, ``chat`` or ``asker``); None for any other name."""
    rules = {
        "worker": _worker,
        "chat": _chat,
        "asker": _asker,
        "runner": _runner,
        "gitattack": _gitattack,
        "lazy": _lazy,
    }
    rule = rules.get(name)
    if rule is None:
        return None
    return ScriptedModel(rule, name=name, record=False)
