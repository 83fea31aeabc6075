"""What the PostgreSQL and cluster tests share: waiting on a check, a query of the test's database,
and a daemon configured as a node of a cluster (tests/e2e/test_cluster*.py, test_postgres_daemon.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from harness import TEST_MODELS, Daemon


async def until(check: Callable[[], Awaitable[Any]], what: str, limit: float = 60.0, step: float = 0.05) -> Any:
    """Ask ``check`` again and again until it returns a truthy value (which is returned); raise
    ``TimeoutError`` naming ``what`` after ``limit`` seconds."""
    end = time.monotonic() + limit
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not within {limit}s")
        await asyncio.sleep(step)


def q(dsn: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Every row of one query on the test's database (psycopg's ``%s`` placeholders)."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, args).fetchall()


def node(state: Path, name: str, dsn: str, *, cluster: dict[str, Any] | None = None, **config: Any) -> Daemon:
    """A daemon (not started) on ``state`` as node ``name`` of the cluster on ``dsn``."""
    return Daemon(
        state,
        config={
            **TEST_MODELS,
            "store": dsn,
            "workdir_roots": [str(state.parent / "work")],
            "cluster": {"node_name": name, "lease_ttl_seconds": 3, **(cluster or {})},
            **config,
        },
    )


__all__ = ["node", "q", "until"]
