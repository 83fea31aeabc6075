"""Errors of the goal engine: one base, :class:`GoalError`, and narrow kinds under it.

Each kind also derives from the runtime's error of the same meaning (``GoalNotFound`` is a
:class:`~agent.NotFound`, hence a ``LookupError``; ``InvalidGoal`` an :class:`~agent.InvalidInput`,
hence a ``ValueError``), so code that catches the runtime's kinds, or the stdlib's, still catches
the goal's, and the daemon answers them with the same protocol error codes. Every message says what
is wrong and what to do about it; nothing was written when one is raised.

:class:`StaleDecision` is a control-flow signal, not a failure: the engine raises it inside its own
transaction to drop a decision taken from state that changed meanwhile, and decides again.
"""

from __future__ import annotations

from agent import Conflict, InvalidInput, InvalidTransition, NotFound


class GoalError(Exception):
    """Base of every error the goal engine raises on purpose."""


class GoalNotFound(GoalError, NotFound):
    """A goal (or the session a goal names) that does not exist."""


class InvalidGoal(GoalError, InvalidInput):
    """A goal spec or change that is malformed or out of range; nothing was written."""


class GoalConflict(GoalError, Conflict):
    """A goal write that conflicts with durable state (a key or work directory already taken)."""


class InvalidGoalTransition(GoalError, InvalidTransition):
    """A goal status change its lifecycle does not allow (e.g. resuming a completed goal)."""


class StaleDecision(GoalError):
    """The goal or its session changed after the engine read them; nothing was written."""
