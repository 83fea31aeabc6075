"""One error base per package: every exception class ``agent``, ``goals`` and ``daemon`` define
derives from that package's base (``AgentError``, ``GoalError``, ``DaemonError``).

Private classes (a leading underscore) are control-flow signals that never leave their module and
are exempt. Each kind keeps its narrow stdlib base too, so ``except LookupError`` and the like still
catch it: the second test pins the ones callers rely on.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import agent
import daemon
import goals
from agent import AgentError, InvalidTransition, NotFound
from daemon.errors import DaemonError, InvalidRunState
from daemon.run_state import RunState, transition_run_state

BASES: dict[str, type[BaseException]] = {"agent": AgentError, "goals": goals.GoalError, "daemon": DaemonError}


def _exception_classes() -> list[tuple[str, type[BaseException]]]:
    found = []
    for package in (agent, goals, daemon):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__
                    and not name.startswith("_")
                ):
                    found.append((f"{module.__name__}.{name}", obj))
    return found


def test_every_exception_derives_from_its_package_base() -> None:
    classes = _exception_classes()
    assert len(classes) > 20  # the scan sees the packages
    strays = [name for name, cls in classes if not issubclass(cls, BASES[name.split(".")[0]])]
    assert strays == []


@pytest.mark.parametrize(
    ("cls", "narrow"),
    [
        (goals.GoalNotFound, LookupError),
        (goals.GoalNotFound, NotFound),
        (goals.InvalidGoal, ValueError),
        (goals.GoalConflict, agent.Conflict),
        (goals.InvalidGoalTransition, InvalidTransition),
        (agent.McpUnavailable, RuntimeError),
        (agent.tools.files.PathDenied, PermissionError),
        (InvalidRunState, RuntimeError),
    ],
)
def test_narrow_stdlib_bases_stay(cls: type[BaseException], narrow: type[BaseException]) -> None:
    assert issubclass(cls, narrow)


def test_an_illegal_run_state_change_raises_the_daemon_error() -> None:
    assert transition_run_state(RunState.STARTING, RunState.SERVING) is RunState.SERVING
    with pytest.raises(InvalidRunState, match="cannot go from stopped to serving"):
        transition_run_state(RunState.STOPPED, RunState.SERVING)
