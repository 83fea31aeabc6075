"""One daemon per state directory and per database: exclusive ``flock`` s on ``<state_dir>/goald.lock``
and on ``<database>.lock``.

Why a lock on the directory, taken before anything else: a second daemon that opened the store
would run crash repair on sessions that are alive in the first (writing "interrupted" turn ends
into their event sequences), and with another socket path two daemons would serve one database
side by side. The database may be configured outside the state directory (``database = ...``), so
two daemons with different state directories could still share one: the database's own lock, next
to the file (taken always, wherever the database lies, since another daemon may name this one's
default database as its ``database``), closes that. The socket cannot guard against any of this,
so :meth:`StateLock.acquire` runs before the
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
from collections.abc import Callable
from pathlib import Path

from daemon.errors import DaemonError

LOCK_NAME = "goald.lock"


class StateDirLocked(DaemonError, RuntimeError):
    """Another process holds the state directory (or the database, if ``database`` is given);
    ``pid`` names it when it could be read."""

    def __init__(self, state_dir: Path, pid: int | None, *, database: Path | None = None) -> None:
        holder = f"pid {pid}" if pid is not None else "a process whose pid could not be read"
        if database is None:
            what, lock, other = f"the state directory {state_dir}", state_dir / LOCK_NAME, "another state directory"
        else:
            what, lock, other = f"the database {database}", database_lock_path(database), "another database"
        super().__init__(
            f"another goald ({holder}) holds {what} (lock {lock}): stop that one first, or give this one {other}"
        )
        self.state_dir = state_dir
        self.database = database
        self.pid = pid


def database_lock_path(database: Path) -> Path:
    """The lock next to a database file: ``<database>.lock`` (of the resolved path, so that a link
    to the database or a path spelled another way names the same lock)."""
    resolved = database.expanduser().resolve()
    return resolved.with_name(resolved.name + ".lock")


class StateLock:
    """The exclusive locks of one state directory and, if given, of its database, held from
    :meth:`acquire` to :meth:`release`."""

    def __init__(self, state_dir: Path, database: Path | None = None) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_NAME
        self.database = database
        self._fds: list[int] = []

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return bool(self._fds)

    def acquire(self) -> None:
        """Take the state directory's lock, then the database's, writing this process's PID into each.

        Raises:
            StateDirLocked: another process (or another :class:`StateLock` of this one) holds either;
                none is then held by this one.
        """
        if self._fds:
            return
        self._fds.append(_take(self.path, lambda pid: StateDirLocked(self.state_dir, pid)))
        if self.database is None:
            return
        database = self.database
        try:
            lock = database_lock_path(database)
            # The database's directory is the store's to make; made here only so its lock can be.
            lock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._fds.append(_take(lock, lambda pid: StateDirLocked(self.state_dir, pid, database=database)))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Let the locks go (the files stay: removing one would race a start that just opened it)."""
        fds, self._fds = self._fds, []
        for fd in reversed(fds):
            with contextlib.suppress(OSError):
                os.close(fd)


def _take(path: Path, refused: Callable[[int | None], StateDirLocked]) -> int:
    """Open ``path`` and ``flock`` it exclusively without waiting; write this process's PID into it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        pid = _read_pid(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise refused(pid) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def default_state_dir() -> Path:
    """The state directory when the configuration names none: systemd's ``StateDirectory=`` (its
    ``STATE_DIRECTORY``), otherwise ``goald`` under the XDG state home."""
    env = os.environ.get("STATE_DIRECTORY")
    if env:
        return Path(env.split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "goald"
