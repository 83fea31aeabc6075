"""The sessions' known states are bounded (issue 30's left item).

The store keeps each session's state as this process last committed it (its last number, its
status, its open turn, its queue): SQLite's one writer numbers events from it, and a PostgreSQL
write is opened on it and checked. It was kept for every session ever written, for the daemon's
whole life. Now at most ``KnownStates.LIMIT`` are kept, the least recently written forgotten first;
a forgotten state costs its session one read at its next write. Pins, on both stores, with the
limit made small:

* writing to more sessions than the limit keeps at most the limit, the most recent ones;
* a session whose state was forgotten writes again with its events numbered on from the stored
  ones (no gap, no repeat), its status and its queue read again as stored.
"""

from __future__ import annotations

import pytest

from agent import create_session
from agent.inbox import enqueue
from agent.messages import Delivery, parse_content
from agent.store import Store
from agent.tx import KnownStates

pytestmark = pytest.mark.both_stores


async def test_at_most_the_limit_is_kept_and_a_forgotten_session_writes_on(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(KnownStates, "LIMIT", 3)
    sessions = [await store.transact(lambda tx: create_session(tx)) for _ in range(5)]
    for sid in sessions:
        await store.transact(lambda tx, sid=sid: tx.emit(sid, "test/one", {}), session=sid)
    assert list(store._states) == sessions[-3:], "the three written last"
    first = sessions[0]
    follow_up = parse_content("a follow-up")
    await store.transact(lambda tx: enqueue(tx, first, follow_up, delivery=Delivery.FOLLOWUP), session=first)
    await store.transact(lambda tx: tx.emit(first, "test/two", {}), session=first)
    events = await store.events_after(first, 0)
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "numbered on, gap-free"
    assert [e.type for e in events][-1] == "test/two"
    assert len(store._states) == 3 and first in store._states
    state = await store.session_state(first)
    assert state.last_seq == len(events)
