"""What callers hand a session's agent: follow-ups, steering, context, and the cancellation of a
queued message.

:class:`MessageIntake` is that part of :class:`agent.driver.Agent` (mixed in; the agent sets
``store`` and ``session_id``). Each call is one transaction of :mod:`agent.inbox`, durable as
queued (or cancelled) when it returns; the committed ``message/queued`` event is what wakes the
driver, so nothing here touches the driver loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from agent.ids import MessageId
from agent.inbox import cancel, enqueue
from agent.messages import CancelReason, Content, Delivery, Source, parse_content
from agent.store import Store


class MessageIntake:
    """Enqueueing and cancelling a session's messages (see the module docstring)."""

    store: Store
    session_id: str

    async def followup(
        self,
        content: str | Content | Any,
        *,
        message_id: MessageId | str | None = None,
        source: Source | None = None,
        pending_key: str | None = None,
        yields_to_followup: bool = False,
    ) -> None:
        """Enqueue a follow-up: durable as queued when this returns; it opens or waits for the next turn."""
        await self._enqueue(Delivery.FOLLOWUP, content, message_id, source, pending_key, yields_to_followup)

    async def steer(
        self, content: str | Content | Any, *, message_id: MessageId | str | None = None, source: Source | None = None
    ) -> None:
        """Enqueue steering: joins the running turn at its next model step; wakes an idle agent."""
        await self._enqueue(Delivery.STEER, content, message_id, source, None, False)

    async def inject(
        self, content: str | Content | Any, *, message_id: MessageId | str | None = None, source: Source | None = None
    ) -> None:
        """Enqueue context: admitted with the next model step; never wakes the agent."""
        await self._enqueue(Delivery.CONTEXT, content, message_id, source, None, False)

    async def enqueue(
        self,
        content: str | Content | Any,
        *,
        delivery: Delivery | str = Delivery.FOLLOWUP,
        message_id: MessageId | str | None = None,
        source: Source | None = None,
    ) -> MessageId:
        """Validate and enqueue with a delivery given by name; returns the message's id (a receipt)."""
        from agent.messages import parse_delivery

        mid = MessageId.parse(message_id) if message_id is not None else MessageId.new()
        await self._enqueue(parse_delivery(delivery), content, mid, source, None, False)
        return mid

    async def _enqueue(
        self,
        delivery: Delivery,
        content: object,
        message_id: MessageId | str | None,
        source: Source | None,
        pending_key: str | None,
        yields: bool,
    ) -> None:
        blocks = parse_content(content)
        mid = MessageId.parse(message_id) if message_id is not None else None
        await self.store.transact(
            partial(
                enqueue,
                session_id=self.session_id,
                content=blocks,
                delivery=delivery,
                message_id=mid,
                source=source,
                pending_key=pending_key,
                yields_to_followup=yields,
            ),
            session=self.session_id,
        )

    async def cancel_message(
        self,
        message_id: MessageId | str,
        reason: str = CancelReason.CANCELLED,
        caller: Mapping[str, int | str] | None = None,
    ) -> None:
        """Cancel a queued message (``caller``: who asked, kept in the event). Raises
        ``InvalidTransition`` if it was already admitted."""
        mid = MessageId.parse(message_id)
        await self.store.transact(
            partial(cancel, session_id=self.session_id, message_id=mid, reason=reason, caller=caller),
            session=self.session_id,
        )
