"""A command the host refuses to start (the disk holding the store under its watermark, issue 24) is
not run, and the shell tool's result says why: ``not run: <reason>``; so does a verification
command's."""

from __future__ import annotations

from pathlib import Path

from agent import Sandbox, ToolContext
from agent.sandbox.base import CommandRefused
from agent.tools.shell import Shell, ShellArgs
from goals import VerifyCommand, sandboxed_runner

WHY = "the disk holding goald's store (/var/lib/goald) has 120 MiB free, under the 256 MiB watermark"


def refuse(*args: object) -> Sandbox:
    raise CommandRefused(WHY)


async def test_the_shell_says_why_a_command_was_not_run(tmp_path: Path) -> None:
    ctx = ToolContext(session_id="ses_x", turn_id="turn_x", call_id="call_x", workdir=tmp_path)
    out = await Shell(refuse).run(ShellArgs(command="dd if=/dev/zero of=big"), ctx)
    assert out.is_error and out.content == f"not run: {WHY}"


async def test_a_verification_command_says_why_it_was_not_run(tmp_path: Path) -> None:
    result = await sandboxed_runner(refuse)(VerifyCommand(cmd="make test"), tmp_path)
    assert not result.passed and result.output_tail == f"not run: {WHY}"
