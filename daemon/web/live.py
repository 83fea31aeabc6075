"""Live pages: server-sent events fed by the committed-event subscription.

Why server-sent events and not a WebSocket: the page only listens (its actions are ordinary
POSTs with the CSRF token), SSE is plain HTTP through any reverse proxy, and it carries a
sequence number per event (``id:``) that the browser sends back as ``Last-Event-ID`` when it
reconnects, which is exactly the subscription's resume point (``afterSeq``).

One goal's stream: every event of its session after ``after`` (the page's newest entry, or the
``Last-Event-ID``), stored ones first, then live ones, each exactly once and in order, as the
event hub promises; each is sent with its timeline entry rendered on the server and the frame of
the band it belongs to (:func:`~daemon.web.timeline_view.band_html` of the band's fold, continued
from the band the page shows last, :mod:`daemon.rpc.timeline`): a band added or grown live reads as
it does after a reload, its counts and conversation link included. A ``goal``
message (no ``id``, so it never moves the resume point) carries the goal's counters and status,
at most twice a second.

Bounded memory on both sides: the daemon keeps at most ``live_backlog`` events queued per page;
past that (a client that stopped reading) the stream is closed, and the client's reconnect
catches up from the store. The page keeps a bounded number of entries (``app.js`` trims the
oldest bands). A comment every 15 s finds dead connections; the number of live pages is capped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from loguru import logger

from agent import Event, EventHub, Store
from daemon.rpc.timeline import Band, bands_before, is_idle
from daemon.rpc.views import event_view
from daemon.web.timeline_view import band_html, entry

PING_SECONDS = 15.0
SUMMARY_EVERY = 0.5
#: How long the stop waits for the live pages to end (:meth:`Streams.close_all`).
CLOSE_SECONDS = 5.0
#: Events whose arrival may change the goal's counters or status.
MOVES_GOAL = ("goal/", "status", "turn/end", "assistant/message", "model/", "context/compacted")


class BandTracker:
    """The band the live page shows on top, folded event by event as the page read folds it."""

    def __init__(self, goal_id: str, band: Band | None = None) -> None:
        self.goal_id = goal_id
        self.band = band if band is not None else Band()

    def message(self, e: Event) -> bytes:
        """One committed event as an SSE message (``id`` = its sequence number): its entry and the
        frame of its band (summary, counts, conversation link), rendered as a reload renders them."""
        if self.band.events and self.band.fold.begins_next(e):
            self.band = Band()
        self.band.events[:] = [e]  # the fold keeps the counts: one event is enough for the frame's bounds
        self.band.fold.add(e)
        frame = band_html(self.goal_id, self.band.fold.view(None))
        data: dict[str, Any] = {
            "seq": e.seq,
            "type": e.type,
            "html": entry({"seq": e.seq, **event_view(e)}),
            "idle": is_idle(e),
            "band": {"first": self.band.fold.first_seq, "html": frame},
        }
        return f"id: {e.seq}\nevent: ev\ndata: {json.dumps(data)}\n\n".encode()


def named(event: str, data: Any) -> bytes:
    """An SSE message without an id."""
    return f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n".encode()


class Streams:
    """The live pages being served: counted, capped, and closed together at shutdown."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: set[asyncio.Task[Any]] = set()

    def full(self) -> bool:
        """Whether one more page would pass the cap."""
        return len(self.open) >= self.cap

    async def close_all(self, within: float = CLOSE_SECONDS) -> None:
        """End every stream (the daemon stops), in ``within`` seconds at most.

        A stream that goes on after its cancel (a cancel swallowed by code it awaits) is cancelled
        again each second; one still running at the end is named in the log and left to the web
        server's own shutdown, which closes its connection: the stop never waits on a page.
        """
        deadline = time.monotonic() + within
        pending = set(self.open)
        while pending:
            for t in pending:
                t.cancel()
            left = deadline - time.monotonic()
            if left <= 0:
                logger.warning("status page: {} live page(s) did not end when the daemon stopped", len(pending))
                return
            _, pending = await asyncio.wait(pending, timeout=min(1.0, left))


async def _open(request: web.Request, streams: Streams) -> tuple[web.StreamResponse, asyncio.Task[Any]]:
    """Start an SSE response and count the task serving it among the live pages."""
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
    await resp.prepare(request)
    task = asyncio.current_task()
    assert task is not None
    streams.open.add(task)
    return resp, task


async def _catch_up(resp: web.StreamResponse, store: Store, session_id: str, after: int, bands: BandTracker) -> int:
    """Send the stored events after ``after``, a page at a time; the last sequence number sent."""
    last = after
    while True:
        page = await store.events_after(session_id, last, limit=500)
        for e in page:
            await resp.write(bands.message(e))
            last = e.seq
        if len(page) < 500:
            return last


async def _forward(
    resp: web.StreamResponse, store: Store, session_id: str, last: int, e: Event, bands: BandTracker
) -> int:
    """Send a live event, and first any the subscription skipped (read from the store), so the page
    gets each event once and in order (``e`` is newer than ``last``); the last sequence number sent."""
    if e.seq != last + 1:
        for missed in await store.events_after(session_id, last, upto=e.seq - 1, limit=e.seq - last - 1):
            await resp.write(bands.message(missed))
            last = missed.seq
    await resp.write(bands.message(e))
    return e.seq


