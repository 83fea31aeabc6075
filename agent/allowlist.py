"""What a sandboxed command sees of the file system: an allowlist, never the whole root.

The sandbox's root is an empty tmpfs, made read-only once the mounts are in place. Into it go:

* the system directories a shell needs, read-only: :data:`SYSTEM_PATHS` (``/usr``, ``/bin``,
  ``/sbin``, ``/lib*``, ``/etc``). One that is a symlink on the host (Debian's merged ``/usr``:
  ``/bin -> usr/bin``) is the same symlink in the sandbox;
* ``/etc`` without its secrets: :data:`ETC_SECRETS` (``shadow``, ``gshadow``, ``sudoers``, ssh host
  keys, TLS private keys, goald's own configuration directory ...) and, found again when ``/etc`` changes, every
  entry of ``/etc`` that other users may not read (a secret by its owner's own account). A file is
  covered by ``/dev/null``, a directory by an empty read-only tmpfs. ``/etc/resolv.conf`` and
  ``/etc/hosts`` keep working when they are symlinks into ``/run`` (systemd-resolved): their
  targets, and only those, are bound too;
* the extra read-only paths of the goal (a toolchain under ``/opt``, say);
* the work directory, read-write, and a private ``/tmp``; ``/proc`` of the sandbox's own PID
  namespace and a minimal ``/dev``;
* with a network allow list, the daemon's proxy's socket for this command, read-only, at
  ``/run/goald/proxy.sock`` (:mod:`agent.sandbox.bridge`), and nothing else of ``/run``.

Nothing else exists: not ``/root``, ``/home``, ``/run`` (``/run/user``, ``/run/credentials``),
``/var`` (``/var/lib`` with the state directory), ``/srv``, ``/mnt``, other work directories. Only
the parent directories of the work directory and of the extra paths appear, empty and read-only.
Paths to hide that lie inside something shown (the configuration directory ``/etc/goald``, a state
directory inside an extra path, a secret inside the work directory) are covered the same way.

Mounts are ordered parents first, so a work directory inside a covered directory (the default
``<state_dir>/work/<goal>`` when the state directory is under an extra path) stays visible while its
siblings do not.
"""

from __future__ import annotations

import functools
import glob
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from agent.errors import AgentError

