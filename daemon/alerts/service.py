"""The notification subsystem of one daemon: the sender, the dead-man request, breaker watching, tests.

The host builds one :class:`Alerts` from ``[notify]`` and runs :meth:`Alerts.run` as one task while it
serves (cancelled at shutdown: a delivery cut short is not recorded and is made again after the
next start, with the same id). Circuit breakers live in memory, so :meth:`Alerts.watch_breakers`
hooks each provider's breaker and writes a notification in a transaction of its own when it opens
(from closed) or closes: a half-open probe that fails re-opens it without a second message.

``goald notify test [SINK]`` (the ``notify/test`` method) sends a test message straight to the sinks
and answers with each one's outcome; it goes around the outbox, since its point is to show the
operator at once whether a sink works.

The dead-man URL is requested every ``deadman_interval_seconds`` while the daemon is healthy (serving,
and its store can write); a monitor that stops hearing from it raises the alarm that a dead daemon
cannot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from loguru import logger

from agent import Runtime, SandboxPolicy, SandboxProfile
from agent.models.health import BreakerState, ProviderHealth
from agent.outbox import Message, NotificationId, put
from agent.sandbox import Sandbox
from agent.store import Store
from agent.tx import Tx, utcnow
from daemon.alerts.config import NotifySettings
from daemon.alerts.kinds import NotificationKind, breaker_notice
from daemon.alerts.payload import payload_of
from daemon.alerts.sender import Sender
from daemon.alerts.sinks import HttpClient, Sink, build_sinks
from daemon.errors import DaemonError


class UnknownSink(DaemonError, LookupError):
    """``notify test`` named a sink that is not configured."""


class Alerts:
    """Notifications of one daemon (see the module docstring)."""

    def __init__(
        self,
        conf: NotifySettings,
        sandboxing: Callable[[], SandboxProfile],
        *,
        decorate: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.conf = conf
        #: Adds what the daemon knows at delivery to a payload (a question's signed answer links).
        self.decorate = decorate
        self.http = HttpClient()
        self._sandboxing = sandboxing
        self.sinks: dict[str, Sink] = build_sinks(conf, self.http, self._sandbox_for)
        self.sender: Sender | None = None

    def _sandbox_for(self, workdir: Path, policy: SandboxPolicy) -> Sandbox:
        return self._sandboxing().sandbox(workdir, policy=policy)

    # -- running -----------------------------------------------------------------------------

    async def run(self, store: Store, healthy: Callable[[], bool]) -> None:
        """Deliver notifications (and request the dead-man URL) until cancelled (again after a
        cancel: in a cluster this runs on one node at a time, and may move back here)."""
        self.sender = Sender(store, self.conf, self.sinks, decorate=self.decorate)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.sender.run())
                if self.conf.deadman_url or self.conf.deadman_url_secret:
                    tg.create_task(self._deadman(healthy))
        finally:
            await asyncio.shield(self.http.aclose())

    async def _deadman(self, healthy: Callable[[], bool]) -> None:
        conf = self.conf
        failing = False
        while True:
            url = conf.deadman_url or (conf.deadman_url_secret.read() if conf.deadman_url_secret else None)
            if url and healthy():
                try:
                    response = await self.http.get().get(url, timeout=min(30.0, conf.deadman_interval_seconds))
                    ok, what = response.status_code < 400, f"HTTP {response.status_code}"
                except Exception as exc:  # logged; the next interval tries again
                    ok, what = False, type(exc).__name__
                if not ok and not failing:
                    logger.warning("the dead-man request failed ({}); it is retried every interval", what)
                elif ok and failing:
                    logger.info("the dead-man request succeeds again")
                failing = not ok
            await asyncio.sleep(conf.deadman_interval_seconds)

    # -- circuit breakers --------------------------------------------------------------------

    def watch_breakers(self, healths: Mapping[str, ProviderHealth], rt: Runtime) -> None:
        """Write a notification when a provider's breaker opens (from closed) or closes."""
        for name, health in healths.items():
            health.breaker.on_change = self._breaker_hook(name, health, rt)

    def _breaker_hook(
        self, name: str, health: ProviderHealth, rt: Runtime
    ) -> Callable[[BreakerState, BreakerState], None]:
        def changed(before: BreakerState, after: BreakerState) -> None:
            if after is BreakerState.OPEN and before is BreakerState.CLOSED:
                opened = True
                snap = health.snapshot()
                logger.bind(provider=name).warning(
                    "provider {}: circuit breaker opened after {} failure(s) in a row; calls wait: {}",
                    name,
                    snap["breaker"].get("consecutiveFailures", "several"),
                    snap.get("lastError") or "no error text",
                )
            elif after is BreakerState.CLOSED:
                opened = False
                logger.bind(provider=name).info("provider {}: circuit breaker closed, calls go out again", name)
            else:
                return
            rt.spawn(self._write(rt.store, name, opened, health.snapshot()))

        return changed

    async def _write(self, store: Store, provider: str, opened: bool, detail: dict[str, Any]) -> None:
        try:
            await store.transact(lambda tx: record_breaker(tx, provider, opened, detail))
        except Exception as exc:  # in memory only: a store that cannot write loses this one, logged
            logger.error("the breaker notification of provider {} was not written: {}", provider, exc)

    # -- notify test -------------------------------------------------------------------------

    async def test(self, sink: str | None = None) -> dict[str, Any]:
        """Send a test message to ``sink`` (or every sink); each one's outcome.

        Raises:
            UnknownSink: ``sink`` is not configured (the message lists the configured ones).
        """
        if sink is not None and sink not in self.sinks:
            known = ", ".join(self.sinks) or "none configured"
            raise UnknownSink(f"no notification sink {sink!r}: the configured sinks are {known}")
        targets = [self.sinks[sink]] if sink is not None else list(self.sinks.values())
        nid = NotificationId.new()
        now = utcnow()
        summary = "goald test notification: this sink works"
        message = Message(
            id=nid,
            kind=NotificationKind.TEST.value,
            group=None,
            count=1,
            ids=[nid],
            payloads=[{"id": nid, "kind": "test", "time": now, "status": "test", "summary": summary}],
            created_at=now,
        )
        payload = payload_of(message)
        results = []
        for target in targets:
            started = time.monotonic()
            outcome = await target.deliver(payload)
            results.append(
                {
                    "sink": target.name,
                    "ok": outcome.ok,
                    "status": outcome.status,
                    "error": outcome.error,
                    "seconds": round(time.monotonic() - started, 3),
                }
            )
        return {"id": nid, "results": results}


def record_breaker(tx: Tx, provider: str, opened: bool, detail: dict[str, Any]) -> NotificationId:
    """Write a breaker notification in ``tx`` (what the hook does in a transaction of its own)."""
    kind, payload = breaker_notice(provider, opened, detail)
    return put(tx, kind, payload)
