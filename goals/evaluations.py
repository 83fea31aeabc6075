"""Running the engine's evaluations: one at a time per goal, coalesced, retried after a failure.

A request to evaluate a goal while its evaluation runs is not a second evaluation: it marks the
goal dirty, and the running one evaluates once more when it ends (the durable state is read
afresh each time, so one more pass covers any number of requests). An evaluation that reports
its decision stale (the session moved on meanwhile) runs again at once.

An evaluation that fails (the store cannot write, a verification runner breaks) is retried after
a backoff, 1 s doubling up to 30 s per failure in a row, like any idle not yet decided: the
engine's ``retry`` callback makes the retry's time durable when it can and arms its timer (see
:meth:`goals.engine.GoalEngine.evaluate`). :meth:`EvaluationRuns.settled` waits until none runs,
which is how the engine stops and how tests wait for a decision.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from loguru import logger

from agent import StorageUnavailable

#: First and longest wait before a failed evaluation is tried again.
EVAL_RETRY_FIRST = 1.0
EVAL_RETRY_MAX = 30.0

#: Evaluate one goal; true when the decision was stale and it should run again at once.
Evaluate = Callable[[str], Awaitable[bool]]
#: After the ``failures``-th failure in a row: evaluate the goal again in ``delay`` seconds.
Retry = Callable[[str, int, float], Awaitable[None]]


class EvaluationRuns:
    """At most one evaluation per goal at a time, coalesced and retried (see the module docstring)."""

    def __init__(self, spawn: Callable[[Coroutine[Any, Any, None]], object], evaluate: Evaluate, retry: Retry) -> None:
        self._spawn = spawn
        self._evaluate = evaluate
        self._retry = retry
        self._evaluating: set[str] = set()
        self._dirty: set[str] = set()
        #: Failed evaluations in a row, by goal (for the retry's backoff).
        self._failures: dict[str, int] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    def kick(self, goal_id: str) -> None:
        """Ask for an evaluation of ``goal_id`` (coalesced with one in flight)."""
        if goal_id in self._evaluating:
            self._dirty.add(goal_id)
            return
        self._spawn(self.run(goal_id))

    async def run(self, goal_id: str) -> None:
        """Evaluate ``goal_id`` until a pass is neither stale nor asked for again (or fails)."""
        if goal_id in self._evaluating:
            self._dirty.add(goal_id)
            return
        self._evaluating.add(goal_id)
        self._idle.clear()
        try:
            again = True
            while again:
                self._dirty.discard(goal_id)
                try:
                    again = await self._evaluate(goal_id)
                except StorageUnavailable as exc:
                    # The store logged the failure once; the retry's timer is in memory only.
                    logger.warning("goal {}: the decision was not committed ({}); it is retried", goal_id, exc)
                    await self._failed(goal_id)
                    again = False
                except Exception:
                    logger.exception("evaluating goal {} failed; it is retried", goal_id)
                    await self._failed(goal_id)
                    again = False
                else:
                    self._failures.pop(goal_id, None)
                again = again or goal_id in self._dirty
        finally:
            self._evaluating.discard(goal_id)
            if not self._evaluating:
                self._idle.set()

    async def settled(self) -> None:
        """Wait until no evaluation is running."""
        while self._evaluating:
            self._idle.clear()
            await self._idle.wait()

    async def _failed(self, goal_id: str) -> None:
        failures = self._failures[goal_id] = self._failures.get(goal_id, 0) + 1
        delay = min(EVAL_RETRY_MAX, EVAL_RETRY_FIRST * 2 ** (failures - 1))
        await self._retry(goal_id, failures, delay)


__all__ = ["EVAL_RETRY_FIRST", "EVAL_RETRY_MAX", "EvaluationRuns"]
