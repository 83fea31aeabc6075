"""Events committed by another node reach this node's hub in order (:mod:`agent.relay`).

Two stores on one PostgreSQL database are two nodes (two connections, two listener threads).
Pins: a message enqueued through node B for a session node A has published reaches A's hub at
once (well under the slow poll) and in order; A's own next commit, made after B's, is published
after B's events even when the notification is still on its way (the gap is read inside A's
transaction); a subscriber on a third node sees the session's whole sequence in order, with no gap
and no repeat, across interleaved commits of both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from agent.events import Event
from agent.ids import MessageId
from agent.inbox import enqueue
from agent.messages import parse_content
from agent.sessions import create_session
from agent.store import Store, Tx


@pytest.fixture
async def nodes(pg_dsn: str) -> AsyncIterator[list[Store]]:
    stores = [await Store.open(pg_dsn) for _ in range(3)]
    try:
        yield stores
    finally:
        for s in stores:
            await s.close()


def recorder(store: Store) -> list[Event]:
    got: list[Event] = []
    store.hub.add_listener(got.append)
    return got


async def wait_for(check: object, what: str, limit: float = 10.0) -> None:
    end = time.monotonic() + limit
    while not check():  # type: ignore[operator]
        if time.monotonic() > end:
            raise TimeoutError(what)
        await asyncio.sleep(0.005)


def add(tx: Tx, sid: str, text: str) -> None:
    enqueue(tx, sid, parse_content(text), message_id=MessageId.new())


async def test_a_remote_enqueue_reaches_the_holder_at_once_and_in_order(nodes: list[Store]) -> None:
    a, b, c = nodes
    seen_a, seen_c = recorder(a), recorder(c)
    sid = await a.transact(lambda tx: create_session(tx))
    await a.transact(lambda tx: add(tx, sid, "from a"))
    # c learns the session by its first notification.
    await wait_for(lambda: len([e for e in seen_c if e.session_id == sid]) >= 1, "c sees a's commit")

    latencies = []
    for i in range(20):
        before = len(seen_a)
        started = time.monotonic()
        await b.transact(lambda tx, i=i: add(tx, sid, f"from b {i}"))
        await wait_for(lambda before=before: len(seen_a) > before, "a sees b's enqueue")
        latencies.append(time.monotonic() - started)
    latencies.sort()
    assert latencies[len(latencies) // 2] < 0.1, latencies  # far under the 5 s poll

    # Interleaved commits, a's right after b's: a publishes b's events first (the gap, read in a's tx).
    for i in range(30):
        await b.transact(lambda tx, i=i: add(tx, sid, f"b {i}"))
        await a.transact(lambda tx, i=i: add(tx, sid, f"a {i}"))

    stored = await a.events_after(sid, 0, limit=10_000)
    await wait_for(lambda: max((e.seq for e in seen_a if e.session_id == sid), default=0) == stored[-1].seq, "a")
    await wait_for(lambda: max((e.seq for e in seen_c if e.session_id == sid), default=0) == stored[-1].seq, "c")
    for seen in (seen_a, seen_c):
        seqs = [e.seq for e in seen if e.session_id == sid]
        assert seqs == list(range(seqs[0], stored[-1].seq + 1)), seqs  # in order, no gap, no repeat
    assert next(e.seq for e in seen_a if e.session_id == sid) == 1


async def test_the_slow_poll_catches_what_no_notification_announced(nodes: list[Store]) -> None:
    a, b, _ = nodes
    seen_a = recorder(a)
    sid = await a.transact(lambda tx: create_session(tx))
    await a.transact(lambda tx: add(tx, sid, "first"))
    # A write that notifies nobody (as if the notification were lost while a reconnected).
    b.node_id = a.node_id  # a ignores notifications carrying its own id
    await b.transact(lambda tx: add(tx, sid, "unannounced"))
    top = (await a.events_after(sid, 0))[-1].seq
    a._relay_soon(None)  # what the poll does every few seconds, and after every reconnect
    await wait_for(lambda: max(e.seq for e in seen_a if e.session_id == sid) == top, "the poll")
