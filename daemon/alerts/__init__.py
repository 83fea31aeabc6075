"""Notifications: a durable outbox delivered at least once to webhooks, ntfy and commands.

What changes writes its notification in its own transaction (:mod:`agent.outbox`; goals through
:mod:`goals.notices`, schedule runs and breakers through :mod:`daemon.alerts.kinds`); the sender
(:mod:`daemon.alerts.sender`) groups by cause, delivers with retries and records every attempt;
:mod:`daemon.alerts.service` ties it to the daemon (breakers, the dead-man URL, ``notify test``).
The name is not ``notify``: :mod:`daemon.notify` is systemd's notify protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daemon.alerts.config import NotifySettings
    from daemon.alerts.kinds import NotificationKind
    from daemon.alerts.service import Alerts, UnknownSink

#: Where each name lives, imported on first use: the settings read ``[notify]`` without loading the
#: sender and the outbox.
_HOMES: dict[str, str] = {
    "Alerts": "daemon.alerts.service",
    "NotificationKind": "daemon.alerts.kinds",
    "NotifySettings": "daemon.alerts.config",
    "UnknownSink": "daemon.alerts.service",
}

if not TYPE_CHECKING:  # (mypy reads the imports above; a module ``__getattr__`` would make every name Any)
    from agent.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())


__all__ = ["Alerts", "NotificationKind", "NotifySettings", "UnknownSink"]
