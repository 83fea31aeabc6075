"""The status page's live streams end when the daemon stops, whatever they were doing.

A real aiohttp server on 127.0.0.1 serves a goal's stream from a real store (SQLite in
``tmp_path``); a real HTTP client reads it. The case pinned here is the one that hung a stopping
daemon: an event published in the same step as the stop's cancel. Python 3.11's
``asyncio.wait_for`` returns the finished read instead of raising the cancel then, so a stream
loop built on it went on serving and the stop waited on it forever.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agent import Store
from agent.events import Event
from daemon.web.live import Streams, goal_stream, goals_stream


async def _summary() -> dict[str, Any]:
    return {}


async def _row(gid: str) -> str | None:
    return f'<tr data-goal="{gid}"><td>moved</td></tr>'


def _event(seq: int, kind: str) -> Event:
    return Event(session_id="s1", seq=seq, type=kind, data={"goalId": "g1"}, at="2026-12-04T00:00:00Z")


async def _read_until(resp: aiohttp.ClientResponse, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        chunk = await resp.content.readany()
        assert chunk, f"the stream ended before {marker!r}; it sent {seen!r}"
        seen += chunk
    return seen


async def _served(tmp_path: Path) -> tuple[Store, Streams, TestServer]:
    store = await Store.open(tmp_path / "agent.db")
    streams = Streams(cap=10)

    async def goal(request: web.Request) -> web.StreamResponse:
        return await goal_stream(
            request,
            store=store,
            hub=store.hub,
            session_id="s1",
            after=0,
            backlog=1000,
            summary=_summary,
            streams=streams,
        )

    async def table(request: web.Request) -> web.StreamResponse:
        return await goals_stream(request, hub=store.hub, sessions={"s1": "g1"}, row=_row, streams=streams)

    app = web.Application()
    app.router.add_get("/goal", goal)
    app.router.add_get("/table", table)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return store, streams, server


@pytest.mark.parametrize(
    ("path", "kind", "shown"),
    [("/goal", "turn/start", b"id: 1\n"), ("/table", "turn/end", b"event: row")],
    ids=["goal-page", "goals-table"],
)
async def test_a_live_stream_ends_at_stop_even_when_an_event_arrives_with_the_cancel(
    tmp_path: Path, path: str, kind: str, shown: bytes
) -> None:
    store, streams, server = await _served(tmp_path)
    try:
        async with aiohttp.ClientSession() as client, client.get(server.make_url(path)) as resp:
            await _read_until(resp, b"event: caught-up")
            store.hub.publish([_event(1, kind)])
            await _read_until(resp, shown)  # the stream is live: it sent the event (or the moved row)
            (task,) = streams.open
            store.hub.publish([_event(2, kind)])  # wakes the stream in the very step the stop cancels it
            task.cancel()
            await asyncio.wait({task}, timeout=10)
            assert task.done(), f"the {path} stream went on serving after its cancel"
            assert not streams.open
    finally:
        await server.close()
        await store.close()


async def test_closing_the_streams_is_bounded_even_when_one_ignores_its_cancel() -> None:
    streams = Streams(cap=10)
    release = asyncio.Event()
    cancels = 0

    async def stubborn() -> None:
        nonlocal cancels
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                cancels += 1  # swallowed, as a careless await would

    polite = asyncio.ensure_future(asyncio.Event().wait())
    task = asyncio.ensure_future(stubborn())
    streams.open.update({task, polite})
    await asyncio.sleep(0)  # both are waiting
    await asyncio.wait_for(streams.close_all(within=1.5), 10)  # returns, though one stream goes on
    assert polite.cancelled()
    assert not task.done() and cancels >= 2, "the stubborn stream was cancelled again each second"
    release.set()
    await asyncio.wait_for(task, 10)
