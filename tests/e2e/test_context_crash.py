"""``kill -9`` during a compaction, then restart: the view is rebuilt with or without it, never half.

A child process (``tests/_context_child.py``) runs a goal on a scripted model with a 4,000-token
window (tokens = bytes / 4). The parent kills it with ``SIGKILL`` either while the summary call is
in flight (the compaction is not committed: the view is rebuilt without it, the call's reservation
is charged in full) or just after a ``context/compacted`` event committed (the view is rebuilt with
it). In both cases the view a restart rebuilds pairs every tool call with its result and keeps the
objective, and a restarted child runs the goal to completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from context_models import objective, pairing_errors

from agent import ContextCompacted, EventType, Store, TextBlock
from agent.context import SUMMARY_HEADER, load_view

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).resolve().parents[1] / "_context_child.py"
TIMEOUT = 60.0
ROUNDS = 12


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "API_KEY" not in k}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@contextlib.asynccontextmanager
async def child(db: Path, workdir: Path, mode: str, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    with log.open("ab") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CHILD), str(db), str(workdir), mode,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=_env(),
        )  # fmt: skip
        try:
            yield proc
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def read_until(proc: asyncio.subprocess.Process, wanted: bytes) -> None:
    assert proc.stdout is not None
    async with asyncio.timeout(TIMEOUT):
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise AssertionError(f"the child exited ({await proc.wait()}) before printing {wanted!r}")
            if line.strip() == wanted:
                return


async def view_state(db: Path) -> tuple[int, list[str]]:
    """(compactions committed, problems of the view a restart rebuilds)."""
    store = await Store.open(db)
    try:
        session = await store.read(lambda c: c.execute("SELECT session_id FROM goals").fetchone()[0])
        compaction, view = await load_view(store, session)
        events = await store.events_after(session, 0, limit=100_000, types=(EventType.CONTEXT_COMPACTED,))
    finally:
        await store.close()
    messages = [e.msg for e in view]
    problems = pairing_errors(messages)
    texts = ["".join(b.text for b in m.content if isinstance(b, TextBlock)) for m in messages]
    if compaction is not None:
        assert isinstance(events[-1].payload, ContextCompacted)
        if not texts or SUMMARY_HEADER not in texts[0]:
            problems.append("a committed compaction is missing from the view")
    elif any(SUMMARY_HEADER in t for t in texts):
        problems.append("a summary without its committed compaction")
    if objective(ROUNDS) not in "\n".join(texts):
        problems.append("the objective is not in the view")
    return len(events), problems


def call_states(db: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return [r[0] for r in conn.execute("SELECT state FROM model_calls ORDER BY rowid")]


@pytest.mark.parametrize("moment", ["during_summary", "after_commit"])
async def test_kill_during_a_compaction_then_restart(tmp_path: Path, moment: str) -> None:
    db, workdir, log = tmp_path / "goald.db", tmp_path / "work", tmp_path / "child.log"
    workdir.mkdir()
    mode = "block" if moment == "during_summary" else "run"
    async with child(db, workdir, mode, log) as proc:
        await read_until(proc, b"SUMMARY" if moment == "during_summary" else b"E context/compacted")
        os.kill(proc.pid, signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL
    before = call_states(db)
    compacted, problems = await view_state(db)
    assert not problems, problems
    if moment == "during_summary":
        # The summary was never committed: the view is the one before it; its call is still open.
        assert compacted == 0 and before[-1] == "reserved"
    else:
        assert compacted >= 1
    async with child(db, workdir, "run", log) as proc:
        await read_until(proc, b"DONE")
        assert await proc.wait() == 0
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        status = conn.execute("SELECT status FROM goals").fetchone()[0]
    assert status == "completed"
    after = call_states(db)
    if moment == "during_summary":
        # Repair charged the cut-off summary call in full; nothing was left open.
        assert after[len(before) - 1] == "charged_in_full"
    assert "reserved" not in after
    compacted_end, problems = await view_state(db)
    assert not problems and compacted_end > compacted
