"""``goald run``: the one-shot CLI, as real subprocesses of ``python -m daemon run``.

Each run starts the daemon's host inside the ``goald run`` process on a temporary state
directory; no daemon is running. Finishes other than ``end_turn`` come from the scripted models
of ``sdk_testmodels`` (named by a ``--config`` file; the process imports them from ``tests/``).
A test that signals a run waits first for the model call's announcement on a datagram socket,
so the signal surely lands mid-turn.

What is pinned: the exit code of each finish (0 ``end_turn``; 3 ``max_tokens`` or ``budget``;
4 ``max_steps``; 1 ``error``, ``interrupted`` or no turn; 130 ``cancelled`` or SIGINT; 2 usage
errors), end to end except "no turn" (see the note before the table test); ``--json`` output
validates against :class:`RunResult`; stdout carries only the response (progress of tool calls
goes to stderr, and only on a terminal).
"""

from __future__ import annotations

import asyncio
import errno
import os
import pty
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ModelCalls, child_env, goald_argv, rpc, toml_text

from agent import EndReason
from daemon.oneshot import exit_code
from daemon.sdk import RunResult

LIMIT = 60.0


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """Settings naming the test models (``t:chat``, ``t:maxtok``, ``t:fail``, ``t:loop``)."""
    path = tmp_path / "goald.toml"
    path.write_text(
        toml_text(
            {
                "shutdown_grace_seconds": 0.2,
                "providers": {"t": {"kind": "scripted", "script": "sdk_testmodels:build"}},
            }
        )
    )
    return path


@pytest.fixture
def calls() -> Iterator[ModelCalls]:
    """The datagram socket the test models announce their calls on."""
    sock = ModelCalls()
    yield sock
    sock.close()


