"""A work directory is opened, never followed: the same directory every time, or a clear refusal.

A work directory is a path the daemon stored when the session (or goal) was set up. Between uses,
whoever can write its parent could swap it for a symlink (``rm -rf b; ln -s / b``) or for another
directory, and the next sandboxed command would get that bound read-write, the next file tool would
read through it as the daemon. So every use opens it the same way: from ``/`` one component at a
time with ``O_PATH | O_DIRECTORY | O_NOFOLLOW`` (a symlink anywhere on the path is refused, not
followed), and checks that what it holds is the directory (device, inode) recorded when the work
directory was first set up in this process (:func:`pin`; a path seen first at its use is recorded
then). The caller works from the descriptor it got (bwrap binds it with ``--bind-fd``; the file
tools walk below it), so nothing is looked up by name after the check.

Work directories are stored resolved (no symlink in them), so a legitimate path never trips this.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from agent.errors import AgentError

_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_known: dict[str, tuple[int, int]] = {}
_lock = threading.Lock()


class WorkdirChanged(AgentError, PermissionError):
    """A work directory that is no longer the directory it was set up as (a symlink now, or replaced)."""


def _key(path: Path) -> str:
    return os.path.normpath(os.fspath(path))


def _walk(path: Path) -> int:
    """An ``O_PATH`` descriptor of ``path``, reached without following any symlink."""
    where = _key(path)
    if not os.path.isabs(where):
        raise WorkdirChanged(f"the work directory {where!r} is not an absolute path")
    fd = os.open("/", _PATH_FLAGS)
    try:
        for part in Path(where).parts[1:]:
            try:
                child = os.open(part, _PATH_FLAGS, dir_fd=fd)
            except NotADirectoryError:
                raise WorkdirChanged(
                    f"the work directory {where!r} is not a real directory any more ({part!r} on its path is a "
                    "symlink or a file): refused; give the session a new work directory"
                ) from None
            except FileNotFoundError:
                raise WorkdirChanged(f"the work directory {where!r} does not exist") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def pin(path: Path) -> None:
    """Record ``path`` as the directory it is now (when a session or goal is set up with it).

    Raises:
        WorkdirChanged: a component of ``path`` is a symlink, or it does not exist.
    """
    fd = _walk(path)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    with _lock:
        _known[_key(path)] = (st.st_dev, st.st_ino)


def open_workdir(path: Path) -> int:
    """An ``O_PATH`` descriptor of the work directory ``path``, checked; the caller closes it.

    Raises:
        WorkdirChanged: a component is a symlink, the directory is gone, or it is another directory
            than the one recorded.
    """
    fd = _walk(path)
    st = os.fstat(fd)
    ident = (st.st_dev, st.st_ino)
    with _lock:
        known = _known.setdefault(_key(path), ident)
    if known != ident:
        os.close(fd)
        raise WorkdirChanged(
            f"the work directory {_key(path)!r} was replaced by another directory since it was set up: "
            "refused; give the session a new work directory"
        )
    return fd


@contextlib.contextmanager
def opened(path: Path) -> Iterator[int]:
    """:func:`open_workdir` as a context manager."""
    fd = open_workdir(path)
    try:
        yield fd
    finally:
        os.close(fd)
