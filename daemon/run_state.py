"""The daemon's run state: one enum, and one function that performs its transitions.

Kept apart from :mod:`daemon.host` so that what may follow what is read in one short place; an
illegal step raises :class:`~daemon.errors.InvalidRunState` rather than being ignored.
"""

from __future__ import annotations

import enum

from daemon.errors import InvalidRunState


class RunState(enum.StrEnum):
    """The daemon's lifecycle."""

    #: Opening the store, repairing, resuming goals.
    STARTING = "starting"
    #: Serving the control protocol.
    SERVING = "serving"
    #: Taking no new work; letting running turns stop.
    STOPPING = "stopping"
    #: Everything closed.
    STOPPED = "stopped"


def transition_run_state(current: RunState, target: RunState) -> RunState:
    """The one place the daemon's run state changes; an illegal step raises."""
    allowed = {
        RunState.STARTING: (RunState.SERVING, RunState.STOPPING),
        RunState.SERVING: (RunState.STOPPING,),
        RunState.STOPPING: (RunState.STOPPED,),
        RunState.STOPPED: (),
    }[current]
    if target not in allowed:
        raise InvalidRunState(f"the daemon cannot go from {current.value} to {target.value}")
    return target
