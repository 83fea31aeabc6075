"""A work directory swapped for a symlink (or another directory) is refused, never followed.

The way in: a model whose work directory holds another session's ran ``rm -rf b; ln -s / b``, and
the next command of session ``b`` got the host's root bound read-write. Now a work directory may
not nest with another session's or live goal's (the daemon refuses it at ``session/new``; a root
itself is a work directory only while no other is inside it), and every sandboxed command and
file-tool call opens the work directory without following symlinks and checks it is the
directory recorded when it was set up. Real bwrap, real
directories under ``/var/tmp`` (``/tmp`` is private in the sandbox), the real daemon for the
protocol checks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TEST_MODELS, Daemon, rpc
from sandboxkit import sandbox_in

from agent import Shell, ToolContext, workdirs
from agent.tools import ReadFile, WriteFile
from daemon.rpc.protocol import ErrorCode, RpcError

needs_bwrap = pytest.mark.needs_bwrap
MARKER = Path("/root/goald-swap-marker")


@pytest.fixture
def outside() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="goald-swap-", dir="/var/tmp")).resolve()
    base.chmod(0o711)  # a root daemon's sandbox user passes through to the work directories here
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
        MARKER.unlink(missing_ok=True)


def ctx(workdir: Path) -> ToolContext:
    return ToolContext(session_id="s", turn_id="t", call_id="c", workdir=workdir)


async def shell(workdir: Path, line: str) -> tuple[str, bool]:
    tool = Shell(sandbox_in(workdir, kill_grace=2.0))
    out = await tool.run(tool.Args(command=line), ctx(workdir))
    return out.content, out.is_error


@needs_bwrap
async def test_a_work_directory_swapped_for_a_symlink_to_root_is_refused(outside: Path) -> None:
    parent = outside / "work"
    inner = parent / "b"
    inner.mkdir(parents=True)
    workdirs.pin(inner)  # as the daemon does when the session is set up
    text, error = await shell(inner, "echo fine > f && cat f")
    assert (text, error) == ("exit code: 0\n--- stdout ---\nfine", False)
    # The outer model swaps it (here from the parent's own sandbox, as the attack did).
    text, error = await shell(parent, "rm -rf b && ln -s / b && echo swapped")
    assert "swapped" in text and not error
    text, error = await shell(inner, f"cat /etc/shadow; touch {MARKER}")
    assert error and "is not a real directory any more" in text
    read = await ReadFile().run(ReadFile.Args(path="etc/shadow"), ctx(inner))
    assert read.is_error and "not a real directory any more" in read.content
    wrote = await WriteFile().run(WriteFile.Args(path="root/goald-swap-marker", content="x"), ctx(inner))
    assert wrote.is_error
    assert MARKER.name not in os.listdir("/root")


@needs_bwrap
async def test_a_work_directory_replaced_by_another_directory_is_refused(outside: Path) -> None:
    inner = outside / "b"
    inner.mkdir()
    (inner / "mine").write_text("mine")
    workdirs.pin(inner)
    other = outside / "other"
    other.mkdir()
    (other / "theirs").write_text("theirs")
    os.rename(inner, outside / "b-old")
    os.rename(other, inner)  # a real directory (not a symlink) now stands at the path
    text, error = await shell(inner, "ls")
    assert error and "was replaced by another directory" in text
    read = await ReadFile().run(ReadFile.Args(path="theirs"), ctx(inner))
    assert read.is_error and "was replaced by another directory" in read.content


async def test_the_daemon_refuses_nested_work_directories(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path / "state", config=TEST_MODELS)
    try:
        daemon.start()
        root = (tmp_path / "state" / "work").resolve()
        (root / "a" / "in").mkdir(parents=True)
        (root / "c" / "x").mkdir(parents=True)
        await rpc(daemon.socket_path, "session/new", {"model": "test:worker", "workdir": str(root / "a")})
        for nested, how in ((root / "a" / "in", "lies inside"), (root, "contains")):
            with pytest.raises(RpcError, match=how):
                await rpc(daemon.socket_path, "session/new", {"model": "test:worker", "workdir": str(nested)})
        # The same directory may be shared; a sibling is fine; a goal inside the session's is not.
        await rpc(daemon.socket_path, "session/new", {"model": "test:worker", "workdir": str(root / "a")})
        await rpc(daemon.socket_path, "session/new", {"model": "test:worker", "workdir": str(root / "c" / "x")})
        with pytest.raises(RpcError, match="contains"):
            await rpc(daemon.socket_path, "session/new", {"model": "test:worker", "workdir": str(root / "c")})
        with pytest.raises(RpcError, match="the work directory of session ses_") as info:
            params = {"objective": "x", "model": "test:worker", "workdir": str(root / "a" / "in")}
            await rpc(daemon.socket_path, "goal/create", params)
        assert info.value.code == ErrorCode.CONFLICT
        assert daemon.terminate() == 0
    finally:
        daemon.close()
