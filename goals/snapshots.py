"""Checkpoints of a goal's work directory, read as data: the start and each round's tree, and their diffs.

A goal on a repository (``repo``) is recorded at its start (``base``) and at each idle that ends a
round (``round-N``), before the next continuation is queued, so nothing of the goal runs while its
tree is read. No git runs on the work directory: the walk reads it as data (symlinks are recorded as
their target text and never followed, special files are skipped, the top-level ``.git`` entry is
git's, not the work's), so a hook, an fsmonitor, a filter or an attribute the model wrote there
runs nowhere. A tree is a manifest (path → content hash, mode), one JSON file per checkpoint; the
contents are blobs stored once by their SHA-256, zlib-compressed, under
``<state_dir>/snapshots/<goal id>/``. The walk is bounded (files, bytes read); a manifest that hit
a bound says so, and a diff against it says which files it could not see.

:func:`diff` renders what changed between two checkpoints as a unified diff in git's layout
(``diff --git a/… b/…``, ``new file``/``deleted file``, ``--- a/…``/``+++ b/…``), and ``--stat``
figures as git's ``--numstat`` counts them, so an operator's tools read it as they read git's.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import shutil
import stat as st
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: What one walk reads at most: files and bytes (a checkpoint that meets either says so).
MAX_FILES = 20_000
MAX_BYTES = 256 * 1024 * 1024
#: What the recorded start of a goal not on a repository may hold (a replay's copy): a directory
#: someone named and reuses goal after goal is not copied whole each time.
START_MAX_BYTES = 16 * 1024 * 1024
#: A blob is text for a diff when it has no NUL in its first 8 KiB (git's test).
_PROBE = 8192
#: Checkpoints stored as the changes since the one before, at most this many in a row (then whole).
CHAIN = 32


def _order(name: str) -> int:
    """``base`` first, then ``round-N`` by N."""
    return -1 if name == "base" else int(name.split("-", 1)[1])


@dataclass
class Manifest:
    """One checkpoint: path → (content hash, mode), and whether a bound cut the walk."""

    files: dict[str, tuple[str, int]] = field(default_factory=dict)
    truncated: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As stored."""
        return {"files": {p: [h, m] for p, (h, m) in sorted(self.files.items())}, "truncated": self.truncated}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        """From what :meth:`to_json` stored."""
        return cls({p: (str(v[0]), int(v[1])) for p, v in data.get("files", {}).items()}, data.get("truncated"))


