"""The sender: delivers the outbox's messages to the sinks, at least once, with retries and backoff.

One loop, driven by durable state only: seal what is ready (:func:`agent.outbox.seal`: grouping by
cause), deliver every pending delivery that is due, record each attempt in its own transaction, and
sleep until the next group or retry is due or a new notification commits (the outbox's signal; no
polling). A failed attempt is retried after ``retry_first_seconds`` doubled per attempt up to
``retry_max_seconds``; after ``max_attempts`` the delivery is recorded ``failed`` (logged as an
error) and not tried again. A restart picks up exactly where the records say: a delivery whose
answer came but whose record did not (the process died in between) is made again, with the same
id; no other delivery repeats.

Deliveries to one sink run a few at a time (:data:`PER_SINK`), and sinks run side by side, so a
sink that hangs until its timeout delays only its own messages.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from loguru import logger

from agent import StorageUnavailable
from agent.outbox import LOCK, Attempt, Due, due, has_unsealed, next_due, prune, record, seal, signal_of
from agent.store import Store
from daemon.alerts.config import NotifySettings
from daemon.alerts.payload import payload_of
from daemon.alerts.sinks import Sink

#: Deliveries to one sink in flight at once.
PER_SINK = 4
#: Due deliveries read per step.
BATCH = 200
#: Seconds between prunes of old messages.
PRUNE_EVERY = 3600.0
#: Longest sleep after an unexpected failure of the loop itself.
LOOP_BACKOFF_MAX = 30.0
#: How often the sender looks for other nodes' notifications (a cluster on PostgreSQL), in seconds.
OTHER_NODES_POLL = 2.0

Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Sender:
    """Delivers the outbox of ``store`` to ``sinks`` under ``conf``. Run :meth:`run` as a task."""

    def __init__(
        self,
        store: Store,
        conf: NotifySettings,
        sinks: dict[str, Sink],
        *,
        clock: Clock = _utcnow,
        decorate: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.store = store
        self.decorate = decorate
        self.conf = conf
        self.sinks = sinks
        self.clock = clock
        self._signal = signal_of(store)
        self._pruned_at = 0.0
        #: Deliveries recorded since start, by outcome (for tests and health).
        self.delivered = 0
        self.failed_attempts = 0
        #: Set after every recorded attempt (tests and benchmarks wait on it).
        self.recorded = asyncio.Event()

    async def run(self) -> None:
        """Deliver until cancelled."""
        failures = 0
        while True:
            self._signal.clear()
            try:
                wait = await self.step()
                failures = 0
            except StorageUnavailable as exc:
                logger.warning("notifications wait for the store: {}", exc)
                await self.store.wait_writable(LOOP_BACKOFF_MAX)
                continue
            except Exception:
                failures += 1
                wait = min(LOOP_BACKOFF_MAX, 2.0 ** (failures - 1))
                logger.exception("the notification sender failed; it goes on in {:.0f}s", wait)
            if wait is not None and wait <= 0:
                continue
            if self.store.kind == "postgresql":
                # Other nodes write outbox rows too and their commits set no event here: look again soon.
                wait = min(wait, OTHER_NODES_POLL) if wait is not None else OTHER_NODES_POLL
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._signal.wait()

    async def step(self) -> float | None:
        """Seal, deliver what is due, and return the seconds until something is due again."""
        conf = self.conf
        seal_wait = None
        # Sealing takes the outbox's lock (every node's sender seals): only when there is something.
        if await self.store.read(has_unsealed):
            seal_wait = await self.store.transact(
                lambda tx: seal(tx, conf.group_window_seconds, conf.sinks_for), named=LOCK
            )
        names = list(self.sinks)
        while True:
            now = self.clock()
            batch = await self.store.read(partial(due, now=now, sinks=names, limit=BATCH))
            if not batch:
                break
            await self._deliver_all(batch)
        await self._maybe_prune()
        nxt = await self.store.read(lambda conn: next_due(conn, names))
        waits = [w for w in (seal_wait,) if w is not None]
        if nxt is not None:
            waits.append(max(0.0, (nxt - self.clock()).total_seconds()))
        return min(waits) if waits else None

    async def _deliver_all(self, batch: list[Due]) -> None:
        by_sink: dict[str, list[Due]] = {}
        for d in batch:
            by_sink.setdefault(d.sink, []).append(d)
        await asyncio.gather(*(self._deliver_sink(self.sinks[name], items) for name, items in by_sink.items()))

    async def _deliver_sink(self, sink: Sink, items: list[Due]) -> None:
        gate = asyncio.Semaphore(PER_SINK)

        async def one(d: Due) -> None:
            async with gate:
                await self._deliver(sink, d)

        await asyncio.gather(*(one(d) for d in items))

    async def _deliver(self, sink: Sink, d: Due) -> None:
        payload = payload_of(d.message)
        if self.decorate is not None:
            payload = self.decorate(payload)
        try:
            outcome = await sink.deliver(payload)
        except Exception as exc:  # a sink must not raise; if one does, it is a failed attempt
            logger.exception("notification sink {} raised", sink.name)
            outcome = Attempt(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
        attempt = d.attempts + 1
        retry_at = None
        if not outcome.ok and not outcome.permanent and attempt < self.conf.max_attempts:
            delay = min(self.conf.retry_max_seconds, self.conf.retry_first_seconds * 2 ** (attempt - 1))
            retry_at = self.clock() + timedelta(seconds=delay)
        await self.store.transact(
            lambda tx: record(tx, d.message.id, sink.name, attempt, outcome, retry_at), named=LOCK
        )
        self.recorded.set()
        if outcome.ok:
            self.delivered += 1
            logger.debug("notification {} ({}) delivered to {}", d.message.id, d.message.kind, sink.name)
        elif retry_at is not None:
            self.failed_attempts += 1
            logger.warning(
                "notification {} to {}: attempt {} failed ({}); next at {}",
                d.message.id,
                sink.name,
                attempt,
                outcome.error,
                retry_at.isoformat(timespec="seconds"),
            )
        elif outcome.permanent:
            self.failed_attempts += 1
            logger.error(
                "notification {} to {}: failed, not retried (a configuration error: fix it and restart): {}",
                d.message.id,
                sink.name,
                outcome.error,
            )
        else:
            self.failed_attempts += 1
            logger.error(
                "notification {} to {}: given up after {} attempts; last: {}",
                d.message.id,
                sink.name,
                attempt,
                outcome.error,
            )

    async def _maybe_prune(self) -> None:
        loop_now = asyncio.get_running_loop().time()
        if self.conf.keep_seconds <= 0 or loop_now - self._pruned_at < PRUNE_EVERY:
            return
        self._pruned_at = loop_now
        before = self.clock() - timedelta(seconds=self.conf.keep_seconds)
        gone = await self.store.transact(lambda tx: prune(tx, before), named=LOCK)
        if gone:
            logger.info("pruned {} delivered notification message(s)", gone)
