"""A goal's work as a branch: the worktree made for a goal on a repository, and its commits.

The repository is the operator's (trusted); what the goal writes is the model's (untrusted). So git
runs on the repository only, never on what the goal wrote:

* **Making the worktree** (at ``goal/create``, before the model has written anything):
  ``git worktree add -b BRANCH WORKDIR BASE`` on the operator's repository, its hooks off.
* **Recording rounds** is not git's: :mod:`goals.snapshots` reads the work directory as data.
* **Committing** a checkpoint onto the goal's branch (``goald goal commit``) is ``git fast-import``
  on the repository, fed the checkpoint's stored contents: git reads nothing of the work directory,
  so no hook, fsmonitor, filter, attribute or config the model wrote there is ever read, let alone run.

Every git here runs with configuration from outside ignored (``GIT_CONFIG_NOSYSTEM``, an empty
global configuration, no ``HOME``, no prompt), hooks off and fsmonitor off; the repository's own
configuration stays the operator's.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from daemon.errors import DaemonError
from goals.snapshots import Manifest, Snapshots

#: Configuration git may not take from anywhere but the repository, and what it may not run.
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "HOME": "/nonexistent",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
    "LC_ALL": "C",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
}
GIT_SAFE = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "protocol.allow=never"]


class GitFailed(DaemonError):
    """A git command on the operator's repository failed (its words are in the message)."""


async def git(repo: Path, *args: str, stdin: bytes | None = None, limit: float = 120.0) -> str:
    """Run ``git -C repo ARGS`` with the configuration from outside ignored; its stdout.

    Raises:
        GitFailed: a non-zero exit (with git's stderr), or no answer within ``limit`` seconds.
    """
    proc = await asyncio.create_subprocess_exec(
        "git",
        *GIT_SAFE,
        "-C",
        str(repo),
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=GIT_ENV,
    )
    try:
        async with asyncio.timeout(limit):
            out, err = await proc.communicate(stdin)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise GitFailed(f"git {args[0]} took over {limit:.0f}s") from None
    if proc.returncode != 0:
        raise GitFailed(f"git {args[0]}: {err.decode(errors='replace').strip()[:500]}")
    return out.decode(errors="replace")


async def make_worktree(repo: Path, base: str, branch: str, workdir: Path) -> str:
    """Make ``workdir`` (empty) a worktree of ``repo`` on a new ``branch`` from ``base``; the base commit.

    Raises:
        GitFailed: not a repository, an unknown base, a branch that exists, ...
    """
    top = (await git(repo, "rev-parse", "--show-toplevel")).strip()
    if not top:
        raise GitFailed(f"{repo} is a bare repository: give a repository with a working tree")
    commit = (await git(repo, "rev-parse", "--verify", "--end-of-options", f"{base}^{{commit}}")).strip()
    await git(repo, "check-ref-format", "--branch", branch)
    await git(repo, "worktree", "add", "--quiet", "-b", branch, str(workdir), commit)
    return commit


async def drop_orphan(repo: Path, branch: str, roots: list[Path]) -> bool:
    """Remove the worktree and branch a goal's creation left when it was cut short (the daemon died
    between making the worktree and committing the goal): only a worktree inside the work-directory
    ``roots`` is removed; ``False`` when there is none such."""
    listing = await git(repo, "worktree", "list", "--porcelain")
    path = None
    for block in listing.split("\n\n"):
        fields = dict(line.split(" ", 1) for line in block.splitlines() if " " in line)
        if fields.get("branch") == f"refs/heads/{branch}":
            path = Path(fields["worktree"])
    if path is None or not any(path.resolve().is_relative_to(r.resolve()) for r in roots):
        return False
    await remove_worktree(repo, branch, path)
    return True


async def remove_worktree(repo: Path, branch: str, workdir: Path) -> None:
    """Undo :func:`make_worktree` (a goal that could not be created): the worktree and its branch."""
    try:
        await git(repo, "worktree", "remove", "--force", str(workdir))
    finally:
        await git(repo, "branch", "-D", "--end-of-options", branch)


async def commit_checkpoint(
    repo: Path, branch: str, parent: str, snapshots: Snapshots, goal_id: str, manifest: Manifest, message: str
) -> str:
    """Write ``manifest`` (a checkpoint's tree) as a commit on ``branch`` after ``parent``, through
    ``git fast-import`` fed the stored contents; the new commit."""
    now = int(time.time())
    msg = message.encode()
    parts = [
        f"commit refs/heads/{branch}\n".encode(),
        f"committer goald <goald@localhost> {now} +0000\n".encode(),
        f"data {len(msg)}\n".encode() + msg + b"\n",
        f"from {parent}\n".encode(),
        b"deleteall\n",
    ]
    for path, (digest, mode) in sorted(manifest.files.items()):
        data = snapshots.blob(goal_id, digest)
        quoted = path.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'M {mode:o} inline "{quoted}"\n'.encode() + f"data {len(data)}\n".encode() + data + b"\n")
    parts.append(b"done\n")
    await git(repo, "fast-import", "--quiet", "--done", stdin=b"".join(parts))
    return (await git(repo, "rev-parse", "--verify", f"refs/heads/{branch}^{{commit}}")).strip()


def default_branch(key: str | None, goal_id: str) -> str:
    """``goald/<key or id>``."""
    return f"goald/{key or goal_id}"


def git_available() -> bool:
    """Whether a ``git`` is on the daemon's PATH."""
    return any(os.access(Path(d) / "git", os.X_OK) for d in GIT_ENV["PATH"].split(":"))


__all__ = [
    "GIT_ENV",
    "GitFailed",
    "commit_checkpoint",
    "default_branch",
    "drop_orphan",
    "git",
    "git_available",
    "make_worktree",
    "remove_worktree",
]
