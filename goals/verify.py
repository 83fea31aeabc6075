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
modification time counts (except for a file over a bound, below), so a model that rewrites
a file with the same bytes -- ``write_file`` replaces it, a new inode with a new time -- or touches
it makes no progress by that: busy-work is stalled (``goals.policy`` rule 9). ``.git`` is walked as
plain data like any other directory, so a commit (HEAD, a ref, the index, the logs change) counts
as progress; its ``objects`` (and ``lfs``) directories are not hashed (only measured, below), since
the refs and the index already name what they hold and a repository's object store can be most of a tree's entries.

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

Cost is bounded, and the daemon never waits on a walk:

* at most :data:`MAX_FINGERPRINT_ENTRIES` (100,000) entries are read per fingerprint, in a fixed
  order (depth first, names sorted), so a tree larger than that is fingerprinted by its first
  100,000 entries plus a marker, and at most :data:`MAX_FINGERPRINT_DEPTH` levels deep; a change
  past the bounds is not seen (a goal's ``progress`` command is the way to observe such a goal);
* a file over :data:`MAX_HASHED_FILE_BYTES` (64 MiB) counts by its size and times (modification,
  change, inode), not its content, so rewriting such a file with the same bytes does count as a
  change;
* at most ``max_bytes`` (:data:`MAX_FINGERPRINT_BYTES`, 256 MiB; the daemon's
  ``fingerprint_max_bytes``) of content is hashed per walk. Each file costs its **allocated**
  bytes (``st_blocks * 512``, at most its size), and only its data is read (``SEEK_DATA``/
  ``SEEK_HOLE``: a sparse file's holes are skipped, so 1,000 sparse 64 MiB files holding nothing
  cost nothing to read, not 62.5 GiB). Which files count by content is decided from metadata alone,
  in walk order, while the costs so far stay within the budget; the files after count by size and
  times. So the choice is the same at every walk of an unchanged tree, cached or not (the digest
  cache still saves the reads), and an unchanged tree keeps its digest;
* reading stops after ``max_seconds`` (:data:`MAX_FINGERPRINT_SECONDS`; the daemon's
  ``fingerprint_max_seconds``; checked before each file, so a file begun, at most 64 MiB, is read
  to its end, and each walk reads at least one file), and, as a backstop, after ``max_bytes``
  actually read (a file system that reports no holes): the walk then lists the rest without
  reading, and its digest does not describe the tree (``WalkStats.cut``); the engine judges no
  progress from it, and what was read is cached, so the next walk goes on from there;
* a walk checks a stop flag between files and between chunks (:class:`Fingerprinter`, in a daemon
  thread of its own): the daemon's shutdown stops it and does not wait for it.

Whatever bound applied is reported (:meth:`WalkStats.summary`): the engine records it in the
goal's events. The walk also measures what the work directory holds on disk
(``WalkStats.disk_bytes``: allocated blocks of every entry walked, a hard-linked file once, and of
``.git/objects`` too, which it does not hash), for the goal's disk limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import math
import os
import signal
import stat
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import Redactor, Sandbox, SandboxUnavailable
from agent.sandbox.base import CommandRefused
from goals.errors import GoalError
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
        except CommandRefused as exc:
            return VerifyResult(cmd=command.cmd, exit_code=None, output_tail=f"not run: {exc}")
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
#: Files larger than this are fingerprinted by size and times, not by content.
MAX_HASHED_FILE_BYTES = 64 * 1024 * 1024
#: The most file content one fingerprint hashes (files counted by their allocated blocks).
MAX_FINGERPRINT_BYTES = 256 * 1024 * 1024
#: The longest one fingerprint reads file content; past it, reading stops (the walk is incomplete).
MAX_FINGERPRINT_SECONDS = 2.0
#: The deepest directory level walked (each level holds one open descriptor while it is walked).
MAX_FINGERPRINT_DEPTH = 256
#: The most file digests kept in memory, over all work directories (least recently used dropped).
MAX_CACHED_DIGESTS = 100_000
#: Fingerprints that run at once (each in a thread of its own).
MAX_WALKS_AT_ONCE = 4
#: A file changed less than this long before the walk is not cached (see the module docstring).
_RACY_NS = 2_000_000_000
#: Directories under ``.git`` whose content the refs and the index already name: not hashed
#: (only measured, for the disk figure).
_GIT_SKIP = frozenset({b"objects", b"lfs"})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1024 * 1024

# A file's digest is valid while (size, mtime_ns, ctime_ns, inode, device) are unchanged.
_Key = tuple[int, int, int, int, int]
_DirCache = dict[bytes, tuple[_Key, bytes]]


def size_text(n: float) -> str:
    """A size in bytes as people read it: ``"1.2 GiB"``, ``"256 MiB"``, ``"512 B"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            break
        n /= 1024
    if unit == "B":
        return f"{int(n)} B"
    return f"{n:.1f} {unit}".replace(".0 ", " ")


@dataclass(frozen=True)
class FingerprintLimits:
    """The bounds of one fingerprint walk (the daemon's ``fingerprint_max_bytes`` and
    ``fingerprint_max_seconds``; see the module docstring)."""

    #: The most file content hashed by one walk, files counted by their allocated blocks.
    max_bytes: int = MAX_FINGERPRINT_BYTES
    #: The longest one walk reads content (``0``: no bound).
    max_seconds: float = MAX_FINGERPRINT_SECONDS
    #: The most entries one walk reads.
    max_entries: int = MAX_FINGERPRINT_ENTRIES
    #: A file larger than this (its apparent size) counts by size and times.
    max_file_bytes: int = MAX_HASHED_FILE_BYTES


class WalkStopped(GoalError):
    """The walk was stopped (the daemon is stopping): it has no result, and nothing may be decided from it."""


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
    """What one fingerprint did and saw (an unchanged tree costs no reads)."""

    def __init__(self) -> None:
        #: Files whose content was read (not taken from the digest cache), and the bytes read.
        self.files_read = 0
        self.bytes_read = 0
        #: Regular files seen, and those counted by size and times (over a bound), not content.
        self.files = 0
        self.files_by_time = 0
        #: Allocated bytes of the regular files seen, and of those counted by content.
        self.file_bytes = 0
        self.content_bytes = 0
        #: What the walked entries hold on disk (allocated blocks; a hard-linked file once).
        self.disk_bytes = 0
        #: The entry bound cut the walk (the rest of the tree is neither hashed nor measured).
        self.truncated = False
        #: Why reading stopped before the walk's end (``"time"``, ``"bytes"``), if it did: some
        #: files could not be counted as they should, so the digest does not describe the tree.
        self.cut: str | None = None
        self.seconds = 0.0

    @property
    def complete(self) -> bool:
        """Whether the digest describes the tree (reading was not cut short)."""
        return self.cut is None

    @property
    def bounded(self) -> bool:
        """Whether a bound applied: files counted by size and times, reading cut, or the entries cut."""
        return self.files_by_time > 0 or self.cut is not None or self.truncated

    def summary(self) -> str:
        """The bounds that applied, in plain words (empty when none did)."""
        parts: list[str] = []
        if self.files_by_time:
            parts.append(
                f"{self.files_by_time} file(s) counted by size and time;"
                f" content hashed for {size_text(self.content_bytes)} of {size_text(self.file_bytes)},"
                f" {size_text(self.bytes_read)} read at this idle"
            )
        if self.cut == "time":
            parts.append(
                f"reading stopped after {self.seconds:.1f}s ({size_text(self.bytes_read)} read): not judged"
                " for progress at this idle; the next one goes on from what was read"
            )
        elif self.cut == "bytes":
            parts.append(
                f"reading stopped at {size_text(self.bytes_read)}: not judged for progress at this idle;"
                " the next one goes on from what was read"
            )
        if self.truncated:
            parts.append(f"only the first {MAX_FINGERPRINT_ENTRIES:,} entries walked")
        return "fingerprint bounded: " + "; ".join(parts) if parts else ""


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` ranges of ``fd`` that hold data, holes left out (``SEEK_DATA``/``SEEK_HOLE``;
    a file system without them reports the whole file as data)."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data past ``offset``
                return
            yield offset, size  # not supported here: all of it is data
            return
        try:
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        except OSError:
            end = size
        if end <= start:
            return
        yield start, end
        offset = end


class _Reader:
    """Reads file content for one walk, within its byte budget, its deadline and its stop flag."""

    def __init__(self, limits: FingerprintLimits, stop: threading.Event | None, stats: WalkStats) -> None:
        self.limits = limits
        self.stop = stop
        self.stats = stats
        self.started = time.monotonic()
        self.deadline = self.started + limits.max_seconds if limits.max_seconds > 0 else math.inf

    def check(self) -> None:
        """Between directories, files and chunks: stop the walk when the stop flag is set."""
        if self.stop is not None and self.stop.is_set():
            raise WalkStopped("the fingerprint was stopped")

    def may_read(self) -> bool:
        """Before a file is read: whether reading goes on (past the deadline it stops, once this walk
        has read a file: each walk reads at least one, so walks that keep being cut still progress
        through the digest cache)."""
        self.check()
        if self.stats.cut is None and self.stats.files_read and time.monotonic() > self.deadline:
            self.stats.cut = "time"
        return self.stats.cut is None

    def digest(self, dfd: int, name: bytes) -> tuple[_Key, bytes] | None:
        """The content digest of the regular file ``name`` in ``dfd``, with its cache key.

        ``None`` if it is not a regular file once opened (a swap since the ``lstat``), is over the
        per-file bound, cannot be read, or the walk's byte budget ran out in it (``stats.cut``).
        Raises :class:`WalkStopped` when the stop flag is set (checked between chunks).
        Opened without following a link and without blocking; only its data is read (holes are
        skipped, so a sparse file costs what it holds on disk).
        """
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > self.limits.max_file_bytes:
                return None
            h = hashlib.blake2b(digest_size=16)
            h.update(b"%d\0" % st.st_size)
            stats = self.stats
            for start, end in _data_extents(fd, st.st_size):
                h.update(b"@%d\0" % start)
                at = start
                while at < end:
                    self.check()
                    want = min(_CHUNK, end - at)
                    if stats.bytes_read + want > self.limits.max_bytes:
                        stats.cut = "bytes"
                        return None
                    chunk = os.pread(fd, want, at)
                    if not chunk:
                        break
                    stats.bytes_read += len(chunk)
                    at += len(chunk)
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
    max_bytes: int = MAX_FINGERPRINT_BYTES,
    max_seconds: float = MAX_FINGERPRINT_SECONDS,
    stop: threading.Event | None = None,
    stats: WalkStats | None = None,
) -> str | None:
    """A digest that changes when the work directory's content changes (``None`` if it is missing).

    Computed in process from names, types, file contents (by a digest cached per file) and link
    targets; a file over ``max_file_bytes``, or past the ``max_bytes`` of content one walk hashes,
    counts by its size and times instead. Reading stops after ``max_seconds`` (``stats.cut`` says
    so: the digest then does not describe the tree). See the module docstring for why nothing is
    executed or followed, and for the bounds. Blocking: run it in a worker thread
    (:class:`Fingerprinter` does).

    Raises:
        WalkStopped: ``stop`` was set during the walk.
    """
    limits = FingerprintLimits(
        max_bytes=max_bytes, max_seconds=max_seconds, max_entries=max_entries, max_file_bytes=max_file_bytes
    )
    return _fingerprint(workdir, limits, stop, stats if stats is not None else WalkStats())


def _fingerprint(
    workdir: Path, limits: FingerprintLimits, stop: threading.Event | None, stats: WalkStats
) -> str | None:
    root = os.fsencode(workdir)
    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError:
        return None
    old = _CACHE.take(root)
    walk = _Walk(old, limits=limits, reader=_Reader(limits, stop, stats), stats=stats)
    try:
        walk.run(top)
    except WalkStopped:
        _CACHE.put(root, {**old, **walk.new})  # what was read is kept; nothing is lost
        raise
    finally:
        stats.seconds = time.monotonic() - walk.reader.started
    _CACHE.put(root, walk.new)
    return walk.h.hexdigest()[:32]


@dataclass(frozen=True)
class Walked:
    """A fingerprint's outcome: the digest (``None``: the work directory is missing) and its stats."""

    digest: str | None
    stats: WalkStats

    @property
    def known(self) -> str | None:
        """The digest when it describes the tree (``None``: missing, or reading was cut short)."""
        return self.digest if self.stats.complete else None


class Fingerprinter:
    """Runs fingerprints for the goal engine: each in a thread of its own, at most
    :data:`MAX_WALKS_AT_ONCE` at a time, within ``limits``, and stoppable.

    :meth:`stop` ends the walks asked for until then: it sets the flag they check between
    directories, files and chunks, and every :meth:`walk` awaiting one raises :class:`WalkStopped`
    at once, without waiting for its thread. The threads are daemon threads: a walk stuck in a
    system call (a hung network file system) can neither delay the event loop's shutdown nor the
    process's exit. Walks asked for after a stop run as usual.
    """

    def __init__(self, limits: FingerprintLimits | None = None, *, at_once: int = MAX_WALKS_AT_ONCE) -> None:
        self.limits = limits or FingerprintLimits()
        self._slots = asyncio.Semaphore(at_once)
        #: The stop flag of the walks asked for since the last stop, and their waiters.
        self._flag = threading.Event()
        self._waiting: set[asyncio.Event] = set()

    def stop(self) -> None:
        """Stop every walk asked for until now (they raise :class:`WalkStopped`)."""
        flag, self._flag = self._flag, threading.Event()
        flag.set()
        for stopped in self._waiting:
            stopped.set()

    async def walk(self, workdir: Path) -> Walked:
        """Fingerprint ``workdir`` in a thread.

        Raises:
            WalkStopped: :meth:`stop` was called while the walk waited for its turn or ran.
        """
        flag, stopped = self._flag, asyncio.Event()
        self._waiting.add(stopped)
        try:
            async with self._slots:
                if flag.is_set():
                    raise WalkStopped("the fingerprint was stopped")
                return await self._run(workdir, flag, stopped)
        finally:
            self._waiting.discard(stopped)

    async def _run(self, workdir: Path, flag: threading.Event, stopped: asyncio.Event) -> Walked:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Walked] = loop.create_future()
        stats = WalkStats()

        def run() -> None:
            result: Walked | BaseException
            try:
                result = Walked(_fingerprint(workdir, self.limits, flag, stats), stats)
            except BaseException as exc:  # handed to the awaiting task
                result = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, done, result)

        threading.Thread(target=run, name=f"goald-fingerprint {workdir.name}", daemon=True).start()
        waiter = asyncio.ensure_future(stopped.wait())
        both: list[asyncio.Future[Any]] = [done, waiter]
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not done.done():
            done.cancel()
            raise WalkStopped("the fingerprint was stopped")
        return done.result()


