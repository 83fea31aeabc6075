"""One daemon per state directory: an exclusive ``flock`` on ``<state_dir>/goald.lock``.

Why a lock on the directory, taken before anything else: a second daemon that opened the store
would run crash repair on sessions that are alive in the first (writing "interrupted" turn ends
into their event sequences), and with another socket path two daemons would serve one database
side by side. The socket cannot guard against either, so :meth:`StateLock.acquire` runs before the
store is opened, before any directory under the state directory is made and before the socket
is touched; a start that finds the lock held writes nothing and exits 75 (``EX_TEMPFAIL``).

Why ``flock`` and not a PID file alone: the kernel releases the lock when its holder dies
(``kill -9`` included), so a stale file never blocks a start; the PID written into the file is
only there to name the holder in the refusal. The descriptor is opened ``O_CLOEXEC``: no command
the daemon starts (a sandboxed shell, an MCP server, bwrap itself) inherits it, so none can keep
the directory locked after the daemon is gone, and none sees it inside the sandbox.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

LOCK_NAME = "goald.lock"


class StateDirLocked(RuntimeError):
    """Another process holds the state directory; ``pid`` names it when it could be read."""

    def __init__(self, state_dir: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "a process whose pid could not be read"
        lock = state_dir / LOCK_NAME
        super().__init__(f"another goald ({holder}) holds the state directory {state_dir} (lock {lock})")
        self.state_dir = state_dir
        self.pid = pid


class StateLock:
    """The exclusive lock of one state directory, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock and write this process's PID into the file.

        Raises:
            StateDirLocked: another process (or another :class:`StateLock` of this one) holds it.
        """
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            pid = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StateDirLocked(self.state_dir, pid) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Let the lock go (the file stays: removing it would race a start that just opened it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
