"""The ``[storage]`` section: the free space the daemon keeps on the disk that holds its store.

Re-exported from :mod:`daemon.settings`. What the daemon does with it is :mod:`daemon.disk`'s: below
the watermark no sandboxed command starts and goals wait; the reserve is a file of real blocks beside
the SQLite store, given back when a write meets a full disk (so the failure, and the result of the
command that filled it, can still be recorded) and made again once space is back.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
