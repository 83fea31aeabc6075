"""The file tools (``read_file``, ``write_file``, ``edit_file``, ``list_dir``) stay inside the work directory.

Issue 6, must-show 6: ``..``, an absolute path outside the work directory and a symlink pointing
outside are refused (for every tool; also a symlinked directory component, and a write through a
dangling symlink); writes inside work; ``edit_file`` replaces exactly one exact occurrence and says
clearly when there is none or more than one.

Every call goes through a real :class:`ToolRegistry` (argument validation, timeout, output cap),
as the driver makes it, on real directories under ``tmp_path``: a work directory and, beside it,
an "outside" directory holding a secret. After each refused call the outside directory is compared
with its state before, byte for byte, so a refusal that still wrote something fails too.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from agent import ToolContext, ToolOutput, ToolRegistry, file_tools
from agent.tools import files

SECRET = "the outside secret 4b7e"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    (path / "dir").mkdir(parents=True)
    (path / "secret.txt").write_text(SECRET)
    (path / "dir" / "inner.txt").write_text(SECRET)
    return path


def snapshot(path: Path) -> dict[str, Any]:
    """Every entry under ``path``: file contents, link targets, directories."""
    out: dict[str, Any] = {}
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_dir():
            out[rel] = ("dir",)
        else:
            out[rel] = ("file", p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
    return out


async def call(work: Path | None, tool: str, **args: Any) -> ToolOutput:
    registry = ToolRegistry(list(file_tools()))
    ctx = ToolContext(session_id="ses_t", turn_id="turn_t", call_id="c1", workdir=work)
    return await registry.call(tool, args, ctx)


# -- inside: the tools work ------------------------------------------------------------------------


async def test_writes_reads_and_lists_inside_the_work_directory(work: Path) -> None:
    out = await call(work, "write_file", path="notes/today.md", content="# Today\nsunny ☀\n")
    assert (out.is_error, out.content) == (False, "wrote 18 bytes to notes/today.md")
    assert (work / "notes" / "today.md").read_text() == "# Today\nsunny ☀\n"
    # Overwrite through an absolute path that lies inside, and through a ``..`` that stays inside.
    out = await call(work, "write_file", path=str(work / "notes" / "today.md"), content="v2\n")
    assert not out.is_error
    out = await call(work, "write_file", path="notes/../top.txt", content="top\n")
    assert not out.is_error
    assert (work / "notes" / "today.md").read_text() == "v2\n"
    assert (work / "top.txt").read_text() == "top\n"

    read = await call(work, "read_file", path="notes/today.md")
    assert (read.is_error, read.content) == (False, "v2\n")
    listing = await call(work, "list_dir")
    assert (listing.is_error, listing.content) == (False, "notes/\ntop.txt")
    assert (await call(work, "list_dir", path="notes")).content == "today.md"
    # No temporary file is left behind by the atomic replace.
    assert sorted(snapshot(work)) == ["notes", "notes/today.md", "top.txt"]


async def test_a_symlink_that_stays_inside_is_followed(work: Path) -> None:
    (work / "real").mkdir()
    (work / "real" / "a.txt").write_text("alpha\n")
    (work / "alias").symlink_to("real")
    (work / "a-link.txt").symlink_to("real/a.txt")
    assert (await call(work, "read_file", path="alias/a.txt")).content == "alpha\n"
    assert (await call(work, "read_file", path="a-link.txt")).content == "alpha\n"
    out = await call(work, "write_file", path="a-link.txt", content="beta\n")
    assert not out.is_error
    # The write went to the link's target; the link is still a link.
    assert (work / "real" / "a.txt").read_text() == "beta\n"
    assert (work / "a-link.txt").is_symlink()
    assert (await call(work, "list_dir", path="alias")).content == "a.txt"


async def test_a_long_file_is_cut_with_a_marker(work: Path) -> None:
    (work / "big.txt").write_text("x" * 50)
    out = await call(work, "read_file", path="big.txt", max_bytes=10)
    assert out.content == "x" * 10 + "\n[... file longer than 10 bytes; rest not shown ...]"


async def test_write_and_edit_keep_an_existing_files_mode(work: Path) -> None:
    script = work / "run.sh"
    script.write_text("echo one\n")
    script.chmod(0o750)
    assert not (await call(work, "write_file", path="run.sh", content="echo two\n")).is_error
    assert not (await call(work, "edit_file", path="run.sh", old="two", new="three")).is_error
    assert script.read_text() == "echo three\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o750


# -- outside: refused, nothing touched -------------------------------------------------------------


def plant(work: Path, outside: Path) -> None:
    """Symlinks in the work directory that lead outside it."""
    (work / "to-secret").symlink_to(outside / "secret.txt")
    (work / "to-outside-dir").symlink_to(outside / "dir")
    (work / "relative-escape").symlink_to("../outside/secret.txt")
    (work / "dangling").symlink_to(outside / "created-through-a-link.txt")
    (work / "sub").mkdir()
    (work / "sub" / "up").symlink_to("../../outside")


ESCAPES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "read_file": [
        ("dot-dot", {"path": "../outside/secret.txt"}),
        ("dot-dot inside a path", {"path": "sub/../../outside/secret.txt"}),
        ("absolute", {"path": "{outside}/secret.txt"}),
        ("absolute system file", {"path": "/etc/hostname"}),
        ("symlink to a file", {"path": "to-secret"}),
        ("relative symlink", {"path": "relative-escape"}),
        ("symlinked directory component", {"path": "to-outside-dir/inner.txt"}),
        ("nested symlinked component", {"path": "sub/up/secret.txt"}),
    ],
    "write_file": [
        ("dot-dot", {"path": "../outside/secret.txt", "content": "pwned"}),
        ("dot-dot new file", {"path": "../outside/new.txt", "content": "pwned"}),
        ("absolute", {"path": "{outside}/secret.txt", "content": "pwned"}),
        ("symlink to a file", {"path": "to-secret", "content": "pwned"}),
        ("symlinked directory component", {"path": "to-outside-dir/inner.txt", "content": "pwned"}),
        ("new file under a symlinked directory", {"path": "to-outside-dir/new/deep.txt", "content": "pwned"}),
        ("dangling symlink", {"path": "dangling", "content": "pwned"}),
        ("nested symlinked component", {"path": "sub/up/secret.txt", "content": "pwned"}),
    ],
    "edit_file": [
        ("dot-dot", {"path": "../outside/secret.txt", "old": "secret", "new": "pwned"}),
        ("absolute", {"path": "{outside}/secret.txt", "old": "secret", "new": "pwned"}),
        ("symlink to a file", {"path": "to-secret", "old": "secret", "new": "pwned"}),
        ("symlinked directory component", {"path": "to-outside-dir/inner.txt", "old": "secret", "new": "pwned"}),
    ],
    "list_dir": [
        ("dot-dot", {"path": ".."}),
        ("dot-dot inside a path", {"path": "sub/../.."}),
        ("absolute", {"path": "{outside}"}),
        ("root", {"path": "/"}),
        ("symlinked directory", {"path": "to-outside-dir"}),
        ("nested symlinked component", {"path": "sub/up"}),
    ],
}
CASES = [pytest.param(tool, args, id=f"{tool}: {label}") for tool, cases in ESCAPES.items() for label, args in cases]


@pytest.mark.parametrize(("tool", "args"), CASES)
async def test_a_path_that_leaves_the_work_directory_is_refused(
    work: Path, outside: Path, tool: str, args: dict[str, Any]
) -> None:
    plant(work, outside)
    args = {k: v.format(outside=outside) if isinstance(v, str) else v for k, v in args.items()}
    outside_before, work_before = snapshot(outside), snapshot(work)
    out = await call(work, tool, **args)
    assert out.is_error
    assert out.content == f"{tool} refused: path {args['path']!r} is outside the work directory"
    assert SECRET not in out.content
    assert snapshot(outside) == outside_before
    assert snapshot(work) == work_before


async def test_a_write_through_a_dangling_symlink_creates_nothing_outside(work: Path, outside: Path) -> None:
    (work / "report.txt").symlink_to(outside / "report.txt")
    out = await call(work, "write_file", path="report.txt", content="pwned")
    assert out.is_error and "outside the work directory" in out.content
    assert not (outside / "report.txt").exists()
    assert (work / "report.txt").is_symlink()


async def test_a_planted_temporary_name_cannot_redirect_a_write(work: Path, outside: Path) -> None:
    # The name a write's temporary file could have, planted as a link to a file outside.
    victim = outside / "secret.txt"
    for name in (".report.txt.goald-tmp", ".report.txt.tmp"):
        (work / name).symlink_to(victim)
    out = await call(work, "write_file", path="report.txt", content="the report\n")
    assert not out.is_error
    assert (work / "report.txt").read_text() == "the report\n"
    assert victim.read_text() == SECRET


async def test_a_directory_swapped_for_a_symlink_after_the_check_is_refused(
    work: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shell call of the same model step may swap a directory for a link between the path check and
    # the I/O. The swap is made deterministic here: right after the check passes.
    (work / "data").mkdir()
    (work / "data" / "inner.txt").write_text("inside\n")
    real_confine = files.confine

    def confine_then_swap(workdir: Path | None, raw: str) -> Path:
        checked = real_confine(workdir, raw)
        if (work / "data").is_dir() and not (work / "data").is_symlink():
            (work / "data" / "inner.txt").unlink()
            (work / "data").rmdir()
            (work / "data").symlink_to(outside / "dir")
        return checked

    monkeypatch.setattr(files, "confine", confine_then_swap)
    before = snapshot(outside)
    for tool, args in [
        ("read_file", {"path": "data/inner.txt"}),
        ("write_file", {"path": "data/inner.txt", "content": "pwned"}),
        ("edit_file", {"path": "data/inner.txt", "old": "secret", "new": "pwned"}),
        ("list_dir", {"path": "data"}),
    ]:
        # Each call sees a real directory at check time again.
        if (work / "data").is_symlink():
            (work / "data").unlink()
            (work / "data").mkdir()
            (work / "data" / "inner.txt").write_text("inside\n")
        out = await call(work, tool, **args)
        assert out.is_error, (tool, out.content)
        swapped = f"path {args['path']!r} changed while in use (a component became a symlink)"
        assert out.content == f"{tool} refused: {swapped}"
        assert SECRET not in out.content
    assert snapshot(outside) == before


async def test_a_fifo_is_refused_without_blocking(work: Path) -> None:
    os.mkfifo(work / "pipe")
    # Opening a FIFO for reading waits for a writer; done on the event loop it would stop the daemon.
    async with asyncio.timeout(5):
        out = await call(work, "read_file", path="pipe")
        edit = await call(work, "edit_file", path="pipe", old="a", new="b")
    assert out.is_error and out.content == "read_file refused: 'pipe' is not a regular file"
    assert edit.is_error and edit.content == "edit_file refused: 'pipe' is not a regular file"


async def test_without_a_work_directory_every_tool_refuses(work: Path) -> None:
    for tool, args in [
        ("read_file", {"path": "a"}),
        ("write_file", {"path": "a", "content": "x"}),
        ("edit_file", {"path": "a", "old": "x", "new": "y"}),
        ("list_dir", {}),
    ]:
        out = await call(None, tool, **args)
        assert (out.is_error, out.content) == (True, f"{tool} refused: this session has no work directory")


async def test_a_nul_byte_and_the_work_directory_itself_are_refused(work: Path) -> None:
    out = await call(work, "read_file", path="a\x00b")
    assert (out.is_error, out.content) == (True, "read_file refused: path contains a NUL byte")
    out = await call(work, "write_file", path=".", content="x")
    assert out.is_error and "is the work directory itself" in out.content


# -- edit_file: exact replace ----------------------------------------------------------------------


async def test_edit_replaces_the_one_exact_occurrence(work: Path) -> None:
    (work / "app.py").write_text("def f():\n    return 1\n\ndef g():\n    return 2\n")
    out = await call(work, "edit_file", path="app.py", old="    return 1\n", new="    return 10\n")
    assert (out.is_error, out.content) == (False, "edited app.py")
    assert (work / "app.py").read_text() == "def f():\n    return 10\n\ndef g():\n    return 2\n"


@pytest.mark.parametrize(
    ("old", "message"),
    [
        ("return 3", "edit_file: `old` occurs 0 times in app.py; it must occur exactly once"),
        ("    return", "edit_file: `old` occurs 2 times in app.py; it must occur exactly once"),
        ("RETURN 1", "edit_file: `old` occurs 0 times in app.py; it must occur exactly once"),
        ("", "edit_file: `old` is empty; give the exact text to replace"),
    ],
)
async def test_edit_without_exactly_one_match_says_so_and_changes_nothing(work: Path, old: str, message: str) -> None:
    text = "def f():\n    return 1\n\ndef g():\n    return 2\n"
    (work / "app.py").write_text(text)
    out = await call(work, "edit_file", path="app.py", old=old, new="pass")
    assert (out.is_error, out.content) == (True, message)
    assert (work / "app.py").read_text() == text


async def test_edit_of_a_missing_or_binary_file_is_a_clear_error(work: Path) -> None:
    out = await call(work, "edit_file", path="nope.txt", old="a", new="b")
    assert out.is_error and out.content.startswith("edit_file refused: [Errno 2] No such file or directory")
    (work / "blob.bin").write_bytes(b"\xff\xfe\x00a")
    out = await call(work, "edit_file", path="blob.bin", old="a", new="b")
    assert (out.is_error, out.content) == (True, "edit_file refused: blob.bin is not UTF-8 text")
    assert (work / "blob.bin").read_bytes() == b"\xff\xfe\x00a"
