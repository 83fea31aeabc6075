"""Scripted models and commands for the goal-wide limits' tests (``script = "limits_testmodels:models"``
in a daemon they start; the harness puts ``tests/`` on the daemon's path).

``hogs`` asks, in one step, for :data:`PARALLEL_HOGS` shell calls at once, each holding
:data:`HOG_MIB` MiB for a few seconds (:data:`HOLD_MEMORY`), then says done: the attack of issue 24
that held 2,574 MiB against a 256 MiB cap while caps were per command.
"""

from __future__ import annotations

from typing import Any

#: Parallel calls of the ``hogs`` step, and the MiB each holds.
PARALLEL_HOGS = 24
HOG_MIB = 100
#: Holds HOG_MIB MiB (a bytearray: every page touched) until every hog of the step has started (each
#: leaves a file in the work directory first; at most 20 s) and 4 s more, then prints how many bytes
#: it held. Waiting for the others makes the hogs overlap however slowly a loaded machine starts
#: them: with a fixed 4 s, a hog started after an earlier one had finished kept its memory too.
HOLD_MEMORY = (
    "mktemp -p . hog-XXXXXXXXXX > /dev/null; python3 -c 'import glob, time\n"
    f"b = bytearray({HOG_MIB} << 20)\n"
    "end = time.monotonic() + 20\n"
    f'while len(glob.glob("hog-*")) < {PARALLEL_HOGS} and time.monotonic() < end:\n'
    "    time.sleep(0.05)\n"
    "time.sleep(4)\n"
    "print(len(b))'"
)
#: What a hog that kept its memory to the end prints.
HELD = str(HOG_MIB << 20)
#: Forks up to 40 children that sleep 4 s, prints how many it started, then waits for them
#: (``os.fork`` fails at once at a process limit, where bash would retry for seconds).
FORKS = (
    "python3 -c 'import os, time\n"
    "n = 0\n"
    "for _ in range(40):\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        time.sleep(4)\n"
    "        os._exit(0)\n"
    "    n += 1\n"
    "print(n, flush=True)\n"
    "for _ in range(n):\n"
    "    os.wait()'"
)


def models(name: str) -> Any:
    from agent import Reply, ScriptedModel, ToolCall, ToolResultBlock

    def results(request: Any) -> list[str]:
        return [b.content for m in request.messages for b in m.content if isinstance(b, ToolResultBlock)]

    if name == "hogs":

        def hogs(request: Any) -> Reply:
            if not results(request):
                call = {"command": HOLD_MEMORY, "timeout_seconds": 60}
                return Reply(tool_calls=[ToolCall("shell", call) for _ in range(PARALLEL_HOGS)])
            return Reply.say("done")

        return ScriptedModel(hogs, name="hogs", record=False)
    return None
