"""The work directory's content fingerprint: a digest that changes when the tree's content changes.

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

The walk is bounded in entries, depth, bytes and time (:mod:`goals.fingerprint_limits`, which also
reports which bound applied, and what the tree holds on disk).
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from goals.fingerprint_limits import (
    MAX_CACHED_DIGESTS,
    MAX_FINGERPRINT_BYTES,
    MAX_FINGERPRINT_DEPTH,
    MAX_FINGERPRINT_ENTRIES,
    MAX_FINGERPRINT_SECONDS,
    MAX_HASHED_FILE_BYTES,
    FingerprintLimits,
    WalkStats,
    WalkStopped,
)

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
    return fingerprint_within(workdir, limits, stop, stats if stats is not None else WalkStats())


def fingerprint_within(
    workdir: Path, limits: FingerprintLimits, stop: threading.Event | None, stats: WalkStats
) -> str | None:
    """:func:`fingerprint` with its bounds as one :class:`FingerprintLimits`, its stop flag and the
    stats it fills in (what :class:`goals.measure.Fingerprinter` runs in its threads)."""
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
