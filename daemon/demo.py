"""``goald demo``: the main job on the embedded defaults.

A temporary state directory, SQLite in it, the daemon's host in this process, and the shipped
scripted model (``scripted:demo``). A demo goal does several rounds of real file work in its work
directory, claims completion once too early (its verification command refuses the claim, and the
output reaches the next round), fixes the work and completes. The live display shows each durable
event as it commits; at the end the demo says where the state and the events are.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from agent import Event, EventType
from daemon.demo_model import DEMO_OBJECTIVE, DEMO_VERIFY
from daemon.display import describe_event, goal_line
from daemon.host import Host
from daemon.lock import StateDirLocked
from daemon.rpc.views import goal_view
from daemon.settings import load_settings
from goals import GOAL_CHANGED, GoalChanged, GoalSpec, GoalStatus, VerifyCommand


async def run_demo(state_dir: Path | None, out: TextIO, *, plain: bool = False) -> int:
    """Run the demo goal in an embedded daemon; returns an exit code (0 when the goal completed)."""
    state = (state_dir or Path(tempfile.mkdtemp(prefix="goald-demo-"))).resolve()
    settings = load_settings(None, state_dir=state, default_model="scripted:demo", sandbox="none")
    host = Host(settings)
    server = asyncio.get_running_loop().create_task(host.run())
    live = not plain and out.isatty()

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    try:
        ready = asyncio.ensure_future(host.ready.wait())
        await asyncio.wait({ready, server}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if not host.ready.is_set():
            ready.cancel()
            exc = server.exception() if server.done() and not server.cancelled() else None
            if isinstance(exc, StateDirLocked):  # another goald serves this state directory; nothing was written
                print(f"goald: {exc}", file=sys.stderr, flush=True)
                return 75
            raise RuntimeError(f"the demo's daemon did not start: {exc}")
        assert host.rt is not None and host.engine is not None
        rt, engine = host.rt, host.engine
        workdir = host.workdirs.resolve(None, "demo")
        done = asyncio.Event()
        # Listen before the goal exists, so its first events (created in the create transaction)
        # are shown too: they are held until the goal's session is known.
        early: list[Event] = []
        session: list[str] = []

        def show(event: Event) -> None:
            if not session:
                early.append(event)
                return
            if event.session_id != session[0]:
                return
            line = f"  [{event.seq:>3}] {describe_event(event.type, event.data)}"
            say(f"\x1b[2m{line}\x1b[0m" if live and event.type in (EventType.STATUS, EventType.TURN_START) else line)
            changed = event.payload if event.type == GOAL_CHANGED else None
            if isinstance(changed, GoalChanged) and changed.status is not GoalStatus.ACTIVE:
                done.set()

        remove = rt.store.hub.add_listener(show)
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
        session.append(goal.session_id)
        for event in early:
            show(event)
        try:
            await asyncio.wait_for(done.wait(), 120)
        finally:
            remove()
        final = await engine.get(goal.id)
        say("")
        say(goal_line(goal_view(final)))
        report = workdir / "report.md"
        if report.exists():
            say("report.md:")
            say("".join(f"  {line}\n" for line in report.read_text().splitlines()).rstrip())
        say(f"state directory: {state}")
        say(f"database (goals, events, inbox, turns): {settings.database_path}")
        say(f"look again: export GOALD_STATE_DIR={state}; goald serve & goald goal logs {goal.id}")
        return 0 if final.status is GoalStatus.COMPLETED else 1
    finally:
        host.request_stop()
        if not (server.done() and not server.cancelled() and server.exception() is not None):
            await asyncio.wait_for(server, 60)


def main() -> int:  # pragma: no cover - convenience for ``python -m daemon.demo``
    """Run the demo to stdout."""
    return asyncio.run(run_demo(None, sys.stdout))
