"""The model's view of a session as its running driver holds it, with the measures kept beside it.

The view is loaded from the store on a turn's first step (or after anything wrote history the
driver did not build: a turn's cleanup, a compaction) and grown in memory afterwards, so a step
does not read the event log again. Beside it: the model's converted form of each message
(:class:`~agent.models.base.WireCache`, started afresh with every load, since the prompt's prefix
may have changed) and the prompt-size estimate (:class:`~agent.context.ContextMeter`), reset with it.
A compaction that could not free enough is not tried again before the view has grown by
:data:`RETRY_GROWTH` of the window (:meth:`History.holding_off`): trying at every step would cost
each step a reading of the view, for nothing.
"""

from __future__ import annotations

import dataclasses

from agent.context import ContextMeter, load_view
from agent.inbox import Admitted
from agent.models.base import ConvMessage, Model, ModelRequest, ToolSpec, WireCache
from agent.spend import PromptEstimator, estimator_for
from agent.store import Store

#: How much of the window the view must grow by before a compaction that freed too little is tried again.
RETRY_GROWTH = 0.05


class History:
    """One session's view as the driver holds it (``None`` until loaded)."""

    def __init__(self, store: Store, session_id: str, model: Model) -> None:
        self.store = store
        self.session_id = session_id
        self.messages: list[ConvMessage] | None = None
        #: The history as the model converted it, one message at a time (reset with the history).
        self.wire = WireCache()
        self.estimator: PromptEstimator = estimator_for(model.spec)
        self.meter = ContextMeter(self.estimator)
        #: The estimate at which the last compaction could not free enough (``None``: none did).
        self.stuck_at: int | None = None

    @property
    def loaded(self) -> bool:
        """Whether the view is held (else the next step loads it)."""
        return self.messages is not None

    async def reload(self) -> None:
        """Load the view as the latest compaction shows it (:mod:`agent.context`), as a restart would."""
        _, view = await load_view(self.store, self.session_id)
        self.messages, self.wire = [e.msg for e in view], WireCache()
        self.meter.reset()
        self.stuck_at = None

    def gave_up(self, tokens: int) -> None:
        """A compaction left the view at about ``tokens``, still too big: wait for it to grow first."""
        self.stuck_at = tokens

    def holding_off(self, tokens: int, window: int) -> bool:
        """Whether a compaction is put off at an estimate of ``tokens`` (see :meth:`gave_up`)."""
        return self.stuck_at is not None and tokens < self.stuck_at + RETRY_GROWTH * window

    def invalidate(self) -> None:
        """Forget the view: something wrote history this copy does not have; the next step reloads."""
        self.messages = None

    def append(self, msg: ConvMessage) -> None:
        """Add one message the driver committed."""
        assert self.messages is not None
        self.messages.append(msg)

    def append_admitted(self, admitted: list[Admitted]) -> None:
        """Add the user messages of an admitted batch."""
        for a in admitted:
            self.append(ConvMessage(role="user", content=a.content))

    def copy(self) -> list[ConvMessage] | None:
        """The view as a new list (``None``: not loaded)."""
        return None if self.messages is None else list(self.messages)

    def request(self, model: Model, system: str | None, tools: list[ToolSpec], max_tokens: int) -> ModelRequest:
        """The next step's request, measured (the model converts only what was added: WireCache)."""
        messages = self.messages
        assert messages is not None
        request = ModelRequest(system, tuple(messages), tools, max_tokens, cache=self.wire)
        return dataclasses.replace(request, prompt_bytes=model.measure(request))
