"""``goald demo``: the main job on the embedded defaults.

A temporary state directory, SQLite in it, the daemon's host in this process, and the shipped
scripted model (``scripted:demo``). A demo goal does several rounds of real file work in its work
directory, claims completion once too early (its verification command refuses the claim, and the
output reaches the next round), fixes the work and completes. The live display shows each durable
event as it commits; at the end the demo says where the state and the events are, and prints the
commands that look again, ready to paste into a shell: the full path of this installation's
``goald`` (it need not be on ``PATH``), a ``serve`` in the background that the next command waits
for (``goald status`` answers once it serves), and the ``kill`` that stops it.

The demo runs its commands in the sandbox when bubblewrap can make one here (as ``goald serve``
does: as the sandbox user when started as root), and unconfined (``sandbox = "none"``) only where
it cannot, so that it works on any machine; it says which once, as the demo's own setting, instead
of the daemon's warning meant for a configuration that chose "none".
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TextIO

from loguru import logger

from agent import Event, EventType, SandboxUnavailable, detect_bwrap
from agent.pgaccess import masked
from daemon.demo_model import DEMO_OBJECTIVE, DEMO_VERIFY
from daemon.display import describe_event, goal_line
from daemon.host import Host
from daemon.lock import StateDirLocked
from daemon.settings import load_settings
from goals import GOAL_CHANGED, Goal, GoalChanged, GoalSpec, GoalStatus, VerifyCommand


async def run_demo(state_dir: Path | None, out: TextIO, *, plain: bool = False) -> int:
    """Run the demo goal in an embedded daemon; returns an exit code (0 when the goal completed)."""
    state = (state_dir or Path(tempfile.mkdtemp(prefix="goald-demo-"))).resolve()
    try:
        await asyncio.to_thread(detect_bwrap)
        sandbox: Literal["bwrap", "none"] = "bwrap"
    except SandboxUnavailable:
        sandbox = "none"
    settings = load_settings(None, state_dir=state, default_model="scripted:demo", sandbox=sandbox)
    # The daemon's warning about sandbox = "none" is meant for a configuration that chose it.
    logger.disable("daemon.sandbox_settings")
    host = Host(settings)
    server = asyncio.get_running_loop().create_task(host.run())

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    try:
        refused = await _started(host, server)
        if refused is not None:
            return refused  # (one line said why: another goald holds the state directory, say)
        if sandbox == "none":
            note = (
                'note: the demo runs its commands unconfined (sandbox = "none" is the demo\'s own setting where'
                " bubblewrap cannot make a sandbox); goald serve uses the configured sandbox (bwrap by default)"
            )
        else:
            who = host.sandboxing.user
            as_whom = f" as the user {who.name}" if who is not None else ""
            note = f"note: the demo runs its commands in the sandbox (bubblewrap{as_whom}), as goald serve does"
        print(note, file=sys.stderr, flush=True)
        final, workdir = await _run_goal(host, say, live=not plain and out.isatty())
        say("")
        say(goal_line(final))
        report = workdir / "report.md"
        if report.exists():
            say("report.md:")
            say("".join(f"  {line}\n" for line in report.read_text().splitlines()).rstrip())
        say(f"state directory: {state}")
        where = masked(settings.store) if settings.store is not None else settings.database_path
        say(f"database (goals, events, inbox, turns): {where}")
        say("look again (paste into a shell: a daemon on this state, the goal's events, then stop the daemon):")
        for line in look_again(state, final.id):
            say(f"  {line}")
        return 0 if final.status is GoalStatus.COMPLETED else 1
    finally:
        logger.enable("daemon.sandbox_settings")
        host.request_stop()
        if not (server.done() and not server.cancelled() and server.exception() is not None):
            await asyncio.wait_for(server, 60)


async def _started(host: Host, server: asyncio.Task[int]) -> int | None:
    """Wait for the embedded daemon to serve; an exit code when another goald holds the state
    directory (nothing was written), ``None`` once it serves.

    Raises:
        RuntimeError: it did not start (with its error, if it ended with one).
    """
    ready = asyncio.ensure_future(host.ready.wait())
    await asyncio.wait({ready, server}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if host.ready.is_set():
        return None
    ready.cancel()
    exc = server.exception() if server.done() and not server.cancelled() else None
    if isinstance(exc, StateDirLocked):  # another goald serves this state directory; nothing was written
        print(f"goald: {exc}", file=sys.stderr, flush=True)
        return 75
    raise RuntimeError(f"the demo's daemon did not start: {exc}")


class _Printer:
    """Shows each durable event of the demo goal's session as it commits, and tells when the goal
    leaves ``active``. It listens before the goal exists, so the goal's first events (created in
    the create transaction) are shown too: they are held until the goal's session is known."""

    def __init__(self, say: Callable[[str], None], live: bool) -> None:
        self.say = say
        self.live = live
        self.done = asyncio.Event()
        self._early: list[Event] = []
        self._session: str | None = None

    def follow(self, session_id: str) -> None:
        """The goal's session is known: show what came before, then its events as they commit."""
        self._session = session_id
        for event in self._early:
            self.show(event)

    def show(self, event: Event) -> None:
        if self._session is None:
            self._early.append(event)
            return
        if event.session_id != self._session:
            return
        line = f"  [{event.seq:>3}] {describe_event(event.type, event.data)}"
        dim = self.live and event.type in (EventType.STATUS, EventType.TURN_START)
        self.say(f"\x1b[2m{line}\x1b[0m" if dim else line)
        changed = event.payload if event.type == GOAL_CHANGED else None
        if isinstance(changed, GoalChanged) and changed.status is not GoalStatus.ACTIVE:
            self.done.set()


