"""``goald run``: one prompt, one owned interval, no daemon needed.

The command starts the daemon's :class:`~daemon.host.Host` in this process on a temporary state
directory (or ``--state-dir``), creates a session, and runs the SDK's :meth:`Client.run
<daemon.sdk.Client.run>` over an in-process connection, so the interval logic is the SDK's own:
from the message's receipt to the next whole-agent idle. It prints the final response (or the
whole :class:`~daemon.sdk.RunResult` as JSON) on stdout, which carries nothing else; progress of
tool calls goes to stderr when stderr is a terminal.

The exit code reflects the run-level ``finish_reason`` (the last root turn's end in the
interval, not the prompt's outcome); see :func:`exit_code`. SIGINT interrupts the running turn
and discards what is queued (the run ends ``cancelled``, exit 130; a second SIGINT stops the
host); SIGTERM stops the host gracefully, so a running turn ends ``interrupted`` at its next safe
point or after the grace period (exit 1). When another goald holds ``--state-dir`` the run exits
75 at once and writes nothing (the host takes the state directory's lock: :mod:`daemon.lock`).
A turn may also be ended by another client of the embedded host's socket (``session/interrupt``):
the host's stop lets that call write its answer before the process exits (:mod:`daemon.rpc.server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from agent import (
    AssistantMessage,
    EndReason,
    EventType,
    InvalidInput,
    Limits,
    SessionId,
    TaskSet,
    ToolResult,
    ToolUseBlock,
    TurnEnded,
    create_session,
)
from daemon.client import Client, RpcError, RunIncomplete, RunResult, SessionEvent
from daemon.display import describe_event
from daemon.host import Host
from daemon.lock import StateDirLocked
from daemon.notify import NOTIFY_ENV
from daemon.settings import Settings

EXIT_END_TURN = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_LIMIT = 3
EXIT_MAX_STEPS = 4
EXIT_CANCELLED = 130
#: Another goald holds ``--state-dir`` (as ``goald serve`` exits).
EXIT_LOCKED = 75

#: Seconds the run may still take to deliver its last events once the host has stopped.
_DRAIN_SECONDS = 5.0


@dataclass(frozen=True)
class RunOptions:
    """What ``goald run`` was asked to do."""

    text: str
    model: str | None = None
    workdir: Path | None = None
    state_dir: Path | None = None
    as_json: bool = False
    max_tokens: int | None = None
    max_steps: int | None = None


def exit_code(finish_reason: EndReason | None, *, sigint: bool = False) -> int:
    """The exit code of a run: 0 ``end_turn``; 3 ``max_tokens`` or ``budget``; 4 ``max_steps``;
    1 ``error``, ``interrupted`` or no turn at all; 130 ``cancelled`` or SIGINT."""
    if sigint:
        return EXIT_CANCELLED
    match finish_reason:
        case EndReason.END_TURN:
            return EXIT_END_TURN
        case EndReason.MAX_TOKENS | EndReason.BUDGET:
            return EXIT_LIMIT
        case EndReason.MAX_STEPS:
            return EXIT_MAX_STEPS
        case EndReason.CANCELLED:
            return EXIT_CANCELLED
        case EndReason.ERROR | EndReason.INTERRUPTED | None:
            return EXIT_ERROR


def embedded_settings(settings: Settings, state_dir: Path, workdir: Path | None) -> Settings:
    """``settings`` for an embedded host on ``state_dir``: its own database and socket, no declared goals."""
    return settings.model_copy(
        update={
            "state_dir": state_dir,
            "database": None,
            "socket": None,
            "goals_file": None,
            "workdir_roots": [workdir] if workdir is not None else [],
        }
    )


async def run_oneshot(settings: Settings, opts: RunOptions, out: TextIO, err: TextIO) -> int:
    """Run ``opts.text`` in an embedded host; returns the exit code."""
    workdir = None
    if opts.workdir is not None:
        workdir = opts.workdir.expanduser().resolve()
        if not workdir.is_dir():
            print(f"goald: --workdir {opts.workdir} is not a directory", file=err)
            return EXIT_USAGE
    temp = None if opts.state_dir is not None else Path(tempfile.mkdtemp(prefix="goald-run-"))
    state = (opts.state_dir or temp or Path()).expanduser().resolve()
    # A systemd unit that runs `goald run` is not the embedded host's to notify.
    for name in NOTIFY_ENV:
        os.environ.pop(name, None)
    host = Host(embedded_settings(settings, state, workdir))
    server = asyncio.get_running_loop().create_task(host.run())
    try:
        ready = asyncio.ensure_future(host.ready.wait())
        await asyncio.wait({ready, server}, return_when=asyncio.FIRST_COMPLETED)
        if not host.ready.is_set():
            ready.cancel()
            exc = server.exception() if server.done() and not server.cancelled() else None
            if isinstance(exc, StateDirLocked):  # another goald serves this state directory; nothing was written
                print(f"goald: {exc}", file=err)
                return EXIT_LOCKED
            print(f"goald: the embedded host did not start: {exc}", file=err)
            return EXIT_ERROR
        return await _run(host, server, opts, workdir, out, err)
    finally:
        host.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server, 60)
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


async def _run(
    host: Host, server: asyncio.Task[int], opts: RunOptions, workdir: Path | None, out: TextIO, err: TextIO
) -> int:
    assert host.rt is not None
    rt = host.rt
    try:
        host.models.get(opts.model)
    except InvalidInput as exc:
        print(f"goald: {exc}", file=err)
        return EXIT_USAGE
    guard = await rt.create_guard(Limits(max_tokens=opts.max_tokens)) if opts.max_tokens is not None else None
    config = {"agent": {"max_steps": opts.max_steps}} if opts.max_steps is not None else None
    sid = SessionId.new()
    where = str(host.workdirs.resolve(str(workdir) if workdir is not None else None, sid))
    await rt.store.transact(
        lambda tx: create_session(tx, model=opts.model, workdir=where, guard_id=guard, config=config, session_id=sid)
    )
    sigint = asyncio.Event()
    client = await Client.in_process(host)
    try:
        _on_sigint(host, client, sid, sigint)
        task = asyncio.ensure_future(client.run(opts.text, sid, on_event=_progress(err) if err.isatty() else None))
        await asyncio.wait({task, server}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            # The host stopped (SIGTERM): what it committed on the way out is still being delivered.
            await asyncio.wait({task}, timeout=_DRAIN_SECONDS)
        if not task.done():
            await client.close()
        try:
            result = await task
        except RunIncomplete as exc:
            if exc.result is None:
                print("goald: the host stopped before the message was received", file=err)
                return EXIT_CANCELLED if sigint.is_set() else EXIT_ERROR
            result = exc.result
            print("goald: the host stopped before the run's interval closed", file=err)
        except (ConnectionError, RpcError) as exc:
            print(f"goald: the run could not start: {exc}", file=err)
            return EXIT_CANCELLED if sigint.is_set() else EXIT_ERROR
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
        await client.close()
    _report(result, opts.as_json, out, err)
    return exit_code(result.finish_reason, sigint=sigint.is_set())


def _on_sigint(host: Host, client: Client, sid: str, flag: asyncio.Event) -> None:
    """First SIGINT: interrupt the turn and discard what is queued; a second one stops the host."""
    tasks = TaskSet()

    def handle() -> None:
        if flag.is_set():
            host.request_stop()
            return
        flag.set()
        tasks.spawn(client.interrupt(sid, discard_queued=True))

    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, handle)


def _report(result: RunResult, as_json: bool, out: TextIO, err: TextIO) -> None:
    if as_json:
        print(result.model_dump_json(indent=2), file=out, flush=True)
    elif result.final_response is not None:
        print(result.final_response, file=out, flush=True)
    if result.finish_reason is not EndReason.END_TURN:
        ends = [e.payload for e in result.events if e.session_id == result.session_id and e.type == EventType.TURN_END]
        last = next((p for p in reversed(ends) if isinstance(p, TurnEnded)), None)
        why = last.error if last is not None else None
        finish = result.finish_reason.value if result.finish_reason is not None else "no turn"
        print(f"goald: the run finished {finish}" + (f": {why}" if why else ""), file=err, flush=True)


def _progress(err: TextIO) -> Callable[[SessionEvent], None]:
    def show(ev: SessionEvent) -> None:
        if ev.type not in (EventType.ASSISTANT_MESSAGE, EventType.TOOL_RESULT):
            return
        shown = ev.payload
        tool_call = isinstance(shown, AssistantMessage) and any(isinstance(b, ToolUseBlock) for b in shown.content)
        if tool_call or isinstance(shown, ToolResult):
            print(f"  {describe_event(ev.type, ev.data)}", file=err, flush=True)

    return show


def read_text(raw: str) -> str:
    """The prompt: ``raw``, or stdin when ``raw`` is ``-``."""
    # Text piped in ends with a newline that is not part of the prompt (as in `$(...)`).
    return sys.stdin.read().rstrip("\n") if raw == "-" else raw
