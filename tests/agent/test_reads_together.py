"""Reads that do not depend on each other go in one round trip (issue 30).

A spend guard's load read its row, then what its calls spent (two round trips, holding the cluster
alone); a session's repair when a node takes it up read its open turns, its open reservations and
its waking messages one after another (three, before the repair's own). Each now sends its reads
together (:meth:`agent.tx.Tx.reads`). Pins, on both stores:

* a guard's load is one round trip (the opening, both reads and the ``COMMIT``), with its limits
  and what its calls spent; a guard that does not exist is ``NotFound``;
* a repair with nothing to repair is two round trips (the reads with the opening; the ``COMMIT``),
  and one with an open turn and an open reservation still ends the turn "interrupted", charges the
  reservation in full once, and reports a session with a waking message as having work.
"""

from __future__ import annotations

import pytest

from agent import Limits, NotFound, create_guard, create_session
from agent.guards import load_guard
from agent.store import Store
from agent.turns import repair
from agent.tx import Tx

pytestmark = pytest.mark.both_stores


async def test_a_guards_load_is_one_round_trip(store: Store) -> None:
    gid = await store.transact(lambda tx: create_guard(tx, Limits(max_tokens=1000, max_cost=2.5)))
    sid = await store.transact(lambda tx: create_session(tx, guard_id=gid))

    def spend(tx: Tx) -> None:
        tx.execute(
            "INSERT INTO model_calls(id, session_id, turn_id, guard_id, provider, model, attempt, state,"
            " reserved_tokens, reserved_cost, input_tokens, output_tokens, cost, started_at)"
            " VALUES ('call_1', ?, NULL, ?, 'p', 'm', 1, 'settled', 100, 0.5, 30, 12, 0.25, ?)",
            (sid, gid, tx.now),
        )

    await store.transact(spend)
    before = store.round_trips
    guard = await store.transact(lambda tx: load_guard(tx, gid))
    if before is not None:
        assert store.round_trips == before + 1
    assert (guard.limits.max_tokens, guard.limits.max_cost) == (1000, 2.5)
    assert (guard.spent_tokens, guard.spent_cost) == (42, 0.25)
    with pytest.raises(NotFound, match="no spend guard grd_none"):
        await store.transact(lambda tx: load_guard(tx, "grd_none"))


async def test_a_repair_reads_together_and_still_repairs(store: Store) -> None:
    quiet = await store.transact(lambda tx: create_session(tx))
    before = store.round_trips
    assert await store.transact(lambda tx: repair(tx, [quiet]), session=quiet) == []
    if before is not None:
        assert store.round_trips == before + 2
    # A session a dead process left mid-turn with a reservation open, and a follow-up queued.
    gid = await store.transact(lambda tx: create_guard(tx, Limits(max_tokens=1000)))
    sid = await store.transact(lambda tx: create_session(tx, guard_id=gid))

    def mid_turn(tx: Tx) -> None:
        tx.execute(
            "INSERT INTO turns(id, session_id, start_seq, started_at) VALUES ('turn_x', ?, ?, ?)",
            (sid, tx.state(sid).last_seq, tx.now),
        )
        tx.execute(
            "INSERT INTO model_calls(id, session_id, turn_id, guard_id, provider, model, attempt, state,"
            " reserved_tokens, reserved_cost, started_at) VALUES ('call_x', ?, 'turn_x', ?, 'p', 'm', 1,"
            " 'reserved', 300, 0.0, ?)",
            (sid, gid, tx.now),
        )
        tx.execute(
            "INSERT INTO inbox(id, session_id, delivery, source_kind, content, queued_seq, created_at)"
            " VALUES ('msg_x', ?, 'followup', 'user', '[]', ?, ?)",
            (sid, tx.state(sid).last_seq, tx.now),
        )
        tx.forget(sid)  # written behind the state's back, as a process that died: read again next

    await store.transact(mid_turn)
    assert await store.transact(lambda tx: repair(tx, [sid])) == [sid], "its follow-up is work"
    rows = await store.read(
        lambda conn: (
            conn.execute("SELECT end_reason FROM turns WHERE id='turn_x'").fetchall()
            + conn.execute("SELECT state FROM model_calls WHERE id='call_x'").fetchall()
        )
    )
    assert [r[0] for r in rows] == ["interrupted", "charged_in_full"]
    charged = [e for e in await store.events_after(sid, 0) if e.type == "model/charged"]
    assert len(charged) == 1 and charged[0].data["tokens"] == 300, "charged in full, once"
