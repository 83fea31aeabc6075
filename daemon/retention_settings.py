"""The ``[retention]`` section: how long ended goals keep their history and work directories.

Re-exported from :mod:`daemon.settings`. The goal package's policy is built from it only when the
daemon runs retention (the CLI's client commands never import :mod:`goals.retention`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from goals.retention import RetentionPolicy


class RetentionSettings(BaseModel):
    """How long ended goals keep their history and work directories (``[retention]``).

    Ages are in seconds (0: keep forever); see :mod:`goals.retention` for what an ended goal keeps.
    """

    model_config = ConfigDict(extra="forbid")

    #: Seconds after a goal ended (completed, failed, cancelled) before its session history is pruned.
    history_seconds: float = Field(default=30 * 86_400.0, ge=0)
    #: Events each pruned session keeps (the newest, extended back to a turn's start).
    keep_events: int = Field(default=200, ge=0)
    #: Seconds after a goal ended before the work directory goald made for it is removed.
    workdir_seconds: float = Field(default=90 * 86_400.0, ge=0)
    #: Goal keys or ids whose work directories are never removed.
    keep_workdirs: list[str] = []
    #: Seconds between the daemon's retention runs (0: only ``goald store compact``).
    interval_seconds: float = Field(default=3600.0, ge=0)
    #: Rows one retention step deletes (one short transaction).
    batch_rows: int = Field(default=500, ge=1, le=100_000)
    #: Bytes of events one retention step deletes, about (at least one event).
    batch_bytes: int = Field(default=1 << 20, ge=1)
    #: Pages one ``incremental_vacuum`` step gives back to the file system.
    vacuum_pages: int = Field(default=256, ge=1, le=1_000_000)

    def policy(self, roots: list[Path]) -> RetentionPolicy:
        """The goal package's retention policy for these settings and work-directory ``roots``."""
        from goals.retention import RetentionPolicy  # the CLI's client commands never need it

        return RetentionPolicy(
            history_seconds=self.history_seconds,
            keep_events=self.keep_events,
            workdir_seconds=self.workdir_seconds,
            keep_workdirs=self.keep_workdirs,
            workdir_roots=roots,
            batch_rows=self.batch_rows,
            batch_bytes=self.batch_bytes,
            vacuum_pages=self.vacuum_pages,
        )
