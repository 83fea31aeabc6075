"""Scripted models for the sandbox's end-to-end tests, loaded inside a daemon they start
(``script = "sandbox_testmodels:models"``; the harness puts ``tests/`` on the daemon's path).

``bomber`` runs a bounded fork bomb, then a bounded memory hog, through ``shell``, then says what
came back. ``leaker`` asks the ``fixture`` MCP server for the value of ``FIXTURE_TOKEN`` and repeats it.
``whoami`` runs :data:`WHOAMI` and answers with its result.
"""

from __future__ import annotations

from typing import Any

#: At most 400 processes, each gone after 30 s; the shell call's timeout ends it first.
FORK_BOMB = "for i in $(seq 400); do (exec -a goald-bomb sleep 30) & done; wait"
#: At most 400 MB in one bash variable.
MEMORY_HOG = "x=$(head -c 400000000 /dev/zero | tr '\\0' x); echo ${#x}"


#: Who a command is: inside (uid, gid) and on the host (the owner of a file it makes, as the
#: test reads it outside).
WHOAMI = "id -u; id -g; touch made-by-the-command"


#: The attacks of the sandbox issue that need nothing but a shell, one shell call each (the model
#: ``attacker``); each prints what it got, so the test reads the results.
ATTACKS = (
    # The descriptor climb: any descriptor that names a directory of the host leads to its root.
    "ls /proc/self/fd; for fd in /proc/self/fd/*; do cat $fd/../../../../../../etc/hostname 2>/dev/null "
    "&& echo CLIMBED $fd; echo pwned > $fd/../escaped 2>/dev/null && echo WROTE $fd; done; echo climb-done",
    # Set-user-ID: a copy of id made set-uid, its directory opened to others.
    "cp /usr/bin/id ./id2; chmod 4755 ./id2; chmod 755 .; stat -c 'mode %a owner %u' id2",
    # The keyring: read the session keyring, add a key of our own.
    "cat /proc/keys | wc -l; python3 -c 'import ctypes; print(ctypes.CDLL(None).syscall(250, 0, -3, 0))'; "
    'python3 -c \'import ctypes; print(ctypes.CDLL(None).syscall(248, b"user", b"mine", b"x", 1, -3))\'',
)


def models(name: str) -> Any:
    from agent import Reply, ScriptedModel, ToolCall, ToolResultBlock

    def results(request: Any) -> list[str]:
        return [b.content for m in request.messages for b in m.content if isinstance(b, ToolResultBlock)]

    if name == "bomber":

        def bomber(request: Any) -> Reply:
            seen = results(request)
            if not seen:
                return Reply.call("shell", command=FORK_BOMB, timeout_seconds=4)
            if len(seen) == 1:
                return Reply.call("shell", command=MEMORY_HOG, timeout_seconds=60)
            return Reply.say("done")

        return ScriptedModel(bomber, name="bomber", record=False)
    if name == "attacker":

        def attacker(request: Any) -> Reply:
            seen = results(request)
            if len(seen) < len(ATTACKS):
                return Reply.call("shell", command=ATTACKS[len(seen)], timeout_seconds=30)
            return Reply.say("done")

        return ScriptedModel(attacker, name="attacker", record=False)
    if name == "whoami":

        def whoami(request: Any) -> Reply:
            seen = results(request)
            if not seen:
                return Reply.call("shell", command=WHOAMI, timeout_seconds=30)
            return Reply.say(seen[0])

        return ScriptedModel(whoami, name="whoami", record=False)
    if name == "leaker":

        def leaker(request: Any) -> Reply:
            seen = results(request)
            if not seen:
                # Not Reply.call: the tool's argument is called ``name``.
                return Reply(tool_calls=[ToolCall("fixture__env", {"name": "FIXTURE_TOKEN"})])
            return Reply.say(f"the token is {seen[0]}")

        return ScriptedModel(leaker, name="leaker", record=False)
    return None