def goald_run(*args: str, config: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``goald [--config C] run ARGS``, to completion."""
    cfg = ["--config", str(config)] if config is not None else []
    return subprocess.run(
        [*goald_argv(), *cfg, "run", *args],
        env=child_env(),
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )


def test_prints_the_final_response_and_nothing_else() -> None:
    done = goald_run("--model", "scripted:echo", "hello there")
    assert (done.returncode, done.stdout) == (0, "echo: hello there\n"), done.stderr


def test_dash_reads_the_prompt_from_stdin() -> None:
    done = goald_run("--model", "scripted:echo", "-", stdin="from stdin\n")
    assert (done.returncode, done.stdout) == (0, "echo: from stdin\n"), done.stderr


@pytest.mark.parametrize(
    ("args", "code", "finish", "response"),
    [
        (["--model", "t:chat"], 0, EndReason.END_TURN, "ack: go"),
        (["--model", "t:maxtok"], 3, EndReason.MAX_TOKENS, "cut off mid"),
        (["--model", "t:chat", "--max-tokens", "10"], 3, EndReason.BUDGET, None),
        (["--model", "t:loop", "--max-steps", "2"], 4, EndReason.MAX_STEPS, "looking again (1)"),
        (["--model", "t:fail"], 1, EndReason.ERROR, None),
    ],
)
def test_exit_code_and_json_for_each_finish(
    config: Path, args: list[str], code: int, finish: EndReason, response: str | None
) -> None:
    done = goald_run(*args, "--json", "go", config=config)
    assert done.returncode == code, done.stderr
    result = RunResult.model_validate_json(done.stdout)  # stdout is the RunResult and nothing else
    assert result.finish_reason is finish
    assert result.final_response == response
    first = result.events[0]
    assert (first.type, first.data["messageId"]) == ("message/queued", result.message_id)
    assert result.events[-1].type == "status" and result.events[-1].seq == result.idle_seq
    if code:
        assert f"the run finished {finish.value}" in done.stderr


def test_plain_output_of_a_limit_is_the_partial_response(config: Path) -> None:
    done = goald_run("--model", "t:maxtok", "go", config=config)
    assert (done.returncode, done.stdout) == (3, "cut off mid\n"), done.stderr


async def _signalled(config: Path, calls: ModelCalls, sig: signal.Signals) -> tuple[int, RunResult]:
    proc = await asyncio.create_subprocess_exec(
        *goald_argv(),
        "--config",
        str(config),
        "run",
        "--model",
        "t:chat",
        "--json",
        "[delay=30] wait for me",
        env=child_env(calls.env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        await asyncio.to_thread(calls.wait, "sdk chat step=0 [delay=30] wait for me", LIMIT)
        proc.send_signal(sig)
        async with asyncio.timeout(LIMIT):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    assert out, err.decode()
    return proc.returncode, RunResult.model_validate_json(out)


async def test_sigint_interrupts_the_turn_and_exits_130(config: Path, calls: ModelCalls) -> None:
    code, result = await _signalled(config, calls, signal.SIGINT)
    assert code == 130
    assert result.finish_reason is EndReason.CANCELLED
    assert result.idle_seq is not None


async def test_sigterm_stops_the_host_and_the_turn_ends_interrupted(config: Path, calls: ModelCalls) -> None:
    code, result = await _signalled(config, calls, signal.SIGTERM)
    assert code == 1
    assert result.finish_reason is EndReason.INTERRUPTED
    assert result.idle_seq is not None


# -- a finish another client of the embedded host brings about ------------------------------------
#
# With --state-dir the embedded host serves its control socket at STATE/goald.sock while the run
# lasts, so another client can interrupt the turn the run owns: a `cancelled` finish without SIGINT.
#
# "No turn" (exit 1, finish_reason None) has no deterministic route from the CLI: the run's message
# is admitted as soon as its fresh session's driver gets a concurrency slot, so it could only be
# cancelled while queued if the slot were already held, and nothing orders the host's resumed work
# before the run's enqueue (a test built that way was flaky). The table
# test below pins the mapping; the SDK tests pin `finish_reason is None` for a message cancelled
# before any turn.


async def test_a_turn_cancelled_by_another_client_exits_130_without_sigint(
    config: Path, calls: ModelCalls, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    proc = await asyncio.create_subprocess_exec(
        *goald_argv(),
        "--config",
        str(config),
        "run",
        "--state-dir",
        str(state),
        "--model",
        "t:chat",
        "--json",
        "[delay=30] wait for me",
        env=child_env(calls.env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        await asyncio.to_thread(calls.wait, "sdk chat step=0 [delay=30] wait for me", LIMIT)
        listed = await rpc(state / "goald.sock", "session/list")
        (sid,) = [s["sessionId"] for s in listed["sessions"]]
        await rpc(state / "goald.sock", "session/interrupt", {"sessionId": sid})
        async with asyncio.timeout(LIMIT):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130, err.decode()
    result = RunResult.model_validate_json(out)
    assert result.finish_reason is EndReason.CANCELLED
    assert result.final_response is None and result.idle_seq is not None
    assert "the run finished cancelled" in err.decode()


@pytest.mark.parametrize(
    "args",
    [
        [],
        [""],
        ["--model", "nope:nothing", "hi"],
        ["--workdir", "/nonexistent/goald-run", "hi"],
        ["--max-steps", "0", "hi"],
    ],
    ids=["no-text", "empty-text", "unknown-model", "missing-workdir", "zero-steps"],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    done = goald_run(*args)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr


@pytest.mark.parametrize(
    ("finish", "sigint", "code"),
    [
        (EndReason.END_TURN, False, 0),
        (EndReason.MAX_TOKENS, False, 3),
        (EndReason.BUDGET, False, 3),
        (EndReason.MAX_STEPS, False, 4),
        (EndReason.ERROR, False, 1),
        (EndReason.INTERRUPTED, False, 1),
        (None, False, 1),  # no turn ended in the interval (no deterministic end-to-end route: see above)
        (EndReason.CANCELLED, False, 130),
        (EndReason.END_TURN, True, 130),
        (None, True, 130),
    ],
)
def test_exit_code_table(finish: EndReason | None, sigint: bool, code: int) -> None:
    assert exit_code(finish, sigint=sigint) == code


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError as exc:  # EIO: the terminal's other side is closed and drained
            if exc.errno != errno.EIO:
                raise
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_tool_progress_goes_to_a_terminal_stderr_and_stdout_carries_only_the_response(
    config: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(
            [
                *goald_argv(),
                "--config",
                str(config),
                "run",
                "--model",
                "t:chat",
                "--workdir",
                str(work),
                "[tool=1] write the note",
            ],
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            timeout=LIMIT,
        )
        os.close(slave)
        slave = -1
        terminal = _read_all(master).decode(errors="replace")
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert proc.returncode == 0, terminal
    assert proc.stdout.decode() == "wrote note.txt\n"
    assert "write_file" in terminal and "tool write_file ->" in terminal
    assert (work / "note.txt").read_text() == "written by the run\n"


def test_no_progress_when_stderr_is_not_a_terminal(config: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    done = goald_run("--model", "t:chat", "--workdir", str(work), "[tool=1] write the note", config=config)
    assert (done.returncode, done.stdout) == (0, "wrote note.txt\n"), done.stderr
    assert "write_file" not in done.stderr
    assert (work / "note.txt").exists()
