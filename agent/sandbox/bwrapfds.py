"""bwrap's descriptors besides the command's standard ones: its ``--args`` pipe (:class:`ArgsPipe`),
its ``--info-fd`` (:class:`Info`: the sandbox's process 1, held by a pidfd) and the pipe holding
the compiled system-call filter (:func:`filter_pipe`). :mod:`agent.sandbox.process` starts bwrap
with them; bwrap closes each once used, so the command holds none of them (the census).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal

from agent.sandbox import seccomp
from agent.sandbox.base import SandboxUnavailable

__all__ = ["ArgsPipe", "Info", "filter_pipe", "ns_of"]


def filter_pipe() -> int:
    """A pipe holding the compiled system-call filter (:mod:`agent.sandbox.seccomp`); its read end."""
    program = seccomp.program()
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, program)  # a few kB: well within a pipe's buffer
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return read_fd


class Info:
    """bwrap's ``--info-fd``: the sandbox's process 1 (held by a pidfd) and its PID namespace."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._buf = b""
        self._done = asyncio.Event()
        self._value: tuple[int, int] | None = None
        self._pidfd = -1
        self._watching = False

    def started(self) -> None:
        os.close(self.write_fd)
        self.write_fd = -1
        asyncio.get_running_loop().add_reader(self.read_fd, self._readable)
        self._watching = True

    def _readable(self) -> None:
        try:
            chunk = os.read(self.read_fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        self._buf += chunk
        if chunk:
            with contextlib.suppress(ValueError):
                data = json.loads(self._buf)
                self._value = (int(data["child-pid"]), int(data["pid-namespace"]))
                self._pin()
                self._finish()
        else:
            self._finish()

    def _pin(self) -> None:
        # A pidfd, checked against the namespace after it is opened, is process 1 itself even if
        # its PID is reused later; failing either, process 1 is gone already.
        assert self._value is not None
        init, inode = self._value
        try:
            fd = os.pidfd_open(init)
        except OSError:
            return
        if ns_of(init) == inode:
            self._pidfd = fd
        else:
            os.close(fd)

    def _finish(self) -> None:
        if self._watching:
            asyncio.get_running_loop().remove_reader(self.read_fd)
            self._watching = False
        self._done.set()

    async def namespace(self) -> tuple[int, int] | None:
        """``(pid of process 1, PID namespace inode)``; ``None`` if bwrap never got that far."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await self._done.wait()
        return self._value

    @property
    def reached(self) -> bool:
        """Whether bwrap got as far as its sandbox's process 1 (it wrote it on the info pipe)."""
        return self._value is not None

    def kill(self) -> None:
        """SIGKILL process 1: the kernel then kills every process of the namespace."""
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def gone(self, seconds: float) -> bool:
        """Wait up to ``seconds`` until process 1 has exited, which the kernel lets it do only once
        every other process of the namespace is gone; whether it has."""
        await self.namespace()
        if self._pidfd < 0:
            return True
        ended = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(self._pidfd, ended.set)  # a pidfd reads ready once its process has exited
        try:
            async with asyncio.timeout(seconds):
                await ended.wait()
        except TimeoutError:
            return False
        finally:
            loop.remove_reader(self._pidfd)
        return True

    def close(self) -> None:
        if self._watching:
            self._finish()
        for fd in (self.read_fd, self.write_fd, self._pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.read_fd = self.write_fd = self._pidfd = -1


class ArgsPipe:
    """bwrap's ``--args`` pipe: bwrap waits on it until :meth:`release` writes the arguments."""

    def __init__(self) -> None:
        self.read_fd = self.write_fd = -1

    def open(self) -> None:
        self.read_fd, self.write_fd = os.pipe()

    def release(self, data: bytes) -> None:
        """Write the arguments and close the pipe: bwrap goes on."""
        if len(data) > 60_000:  # a pipe's buffer; more would block before bwrap reads it
            raise SandboxUnavailable("the sandbox's arguments (its secrets and mounts) are over 60 kB")
        if self.write_fd >= 0:
            try:
                if data:
                    os.write(self.write_fd, data)
            except BrokenPipeError:
                pass  # it exited before bwrap ran (its cgroup refused it: exit 70); its result says so
            finally:
                os.close(self.write_fd)
                self.write_fd = -1

    def close_read(self) -> None:
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1

    def close(self) -> None:
        """Close both ends without writing anything."""
        self.close_read()
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1


def ns_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None