def _settle(done: asyncio.Future[Walked], result: Walked | BaseException) -> None:
    if done.done():
        return
    if isinstance(result, BaseException):
        done.set_exception(result)
    else:
        done.set_result(result)


class _Walk:
    """One fingerprint walk.

    Depth first, each directory's entries sorted by name: the order (and so a cut at the bound)
    does not depend on the file system's listing order. Each level is walked through its own
    descriptor, opened relative to its parent's without following a link, so a directory swapped
    for a link during the walk leads nowhere outside the work directory.

    Which files count by content is decided in that order from their metadata alone: each regular
    file within the per-file bound costs its allocated bytes (``st_blocks * 512``, at most its size:
    a sparse file costs what it holds), and it counts by content while the costs so far stay within
    the walk's byte budget, by size and times after. The choice therefore does not depend on the
    digest cache (a cached file costs its bytes as a read one does), and an unchanged tree keeps
    its digest from walk to walk.
    """

    def __init__(self, old: _DirCache, *, limits: FingerprintLimits, reader: _Reader, stats: WalkStats) -> None:
        self.h = hashlib.sha256()
        self.old = old
        #: The file digests to keep for the next walk.
        self.new: _DirCache = {}
        self.racy_after = time.time_ns() - _RACY_NS
        self.limits = limits
        self.reader = reader
        self.stats = stats
        self.seen = 0
        self.measured = 0
        self.truncated = False
        #: Hard-linked inodes already counted in the disk figure.
        self.linked: set[tuple[int, int]] = set()
        #: The open levels: (descriptor, relative path, subdirectories still to walk, measured only).
        self.frames: list[tuple[int, bytes, list[bytes], bool]] = []

    def run(self, top: int) -> None:
        """Walk from the work directory's descriptor ``top`` (closed, with every other, at the end)."""
        h, frames = self.h, self.frames
        try:
            self._enter(top, b"", False)
            while frames and not self.truncated:
                fd, rel, pending, measure_only = frames[-1]
                if not pending:
                    os.close(fd)
                    frames.pop()
                    continue
                name = pending.pop()
                child = rel + b"/" + name if rel else name
                skip = measure_only or (name in _GIT_SKIP and (rel == b".git" or rel.endswith(b"/.git")))
                if len(frames) >= MAX_FINGERPRINT_DEPTH:
                    if not measure_only:
                        h.update(b"...deep\0%s\0" % child)
                    continue
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    if not measure_only:
                        h.update(b"?" + child + b"\0")  # gone, or no longer a directory, since listed
                    continue
                self._enter(sub, child, skip)
        finally:
            for fd, _, _, _ in frames:
                os.close(fd)
            self.stats.truncated = self.truncated

    def _disk(self, st: os.stat_result) -> None:
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            inode = (st.st_dev, st.st_ino)
            if inode in self.linked:
                return
            self.linked.add(inode)
        self.stats.disk_bytes += st.st_blocks * 512

    def _enter(self, fd: int, rel: bytes, measure_only: bool) -> None:
        """Hash one directory's entries (or, ``measure_only``, only count what they hold on disk);
        its subdirectories are walked next."""
        subdirs: list[bytes] = []
        self.frames.append((fd, rel, subdirs, measure_only))  # first, so the descriptor is closed whatever happens
        self.reader.check()
        try:
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            if not measure_only:
                self.h.update(b"?" + rel + b"\0")  # unreadable: recorded as such
            entries = []
        for entry in entries:
            if measure_only:
                # Not hashed (the refs and the index name it), but what it holds counts on disk, under
                # a bound of its own so that a large object store does not cut the fingerprint short.
                if self.measured >= self.limits.max_entries:
                    break
                self.measured += 1
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                self._disk(st)
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(os.fsencode(entry.name))
                continue
            if self.seen >= self.limits.max_entries:
                self.truncated = True
                break
            self.seen += 1
            name = os.fsencode(entry.name)
            child = rel + b"/" + name if rel else name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            self._disk(st)
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
        stats = self.stats
        stats.files += 1
        cost = min(st.st_size, st.st_blocks * 512)
        stats.file_bytes += cost
        by_content = st.st_size <= self.limits.max_file_bytes and stats.content_bytes + cost <= self.limits.max_bytes
        digest = None
        key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        if by_content:
            stats.content_bytes += cost
            cached = self.old.get(child)
            digest = cached[1] if cached is not None and cached[0] == key else None
            if digest is None and self.reader.may_read():
                read = self.reader.digest(fd, name)
                if read is not None:
                    key, digest = read
            if digest is None and stats.cut is not None:
                # Reading was cut short: this file cannot be counted as it should (the digest says
                # nothing reliable now; the next walk goes on from the cache).
                self.h.update(b"?\0%s\0" % child)
                return
        if digest is None:
            stats.files_by_time += 1
            self.h.update(b"F\0%s\0%d\0%d\0%d\0%d\0" % (child, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
            return
        self.h.update(b"f\0%s\0%s\0" % (child, digest))
        # A file changed within the last moments may change again within the same clock
        # tick, leaving its key as it was: it is read again next time, not trusted.
        if max(key[1], key[2]) < self.racy_after:
            self.new[child] = (key, digest)
