"""A call's settlement is counted in ``usage_totals`` once, in the transaction that settles it.

On PostgreSQL the settlement and its count are one statement sent with the transaction's next
(:func:`agent.usage.end_calls`: an ``UPDATE`` in a ``WITH`` feeding the totals' upsert); on SQLite,
which has no update in a ``WITH``, the update returns the rows it ended and each is counted. Either
way: a call settled twice is counted once, an error class has its own row, and a transaction that
rolls back counts nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.calls import reserve_call, settle_call
from agent.db import Conn
from agent.sessions import create_session
from agent.spend import Usage
from agent.store import Store
from agent.tx import Tx
from agent.usage import UsageTotal, usage_totals

pytestmark = pytest.mark.both_stores


def reserve(tx: Tx, sid: str, call_id: str) -> None:
    reserve_call(
        tx,
        call_id=call_id,
        session_id=sid,
        turn_id="turn_1",
        guard_id=None,
        provider="p",
        model="m",
        attempt=1,
        tokens=1000,
        cost=1.0,
    )


async def totals(store: Store) -> dict[str, UsageTotal]:
    def run(conn: Conn) -> list[UsageTotal]:
        return usage_totals(conn)

    return {t.error_class or "": t for t in await store.read(run)}


async def test_a_settled_call_is_counted_once(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        sid = await store.transact(lambda tx: create_session(tx))
        for cid in ("call_a", "call_b", "call_c"):
            await store.transact(lambda tx, cid=cid: reserve(tx, sid, cid), session=sid)
        used = Usage(input_tokens=100, output_tokens=20, cache_read_tokens=5, cache_write_tokens=1)

        def settle_a(tx: Tx) -> None:
            settle_call(tx, "call_a", used, 0.25)
            # What the settlement did is read by the transaction's next statement.
            row = tx.one("SELECT state, input_tokens FROM model_calls WHERE id = ?", ("call_a",))
            assert (row[0], row[1]) == ("settled", 100)

        await store.transact(settle_a, session=sid)
        await store.transact(lambda tx: settle_call(tx, "call_a", used, 0.25), session=sid)  # no longer reserved
        await store.transact(
            lambda tx: settle_call(tx, "call_b", Usage(input_tokens=7), 0.0, error_class="rate_limited", error="429"),
            session=sid,
        )

        def settle_then_fail(tx: Tx) -> None:
            settle_call(tx, "call_c", used, 0.25)
            raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            await store.transact(settle_then_fail, session=sid)
        got = await totals(store)
        assert set(got) == {"", "rate_limited"}
        ok, limited = got[""], got["rate_limited"]
        assert (ok.calls, ok.input_tokens, ok.output_tokens, ok.cache_read_tokens, ok.cache_write_tokens) == (
            1,
            100,
            20,
            5,
            1,
        )
        assert ok.cost == pytest.approx(0.25)
        assert (limited.calls, limited.input_tokens) == (1, 7)
        # The call the rolled-back transaction settled is still reserved, and counts when it settles.
        await store.transact(lambda tx: settle_call(tx, "call_c", used, 0.25), session=sid)
        assert (await totals(store))[""].calls == 2
