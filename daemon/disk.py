"""The disk that holds the store: a watermark of free space, and the store's reserve.

A goal's command can fill the disk its work directory is on; with work directories under the state
directory (the default layout) that is the store's disk too, and a full store stops every goal.
Three layers, none of which trusts the others:

* each goal's **disk limit** (:mod:`goals.policy`: its work directory, as the fingerprint's walk
  measures it, over the limit pauses the goal ``disk_limit``);
* the **watermark** (``[storage] min_free_mb``, ``min_free_percent``): below it no sandboxed command
  starts (the tool result says why: :meth:`StoreDisk.low`, raised as
  :class:`~agent.sandbox.base.CommandRefused`) and goals wait at their idle, active, with the reason
  (:attr:`goals.GoalEngine.hold`), until space is back;
* the **reserve** (``[storage] reserve_mb``): a file of real blocks beside the SQLite store
  (:class:`agent.storage.StoreReserve`), released by the store when a write meets a full disk, so
  that the failure and the command's result are recorded, and made again here once the disk has
  room for it above the watermark.

For a PostgreSQL store the disk watched is the state directory's (work directories default there);
there is no reserve. The ``[storage]`` section is :class:`StorageSettings` (re-exported from
:mod:`daemon.settings`).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field

from agent.storage import StoreReserve
from goals import size_text

MIB = 1024 * 1024
#: How often the disk is looked at (the reserve made again, a low disk's clearing logged).
WATCH_SECONDS = 5.0
#: The reserve's file name, beside the SQLite database.
RESERVE_NAME = "store.reserve"


class StorageSettings(BaseModel):
    """Free space on the store's disk (``[storage]``)."""

    model_config = ConfigDict(extra="forbid")

    #: Below this many MiB free on the disk holding the store, no sandboxed command starts and goals
    #: wait (active, nothing counted, the reason shown) until space is back (0: no watermark).
    min_free_mb: int = Field(default=256, ge=0, le=1024 * 1024)
    #: The same as a share of that disk, in percent (0: none); the larger of the two applies.
    min_free_percent: float = Field(default=0.0, ge=0, le=50)
    #: MiB of real blocks kept in ``store.reserve`` beside the SQLite database, released when a write
    #: meets a full disk (0: no reserve).
    reserve_mb: int = Field(default=16, ge=0, le=1024)


class StoreDisk:
    """The free space of the disk holding ``path`` (the store's directory), against ``settings``."""

    def __init__(self, path: Path, settings: StorageSettings, *, reserve: bool = True) -> None:
        self.path = path
        self.settings = settings
        self.reserve = (
            StoreReserve(path / RESERVE_NAME, settings.reserve_mb * MIB) if reserve and settings.reserve_mb else None
        )
        self._was_low: str | None = None

    def space(self) -> tuple[int, int] | None:
        """``(free bytes, total bytes)`` of the disk, as an unprivileged writer sees it (``None``: unknown)."""
        try:
            st = os.statvfs(self.path)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize

    def watermark(self, total: int) -> int:
        """The free bytes below which the disk is low."""
        return max(self.settings.min_free_mb * MIB, int(total * self.settings.min_free_percent / 100))

    def low(self) -> str | None:
        """Why nothing may start now (the disk is under the watermark), in plain words; ``None``: it may."""
        space = self.space()
        if space is None:
            return None
        free, total = space
        mark = self.watermark(total)
        if mark <= 0 or free >= mark:
            return None
        return (
            f"the disk holding goald's store ({self.path}) has {size_text(free)} free,"
            f" under the {size_text(mark)} watermark"
        )

    def keep_reserve(self) -> None:
        """Make the reserve (again) when it is missing and the disk has room for it above the watermark."""
        if self.reserve is None or self.reserve.present():
            return
        space = self.space()
        if space is None:
            return
        free, total = space
        if free < self.watermark(total) + self.reserve.size:
            return
        if self.reserve.make():
            logger.info("the store's reserve ({}) is in place: {}", size_text(self.reserve.size), self.reserve.path)

    def before_open(self) -> None:
        """Before the store opens: on a disk with less free than the reserve, release it (the store's
        repair and migrations may need the room); else make it."""
        if self.reserve is None:
            return
        space = self.space()
        if space is not None and space[0] < self.reserve.size and self.reserve.release():
            logger.warning(
                "the disk holding the store has {} free: the store's reserve was released so that it can open",
                size_text(space[0]),
            )
            return
        self.keep_reserve()

    def check(self) -> None:
        """One look: log a low disk as it begins and as it clears; make the reserve again when it can."""
        why = self.low()
        if why != self._was_low:
            if why is not None:
                logger.warning("{}: no sandboxed command starts and goals wait until space is back", why)
            else:
                logger.info("the disk holding goald's store has space again: commands and goals go on")
            self._was_low = why
        self.keep_reserve()

    async def watch(self, interval: float = WATCH_SECONDS) -> None:
        """:meth:`check` every ``interval`` seconds, forever (cancel to stop)."""
        while True:
            await asyncio.to_thread(self.check)
            await asyncio.sleep(interval)
