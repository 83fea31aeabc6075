"""Two nodes' write locks, watched: a transaction held open at a known point, and PostgreSQL's view
of a write waiting on an advisory lock (``pg_locks``), not guessed from a time."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg

from agent.ids import MessageId
from agent.inbox import enqueue
from agent.messages import parse_content
from agent.tx import Tx

LIMIT = 10.0


def add(tx: Tx, sid: str, text: str) -> None:
    enqueue(tx, sid, parse_content(text), message_id=MessageId.new())


def waiting_on_advisory_locks(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
        return int(row[0]) if row else 0


async def until_waiting(dsn: str) -> None:
    end = time.monotonic() + LIMIT
    while await asyncio.to_thread(waiting_on_advisory_locks, dsn) == 0:
        assert time.monotonic() < end, "the second write never waited on a lock"
        await asyncio.sleep(0.01)


class Held:
    """Node A's transaction, held open on its store thread until :meth:`release`."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.go = threading.Event()
        self.ended_at = 0.0

    def __call__(self, sid: str) -> object:
        def run(tx: Tx) -> None:
            add(tx, sid, "from a")
            self.inside.set()
            assert self.go.wait(LIMIT), "node A's transaction was never released"
            self.ended_at = time.monotonic()

        return run

    async def entered(self) -> None:
        assert await asyncio.to_thread(self.inside.wait, LIMIT), "node A's transaction never began"

    def release(self) -> None:
        self.go.set()
