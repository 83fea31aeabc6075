"""Errors of the agent runtime.

Three kinds, kept apart: user misuse (bad input, unknown ids, illegal transitions) raised to the
caller before anything is written; run failures (a model or tool failing) that end a turn and are
recorded; and control-flow signals that never escape the driver.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error the agent runtime raises on purpose."""


class InvalidInput(AgentError, ValueError):
    """Input that is malformed or out of range; nothing was written."""


class NotFound(AgentError, LookupError):
    """A session, message or other row that does not exist."""


class InvalidTransition(AgentError, RuntimeError):
    """A lifecycle transition that the lifecycle does not allow (e.g. cancelling an admitted message)."""


class Conflict(AgentError, RuntimeError):
    """A write that conflicts with durable state (a pending key already queued, an id reused)."""


class StoreClosed(AgentError, RuntimeError):
    """The store was closed."""


class NotSupported(AgentError, RuntimeError):
    """What was asked is not done by this kind of store (a file backup of PostgreSQL, say); the
    message says what does it instead."""


class HeldElsewhere(Conflict):
    """Another node of the cluster drives the session: this one does not load it."""


class LeaseLost(StoreClosed):
    """This node no longer holds the lease of the session it was driving (another node took it over
    after this one stopped renewing): the write was refused and nothing was written."""


class StaleOpening(AgentError, RuntimeError):
    """A turn's opening planned on the session's state as this node last committed it found the
    session changed (a message queued or cancelled meanwhile, another node's write): the write that
    carried it was rolled back whole, and the driver opens the turn again on the state it reads
    (:func:`agent.turns.open_planned`). A control-flow signal of the driver's, which reaches nobody
    else but the caller of :meth:`agent.driver.Agent.open_after` whose write was not committed (it
    commits it itself)."""


class SchemaTooNew(AgentError, RuntimeError):
    """The database was written by a newer goald than this one."""


class StorageUnavailable(AgentError, RuntimeError):
    """The store cannot write (disk full, an I/O error, a read-only file system); nothing was written.

    ``hint`` says what to do. Whoever holds durable work (the driver, the goal engine) retries
    until a write succeeds; new input is refused with this error meanwhile.
    """

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