#: Read-only in every sandbox (those that exist on the host).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
#: Hidden inside ``/etc`` whatever their mode (globs).
ETC_SECRETS = (
    "/etc/shadow*",
    "/etc/gshadow*",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh/*_key",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/etc/credstore",
    "/etc/credstore.encrypted",
    "/etc/krb5.keytab",
    "/etc/ppp/*-secrets",
    "/etc/NetworkManager/system-connections",
    "/etc/wpa_supplicant",
    "/etc/letsencrypt",
    "/etc/goald",
    "/etc/default/goald",
)
#: ``/etc`` files that may be symlinks into a directory not shown (``/run``): their targets are bound.
_FOLLOWED = ("/etc/resolv.conf", "/etc/hosts")
_TMP = Path("/tmp")
#: Files of the sandbox's ``/proc`` covered by ``/dev/null``.
_PROC_COVERED = ("/proc/keys", "/proc/key-users")


class MountError(AgentError, ValueError):
    """A mount plan that cannot work (an extra path that does not exist, the work directory hidden)."""


def _unreadable_in_etc() -> tuple[Path, ...]:
    """:func:`_scan_etc`, found again whenever ``/etc``'s modification time changes (an entry added,
    removed or renamed there: how packages and editors replace a file). A chmod in place does not
    change it; that is still seen at the daemon's next start."""
    try:
        stamp = os.stat("/etc").st_mtime_ns
    except OSError:
        stamp = 0
    return _scan_etc(stamp)


@functools.lru_cache(maxsize=1)
def _scan_etc(_stamp: int) -> tuple[Path, ...]:
    """Entries of ``/etc`` that others may not read (directories: not search and read), not descended into."""
    found: list[Path] = []
    stack = ["/etc"]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                if mode & 0o005 != 0o005:
                    found.append(Path(entry.path))
                else:
                    stack.append(entry.path)
            elif stat.S_ISREG(mode) and not mode & stat.S_IROTH:
                found.append(Path(entry.path))
    return tuple(found)


def etc_secrets() -> list[Path]:
    """What is hidden of ``/etc``: :data:`ETC_SECRETS` as found now, and what others may not read."""
    named = [Path(p) for pattern in ETC_SECRETS for p in glob.glob(pattern)]
    return list(dict.fromkeys([*named, *_unreadable_in_etc()]))


#: The directories :data:`ETC_SECRETS`' patterns match in (their entries are the matches).
_PATTERN_DIRS = tuple(dict.fromkeys(os.path.dirname(p) for p in ETC_SECRETS))
#: :func:`_etc_covered`'s last answer: the directories it depends on, their stamps, the paths.
_etc_cache: tuple[tuple[str, ...], tuple[tuple[int, int] | None, ...], tuple[Path, ...]] | None = None


def _stamps(dirs: Iterable[str]) -> tuple[tuple[int, int] | None, ...]:
    out: list[tuple[int, int] | None] = []
    for d in dirs:
        try:
            st = os.stat(d)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_mtime_ns))
    return tuple(out)


def _ancestors(path: str) -> list[str]:
    parents: list[str] = []
    while True:
        up = os.path.dirname(path)
        if up == path:
            return parents
        parents.append(up)
        path = up


def _etc_covered() -> tuple[Path, ...]:
    """:func:`etc_secrets` that exist, resolved (``realpath``), in the order found: what every
    command's mounts cover of ``/etc``. Resolving them is most of the cost of a command's mount plan,
    so the answer is kept while every directory it depends on (those the patterns match in, and
    every ancestor of each path, as named and as resolved) keeps its inode and modification time:
    an entry added, removed, renamed or swapped for a link in any of them moves that time. The
    stamps are taken before the paths are found, so a change made while they are found is seen at
    the next call."""
    global _etc_cache
    cached = _etc_cache
    if cached is not None and _stamps(cached[0]) == cached[1]:
        return cached[2]
    dirs = list(dict.fromkeys(["/etc", *_PATTERN_DIRS, *(cached[0] if cached is not None else ())]))
    for _ in range(3):
        stamps = _stamps(dirs)
        found: list[Path] = []
        needed: dict[str, None] = dict.fromkeys(dirs)
        for raw in etc_secrets():
            real = os.path.realpath(raw)
            needed.update(dict.fromkeys([*_ancestors(str(raw)), *_ancestors(real)]))
            if os.path.lexists(real):
                found.append(Path(real))
        if len(needed) == len(dirs):  # every directory it depends on was stamped before
            result = tuple(dict.fromkeys(found))
            _etc_cache = (tuple(dirs), stamps, result)
            return result
        dirs = list(needed)
    return tuple(dict.fromkeys(found))  # still moving: not kept


def _within(path: Path, top: Path) -> bool:
    """``path.is_relative_to(top)`` for absolute, normalized paths, by their strings (pathlib's
    is an order of magnitude slower, and a command's mount plan asks it hundreds of times)."""
    inner, outer = str(path), str(top)
    return inner == outer or inner.startswith(outer if outer.endswith("/") else outer + "/")


def _under(path: Path, tops: Iterable[Path]) -> bool:
    return any(_within(path, top) for top in tops)


def mounts(
    workdir: Path,
    read_only: Iterable[Path] = (),
    hidden: Iterable[Path] = (),
    *,
    workdir_fd: int | None = None,
    sockets: Iterable[tuple[Path, str]] = (),
) -> list[str]:
    """bwrap's arguments for the file system: allowlist, extra read-only paths, hidden paths, work
    directory, private ``/tmp``, ``/proc`` and ``/dev``; the root made read-only last.

    ``sockets``: ``(host path, path inside)`` of unix sockets bound read-only (the network proxy's,
    :mod:`agent.sandbox.proxy`; a socket on a read-only mount can still be connected to).

    ``workdir_fd`` is a descriptor of the work directory checked by
    :func:`agent.workdirs.open_workdir`: bound with ``--bind-fd``, so a path swapped for a symlink
    after the check is never followed, and bwrap closes it once the mount is made (it must never
    reach the command: through ``/proc/self/fd/N/..`` it would climb to the host's root). Without
    it the path itself is bound.

    Raises:
        MountError: an extra path does not exist, or the work directory is one of the hidden paths.
    """
    workdir = Path(os.path.normpath(workdir))
    ops, shown = _shown(read_only)
    ops.append((len(_TMP.parts), 0, _TMP, "tmp", ""))
    covered = [(path, path.is_dir()) for path in _covered(hidden, workdir, shown)]
    for path, is_dir in covered:
        ops.append((len(path.parts), 1, path, "dir" if is_dir else "file", ""))
    for source, target in sockets:
        inside = Path(target)
        ops.append((len(inside.parts), 0, inside, "ro", str(source)))
    if workdir != Path("/"):
        if workdir_fd is None:
            ops.append((len(workdir.parts), 2, workdir, "bind", str(workdir)))
        else:
            ops.append((len(workdir.parts), 2, workdir, "bind-fd", str(workdir_fd)))
    # The kernel keyrings' listing is covered: what the keyrings hold is not a command's business
    # (and keyctl itself is refused by the system-call filter).
    keys = [a for p in _PROC_COVERED if os.path.exists(p) for a in ("--ro-bind", "/dev/null", p)]
    args = ["--proc", "/proc", *keys, "--dev", "/dev", *_arguments(ops)]
    # Made read-only last: mount points for what lies inside them were created first.
    for path, is_dir in covered:
        if is_dir:
            args += ["--remount-ro", str(path)]
    return [*args, "--remount-ro", "/"]


#: A mount: (depth, order, path, op, source). Sorted, parents come first; at one depth, what shows
#: before what covers, and the work directory last.
_Op = tuple[int, int, Path, str, str]


def _shown(read_only: Iterable[Path]) -> tuple[list[_Op], list[Path]]:
    """The mounts of what is shown read-only (the system allowlist, the extra paths, the files the
    followed links of ``/etc`` point to), and the directories shown."""
    ops: list[_Op] = []
    shown: list[Path] = []
    for name in SYSTEM_PATHS:
        path = Path(name)
        if path.is_symlink():
            ops.append((1, 0, path, "symlink", os.readlink(path)))
        elif path.is_dir():
            ops.append((1, 0, path, "ro", name))
            shown.append(path)
    for raw in read_only:
        path = Path(os.path.normpath(raw))
        if not path.is_absolute():
            raise MountError(f"the read-only path {str(raw)!r} is not absolute")
        if not path.exists():
            raise MountError(f"the read-only path {str(raw)!r} does not exist")
        if _under(path, shown):
            continue
        ops.append((len(path.parts), 0, path, "ro", str(path)))
        shown.append(path)
    for name in _FOLLOWED:
        real = Path(os.path.realpath(name))
        if Path(name).is_symlink() and real.is_file() and not _under(real, shown):
            ops.append((len(real.parts), 0, real, "ro", str(real)))
    return ops, shown


def _covered(hidden: Iterable[Path], workdir: Path, shown: list[Path]) -> list[Path]:
    """The hidden paths (and the secrets of ``/etc``) that lie in what is shown: each gets covered."""
    covered: dict[Path, None] = {}
    for path in [*(Path(os.path.realpath(raw)) for raw in hidden), *_etc_covered()]:
        if path == workdir:
            raise MountError(f"the work directory {str(workdir)!r} is one of the hidden paths")
        if path in covered or not os.path.lexists(path):
            continue
        inside_workdir = _within(path, workdir) and workdir != Path("/")
        if (_under(path, shown) and not _within(path, _TMP)) or inside_workdir:
            covered[path] = None
    return list(covered)


def _arguments(ops: list[_Op]) -> list[str]:
    """bwrap's arguments for ``ops``, parents first."""
    args: list[str] = []
    for _, _, where, op, source in sorted(ops):
        target = str(where)
        if op == "symlink":
            args += ["--symlink", source, target]
        elif op == "ro":
            args += ["--ro-bind", source, target]
        elif op in ("tmp", "dir"):
            args += ["--tmpfs", target]
        elif op == "file":
            args += ["--ro-bind", "/dev/null", target]
        elif op == "bind-fd":
            args += ["--bind-fd", source, target]
        else:
            args += ["--bind", source, target]
    return args
