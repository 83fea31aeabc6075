"""Errors of the daemon: one base, :class:`DaemonError`, under every error the daemon raises on purpose.

Each kind keeps its narrow stdlib base as well (``ConfigError`` is a ``ValueError``,
``DaemonUnavailable`` a ``ConnectionError``, ``FrameTimeout`` a ``TimeoutError``), so existing
``except`` clauses still catch it; the kinds live beside the code that raises them. Errors the
agent runtime or the goal engine raise keep their own bases (``AgentError``, ``GoalError``): the
protocol maps those to error codes, and this base says only that the daemon itself refused.
"""

from __future__ import annotations


class DaemonError(Exception):
    """Base of every error the daemon raises on purpose."""


class InvalidRunState(DaemonError, RuntimeError):
    """A run-state change the daemon's lifecycle does not allow (a bug in the caller, not in the input)."""
