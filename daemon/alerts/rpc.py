"""The ``notify/*`` methods: ``notify/test`` sends a test message to one sink or all of them."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from daemon.alerts.service import Alerts, UnknownSink
from daemon.rpc.params import Params
from daemon.rpc.protocol import Dispatcher, ErrorCode, Peer, RpcError


class NotifyTest(Params):
    """``notify/test``: the sink to test (``None``: every configured sink)."""

    sink: str | None = Field(default=None, min_length=1, max_length=64)


def register(d: Dispatcher, alerts: Alerts) -> None:
    """Add the ``notify/*`` methods to ``d``."""

    @d.method("notify/test", NotifyTest)
    async def notify_test(p: NotifyTest, peer: Peer) -> dict[str, Any]:
        try:
            return await alerts.test(p.sink)
        except UnknownSink as exc:
            raise RpcError(ErrorCode.NOT_FOUND, str(exc)) from None
