"""Scripted models for the SDK and ``goald run`` tests, loaded inside a daemon or a ``goald run`` process.

A test's config names this module as a scripted provider::

    [providers.t]
    kind = "scripted"
    script = "sdk_testmodels:build"

and picks a model by name, one per way a turn can finish:

* ``t:chat`` answers ``ack: <the last user text>``. A ``[delay=s]`` directive in the text is the
  model's latency (the model being slow); ``[tool=1]`` makes the first step write ``note.txt``
  with ``write_file`` before answering.
* ``t:maxtok`` stops at its output limit (finish ``max_tokens``) with partial text.
* ``t:fail`` fails with an authentication error (not retried: the turn ends ``error``).
* ``t:loop`` asks for ``list_dir`` at every step (the turn ends ``max_steps``).
* ``t:delegate`` hands the task down with the real ``delegate`` tool: ``[depth=n]`` with ``n > 0``
  delegates ``[depth=n-1] ...`` to a subagent (which runs this same model), then answers
  ``done at depth n``; ``[depth=0]`` answers at once, or after ``s`` seconds with ``hold=s``
  (passed down the levels). Every call reports usage that differs by depth and step
  (:func:`delegate_usage`), so a sum that counts a session twice shows.
* ``t:stream`` streams ``first part, second part`` in two chunks, ``[chunk_delay=s]`` apart (the
  first chunk is out as soon as the call has announced itself).

Each call announces itself (``sdk <model> step=<n> <text>``) on the harness's datagram socket
when ``TESTMODELS_CALLS_SOCKET`` is set, so a test can wait until a call is surely in flight.
"""

from __future__ import annotations

from goald_testmodels import _last_user, announce, directives

from agent import FinishReason, ModelErrorKind, ModelRequest, Reply, ScriptedModel, ToolCall, Usage


def _chat(request: ModelRequest) -> Reply:
    text, step = _last_user(request)
    conf = directives(text)
    announce(f"sdk chat step={step} {text[:200]}")
    delay = conf.get("delay", 0.0)
    if conf.get("tool") and step == 0:
        write = ToolCall("write_file", {"path": "note.txt", "content": "written by the run\n"})
        return Reply(text="Writing note.txt.", tool_calls=[write], delay=delay)
    if step > 0:
        return Reply.say("wrote note.txt")
    return Reply.say(f"ack: {text[:60]}", delay=delay, usage=Usage(input_tokens=10, output_tokens=4))


def _maxtok(request: ModelRequest) -> Reply:
    text, step = _last_user(request)
    announce(f"sdk maxtok step={step} {text[:200]}")
    return Reply(text="cut off mid", finish=FinishReason.MAX_TOKENS, usage=Usage(input_tokens=5, output_tokens=7))


def _fail(request: ModelRequest) -> Reply:
    text, step = _last_user(request)
    announce(f"sdk fail step={step} {text[:200]}")
    return Reply.fail(ModelErrorKind.AUTH, "scripted: the API key was refused")


def _loop(request: ModelRequest) -> Reply:
    text, step = _last_user(request)
    announce(f"sdk loop step={step} {text[:200]}")
    return Reply(text=f"looking again ({step})", tool_calls=[ToolCall("list_dir", {"path": "."})])


def delegate_usage(depth: int, step: int) -> Usage:
    """What ``t:delegate`` reports for step ``step`` of a session at directive depth ``depth``."""
    return Usage(input_tokens=100 * (depth + 1) + step, output_tokens=10 * (depth + 1) + step, cache_read_tokens=depth)


def _delegate(request: ModelRequest) -> Reply:
    text, step = _last_user(request)
    conf = directives(text)
    depth, hold = int(conf.get("depth", 0)), conf.get("hold", 0.0)
    announce(f"sdk delegate step={step} {text[:200]}")
    used = delegate_usage(depth, step)
    if depth > 0 and step == 0:
        held = f" hold={hold:g}" if hold else ""
        task = ToolCall("delegate", {"task": f"[depth={depth - 1}{held}] the part {depth - 1} levels down"})
        return Reply(text=f"Delegating from depth {depth}.", tool_calls=[task], usage=used)
    return Reply.say(f"done at depth {depth}", usage=used, delay=hold if depth == 0 else 0.0)


def _stream(request: ModelRequest) -> Reply:
    text, step = _last_user(request)
    announce(f"sdk stream step={step} {text[:200]}")
    return Reply.say("first part, second part", chunks=2, chunk_delay=directives(text).get("chunk_delay", 0.0))


def build(name: str) -> ScriptedModel | None:
    """The model called ``name``; None for any other name."""
    rules = {"chat": _chat, "maxtok": _maxtok, "fail": _fail, "loop": _loop, "stream": _stream, "delegate": _delegate}
    rule = rules.get(name)
    return ScriptedModel(rule, name=name, record=False) if rule is not None else None
