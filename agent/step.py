"""One model step of a running turn: the request, compaction, retries with backoff, the answer.

:class:`ModelStep` is the driver's model-call path; :class:`~agent.driver.Agent` stays the public
face and hands each step here. Each attempt of the step is reserved, time-bound and settled by
:class:`~agent.attempts.Attempts`.

Decisions, and why:

* **Retries** happen within the turn for the kinds another attempt may fix (retryable kinds and
  malformed answers: :attr:`~agent.models.base.ModelError.retried_in_turn`), after jittered
  exponential backoff or the provider's ``Retry-After`` (:class:`~agent.config.RetryPolicy`). The
  backoff never sleeps past the end of the guard's time (the next reservation is refused then); a
  stopping agent does not retry.
* **A prompt refused as too long** is no error of the goal's: the estimate was low, or the window
  smaller than assumed. The window the refusal states is learned (:mod:`agent.models.windows`), the
  meter calibrated with the size it states, the view compacted, and the step tried once more. An
  empty answer (an HTTP 200 with no event) after a prompt near the window is taken for the same
  (llama-cpp-python's server answers an overflowing streamed prompt so), never for a dropped
  connection; far from the window it is retried as a malformed answer. Either way it is charged
  nothing: its stream never began.
* **A request estimated not to fit** (its likely size and its output limit over the window) is
  never sent: compaction runs first, and when even its fallback cannot make it fit, the turn ends
  ``error`` (``context_too_small``, with the figures). An answer takes at most a quarter of the
  window, so a small window (a local server's 2,048 tokens) leaves the prompt room.
* **A failed attempt that began an answer but reported no usage** is charged the prompt's likely
  size (the model's running ratio), never the reservation's upper bound.
* **An answer cut off by the output limit** keeps its tool calls only as notes (they are incomplete:
  never run, never called malformed, never retried); the turn ends ``max_tokens``.
* **The turn's last answer** (no tool call to run) commits with the turn's end, which is the
  driver's next write, with nothing awaited before it (:meth:`agent.writer.DriverWriter.defer`):
  one transaction less per turn. A crash between the two leaves what a crash before the answer's
  commit left: a call without an outcome, charged its reservation.
* **An answer whose calls change nothing but through the driver** (each tool declares it,
  :attr:`agent.tools.base.Tool.effects_in_store`: reading a file, listing a directory, a goal's
  note, claim or question) is deferred the same way: its calls run, and it commits with the
  driver's next write (a result, the next call's reservation) or first in the transaction in which
  a call records its change (:meth:`agent.tools.base.ToolContext.transact`). So the rule of
  ``docs/architecture.md``'s invariant 12 holds in its purpose: no effect of a call is ever durable
  before the answer that asked for it. One transaction less per such step. A crash while its
  calls run leaves a call without an outcome, charged its reservation, and nothing it changed. An
  answer with any other call (a file written, a command, a subagent, an MCP tool) is durable
  before its calls run. The spend guard counts a deferred answer's call settled at once (what it
  spent is known when it answers), so the next reservation binds on it, not on its bound.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from functools import partial

from loguru import logger

from agent.attempts import Attempts
from agent.calls import CallId, OutOfTime
from agent.compaction import compact_view
from agent.messages import TextBlock, ToolUseBlock
from agent.models.base import (
    ConvMessage,
    FinishReason,
    Model,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    ModelResponse,
    drop_cut_calls,
)
from agent.models.classify import stated_window
from agent.models.windows import SERVER_REFUSAL
from agent.payloads import EndReason
from agent.turns import CANCELLED_TOOL_TEXT, OpenedTurn, TurnEnd

#: The ``error_kind`` of a turn that ended because its request cannot be made to fit the model's
#: window, even after compaction (the request is not sent; the error names the figures).
CONTEXT_TOO_SMALL = "context_too_small"
#: An empty answer (an HTTP 200 with no event) after a prompt whose likely size and output limit
#: reach this share of the window is taken for a prompt that did not fit (compact, retry once).
NEAR_WINDOW = 0.5
#: The largest share of the context window an answer may take: with a small window (a local
#: server's 2,048 tokens) the configured output limit would leave the prompt no room.
ANSWER_SHARE = 0.25


def output_limit(max_tokens: int, window: int) -> int:
    """The output limit of a call: ``max_tokens``, at most :data:`ANSWER_SHARE` of the window."""
    return max(16, min(max_tokens, int(window * ANSWER_SHARE)))


class _Next(enum.Enum):
    """What a step does after a failed attempt, when the turn goes on."""

    #: Compact the view, then try again (the provider refused the prompt as too long).
    COMPACT = "compact"
    #: Try again after the backoff.
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class _Attempt:
    """One reserved attempt of a step."""

    turn: OpenedTurn
    call_id: CallId
    number: int
    request: ModelRequest
    #: The reservation's prompt part: the upper bound of the prompt's tokens.
    bound: int


class ModelStep:
    """The model steps of one session's driver (see the module docstring)."""

    def __init__(self, attempts: Attempts) -> None:
        self.attempts = attempts

    async def run(self, turn: OpenedTurn) -> ModelResponse | TurnEnd:
        """One model step: the answer, committed and added to the view, or how the turn ends."""
        calls = self.attempts
        model = calls.agent.model
        await model.discover_window()  # once per model, where the configuration did not set it
        configured = calls.agent.config.max_tokens or model.max_tokens
        number = 0
        compact = refused = False
        while True:
            number += 1
            # Read at each attempt: a refusal may have taught the model its real window.
            max_tokens = output_limit(configured, model.context_window)
            request = await self._prepare(turn, max_tokens, compact)
            if isinstance(request, TurnEnd):
                return request
            compact = False
            bound = calls.history.estimator.bound(request.prompt_bytes)
            attempt = _Attempt(turn, CallId.new(), number, request, bound)
            held = await calls.reserve(turn, model, bound, max_tokens, number, attempt.call_id)
            if isinstance(held, TurnEnd):
                return held
            calls.stream = []
            try:
                response = await calls.complete_in_time(request, turn.turn_id)
            except OutOfTime as cut:
                await calls.cleanup(turn, CANCELLED_TOOL_TEXT, error_class="deadline")
                return TurnEnd(reason=EndReason.BUDGET, error=str(cut))
            except ModelError as exc:
                after = await self._failed(attempt, model, exc, refused)
                if after is _Next.COMPACT:
                    refused = compact = True
                if isinstance(after, TurnEnd):
                    return after
                continue
            return await self._accept(attempt, model, response)

    async def _prepare(self, turn: OpenedTurn, max_tokens: int, compact: bool) -> ModelRequest | TurnEnd:
        """The attempt's request, after a compaction when the view is too big (or was refused)."""
        calls = self.attempts
        request = calls.request(max_tokens)
        meter, window = calls.history.meter, calls.agent.model.context_window
        if compact or self._compacts(request, max_tokens):
            ended = await compact_view(calls, turn, request, max_tokens)
            if ended is not None:
                return ended
            request = calls.request(max_tokens)
        likely = meter.likely(request.prompt_bytes)
        if likely + max_tokens > window:
            # Even the fallback could not make it fit: a request estimated not to fit is never sent.
            model = calls.agent.model
            why = (
                f"the request (about {likely} tokens, and {max_tokens} for the answer) does not fit the model's"
                f" context window of {window} tokens ({model.window_source}), even after compaction"
            )
            logger.warning("session {}: {} ({})", calls.agent.session_id, why, model.spec)
            return TurnEnd(reason=EndReason.ERROR, error=f"{CONTEXT_TOO_SMALL}: {why}", error_kind=CONTEXT_TOO_SMALL)
        return request

    def _compacts(self, request: ModelRequest, max_tokens: int) -> bool:
        """Whether the view is compacted before this request: over the trigger, unless the last
        compaction freed too little and the view has not grown much since (and the request fits)."""
        calls = self.attempts
        meter, window = calls.history.meter, calls.agent.model.context_window
        if not meter.over(request.prompt_bytes, max_tokens, window, calls.agent.config.context):
            return False
        fits = meter.likely(request.prompt_bytes) + max_tokens <= window
        return not (fits and calls.history.holding_off(meter.estimate(request.prompt_bytes), window))

    async def _failed(self, attempt: _Attempt, model: Model, exc: ModelError, refused: bool) -> _Next | TurnEnd:
        """Settle a failed attempt and say whether the step goes on; backs off before a retry."""
        calls = self.attempts
        turn, call_id, number, bound = attempt.turn, attempt.call_id, attempt.number, attempt.bound
        # What the server could have processed of the prompt, if it began an answer and said nothing.
        likely = calls.history.meter.likely(attempt.request.prompt_bytes)
        if not refused and not calls.agent.is_stopping():
            overflow = self._overflow(model, attempt.request, exc, likely)
            if overflow is not None:
                # Not an error of the goal's: the estimate was low, or the window smaller than assumed.
                # Learn the window the server states, calibrate, compact, retry once.
                self._learn(model, attempt.request, overflow)
                await calls.settle_failed(
                    turn, call_id, overflow, attempt=number, retry=True, prompt_bound=bound, prompt_estimate=likely
                )
                return _Next.COMPACT
        retry = exc.retried_in_turn and calls.agent.config.retry.retries(number, exc.retry_after)
        retry = retry and not calls.agent.is_stopping()
        # Read now, as the failure left it: a goal does not count errors of a provider outage.
        breaker_open = getattr(model, "breaker_open", None)
        outage = bool(breaker_open()) if callable(breaker_open) else False
        await calls.settle_failed(
            turn,
            call_id,
            exc,
            attempt=number,
            retry=retry,
            prompt_bound=bound,
            breaker_open=outage,
            prompt_estimate=likely,
        )
        if not retry:
            return TurnEnd(reason=EndReason.ERROR, error=str(exc), error_kind=exc.kind.value)
        delay = calls.agent.config.retry.delay(number, exc.retry_after)
        left = calls.agent.guard.time_left()
        # Never sleep past the end of the time: the next reservation is refused then.
        await asyncio.sleep(delay if left is None else min(delay, max(left, 0.0)))
        return _Next.RETRY

    @staticmethod
    def _overflow(model: Model, request: ModelRequest, exc: ModelError, likely: int) -> ModelError | None:
        """The failure as a prompt that did not fit (``context_length``), if it is one: a refusal for
        length, or an empty answer (an HTTP 200 with no event) after a prompt near the window."""
        if exc.kind is ModelErrorKind.CONTEXT_LENGTH:
            return exc
        window = model.context_window
        if not exc.empty or likely + request.max_tokens < NEAR_WINDOW * window:
            return None
        why = (
            f"probable overflow: {exc.message}, after a prompt of about {likely} tokens (and {request.max_tokens}"
            f" for the answer) near the context window of {window} tokens ({model.window_source})"
        )
        return ModelError(ModelErrorKind.CONTEXT_LENGTH, why, status=exc.status, empty=True)

    def _learn(self, model: Model, request: ModelRequest, exc: ModelError) -> None:
        """What a refusal for length teaches: the server's window (used by compaction at once, recorded
        with its source) and the prompt's real size (the estimates calibrated with it). An empty answer
        states nothing: nothing is learned from it."""
        if exc.empty:
            return
        stated = exc.stated or stated_window(exc.message)
        if stated is not None and stated.window is not None:
            model.learn_window(stated.window, SERVER_REFUSAL)
        tokens = stated.prompt_tokens(request.max_tokens) if stated is not None else None
        self.attempts.history.meter.refused(request.prompt_bytes, tokens or model.context_window + 1)

    async def _accept(self, attempt: _Attempt, model: Model, response: ModelResponse) -> ModelResponse:
        """Commit an answer (settling its call), add it to the view and calibrate the estimates."""
        calls = self.attempts
        calls.stream = []
        content = response.content
        if response.finish_reason is FinishReason.MAX_TOKENS and any(isinstance(b, ToolUseBlock) for b in content):
            # Tool calls cut off by the output limit are incomplete: recorded as notes, never run.
            content = drop_cut_calls(content)
        if not content:
            content = [TextBlock(text="")]
        usage = response.usage
        cost = model.price.cost(usage) if model.price else 0.0
        commit = partial(
            calls.commit_answer,
            call_id=attempt.call_id,
            turn_id=attempt.turn.turn_id,
            content=content,
            finish=response.finish_reason.value,
            usage=usage,
            cost=cost,
        )
        uses = [b.name for b in content if isinstance(b, ToolUseBlock)]
        if uses and not calls.agent.tools.effects_in_store(uses):
            await calls.write(commit)  # durable before its calls run (the module docstring)
        else:
            # The turn ends, or only calls that change nothing but through the driver follow:
            # committed with the next write (the turn's end; the calls' results or what one of them
            # records first, in the same transaction).
            calls.writer.defer(commit)
            if uses:
                # Settled in the guard now, as at the commit: the next call's reservation, checked
                # before the write that carries this answer, binds on what this call really spent.
                calls.agent.guard.settle(attempt.call_id, usage.total, cost)
        prompt_bytes = attempt.request.prompt_bytes
        if not response.estimated:  # an estimate of goald's own would calibrate nothing
            calls.history.estimator.observe(prompt_bytes, usage.prompt_tokens)
            calls.history.meter.observe(prompt_bytes, usage)
        calls.history.append(ConvMessage(role="assistant", content=content))
        if content is not response.content:
            response = response.model_copy(update={"content": content})
        return response
