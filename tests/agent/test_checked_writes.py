"""A write whose check is made where it runs, and reads sent together (issue 30).

A goal's decision writes its continuation (an inbox row a second queued ``pending_key`` refuses) and
saves the goal at the revision it read (an update that must change exactly one row); each used to
wait for its answer, a round trip apiece, before the ``COMMIT``. :meth:`agent.tx.Tx.write` sends
them with the transaction's next statement or its ``COMMIT`` instead: the server makes the check
(``goald_one_row``, agent schema version 8) and the connection turns its failure into the caller's
error. A goal's evaluation reads the goal and its round's events with :meth:`agent.tx.Tx.reads`, in
one round trip with the ``COMMIT``. Pins, on both stores:

* a checked write that holds commits, in the transaction's one round trip (PostgreSQL);
* one that changes no row raises its caller's error, from the ``COMMIT`` on PostgreSQL, and the
  transaction writes nothing, even when its function caught the error (SQLite raises it at once);
* a refusal mapped by ``refused`` is raised as the caller's error, and every later statement of
  the transaction raises it again (PostgreSQL would only roll back at its ``COMMIT``);
* reads sent together return each one's rows, in one round trip with the ``COMMIT``.
"""

from __future__ import annotations

import contextlib

import pytest

from agent.db import integrity_errors
from agent.sessions import create_session
from agent.store import Store
from agent.tx import Tx

pytestmark = pytest.mark.both_stores


class Moved(Exception):
    """The caller's error for an update that found its row changed."""


class Taken(Exception):
    """The caller's error for a row whose id is taken."""


def set_config(tx: Tx, sid: str, seen: str, new: str) -> None:
    """The session's config changed to ``new`` only if it is still ``seen``."""
    tx.write(
        "UPDATE sessions SET config=? WHERE id=? AND config=?",
        (new, sid, seen),
        one_row=lambda: Moved(f"session {sid}'s config is no longer {seen}"),
    )


async def config_of(store: Store, sid: str) -> str:
    row = await store.read(lambda c: c.execute("SELECT config FROM sessions WHERE id=?", (sid,)).fetchone())
    return str(row[0])


async def types_of(store: Store, sid: str) -> list[str]:
    return [e.type for e in await store.events_after(sid, 0)]


async def test_a_checked_write_that_holds_commits_in_one_round_trip(store: Store) -> None:
    sid = await store.transact(lambda tx: create_session(tx))
    await store.transact(lambda tx: tx.emit(sid, "test/first", {}), session=sid)  # the state is known now

    def decide(tx: Tx) -> None:
        tx.emit(sid, "test/decided", {})
        set_config(tx, sid, "{}", '{"round": 1}')
        tx.emit(sid, "test/after", {})

    before = store.round_trips
    await store.transact(decide, session=sid)
    if before is not None:  # PostgreSQL: the opening, the events, the update, its check, the COMMIT
        assert store.round_trips == before + 1
    assert await config_of(store, sid) == '{"round": 1}'
    assert (await types_of(store, sid))[-2:] == ["test/decided", "test/after"]


@pytest.mark.parametrize("caught", [False, True], ids=["raised", "caught"])
async def test_a_checked_write_that_changes_no_row_fails_its_transaction(store: Store, caught: bool) -> None:
    sid = await store.transact(lambda tx: create_session(tx))
    await store.transact(lambda tx: tx.emit(sid, "test/first", {}), session=sid)
    top = (await store.session_state(sid)).last_seq

    def stale(tx: Tx) -> str:
        tx.emit(sid, "test/decided", {})
        with contextlib.suppress(Moved) if caught else contextlib.nullcontext():
            set_config(tx, sid, '{"round": 7}', '{"round": 8}')  # it is "{}": no row changes
        return "returned"

    before = store.round_trips
    with pytest.raises(Moved, match=r"config is no longer \{\"round\": 7\}"):
        await store.transact(stale, session=sid)
    if before is not None:  # the write's one text raised it (its own transaction: no rollback to send)
        assert store.round_trips == before + 1
    assert await config_of(store, sid) == "{}"
    assert (await store.session_state(sid)).last_seq == top and (await types_of(store, sid))[-1] == "test/first"
    # Nothing is left of it: the session's next write opens and commits as usual.
    await store.transact(lambda tx: set_config(tx, sid, "{}", '{"round": 2}'), session=sid)
    assert await config_of(store, sid) == '{"round": 2}'


async def test_a_refusal_is_the_callers_error_and_every_later_statement_raises_it(store: Store) -> None:
    sid = await store.transact(lambda tx: create_session(tx))

    def taken(exc: Exception) -> BaseException | None:
        return Taken(f"session id {sid} is taken") if isinstance(exc, integrity_errors()) else None

    def again(tx: Tx) -> int:
        with contextlib.suppress(Taken):
            tx.write("INSERT INTO sessions(id, created_at) VALUES (?, ?)", (sid, tx.now), refused=taken)
            # On PostgreSQL the row goes with this read, which raises the refusal.
            tx.one("SELECT COUNT(*) FROM sessions")
        return int(tx.one("SELECT COUNT(*) FROM sessions")[0])  # raises it again, on both stores

    with pytest.raises(Taken, match="is taken"):
        await store.transact(again)
    count = await store.read(lambda c: c.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])
    assert int(count) == 1
    # A failure the mapping does not claim is raised as it is.
    with pytest.raises(integrity_errors()):
        await store.transact(
            lambda tx: tx.write(
                "INSERT INTO sessions(id, created_at) VALUES (?, ?)", (sid, tx.now), refused=lambda e: None
            )
        )


async def test_reads_sent_together_return_each_ones_rows_with_the_commit(store: Store) -> None:
    sid = await store.transact(lambda tx: create_session(tx))
    for n in range(3):
        await store.transact(lambda tx, n=n: tx.emit(sid, f"test/{n}", {"n": n}), session=sid)

    def both(tx: Tx) -> tuple[list[str], list[int]]:
        tx.last_read()
        sessions, events = tx.reads(
            ("SELECT id FROM sessions WHERE id=?", (sid,)),
            ("SELECT seq FROM events WHERE session_id=? AND seq>? ORDER BY seq", (sid, 1)),
        )
        return [r["id"] for r in sessions], [r["seq"] for r in events]

    before = store.round_trips
    ids, seqs = await store.transact(both, session=sid)
    assert ids == [sid] and seqs == [2, 3, 4]  # the session's creation is its event 1
    if before is not None:  # the opening, both reads and the COMMIT
        assert store.round_trips == before + 1
    empty = await store.transact(
        lambda tx: tx.reads(("SELECT id FROM sessions WHERE id=?", ("nope",)), ("SELECT 1 AS one", ()))
    )
    assert list(empty[0]) == [] and [r["one"] for r in empty[1]] == [1]
