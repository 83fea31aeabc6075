"""Who a sandboxed command is on the host: never root, never a root daemon's own uid.

A daemon started as root (by hand: ``goald serve``, ``run``, ``acp``, ``demo``) would otherwise run
every command as root outside its user namespace: a file the command makes is root's, and a copy
of ``/usr/bin/id`` made set-user-ID in a work directory another user can reach is a root shell for
that user. So a root daemon starts bwrap as a dedicated unprivileged user, ``goald-sandbox`` by
default (``sandbox_user``; an existing name, or ``UID:GID``). It is made once, as a system user
without a home or a login shell, when it does not exist (``useradd --system``), and said so in
the log. What a command creates is that user's; a root daemon reads and writes work directories
as root, and its file tools hand what they create to the work directory's owner
(:func:`adopt`). A daemon that is not root (the shipped system unit's dynamic user, a person's
own daemon) runs commands as itself: there is nobody to protect from it but itself.

Work directories and their parents: a new work directory belongs to the sandbox user (0700), its
root is ``root:<sandbox group> 0710`` so that bwrap, running as that user, can reach it to bind it,
and nobody else can list or enter it (:func:`prepare_root`).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from agent.sandbox.base import SandboxUnavailable

#: The user a root daemon's commands run as, unless ``sandbox_user`` names another.
DEFAULT_USER = "goald-sandbox"


@dataclass(frozen=True)
class SandboxUser:
    """The unprivileged user bwrap runs as for a root daemon."""

    name: str
    uid: int
    gid: int

    @property
    def ids(self) -> tuple[int, int]:
        return (self.uid, self.gid)


def sandbox_user(spec: str = DEFAULT_USER, *, create: bool = True) -> SandboxUser | None:
    """The user sandboxed commands run as: ``None`` when this process is not root (they run as it).

    ``spec`` is a user name (made as a system user when missing and ``create``) or ``UID:GID``.

    Raises:
        SandboxUnavailable: the user does not exist and cannot be made, or ``spec`` names root.
    """
    if os.geteuid() != 0:
        return None
    if ":" in spec:
        uid_text, _, gid_text = spec.partition(":")
        try:
            user = SandboxUser(spec, int(uid_text), int(gid_text))
        except ValueError:
            raise SandboxUnavailable(f"sandbox_user {spec!r} is neither a user name nor UID:GID") from None
    else:
        user = _named(spec, create=create)
    if user.uid == 0 or user.gid == 0:
        raise SandboxUnavailable(f"sandbox_user {spec!r} is root: commands must never run as root")
    return user


def _named(name: str, *, create: bool) -> SandboxUser:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if not create:
            raise SandboxUnavailable(f"the sandbox user {name!r} does not exist") from None
        _make(name)
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise SandboxUnavailable(f"the sandbox user {name!r} could not be made") from None
    return SandboxUser(name, entry.pw_uid, entry.pw_gid)


def _make(name: str) -> None:
    useradd = shutil.which("useradd", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if useradd is None:
        raise SandboxUnavailable(
            f"the sandbox user {name!r} does not exist and useradd is missing: make a system user of that name "
            "(or set sandbox_user to UID:GID of an unprivileged user)"
        )
    nologin = shutil.which("nologin", path="/usr/sbin:/sbin:/usr/bin:/bin") or "/bin/false"
    argv = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
    done = subprocess.run([*argv, "--shell", nologin, name], capture_output=True, text=True, timeout=30)
    if done.returncode != 0 and "already exists" not in done.stderr:
        why = done.stderr.strip() or f"exit code {done.returncode}"
        raise SandboxUnavailable(f"the sandbox user {name!r} could not be made: {why}")
    logger.info("made the system user {!r}: a root daemon's sandboxed commands run as it", name)


def prepare_root(root: Path, user: SandboxUser | None, *, setting: str = "workdir_roots") -> None:
    """Make a work-directory root reachable by the sandbox user and nobody else: ``0710``, its group
    the sandbox user's. Its parents must let that user through (their search bit for others, or
    the same group); one that does not is said in a warning (:func:`reach_problem`; ``setting`` is
    the configuration key that places ``root``), and commands there cannot start."""
    if user is None:
        return
    with contextlib.suppress(FileExistsError):
        root.mkdir(parents=True, mode=0o700)
    os.chown(root, 0, user.gid)
    os.chmod(root, 0o710)
    problem = reach_problem(root, user.ids, name=user.name, what="what is under it", setting=setting)
    if problem is not None:
        logger.warning("{}; commands there cannot start", problem)


def blocker(path: Path, uid: int, gids: Iterable[int]) -> tuple[Path, os.stat_result] | None:
    """The first directory on the way to ``path`` (its parents, from ``/`` down) that ``uid`` with the
    groups ``gids`` may not pass through (no search permission for it), with its status; ``None`` when
    every one lets it through, or cannot be read (then nothing can be said). Root passes everywhere.

    The kernel's rule: the owner's bits for the owner, else the group's for a member, else the others'
    (access control lists aside: a directory one grants passage to is reported as a blocker)."""
    if uid == 0:
        return None
    groups = set(gids)
    for parent in reversed(Path(os.path.normpath(path)).parents):
        try:
            st = parent.stat()
        except OSError:
            return None
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return parent, st
    return None


def reach_problem(
    path: Path,
    ids: tuple[int, int],
    *,
    name: str | None = None,
    what: str | None = None,
    setting: str | None = "workdir_roots",
    groups: Iterable[int] | None = None,
) -> str | None:
    """In plain words, why the user ``ids`` (``(uid, gid)``, no other group: how bwrap runs for a root
    daemon; negative: a user not made yet, who passes by the others' bits only) cannot reach
    ``path``, and how to fix it; ``None`` when it can.

    ``what`` names what lies at ``path`` (default: the path itself); ``setting`` is the configuration
    key that places it (the other fix: set it to a directory the user can reach; ``None``: no key
    does); ``groups`` all the groups the user passes with (default: ``gid`` only)."""
    uid, gid = ids
    found = blocker(path, uid, [gid] if groups is None else groups)
    if found is None:
        return None
    where, st = found
    if uid < 0:  # the user is made at the first start: nothing owns anything of it yet
        who, group = f"the sandbox user {name!r} (made at the daemon's first start)", name or DEFAULT_USER
    else:
        who = f"the sandbox user {name!r} (uid {uid})" if name is not None else f"the sandbox user (uid {uid})"
        group = str(gid)
    target = f"{what} ({path})" if what is not None else str(path)
    return (
        f"{who} cannot reach {target}: {where} (mode {stat.S_IMODE(st.st_mode):04o}, owner {_owner(st)}) "
        f"does not let it through; give that directory search permission (chmod o+x {where}, or "
        f"chgrp {group} {where} && chmod g+x {where})"
        + (f", or set {setting} to a directory it can reach" if setting is not None else "")
    )


def _owner(st: os.stat_result) -> str:
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{user}:{group}"


def hand_over(workdir: Path, user: SandboxUser | None, *, tree: bool = False) -> None:
    """Give a work directory to the sandbox user (a root daemon's; nothing otherwise): the directory
    itself, or with ``tree`` everything in it too (a directory someone named for a goal, which its
    commands must be able to change). Symlinks are changed themselves, never followed."""
    if user is None:
        return
    if os.lstat(workdir).st_uid == user.uid and not tree:
        return
    os.lchown(workdir, user.uid, user.gid)
    if not tree:
        return
    for top, dirs, files in os.walk(workdir, followlinks=False):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(top, name), user.uid, user.gid)


def adopt(fd: int, dir_fd: int) -> None:
    """Give what a root daemon's file tool just made (``fd``) to the owner of the work directory it
    is in (``dir_fd``), so the sandbox user's commands can change it later. Nothing when not root."""
    if os.geteuid() != 0:
        return
    owner = os.fstat(dir_fd)
    mine = os.fstat(fd)
    if (mine.st_uid, mine.st_gid) != (owner.st_uid, owner.st_gid):
        os.fchown(fd, owner.st_uid, owner.st_gid)
