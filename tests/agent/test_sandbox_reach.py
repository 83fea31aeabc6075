"""A root daemon's sandbox user must pass through every directory above a work directory: when one
does not let it through, bwrap says only ``Can't find source path /proc/self/fd/N: Permission
denied``. The tool result and the log say instead, in plain words, which directory stops which
user and how to fix it, and ``goald config check`` says it beforehand. With real bwrap, as root
(the sandbox user exists only for a root daemon).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger
from sandboxkit import bwrap

from agent.sandbox import Sandbox, SandboxUser, sandbox_user
from agent.sandbox.identity import blocker, hand_over, prepare_root
from agent.tools.base import ToolContext
from agent.tools.shell import Shell
from daemon.config_check import config_findings
from daemon.settings import load_settings

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: only a root daemon has a sandbox user")


@pytest.fixture
def user() -> SandboxUser:
    found = sandbox_user()
    assert found is not None
    return found


@pytest.fixture
def errors() -> Iterator[list[str]]:
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(m.record["message"]), level="ERROR")
    yield seen
    logger.remove(sink)


def closed_workdir(outside: Path, user: SandboxUser) -> tuple[Path, Path]:
    """A work directory made as a root daemon makes one, under a directory only root may pass (0700)."""
    closed = outside / "closed"
    closed.mkdir(mode=0o700)
    root = closed / "work"
    prepare_root(root, user)
    workdir = root / "g"
    workdir.mkdir(mode=0o700)
    hand_over(workdir, user)
    return closed, workdir


@needs_root
@pytest.mark.needs_bwrap
async def test_an_unreachable_work_directory_is_said_in_plain_words(
    outside: Path, user: SandboxUser, errors: list[str]
) -> None:
    closed, workdir = closed_workdir(outside, user)
    found = bwrap()
    box = Sandbox(workdir, bwrap=found.path, disable_userns=found.disable_userns, run_as=user.ids)
    shell = Shell(box)
    ctx = ToolContext(session_id="s", turn_id="t", call_id="c", workdir=workdir)
    out = await shell.run(shell.Args(command="echo ran"), ctx)
    assert out.is_error
    says = (
        f"shell is not available: the sandbox user {user.name!r} (uid {user.uid}) cannot reach the work directory "
        f"({workdir}): {closed} (mode 0700, owner root:root) does not let it through; give that directory search "
        f"permission (chmod o+x {closed}, or chgrp {user.gid} {closed} && chmod g+x {closed}), or set workdir_roots "
        "to a directory it can reach"
    )
    assert out.content == says
    assert "/proc/self/fd" not in out.content
    assert errors == ["a sandboxed command could not start: " + says.removeprefix("shell is not available: ")]
    # The fix it names works.
    closed.chmod(0o711)
    out = await shell.run(shell.Args(command="echo ran"), ctx)
    assert (out.is_error, out.content) == (False, "exit code: 0\n--- stdout ---\nran")


@pytest.mark.needs_bwrap
async def test_a_command_that_only_prints_the_words_keeps_its_own_result(outside: Path, errors: list[str]) -> None:
    workdir = outside / "g"
    workdir.mkdir()
    user = sandbox_user()
    if user is not None:
        prepare_root(outside, user)
        hand_over(workdir, user)
    found = bwrap()
    box = Sandbox(
        workdir, bwrap=found.path, disable_userns=found.disable_userns, run_as=None if user is None else user.ids
    )
    words = "bwrap: Can't find source path /proc/self/fd/3: Permission denied"
    result = await box.run(["bash", "-c", f'echo "{words}" >&2; exit 1'], timeout=30)
    assert (result.exit_code, result.stderr) == (1, words + "\n")
    assert errors == []


def test_blocker_follows_the_kernels_rule(outside: Path) -> None:
    top = outside / "a"
    top.mkdir(mode=0o750)
    os.chown(top, 1234, 4321)
    inner = top / "b" / "c"
    # The owner's bits for the owner, the group's for a member, the others' for anyone else.
    assert blocker(inner, 1234, [1]) is None
    assert blocker(inner, 99, [4321]) is None
    assert blocker(inner, 99, [1]) == (top, top.stat())
    top.chmod(0o051)  # the owner's bits bind the owner even when the others' would let it through
    assert blocker(inner, 1234, [4321]) == (top, top.stat())
    assert blocker(inner, 99, [1]) is None
    assert blocker(inner, 0, []) is None  # root passes everywhere


@needs_root
def test_config_check_says_beforehand_which_directory_stops_the_sandbox_user(outside: Path, user: SandboxUser) -> None:
    closed = outside / "closed"
    closed.mkdir(mode=0o700)
    state = outside / "state"
    state.mkdir(mode=0o700)

    def reach(**kw: object) -> list[str]:
        found = config_findings(load_settings(state_dir=str(state), **kw))
        return [str(f) for f in found if "cannot reach" in f.message or "could not pass" in f.message]

    assert reach(workdir_roots=[str(closed / "work")]) == [
        f"workdir_roots: the sandbox user {user.name!r} (uid {user.uid}) cannot reach the work directories under it "
        f"({closed / 'work'}): {closed} (mode 0700, owner root:root) does not let it through; give that directory "
        f"search permission (chmod o+x {closed}, or chgrp {user.gid} {closed} && chmod g+x {closed}), or set "
        "workdir_roots to a directory it can reach"
    ]
    # A read-only path behind it, and a missing parent that serve would make 0700.
    [ro] = reach(workdir_roots=[str(outside / "open")], sandbox_read_only_paths=[str(closed / "tool")])
    assert ro.startswith(f"sandbox_read_only_paths: the sandbox user {user.name!r}") and f"{closed} (mode 0700" in ro
    [missing] = reach(workdir_roots=[str(outside / "new" / "work")])
    assert missing == (
        f"workdir_roots: {outside / 'new'} does not exist: goald serve would make it 0700 (its umask), and the "
        f"sandbox user {user.name!r} could not pass through it to {outside / 'new' / 'work'}; make it yourself "
        "with mode 0711"
    )
    # The default layout: the state directory is let through by serve itself; its parents must be.
    assert reach() == []
    inner = closed / "state"
    inner.mkdir()
    [default] = [str(f) for f in config_findings(load_settings(state_dir=str(inner))) if "cannot reach" in f.message]
    assert default.startswith(f"state_dir: the sandbox user {user.name!r}") and f"{closed} (mode 0700" in default
    # Fixed as it says: nothing more to say.
    closed.chmod(0o711)
    assert reach(workdir_roots=[str(closed / "work")], sandbox_read_only_paths=[str(closed / "tool")]) == []