async def _run_goal(host: Host, say: Callable[[str], None], *, live: bool) -> tuple[Goal, Path]:
    """Create the demo goal, show its events until it leaves ``active``; the goal as it ended, and
    its work directory."""
    assert host.rt is not None and host.engine is not None
    rt, engine = host.rt, host.engine
    workdir = host.workdirs.resolve(None, "demo")
    printer = _Printer(say, live)
    remove = rt.store.hub.add_listener(printer.show)
    goal = await engine.create(
        GoalSpec(
            objective=DEMO_OBJECTIVE,
            title="Nightly report",
            model="scripted:demo",
            workdir=str(workdir),
            verify=[VerifyCommand(cmd=DEMO_VERIFY, timeout=30)],
        )
    )
    say(f"goal {goal.id} on session {goal.session_id}; work directory {workdir}")
    say(f"objective: {DEMO_OBJECTIVE}")
    say(f"verification: {DEMO_VERIFY}")
    printer.follow(goal.session_id)
    try:
        await asyncio.wait_for(printer.done.wait(), 120)
    finally:
        remove()
    return await engine.get(goal.id), workdir


def goald_command() -> str:
    """This installation's ``goald``, by full path (the venv's script beside this interpreter), or
    the interpreter running the package when there is no script."""
    script = Path(sys.executable).with_name("goald")
    if script.is_file() and os.access(script, os.X_OK):
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m daemon"


def look_again(state: Path, goal_id: str) -> list[str]:
    """The shell lines that serve ``state`` in the background, wait until it answers, show the
    goal's events and stop the daemon (it ends on SIGTERM, gracefully)."""
    goald = goald_command()
    return [
        f"export GOALD_STATE_DIR={shlex.quote(str(state))}",
        f'{goald} serve 2>>"$GOALD_STATE_DIR/serve.log" & GOALD_PID=$!',
        # Waits while the daemon starts; gives up if it exited (its reason is in serve.log).
        f"until {goald} status >/dev/null 2>&1; do kill -0 $GOALD_PID || break; sleep 0.2; done",
        f"{goald} goal logs {goal_id}",
        "kill $GOALD_PID  # stops the daemon",
    ]


def main() -> int:  # pragma: no cover - convenience for ``python -m daemon.demo``
    """Run the demo to stdout."""
    return asyncio.run(run_demo(None, sys.stdout))
