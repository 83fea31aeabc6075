"""The bounds of a work directory's fingerprint walk, and the report of which applied.

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
* a walk checks a stop flag between files and between chunks (:class:`goals.measure.Fingerprinter`,
  in a daemon thread of its own): the daemon's shutdown stops it and does not wait for it.

Whatever bound applied is reported (:meth:`WalkStats.summary`): the engine records it in the
goal's events. The walk also measures what the work directory holds on disk
(``WalkStats.disk_bytes``: allocated blocks of every entry walked, a hard-linked file once, and of
``.git/objects`` too, which it does not hash), for the goal's disk limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from goals.errors import GoalError

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
