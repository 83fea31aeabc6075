"""Proof of completion and of progress: verification commands and the work-directory fingerprint.

Verification commands (and a goal's ``progress`` command) run in the goal's work directory through
a command runner: the daemon's runs them in the goal's own sandbox (:func:`sandboxed_runner`: its
network setting, secrets and extra read-only paths; secrets redacted from the output); the default
:func:`run_command` is a plain subprocess in its own process group, for an engine embedded without
a daemon. A timeout kills the whole command.

The fingerprint tells whether the work directory's content changed. **The daemon reads a work
directory as data, never as configuration**: the work directory belongs to the model, so nothing
in it may decide what the daemon runs. The fingerprint therefore runs no program at all (an
earlier version ran ``git rev-parse``/``git status`` there, as the daemon, and a ``.git/config``
the model wrote -- ``core.fsmonitor``, ``core.hooksPath``, a filter driver, a pager -- ran any
command outside the sandbox). It is computed in process from every entry's name and type, a
regular file's **content** (a digest), a symbolic link's target (read, never followed). No
modification time counts (except for a file over the size bound, below), so a model that rewrites
a file with the same bytes -- ``write_file`` replaces it, a new inode with a new time -- or touches
it makes no progress by that: busy-work is stalled (``goals.policy`` rule 9). ``.git`` is walked as
plain data like any other directory, so a commit (HEAD, a ref, the index, the logs change) counts
as progress; its ``objects`` (and ``lfs``) directories are skipped, since the refs and the index
already name what they hold and a repository's object store can be most of a tree's entries.

Files are opened ``O_RDONLY|O_NOFOLLOW|O_NONBLOCK`` and hashed only if ``fstat`` on the open
descriptor says regular file (a FIFO, socket or device node is never opened: its name and type
count; one swapped in after the ``lstat`` is closed unread). Directories are walked through
descriptors opened relative to their parent's with ``O_NOFOLLOW``, so a directory swapped for a
link to ``/`` mid-walk leads nowhere.

An unchanged tree costs no reads: each file's digest is cached in memory, per work directory,
keyed by its size, modification and change times, inode and device; a key that differs is read
again. A file changed within two seconds before the walk is not cached (it could change again
within the same clock tick with an unchanged key, git's "racy" case): it is read again next time.
The cache holds at most :data:`MAX_CACHED_DIGESTS` digests over all work directories (about 25 MB
at the bound; least recently fingerprinted work directory dropped first).

Cost is bounded: at most :data:`MAX_FINGERPRINT_ENTRIES` (100,000) entries are read per
fingerprint, in a fixed order (depth first, names sorted), so a tree larger than that is
fingerprinted by its first 100,000 entries plus a marker, and at most
:data:`MAX_FINGERPRINT_DEPTH` levels deep; a change past the bounds is not seen (a goal's
``progress`` command is the way to observe such a goal). A file over
:data:`MAX_HASHED_FILE_BYTES` (64 MiB) counts by its size and modification time, not its content,
so rewriting such a file with the same bytes does count as a change. The first fingerprint of a
tree reads every file under that bound once. Always in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import signal
import stat
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

from agent import Redactor, Sandbox, SandboxUnavailable
from goals.model import VerifyCommand, VerifyResult

OUTPUT_TAIL = 4000
CommandRunner = Callable[[VerifyCommand, Path], Awaitable[VerifyResult]]


async def run_command(command: VerifyCommand, workdir: Path) -> VerifyResult:
    """Run one command with ``bash -c`` in ``workdir``; stdout and stderr are merged."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command.cmd,
        cwd=str(workdir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    timed_out = False
    try:
        async with asyncio.timeout(command.timeout):
            out, _ = await proc.communicate()
    except TimeoutError:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    text = out.decode("utf-8", errors="replace")
    if timed_out:
        text += f"\n[timed out after {command.timeout:g}s; process group killed]"
    return VerifyResult(
        cmd=command.cmd,
        exit_code=None if timed_out else proc.returncode,
        output_tail=text[-OUTPUT_TAIL:],
        timed_out=timed_out,
        seconds=round(time.monotonic() - started, 3),
    )


def sandboxed_runner(sandbox_for: Callable[[Path], Sandbox], redactor: Redactor | None = None) -> CommandRunner:
    """A runner that runs each command with ``bash -c`` in ``sandbox_for(workdir)`` (stdout and stderr
    merged), its output redacted by the sandbox's secrets and ``redactor``. A sandbox that cannot be
    made fails the command, saying why."""

    async def run(command: VerifyCommand, workdir: Path) -> VerifyResult:
        try:
            sandbox = sandbox_for(workdir)
            result = await sandbox.run(
                ["bash", "-c", command.cmd], timeout=command.timeout, output_cap=2 * OUTPUT_TAIL, merge_stderr=True
            )
        except SandboxUnavailable as exc:
            return VerifyResult(cmd=command.cmd, exit_code=None, output_tail=f"verification cannot run: {exc}")
        text = result.stdout
        if redactor is not None:
            text = redactor.redact(text)
        if result.timed_out:
            text += f"\n[timed out after {command.timeout:g}s; every process of the command was killed]"
        return VerifyResult(
            cmd=command.cmd,
            exit_code=result.exit_code,
            output_tail=text[-OUTPUT_TAIL:],
            timed_out=result.timed_out,
            seconds=result.seconds,
        )

    return run


def progress_digest(result: VerifyResult) -> str:
    """What a ``progress`` command observed, as a digest: its exit code (or its timeout) and output."""
    state = "timeout" if result.timed_out else f"exit {result.exit_code}"
    return hashlib.sha256(f"{state}\0{result.output_tail}".encode()).hexdigest()[:32]


def within(runner: CommandRunner, seconds: float) -> CommandRunner:
    """``runner`` inside the goal's time: ``seconds`` from now its deadline or wall time ends, and
    no command runs past that. A command's timeout is cut to the time left (its result says so when
    the cut ended it); with no time left a command is not run, and fails saying why. Either way the
    claim it checks is refused, and the spent budget ends the goal at its next decision."""
    ends = time.monotonic() + seconds

    async def run(command: VerifyCommand, workdir: Path) -> VerifyResult:
        left = ends - time.monotonic()
        if left <= 0:
            return VerifyResult(
                cmd=command.cmd,
                exit_code=None,
                output_tail="not run: the goal's deadline or wall time ran out",
                out_of_time=True,
            )
        if left >= command.timeout:
            return await runner(command, workdir)
        left = math.ceil(left * 100) / 100  # in hundredths, rounded up: the cut is never before the end
        result = await runner(command.model_copy(update={"timeout": left}), workdir)
        if not result.timed_out:
            return result
        note = f"\n[cut short: the goal's deadline or wall time left {left:g}s of the command's {command.timeout:g}s]"
        return result.model_copy(
            update={"output_tail": (result.output_tail + note)[-OUTPUT_TAIL:], "out_of_time": True}
        )

    return run


async def run_all(
    commands: list[VerifyCommand], workdir: Path, runner: CommandRunner = run_command
) -> list[VerifyResult]:
    """Run every command in order; stop at the first failure."""
    results = []
    for command in commands:
        result = await runner(command, workdir)
        results.append(result)
        if not result.passed:
            break
    return results


#: The most directory entries one fingerprint reads (files, directories and links alike).
MAX_FINGERPRINT_ENTRIES = 100_000
#: Files larger than this are fingerprinted by size and modification time, not by content.
MAX_HASHED_FILE_BYTES = 64 * 1024 * 1024
#: The deepest directory level walked (each level holds one open descriptor while it is walked).
MAX_FINGERPRINT_DEPTH = 256
#: The most file digests kept in memory, over all work directories (least recently used dropped).
MAX_CACHED_DIGESTS = 100_000
#: A file changed less than this long before the walk is not cached (see the module docstring).
_RACY_NS = 2_000_000_000
#: Directories under ``.git`` whose content the refs and the index already name: not walked.
_GIT_SKIP = frozenset({b"objects", b"lfs"})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1024 * 1024

# A file's digest is valid while (size, mtime_ns, ctime_ns, inode, device) are unchanged.
_Key = tuple[int, int, int, int, int]
_DirCache = dict[bytes, tuple[_Key, bytes]]


class _DigestCache:
    """Content digests per work directory, least recently used work directory dropped first.

    Thread-safe: fingerprints of several goals run in worker threads at once. A walk takes its
    directory's map out and puts back the map of what it saw, so a deleted file's digest goes too.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._dirs: OrderedDict[bytes, _DirCache] = OrderedDict()
        self._size = 0

    def take(self, root: bytes) -> _DirCache:
        with self._lock:
            found = self._dirs.pop(root, None)
            if found is None:
                return {}
            self._size -= len(found)
            return found

    def put(self, root: bytes, digests: _DirCache) -> None:
        with self._lock:
            old = self._dirs.pop(root, None)
            if old is not None:
                self._size -= len(old)
            if len(digests) > self.limit:
                return
            self._dirs[root] = digests
            self._size += len(digests)
            while self._size > self.limit:
                _, dropped = self._dirs.popitem(last=False)
                self._size -= len(dropped)

    def clear(self) -> None:
        with self._lock:
            self._dirs.clear()
            self._size = 0

    def __len__(self) -> int:
        with self._lock:
            return self._size


_CACHE = _DigestCache(MAX_CACHED_DIGESTS)


class WalkStats:
    """What one fingerprint did: how many files it read (an unchanged tree costs none)."""

    def __init__(self) -> None:
        self.files_read = 0


def _file_digest(dfd: int, name: bytes, max_bytes: int, stats: WalkStats) -> tuple[_Key, bytes] | None:
    """The content digest of the regular file ``name`` in ``dfd``, with its cache key.

    ``None`` if it is not a regular file once opened (a swap since the ``lstat``), is larger than
    ``max_bytes``, or cannot be read. Opened without following a link and without blocking.
    """
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        h = hashlib.blake2b(digest_size=16)
        total = 0
        while chunk := os.read(fd, _CHUNK):
            total += len(chunk)
            if total > max_bytes:
                return None
            h.update(chunk)
        stats.files_read += 1
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev), h.digest()
    except OSError:
        return None
    finally:
        os.close(fd)


def fingerprint(
    workdir: Path,
    *,
    max_entries: int = MAX_FINGERPRINT_ENTRIES,
    max_file_bytes: int = MAX_HASHED_FILE_BYTES,
    stats: WalkStats | None = None,
) -> str | None:
    """A digest that changes when the work directory's content changes (``None`` if it is missing).

    Computed in process from names, types, file contents (by a digest cached per file) and link
    targets; a file over ``max_file_bytes`` counts by its size and modification time instead. See
    the module docstring for why nothing is executed or followed, and for the bounds. Blocking:
    run it in a worker thread.
    """
    stats = stats if stats is not None else WalkStats()
    root = os.fsencode(workdir)
    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError:
        return None
    walk = _Walk(_CACHE.take(root), max_entries=max_entries, max_file_bytes=max_file_bytes, stats=stats)
    walk.run(top)
    _CACHE.put(root, walk.new)
    return walk.h.hexdigest()[:32]


class _Walk:
    """One fingerprint walk.

    Depth first, each directory's entries sorted by name: the order (and so a cut at the bound)
    does not depend on the file system's listing order. Each level is walked through its own
    descriptor, opened relative to its parent's without following a link, so a directory swapped
    for a link during the walk leads nowhere outside the work directory.
    """

    def __init__(self, old: _DirCache, *, max_entries: int, max_file_bytes: int, stats: WalkStats) -> None:
        self.h = hashlib.sha256()
        self.old = old
        #: The file digests to keep for the next walk.
        self.new: _DirCache = {}
        self.racy_after = time.time_ns() - _RACY_NS
        self.max_entries = max_entries
        self.max_file_bytes = max_file_bytes
        self.stats = stats
        self.seen = 0
        self.truncated = False
        #: The open levels: (descriptor, relative path, subdirectories still to walk).
        self.frames: list[tuple[int, bytes, list[bytes]]] = []

    def run(self, top: int) -> None:
        """Walk from the work directory's descriptor ``top`` (closed, with every other, at the end)."""
        h, frames = self.h, self.frames
        try:
            self._enter(top, b"")
            while frames and not self.truncated:
                fd, rel, pending = frames[-1]
                if not pending:
                    os.close(fd)
                    frames.pop()
                    continue
                name = pending.pop()
                child = rel + b"/" + name if rel else name
                if len(frames) >= MAX_FINGERPRINT_DEPTH:
                    h.update(b"...deep\0%s\0" % child)
                    continue
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    h.update(b"?" + child + b"\0")  # gone, or no longer a directory, since listed
                    continue
                self._enter(sub, child)
        finally:
            for fd, _, _ in frames:
                os.close(fd)

    def _enter(self, fd: int, rel: bytes) -> None:
        """Hash one directory's entries; its subdirectories are walked next."""
        subdirs: list[bytes] = []
        self.frames.append((fd, rel, subdirs))  # first, so the descriptor is closed whatever happens
        try:
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            self.h.update(b"?" + rel + b"\0")  # unreadable: recorded as such
            entries = []
        for entry in entries:
            if self.seen >= self.max_entries:
                self.truncated = True
                break
            self.seen += 1
            name = os.fsencode(entry.name)
            child = rel + b"/" + name if rel else name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            self._entry(fd, rel, name, child, st, subdirs)
        if self.truncated:
            self.h.update(b"...truncated\0")
        subdirs.reverse()  # popped from the end: first name first

    def _entry(self, fd: int, rel: bytes, name: bytes, child: bytes, st: os.stat_result, subdirs: list[bytes]) -> None:
        h = self.h
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            # No modification time: a file replaced by rename (as write_file does) changes
            # its directory's, and the directory's names and contents are hashed anyway.
            h.update(b"d\0%s\0" % child)
            if not (name in _GIT_SKIP and (rel == b".git" or rel.endswith(b"/.git"))):
                subdirs.append(name)
        elif stat.S_ISLNK(mode):
            try:
                target = os.readlink(name, dir_fd=fd)
            except OSError:
                target = b"?"
            h.update(b"l\0%s\0%s\0" % (child, target))
        elif stat.S_ISREG(mode):
            self._file(fd, name, child, st)
        else:
            # A FIFO, a socket, a device node: never opened.
            h.update(b"o\0%s\0" % child)

    def _file(self, fd: int, name: bytes, child: bytes, st: os.stat_result) -> None:
        key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        cached = self.old.get(child)
        digest = cached[1] if cached is not None and cached[0] == key else None
        if digest is None and st.st_size <= self.max_file_bytes:
            read = _file_digest(fd, name, self.max_file_bytes, self.stats)
            if read is not None:
                key, digest = read
        if digest is None:
            self.h.update(b"F\0%s\0%d\0%d\0" % (child, st.st_size, st.st_mtime_ns))
            return
        self.h.update(b"f\0%s\0%s\0" % (child, digest))
        # A file changed within the last moments may change again within the same clock
        # tick, leaving its key as it was: it is read again next time, not trusted.
        if max(key[1], key[2]) < self.racy_after:
            self.new[child] = (key, digest)
