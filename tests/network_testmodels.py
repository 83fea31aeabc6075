"""Scripted models for the sandbox network's end-to-end test, loaded inside the daemon it starts
(``script = "network_testmodels:models"``; the harness puts ``tests/`` on the daemon's path).

``fetcher`` runs one shell call that asks, through the proxy the sandbox's variables point at, for
a listed name (``example.test``, which the daemon's ``sandbox_network_hosts`` maps to the test's
own server on the port in ``NET_TEST_PORT``) and an unlisted one, and tries the host's loopback
directly; then it says what came back.
"""

from __future__ import annotations

import os
from typing import Any

FETCH = r"""python3 - <<'EOF'
import socket, urllib.request
for url in ("http://example.test:PORT/daemon", "http://blocked.test:PORT/"):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            print("GOT", url, r.status)
    except Exception as exc:
        print("ERR", url, exc)
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=3).close()
    print("LOOPBACK reached")
except OSError as exc:
    print("LOOPBACK refused", exc)
EOF"""


def models(name: str) -> Any:
    from agent import Reply, ScriptedModel, ToolResultBlock

    def fetcher(request: Any) -> Reply:
        seen = [b for m in request.messages for b in m.content if isinstance(b, ToolResultBlock)]
        if not seen:
            return Reply.call("shell", command=FETCH.replace("PORT", os.environ["NET_TEST_PORT"]), timeout_seconds=60)
        return Reply.say("done")

    if name == "fetcher":
        return ScriptedModel(fetcher, name="fetcher", record=False)
    raise KeyError(name)
