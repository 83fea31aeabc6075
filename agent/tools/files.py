"""File tools confined to a session's work directory.

Every path is resolved (symlinks included) and must stay inside the work directory: ``..`` that
climbs out, an absolute path elsewhere, and a symlink that points outside are refused before any
file is touched (:func:`confine`).

Checking a path and then opening it by name would leave a race: a shell command of the same model
step (tool calls run in parallel) can swap a checked directory for a symlink to, say, the daemon's
database between the check and the open, and the file tools run unsandboxed, as the daemon. So the
I/O never follows a name again: it walks from the work directory down the resolved path one
component at a time with ``O_NOFOLLOW`` (a component that turned into a symlink is refused), and
then works relative to the directory it holds open. The work directory itself is opened the same
way, from ``/``, and must still be the directory the session was set up with
(:mod:`agent.workdirs`): one swapped for a symlink or another directory is refused. A write goes
to a fresh temporary file created with ``O_EXCL`` (never through a name someone planted) and is
renamed over the target, which replaces a symlink rather than following it. Only regular files
are read or edited: opening a FIFO would block the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, Field

from agent import workdirs
from agent.errors import AgentError
from agent.sandbox.identity import adopt
from agent.tools.base import Tool, ToolContext, ToolOutput


class PathDenied(AgentError, PermissionError):
    """A path that leaves the work directory."""


def confine(workdir: Path | None, raw: str) -> Path:
    """Resolve ``raw`` inside ``workdir`` or raise :class:`PathDenied` saying why."""
    if workdir is None:
        raise PathDenied("this session has no work directory")
    root = workdir.resolve()
    if "\x00" in raw:
        raise PathDenied("path contains a NUL byte")
    candidate = Path(raw)
    target = candidate if candidate.is_absolute() else root / candidate
    resolved = target.resolve(strict=False)
    if resolved != root and not resolved.is_relative_to(root):
        raise PathDenied(f"path {raw!r} is outside the work directory")
    return resolved


# -- I/O that never follows a name twice ---------------------------------------------------------

#: The largest file ``edit_file`` rewrites.
_EDIT_LIMIT = 10_000_000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(workdir: Path, raw: str) -> tuple[Path, tuple[str, ...]]:
    """The resolved work directory and the components of ``raw`` below it (checked by :func:`confine`)."""
    target = confine(workdir, raw)
    root = workdir.resolve()
    return root, target.relative_to(root).parts


def _swapped(raw: str) -> PathDenied:
    return PathDenied(f"path {raw!r} changed while in use (a component became a symlink)")


@contextlib.contextmanager
def _open_dir(workdir: Path, parts: tuple[str, ...], raw: str, *, create: bool = False) -> Iterator[int]:
    """A descriptor of the directory ``workdir/parts``, reached without following any symlink: the work
    directory itself is checked to be the one the session was set up with (:mod:`agent.workdirs`)."""
    with workdirs.opened(workdir) as checked:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=checked)
    try:
        for part in parts:
            made = False
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
                    made = True
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                if made:
                    adopt(child, fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(
                    os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
                ):
                    raise _swapped(raw) from None
                raise
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _read(workdir: Path, raw: str, limit: int) -> bytes:
    """Up to ``limit`` bytes of a regular file."""
    _, parts = _parts(workdir, raw)
    if not parts:
        raise IsADirectoryError(f"{raw!r} is the work directory itself, not a file")
    with _open_dir(workdir, parts[:-1], raw) as dfd:
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _swapped(raw) from None
            raise
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise OSError(f"{raw!r} is {kind}")
        os.set_blocking(fh.fileno(), True)
        return fh.read(limit)


def _write(workdir: Path, raw: str, data: bytes) -> None:
    """Replace (or create) a file atomically, creating its parent directories."""
    _, parts = _parts(workdir, raw)
    if not parts:
        raise IsADirectoryError(f"{raw!r} is the work directory itself, not a file")
    name = parts[-1]
    with _open_dir(workdir, parts[:-1], raw, create=True) as dfd:
        mode = None
        with contextlib.suppress(FileNotFoundError):
            old = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISREG(old.st_mode):
                # An executable script stays executable; set-id bits never survive a write.
                mode = stat.S_IMODE(old.st_mode) & 0o1777
        tmp = f".{name[:200]}.{secrets.token_hex(6)}.goald-tmp"
        # A new file gets 0o666 less the umask, as open(2) makes it.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                adopt(fh.fileno(), dfd)
                fh.write(data)
                if mode is not None:
                    os.fchmod(fh.fileno(), mode)
            # rename(2) replaces a symlink at ``name`` instead of following it.
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise


def _list(workdir: Path, raw: str) -> list[str]:
    _, parts = _parts(workdir, raw)
    with _open_dir(workdir, parts, raw) as dfd, os.scandir(dfd) as it:
        return sorted(e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in it)


def _refused(tool: str, exc: OSError) -> ToolOutput:
    return ToolOutput(f"{tool} refused: {exc}", True)


# -- the tools -------------------------------------------------------------------------------------


class ReadFileArgs(BaseModel):
    """Arguments of ``read_file``."""

    path: str = Field(description="File path relative to the work directory")
    max_bytes: int = Field(default=200_000, ge=1, le=10_000_000)


class ReadFile(Tool[ReadFileArgs]):
    """Read a text file."""

    name = "read_file"
    description = "Read a UTF-8 text file from the work directory."
    Args = ReadFileArgs
    repeat_safe = True
    effects_in_store = True  # it changes nothing

    async def run(self, args: ReadFileArgs, ctx: ToolContext) -> ToolOutput:
        try:
            if ctx.workdir is None:
                raise PathDenied("this session has no work directory")
            data = await asyncio.to_thread(_read, ctx.workdir, args.path, args.max_bytes + 1)
        except OSError as exc:
            return _refused(self.name, exc)
        text = data[: args.max_bytes].decode("utf-8", errors="replace")
        if len(data) > args.max_bytes:
            text += f"\n[... file longer than {args.max_bytes} bytes; rest not shown ...]"
        return ToolOutput(text)


class WriteFileArgs(BaseModel):
    """Arguments of ``write_file``."""

    path: str = Field(description="File path relative to the work directory")
    content: str = Field(description="The whole new content")


class WriteFile(Tool[WriteFileArgs]):
    """Create or replace a text file."""

    name = "write_file"
    description = "Create or overwrite a UTF-8 text file in the work directory (parents are created)."
    Args = WriteFileArgs
    repeat_safe = True

    async def run(self, args: WriteFileArgs, ctx: ToolContext) -> ToolOutput:
        data = args.content.encode("utf-8")
        try:
            if ctx.workdir is None:
                raise PathDenied("this session has no work directory")
            await asyncio.to_thread(_write, ctx.workdir, args.path, data)
        except OSError as exc:
            return _refused(self.name, exc)
        return ToolOutput(f"wrote {len(data)} bytes to {args.path}")


class EditFileArgs(BaseModel):
    """Arguments of ``edit_file``."""

    path: str
    old: str = Field(description="Exact text to replace; must occur exactly once")
    new: str


class EditFile(Tool[EditFileArgs]):
    """Replace one exact occurrence of a text in a file."""

    name = "edit_file"
    description = "Replace exactly one occurrence of `old` with `new` in a text file of the work directory."
    Args = EditFileArgs

    async def run(self, args: EditFileArgs, ctx: ToolContext) -> ToolOutput:
        try:
            if ctx.workdir is None:
                raise PathDenied("this session has no work directory")
            data = await asyncio.to_thread(_read, ctx.workdir, args.path, _EDIT_LIMIT + 1)
        except OSError as exc:
            return _refused(self.name, exc)
        if len(data) > _EDIT_LIMIT:
            return ToolOutput(f"edit_file refused: {args.path} is larger than {_EDIT_LIMIT} bytes", True)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return ToolOutput(f"edit_file refused: {args.path} is not UTF-8 text", True)
        if not args.old:
            return ToolOutput("edit_file: `old` is empty; give the exact text to replace", True)
        count = text.count(args.old)
        if count != 1:
            return ToolOutput(f"edit_file: `old` occurs {count} times in {args.path}; it must occur exactly once", True)
        try:
            await asyncio.to_thread(_write, ctx.workdir, args.path, text.replace(args.old, args.new, 1).encode("utf-8"))
        except OSError as exc:
            return _refused(self.name, exc)
        return ToolOutput(f"edited {args.path}")


class ListDirArgs(BaseModel):
    """Arguments of ``list_dir``."""

    path: str = "."


class ListDir(Tool[ListDirArgs]):
    """List a directory."""

    name = "list_dir"
    description = "List the entries of a directory of the work directory (directories end with /)."
    Args = ListDirArgs
    repeat_safe = True
    effects_in_store = True  # it changes nothing

    async def run(self, args: ListDirArgs, ctx: ToolContext) -> ToolOutput:
        try:
            if ctx.workdir is None:
                raise PathDenied("this session has no work directory")
            lines = await asyncio.to_thread(_list, ctx.workdir, args.path)
        except OSError as exc:
            return _refused(self.name, exc)
        return ToolOutput("\n".join(lines) if lines else "(empty)")


def file_tools() -> list[Tool[ReadFileArgs] | Tool[WriteFileArgs] | Tool[EditFileArgs] | Tool[ListDirArgs]]:
    """The built-in file tools."""
    return [ReadFile(), WriteFile(), EditFile(), ListDir()]
