"""Expected, handled events are logged as one line without a traceback (issue 25, point 9).

- A node whose lease was taken over while its driver was inside a model call writes nothing more
  (the fence refuses the write with ``LeaseLost``): that is the cluster working, not a bug, so it is
  one line at info — not ``ERROR an agent driver failed`` with a traceback hundreds of lines long —
  and no task is left with an exception nobody retrieved. In one process: a runtime on PostgreSQL
  with a real lease manager (node ``a``), and another node's takeover written to the lease row as
  the other node's claim writes it.
- PostgreSQL going away: one warning when the outage begins (however many writes fail, whatever
  each failure says), one info line when the store writes again, no error and no traceback.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from clusterkit import q, until
from loguru import logger
from pgkit import NO_POSTGRES, PgServer

from agent import ModelRegistry, Runtime, StorageUnavailable, Store, ToolRegistry
from agent.inbox import enqueue
from agent.messages import parse_content
from agent.models.base import ModelRequest
from agent.models.scripted import Reply, ScriptedModel
from agent.sessions import create_session
from daemon.cluster.lease_rows import MIGRATIONS
from daemon.cluster.leases import LeaseManager
from daemon.cluster.settings import ClusterSettings
from goals.schema import MIGRATIONS as GOAL_MIGRATIONS

pytestmark = pytest.mark.skipif(NO_POSTGRES is not None, reason=f"PostgreSQL is not available: {NO_POSTGRES}")


@pytest.fixture
def records() -> Iterator[list[Any]]:
    got: list[Any] = []
    sink = logger.add(lambda message: got.append(message.record), level="DEBUG", format="{message}")
    try:
        yield got
    finally:
        logger.remove(sink)


async def test_a_fenced_late_write_is_one_info_line(
    pg_dsn: str, records: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    in_call, go_on = asyncio.Event(), asyncio.Event()

    async def answer(request: ModelRequest) -> Reply:
        in_call.set()
        await go_on.wait()
        return Reply.say("late")

    model = ScriptedModel(answer)
    registry = ModelRegistry()
    registry.add(model)
    registry.default = model.spec
    async with Runtime.open(pg_dsn, models=registry, tools=lambda row: ToolRegistry([])) as rt:
        await rt.store.migrate("goals", GOAL_MIGRATIONS)  # the lease manager reads goals' node labels
        await rt.store.migrate("cluster", MIGRATIONS)
        leases = LeaseManager(pg_dsn, rt.store, ClusterSettings(node_name="a", lease_ttl_seconds=60))
        rt.leases = leases
        await leases.start(rt.spawn)
        try:
            sid = await rt.create_session()
            await rt.enqueue(sid, "work")  # its commit loads the agent here: the lease taken, the driver started
            await asyncio.wait_for(in_call.wait(), 20)
            agent = rt.live_agents[sid]
            assert sid in leases.held
            # Node b takes the session over (as its claim does once a's lease has expired).
            b = "INSERT INTO nodes(id, name, host, pid, labels, lease_limit) VALUES ('b', 'b', 'h', 1, '[]', 10)"
            q(pg_dsn, b + " RETURNING 1")
            q(pg_dsn, "UPDATE leases SET node_id = 'b', epoch = epoch + 1 WHERE session_id = %s RETURNING 1", sid)
            go_on.set()  # a's driver wakes and commits the answer: refused by the fence

            async def let_go() -> bool:
                return sid not in leases.held and agent._driver is not None and agent._driver.done()

            await until(let_go, "a lets the session go")
        finally:
            await leases.stop()
        # Nothing of a's late answer was written.
        assert q(pg_dsn, "SELECT COUNT(*) FROM events WHERE session_id = %s AND data LIKE %s", sid, "%late%") == [(0,)]
    gc.collect()  # an unretrieved task exception is reported when its task is collected

    refused = [r for r in records if "nothing was written" in r["message"]]
    assert [(r["level"].name, r["exception"]) for r in refused] == [("INFO", None)], refused
    assert refused[0]["message"].startswith(f"lease lost for session {sid}: node a no longer holds it (now node b")
    assert "the session is let go" in refused[0]["message"]
    bad = [r["message"] for r in records if r["level"].no >= logging.ERROR or r["exception"] is not None]
    assert bad == []
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


@pytest.fixture
def own_server() -> Iterator[PgServer]:
    """A PostgreSQL server of this test's own (it is stopped and started again mid-test)."""
    server = PgServer.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_store_outage_is_one_warning_and_its_end_one_info_line(
    own_server: PgServer, records: list[Any]
) -> None:
    store = await Store.open(own_server.create_database())
    try:
        sid = await store.transact(lambda tx: create_session(tx))
        own_server.halt()
        for _ in range(3):  # the first finds its connection closed, the next ones cannot connect
            with pytest.raises(StorageUnavailable):
                await store.transact(lambda tx: enqueue(tx, sid, parse_content("lost")))
        own_server.restart()

        async def written() -> bool:
            try:
                await store.transact(lambda tx: enqueue(tx, sid, parse_content("kept")))
            except StorageUnavailable:
                return False
            return True

        await until(written, "a write once the server is back", limit=30)
    finally:
        await store.close()
    lines = [(r["level"].name, r["message"]) for r in records if r["name"] == "agent.storage" and r["level"].no >= 20]
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert lines[0][1].startswith("the store cannot write: PostgreSQL at ") and "cannot be reached" in lines[0][1]
    assert lines[1][1].startswith("the store writes again")
    assert not [r for r in records if r["level"].no >= logging.ERROR or r["exception"] is not None]
