"""Clients of a running daemon.

- :mod:`~daemon.client.connection`: :class:`Connection`, the JSON-RPC connection as it is on the
  wire (dicts in, dicts out), used by the CLI and the tests.
- :mod:`~daemon.client.sdk`: :class:`Client`, the Python SDK built on it (``run()`` and the
  typed calls), with its parts: :mod:`~daemon.client.notifications` (typed notifications and the
  streams that hand them out) and :mod:`~daemon.client.child` (a private ``goald serve --stdio``
  child: its command line, and stopping it with escalation).
- :mod:`~daemon.client.interval`: what ``run()`` owns, from a message's receipt to the next
  whole-agent idle, and its :class:`RunResult`.

``daemon.sdk`` re-exports the SDK's public names (the documented import path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daemon.client.connection import Connection, DaemonUnavailable, SocketPermissionDenied
    from daemon.client.interval import Interval, RunResult, RunUsage, SessionEvent, find_receipt
    from daemon.client.sdk import (
        AgentState,
        Client,
        MessageIdReused,
        Notification,
        Notifications,
        RunIncomplete,
        StatusChange,
        StopStep,
    )
    from daemon.rpc.protocol import RpcError

#: Where each name lives, imported on first use: the CLI needs the connection only, not the SDK
#: (which loads the whole daemon to run one in its process).
_HOMES: dict[str, str] = {
    "AgentState": "daemon.client.sdk",
    "Client": "daemon.client.sdk",
    "Connection": "daemon.client.connection",
    "DaemonUnavailable": "daemon.client.connection",
    "Interval": "daemon.client.interval",
    "MessageIdReused": "daemon.client.sdk",
    "Notification": "daemon.client.sdk",
    "Notifications": "daemon.client.sdk",
    "RpcError": "daemon.rpc.protocol",
    "RunIncomplete": "daemon.client.sdk",
    "RunResult": "daemon.client.interval",
    "RunUsage": "daemon.client.interval",
    "SessionEvent": "daemon.client.interval",
    "SocketPermissionDenied": "daemon.client.connection",
    "StatusChange": "daemon.client.sdk",
    "StopStep": "daemon.client.sdk",
    "find_receipt": "daemon.client.interval",
}

if not TYPE_CHECKING:  # (mypy reads the imports above; a module ``__getattr__`` would make every name Any)
    from agent.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())


__all__ = [
    "AgentState",
    "Client",
    "Connection",
    "DaemonUnavailable",
    "Interval",
    "MessageIdReused",
    "Notification",
    "Notifications",
    "RpcError",
    "RunIncomplete",
    "RunResult",
    "RunUsage",
    "SessionEvent",
    "SocketPermissionDenied",
    "StatusChange",
    "StopStep",
    "find_receipt",
]
