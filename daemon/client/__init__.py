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
