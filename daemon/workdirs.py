"""Work directories: where a session or goal works, always inside the allowed roots.

A directory named by a caller is checked (absolute, inside a root, an existing directory); without
one a new directory named after the session, goal or fire is made in the first root. Either way it
is pinned (:mod:`agent.workdirs`): every later use must still find the same directory. This is its
own small service so that the RPC methods, declared goals and schedule firing need only it, not
the daemon's host.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from agent import workdirs
from agent.sandbox import SandboxUser
from agent.sandbox.identity import hand_over
from daemon.rpc.protocol import InvalidField
from goals.snapshots import MAX_BYTES, MAX_FILES


class Workdirs:
    """Resolves work directories inside ``roots`` (the first is where new ones are made)."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self._roots = tuple(roots)
        #: Who new work directories belong to: the sandbox user of a root daemon (set once the
        #: sandbox profile is built), else the daemon itself.
        self.owner: SandboxUser | None = None

    def inside_roots(self, raw: str, field: str) -> Path:
        """An existing directory inside the roots, read only (nothing is pinned or handed over).

        Raises:
            InvalidField: relative, outside the roots, or not a directory (naming ``field``).
        """
        path = Path(raw).expanduser()
        if not path.is_absolute():
            raise InvalidField(f"{field} {raw!r} must be an absolute path", field=field)
        path = path.resolve()
        roots = [r.resolve() for r in self._roots]
        if not any(path.is_relative_to(r) for r in roots):
            raise InvalidField(
                f"{field} {raw!r} is outside the allowed work-directory roots ({', '.join(map(str, roots))})",
                field=field,
            )
        if not path.is_dir():
            raise InvalidField(f"{field} {raw!r} does not exist or is not a directory", field=field)
        return path

    def hand_tree(self, path: Path) -> None:
        """Give everything in a work directory goald filled (a goal's worktree) to the sandbox user."""
        hand_over(path, self.owner, tree=True)

    def resolve(self, raw: str | None, name: str) -> Path:
        """A work directory inside the allowed roots: ``raw`` checked, or a new one named ``name``.

        Raises:
            InvalidField: ``raw`` is relative, outside the roots, or not a directory (field ``workdir``).
        """
        roots = [r.resolve() for r in self._roots]
        if raw is None:
            path = roots[0] / name
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            hand_over(path, self.owner)
            workdirs.pin(path)
            return path
        path = Path(raw).expanduser()
        if not path.is_absolute():
            raise InvalidField(f"workdir {raw!r} must be an absolute path", field="workdir")
        # A root itself is allowed (``goald run --workdir``, an editor's project): what keeps one
        # session from swapping another's directory is the nesting check at ``session/new`` and
        # ``goal/create`` and the pin below, checked at every use.
        path = path.resolve()
        if not any(path.is_relative_to(r) for r in roots):
            raise InvalidField(
                f"workdir {raw!r} is outside the allowed work-directory roots ({', '.join(map(str, roots))})",
                field="workdir",
            )
        if not path.is_dir():
            raise InvalidField(f"workdir {raw!r} does not exist or is not a directory", field="workdir")
        workdirs.pin(path)  # the directory every later use must still be
        if self.owner is not None and path.stat().st_uid != self.owner.uid:
            # A root daemon's commands run as the sandbox user: the named directory becomes theirs.
            hand_over(path, self.owner, tree=True)
        return path


def copy_tree(source: Path, target: Path, *, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> int:
    """Copy ``source`` into the empty directory ``target`` as data: directories, regular files with
    their modes, symlinks as symlinks (never followed), nothing else; returns the entries copied.

    Raises:
        InvalidField: over ``max_files`` entries or ``max_bytes`` (field ``startFrom``).
    """
    count, size = 0, 0
    for top, dirs, files in os.walk(source, followlinks=False):
        rel = Path(top).relative_to(source)
        dirs.sort()
        for name in dirs + sorted(files):
            src, dst = Path(top) / name, target / rel / name
            count += 1
            if count > max_files:
                raise InvalidField(f"startFrom {str(source)!r} holds over {max_files:,} entries", field="startFrom")
            info = src.lstat()
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISDIR(info.st_mode):
                dst.mkdir(mode=0o700)
            elif stat.S_ISREG(info.st_mode):
                size += info.st_size
                if size > max_bytes:
                    raise InvalidField(f"startFrom {str(source)!r} holds over {max_bytes:,} bytes", field="startFrom")
                shutil.copyfile(src, dst, follow_symlinks=False)
                os.chmod(dst, 0o755 if info.st_mode & 0o111 else 0o644)
    return count