async def goal_stream(
    request: web.Request,
    *,
    store: Store,
    hub: EventHub,
    session_id: str,
    after: int,
    backlog: int,
    summary: Callable[[], Awaitable[dict[str, Any]]],
    streams: Streams,
    goal_id: str = "",
) -> web.StreamResponse:
    """Serve one goal's live stream until the client goes or the daemon stops."""
    resp, task = await _open(request, streams)
    sub = hub.open(session_id)  # before reading the store: nothing committed in between is missed
    try:
        # The band the page shows last (the one that holds ``after``): live events continue it.
        shown = await store.read(lambda conn: bands_before(conn, session_id, after + 1, 1)) if after else None
        bands = BandTracker(goal_id, shown.bands[0] if shown is not None and shown.bands else None)
        await resp.write(b"retry: 1000\n\n")
        last = await _catch_up(resp, store, session_id, after, bands)
        await resp.write(named("goal", await summary()))
        await resp.write(named("caught-up", {"seq": last}))
        dirty_since: float | None = None
        sent_at = time.monotonic()
        while True:
            if sub.queue.qsize() > backlog:
                # The client reads too slowly: drop the queue, let it reconnect and read from the store.
                await resp.write(named("behind", {"seq": last}))
                break
            wait = PING_SECONDS
            if dirty_since is not None:
                wait = max(0.0, sent_at + SUMMARY_EVERY - time.monotonic())
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns a read that finished in
                # the step the stop cancels the stream, swallowing the cancel (and the stop hangs).
                async with asyncio.timeout(wait):
                    e = await sub.queue.get()
            except TimeoutError:
                if dirty_since is not None:
                    await resp.write(named("goal", await summary()))
                    dirty_since, sent_at = None, time.monotonic()
                else:
                    await resp.write(b": ping\n\n")
                continue
            if e.seq <= last:
                continue
            last = await _forward(resp, store, session_id, last, e, bands)
            if e.type.startswith(MOVES_GOAL):
                dirty_since = dirty_since or time.monotonic()
                if sub.queue.empty() and time.monotonic() - sent_at >= SUMMARY_EVERY:
                    await resp.write(named("goal", await summary()))
                    dirty_since, sent_at = None, time.monotonic()
    except ConnectionResetError:
        pass  # the page went away
    finally:
        sub.close()
        streams.open.discard(task)
    return resp


#: Events after which a goal's row in the table may read differently (status, rounds, spend).
MOVES_ROW = ("goal/", "turn/end", "message/queued")
#: Rows one flush re-renders; more than that and the page is told to reload instead.
MAX_ROWS_PER_FLUSH = 100


async def goals_stream(
    request: web.Request,
    *,
    hub: EventHub,
    sessions: dict[str, str],
    row: Callable[[str], Awaitable[str | None]],
    streams: Streams,
) -> web.StreamResponse:
    """Serve the goals table's live stream: a ``row`` message (the goal's id and its re-rendered
    row) for each goal whose events moved, at most twice a second; ``reload`` when too many moved
    at once or a goal the page does not know appeared. ``sessions`` maps the listed goals' session
    ids to their goal ids (events without a ``goalId``, such as ``turn/end``, are found by it).

    Nothing is queued per event: a listener marks goals dirty (a set, bounded by the number of
    goals) and one flush reads each dirty goal once, so a busy fleet costs the page one read per
    goal per half second at most. No sequence numbers: a reconnecting page reloads the table.
    """
    resp, task = await _open(request, streams)
    dirty: set[str] = set()
    wake = asyncio.Event()

    def mark(e: Event) -> None:
        if not e.type.startswith(MOVES_ROW):
            return
        gid = e.data.get("goalId") if isinstance(e.data, dict) else None
        gid = gid if isinstance(gid, str) else sessions.get(e.session_id)
        if gid is not None:
            dirty.add(gid)
            wake.set()

    remove = hub.add_listener(mark)
    try:
        await resp.write(b"retry: 1000\n\n")
        await resp.write(named("caught-up", {}))
        while True:
            try:
                async with asyncio.timeout(PING_SECONDS):  # not wait_for: see goal_stream
                    await wake.wait()
            except TimeoutError:
                await resp.write(b": ping\n\n")
                continue
            await asyncio.sleep(SUMMARY_EVERY)  # gather what else moves in the next half second
            wake.clear()
            moved = list(dirty)
            dirty.clear()
            await _flush(resp, moved, sessions, row)
    except ConnectionResetError:
        pass  # the page went away
    finally:
        remove()
        streams.open.discard(task)
    return resp


async def _flush(
    resp: web.StreamResponse, moved: list[str], sessions: dict[str, str], row: Callable[[str], Awaitable[str | None]]
) -> None:
    """Send each moved goal's re-rendered row, or ``reload`` when more moved than one flush re-renders."""
    if len(moved) > MAX_ROWS_PER_FLUSH:
        await resp.write(named("reload", {"goals": len(moved)}))
        return
    known = set(sessions.values())
    for gid in moved:
        html = await row(gid)
        if html is not None:
            await resp.write(named("row", {"goalId": gid, "html": html, "known": gid in known}))
