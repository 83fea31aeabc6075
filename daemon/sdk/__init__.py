"""goald's Python SDK: an async :class:`Client` of a running daemon (or of a private child daemon).

``prompt()`` answers a ``MessageId`` once the enqueue is durable; ``notifications()`` streams
``session.event`` / ``session.status``; ``run()`` owns the interval from the message's receipt
to the next whole-agent idle and returns a :class:`RunResult` (see :mod:`daemon.client.interval`
for what it does and does not claim)::

    async with await Client.spawn() as client:
        result = await client.run("Summarise data.csv", model="scripted:echo")
        print(result.final_response, result.finish_reason)

The public import path; the code lives in :mod:`daemon.client`.
"""

from daemon.client import (
    AgentState,
    Client,
    DaemonUnavailable,
    Interval,
    MessageIdReused,
    Notification,
    Notifications,
    RpcError,
    RunIncomplete,
    RunResult,
    RunUsage,
    SessionEvent,
    StatusChange,
    StopStep,
    find_receipt,
)

__all__ = [
    "AgentState",
    "Client",
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
    "StatusChange",
    "StopStep",
    "find_receipt",
]
