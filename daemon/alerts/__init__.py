"""Notifications: a durable outbox delivered at least once to webhooks, ntfy and commands.

What changes writes its notification in its own transaction (:mod:`agent.outbox`; goals through
:mod:`goals.notices`, schedule runs and breakers through :mod:`daemon.alerts.kinds`); the sender
(:mod:`daemon.alerts.sender`) groups by cause, delivers with retries and records every attempt;
:mod:`daemon.alerts.service` ties it to the daemon (breakers, the dead-man URL, ``notify test``).
The name is not ``notify``: :mod:`daemon.notify` is systemd's notify protocol.
"""

from daemon.alerts.config import NotifySettings
from daemon.alerts.kinds import NotificationKind
from daemon.alerts.service import Alerts, UnknownSink

__all__ = ["Alerts", "NotificationKind", "NotifySettings", "UnknownSink"]