class Snapshots:
    """The checkpoints of every goal, under one directory (``<state_dir>/snapshots``)."""

    def __init__(self, root: Path, *, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> None:
        self.root = root
        self.max_files = max_files
        self.max_bytes = max_bytes

    def _dir(self, goal_id: str) -> Path:
        return self.root / goal_id

    def _blob_path(self, goal_id: str, digest: str) -> Path:
        return self._dir(goal_id) / "blobs" / digest[:2] / digest[2:]

    # -- taking one ----------------------------------------------------------------------------

    def take(self, goal_id: str, name: str, workdir: Path, *, max_bytes: int | None = None) -> Manifest:
        """Record ``workdir`` as checkpoint ``name`` of ``goal_id`` (blocking: run it in a thread);
        ``max_bytes``: a smaller bound on what is read for this one."""
        manifest = Manifest()
        budget = [min(self.max_bytes, max_bytes) if max_bytes is not None else self.max_bytes]
        self._walk(goal_id, workdir, "", manifest, budget, top=True)
        target = self._dir(goal_id) / f"{name}.json"
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._stored(goal_id, name, manifest)))
        os.replace(tmp, target)
        return manifest

    def _stored(self, goal_id: str, name: str, manifest: Manifest) -> dict[str, Any]:
        """What is written for ``manifest``: the whole tree, or (after an earlier checkpoint, at most
        :data:`CHAIN` in a row) only what changed since that one, so a round of one changed file in
        a tree of thousands costs a few hundred bytes, not the whole list again."""
        earlier = [n for n in self.names(goal_id) if n != name and _order(n) < _order(name)]
        if not earlier:
            return {**manifest.to_json(), "depth": 0}
        parent_name = earlier[-1]
        raw = self._raw(goal_id, parent_name)
        parent = self.manifest(goal_id, parent_name)
        if raw is None or parent is None or int(raw.get("depth", 0)) >= CHAIN:
            return {**manifest.to_json(), "depth": 0}
        changed = {p: [h, m] for p, (h, m) in manifest.files.items() if parent.files.get(p) != (h, m)}
        removed = sorted(set(parent.files) - set(manifest.files))
        return {
            "parent": parent_name,
            "depth": int(raw.get("depth", 0)) + 1,
            "changed": changed,
            "removed": removed,
            "truncated": manifest.truncated,
        }

    def _raw(self, goal_id: str, name: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self._dir(goal_id) / f"{name}.json").read_text())
            return data
        except FileNotFoundError:
            return None

    def _walk(self, goal_id: str, directory: Path, prefix: str, out: Manifest, budget: list[int], *, top: bool) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if top and entry.name == ".git":
                continue  # git's own (the worktree's link to its repository), not the goal's work
            rel = prefix + entry.name
            if len(out.files) >= self.max_files:
                out.truncated = f"more than {self.max_files} files: the rest were not recorded"
                return
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.S_ISDIR(info.st_mode):
                self._walk(goal_id, Path(entry.path), rel + "/", out, budget, top=False)
            elif st.S_ISLNK(info.st_mode):
                with contextlib.suppress(OSError):
                    out.files[rel] = (self._store(goal_id, os.readlink(entry.path).encode()), 0o120000)
            elif st.S_ISREG(info.st_mode):
                if info.st_size > budget[0]:
                    out.truncated = f"over the bytes it may read: {rel} and later files were not recorded"
                    return
                data = _read(entry.path)
                if data is None:
                    continue
                budget[0] -= len(data)
                mode = 0o100755 if info.st_mode & 0o111 else 0o100644
                out.files[rel] = (self._store(goal_id, data), mode)

    def _store(self, goal_id: str, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self._blob_path(goal_id, digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(zlib.compress(data, 6))
            os.replace(tmp, path)
        return digest

    # -- reading -------------------------------------------------------------------------------

    def manifest(self, goal_id: str, name: str) -> Manifest | None:
        """Checkpoint ``name`` (``None``: not recorded), its changes applied over its parent's."""
        raw = self._raw(goal_id, name)
        if raw is None:
            return None
        if "parent" not in raw:
            return Manifest.from_json(raw)
        parent = self.manifest(goal_id, str(raw["parent"]))
        if parent is None:
            return None
        files = dict(parent.files)
        for path in raw.get("removed", []):
            files.pop(path, None)
        files.update({p: (str(v[0]), int(v[1])) for p, v in raw.get("changed", {}).items()})
        return Manifest(files, raw.get("truncated"))

    def names(self, goal_id: str) -> list[str]:
        """The goal's checkpoints: ``base``, then ``round-N`` by round."""
        found = [p.stem for p in self._dir(goal_id).glob("*.json")]
        rounds = sorted(_order(n) for n in found if n.startswith("round-"))
        return (["base"] if "base" in found else []) + [f"round-{n}" for n in rounds]

    def restore(self, goal_id: str, manifest: Manifest, target: Path) -> int:
        """Write ``manifest``'s tree into the empty directory ``target`` (a replay's start): files with
        their modes, symlinks as symlinks; returns how many entries were written.

        Raises:
            ValueError: a path that would leave ``target`` (a manifest is never written with one).
        """
        root = target.resolve()
        for path, (digest, mode) in sorted(manifest.files.items()):
            dest = (root / path).resolve() if mode != 0o120000 else (root / path).parent.resolve() / Path(path).name
            if not dest.is_relative_to(root) or ".." in Path(path).parts:
                raise ValueError(f"{path!r} leaves the directory")
            dest.parent.mkdir(parents=True, exist_ok=True)
            data = self.blob(goal_id, digest)
            if mode == 0o120000:
                os.symlink(data.decode(), dest)
            else:
                dest.write_bytes(data)
                os.chmod(dest, 0o755 if mode == 0o100755 else 0o644)
        return len(manifest.files)

    def blob(self, goal_id: str, digest: str) -> bytes:
        """A stored content by its hash."""
        return zlib.decompress(self._blob_path(goal_id, digest).read_bytes())

    def remove(self, goal_id: str) -> None:
        """Forget every checkpoint of the goal (retention)."""
        shutil.rmtree(self._dir(goal_id), ignore_errors=True)

    # -- comparing -----------------------------------------------------------------------------

    def diff(self, goal_id: str, old: Manifest, new: Manifest) -> list[FileDiff]:
        """Every file that differs between two checkpoints, by path."""
        out = []
        for path in sorted(set(old.files) | set(new.files)):
            a, b = old.files.get(path), new.files.get(path)
            if a == b:
                continue
            before = self.blob(goal_id, a[0]) if a is not None else b""
            after = self.blob(goal_id, b[0]) if b is not None else b""
            out.append(file_diff(path, a, b, before, after))
        return out


def _read(path: str) -> bytes | None:
    """A regular file's bytes, never through a symlink or from a FIFO (it may have changed since its stat)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not st.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class FileDiff:
    """One file's change: its path, how (``added``, ``deleted``, ``modified``, ``mode``), git's
    numstat counts (``None`` for a binary file) and its unified diff in git's layout."""

    path: str
    status: str
    added: int | None
    removed: int | None
    text: str

    def public(self) -> dict[str, Any]:
        """As the control protocol sends it."""
        return {"path": self.path, "status": self.status, "added": self.added, "removed": self.removed}


def _is_text(data: bytes) -> bool:
    return b"\0" not in data[:_PROBE]


def file_diff(path: str, a: tuple[str, int] | None, b: tuple[str, int] | None, before: bytes, after: bytes) -> FileDiff:
    """One file's :class:`FileDiff` (``a``/``b``: its hash and mode before and after, ``None`` when absent)."""
    status = "added" if a is None else "deleted" if b is None else "modified"
    head = [f"diff --git a/{path} b/{path}"]
    if a is None and b is not None:
        head.append(f"new file mode {b[1]:o}")
    elif b is None and a is not None:
        head.append(f"deleted file mode {a[1]:o}")
    elif a is not None and b is not None and a[1] != b[1]:
        head += [f"old mode {a[1]:o}", f"new mode {b[1]:o}"]
        if a[0] == b[0]:
            return FileDiff(path, "mode", 0, 0, "\n".join(head) + "\n")
    if not (_is_text(before) and _is_text(after)):
        head.append(f"Binary files {'a/' + path if a else '/dev/null'} and {'b/' + path if b else '/dev/null'} differ")
        return FileDiff(path, status, None, None, "\n".join(head) + "\n")
    old_lines = before.decode("utf-8", "replace").splitlines(keepends=True)
    new_lines = after.decode("utf-8", "replace").splitlines(keepends=True)
    body = []
    added = removed = 0
    for line in difflib.unified_diff(
        old_lines, new_lines, "a/" + path if a else "/dev/null", "b/" + path if b else "/dev/null", n=3
    ):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
        body.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    text = "\n".join(head) + "\n" + "".join(body)
    return FileDiff(path, status, added, removed, text)


__all__ = ["MAX_BYTES", "MAX_FILES", "START_MAX_BYTES", "FileDiff", "Manifest", "Snapshots", "file_diff"]
