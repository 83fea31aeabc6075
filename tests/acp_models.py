"""Deterministic models for ``goald acp`` tests, loaded *inside* the bridge's embedded daemon.

The test's config names this module as a scripted provider (``tests/`` is on the child's
``PYTHONPATH``)::

    default_model = "acp:chat"
    [providers.acp]
    kind = "scripted"
    script = "acp_models:model"

``chat`` reads a keyword in the last user message (the ACP prompt) and answers accordingly:

* ``[max_tokens]`` — a reply cut off by the output limit;
* ``[refuse]`` — the provider refuses;
* ``[fail]`` — a provider error that is not retried;
* ``[loop]`` — a ``list_dir`` call at every step, forever (the turn hits its step limit);
* ``[slow]`` — text streamed in 60 chunks 0.05 s apart (the model being slow);
* ``[tool]`` — writes ``note.txt`` in the work directory, then says so;
* ``[gate PATH]`` — the call connects to the unix socket ``PATH`` (the test's gate) and answers
  ``released`` once the gate sends a byte: a model call that lasts exactly until the test says;
* ``[print]`` — writes ``STRAY-PRINT`` with ``print`` and runs ``echo STRAY-CHILD`` (stdout
  pollution the bridge must keep off its protocol stream), then answers;
* anything else — ``ack: <text>`` in three chunks.

A goal's continuation (it starts with ``[goal goal_…]``) gets the goal worker: in round ``r`` it
writes ``round<r>.txt``, notes progress (or, in the last round, claims completion), then ends
the round with a line of text. The number of rounds is ``[rounds=N]`` in the objective (1 if
absent); ``[delay=S]`` there makes each of its calls take ``S`` seconds (the model being slow), and
``[gate PATH]`` holds round 1's first call at the test's gate until it opens.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Awaitable

from agent import FinishReason, ModelErrorKind, ModelRequest, Reply, ScriptedModel, TextBlock, ToolCall

_ROUND = re.compile(r"Round (\d+)")
_ROUNDS = re.compile(r"\[rounds=(\d+)\]")
_DELAY = re.compile(r"\[delay=([0-9.]+)\]")
_GATE = re.compile(r"\[gate (\S+)\]")
SLOW_TEXT = "".join(f"w{i:02d} " for i in range(60))


def _last_user(request: ModelRequest) -> tuple[str, int]:
    """The last user message's text and how many assistant messages followed it."""
    last = max((i for i, m in enumerate(request.messages) if m.role == "user"), default=-1)
    if last < 0:
        return "", 0
    text = "".join(b.text for b in request.messages[last].content if isinstance(b, TextBlock))
    return text, sum(1 for m in request.messages[last + 1 :] if m.role == "assistant")


async def _gated(path: str) -> Reply:
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        await reader.read(1)  # the gate's release, or its end
    finally:
        writer.close()
    return Reply.say("released", chunks=2)


async def _after_gate(path: str, reply: Reply) -> Reply:
    await _gated(path)
    return reply


def _worker(text: str, step: int) -> Reply | Awaitable[Reply]:
    found = _ROUND.search(text)
    gate = _GATE.search(text)
    if gate is not None and step == 0 and (found is None or found.group(1) == "1"):
        # Round 1's first call lasts until the test opens the gate, then goes on as usual.
        return _after_gate(gate.group(1), _round_step(text, step))
    return _round_step(text, step)


def _round_step(text: str, step: int) -> Reply:
    found = _ROUND.search(text)
    round_no = int(found.group(1)) if found else 1
    rounds_found = _ROUNDS.search(text)
    rounds = int(rounds_found.group(1)) if rounds_found else 1
    delay_found = _DELAY.search(text)
    delay = float(delay_found.group(1)) if delay_found else 0.0
    if step == 0:
        write = ToolCall("write_file", {"path": f"round{round_no}.txt", "content": f"round {round_no}\n"})
        return Reply(text=f"Round {round_no}: writing round{round_no}.txt.", tool_calls=[write], delay=delay)
    if step == 1:
        if round_no >= rounds:
            claim = {"summary": f"all {rounds} rounds written", "evidence": f"round{round_no}.txt exists"}
            return Reply(tool_calls=[ToolCall("goal_complete", claim)], delay=delay)
        return Reply(tool_calls=[ToolCall("goal_progress", {"note": f"round {round_no} written"})], delay=delay)
    return Reply.say(f"Round {round_no} finished.", delay=delay)


def _chat(request: ModelRequest) -> Reply | Awaitable[Reply]:
    text, step = _last_user(request)
    if text.startswith("[goal goal_"):
        return _worker(text, step)
    gate = _GATE.search(text)
    if gate is not None:
        return _gated(gate.group(1))
    if "[max_tokens]" in text:
        return Reply(text="This answer is cut o", finish=FinishReason.MAX_TOKENS, chunks=2)
    if "[refuse]" in text:
        return Reply(text="I can't help with that.", finish=FinishReason.REFUSAL)
    if "[fail]" in text:
        return Reply.fail(ModelErrorKind.BAD_REQUEST, "the provider rejected the request (scripted)")
    if "[loop]" in text:
        return Reply.call("list_dir", path=".")
    if "[slow]" in text:
        return Reply(text=SLOW_TEXT, chunks=60, chunk_delay=0.05)
    if "[print]" in text:
        print("STRAY-PRINT", flush=True)
        subprocess.run(["echo", "STRAY-CHILD"], check=True)
        return Reply.say("printed")
    if "[tool]" in text:
        if step == 0:
            write = ToolCall("write_file", {"path": "note.txt", "content": "hi\n"})
            return Reply(text="Writing a note. ", tool_calls=[write])
        return Reply.say("Wrote note.txt.", chunks=2)
    return Reply.say(f"ack: {text}", chunks=3)


def model(name: str) -> ScriptedModel | None:
    """The model called ``name`` (only ``chat``)."""
    return ScriptedModel(_chat, name=name, record=False) if name == "chat" else None
