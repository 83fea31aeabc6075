"""Background tasks that must outlive the call that started them, and be stopped by their owner.

The event loop keeps only a weak reference to a task, so a task started and forgotten may be
collected mid-run; every owner of fire-and-forget work (a connection's handlers, the ACP bridge,
the scheduler's fires, a signal handler) therefore holds its tasks in a set until each is done.
:class:`TaskSet` is that set, written once: :meth:`~TaskSet.spawn` starts and keeps a task,
and the owner stops them with :meth:`~TaskSet.cancel` (at once) or :meth:`~TaskSet.drain` (a
grace period first, then cancel), so no task outlives its owner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class TaskSet:
    """The live background tasks of one owner."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Start ``coro`` as a task on the running loop and keep it until it is done."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    def busy(self) -> bool:
        """Whether a task is still running."""
        return any(not t.done() for t in self._tasks)

    async def cancel(self) -> None:
        """Cancel every task and wait for each to end (their failures are not raised here)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def drain(self, grace: float) -> None:
        """Give the tasks ``grace`` seconds to finish, then cancel the rest and wait for them."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
