"""The compaction step of a running turn: summarize the older view, else elide and drop.

:mod:`agent.context` holds the rules (the view, the estimate, where to cut, the fallback plan) as
pure functions; this module carries them out for one session's driver before a model call, with
the driver's own writes, reservations and call machinery, so a summary call is checked, reserved,
time-bound and charged exactly like a turn's call. It is a separate module so that the driver stays
about turns; what it gets of the driver is its :class:`~agent.attempts.Attempts` (the model-call
machinery, with the agent's parts read live through ``attempts.agent``), never its private parts.

Decisions, and why:

* **Down to a target, not just under the trigger.** A compaction aims at ``compact_to`` of the
  window for the whole prompt (system prompt and tools included), leaving the room between it and
  ``compact_at`` for the turns that follow: compacting just under the trigger would compact again a
  round or two later, and every compaction breaks the provider's prompt cache. The verbatim part
  gets what the target leaves after the fixed part and the summary's limit (``summary_share`` of the
  window), and at least the newest user message and what follows it.
* **Fallback to the same target** when the summary call fails or would not fit.
* **One transaction** writes the ``context/compacted`` event and settles the summary call, so a
  crash leaves the compaction whole or absent; the driver then reloads its view from the store,
  exactly as a restart would, and starts a fresh wire cache (the prompt's prefix changed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from loguru import logger

from agent.attempts import Attempts, nothing
from agent.calls import CallId, OutOfTime, settle_call
from agent.context import (
    COMPACTED,
    SUMMARY_INSTRUCTION,
    Entry,
    apply,
    choose_cut,
    dropped_summary,
    load_view,
    newest_user,
    plan_fallback,
    tool_ids,
)
from agent.messages import TextBlock
from agent.models.base import (
    ConvMessage,
    FinishReason,
    Model,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    message_bytes,
    specs_size,
)
from agent.payloads import ContextCompacted, EndReason
from agent.spend import Usage, estimator_for
from agent.turns import CANCELLED_TOOL_TEXT, OpenedTurn, TurnEnd
from agent.tx import Tx

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, slots=True)
class Summary:
    """A summary call's outcome."""

    text: str
    call_id: str
    usage: Usage
    cost: float
    model: Model


def summary_limit(host: Attempts, model: Model) -> int:
    """The output limit of a summary call: the policy's, the model's, and a share of the window."""
    policy = host.agent.config.context
    share = max(16, int(host.agent.model.context_window * policy.summary_share))
    return min(policy.summary_max_tokens, model.max_tokens, share)


async def compact_view(host: Attempts, turn: OpenedTurn, request: ModelRequest, max_tokens: int) -> TurnEnd | None:
    """Make the agent's view smaller before a call: summarize its older part, else elide and drop.

    Returns a :class:`TurnEnd` when the turn must end (the guard refused the summary call, its time
    ran out); otherwise the view is replaced (or left as it is when nothing can shrink it).
    """
    # A step's tool result is committed with the next write: flush it, the view is read from the store.
    await host.write(nothing)
    previous, view = await load_view(host.agent.store, host.agent.session_id)
    before = host.history.meter.estimate(request.prompt_bytes)
    sizes = _sizes(host, request, view, max_tokens)
    fixed, ratio, target, fits = sizes.fixed, sizes.ratio, sizes.target, sizes.fits
    prev_summary = previous.summary if previous is not None else None
    base = {"turn_id": turn.turn_id, "elide_keep": host.agent.config.context.elide_keep, "tokens_before": before}
    if previous is not None:  # the steps of a long turn left out so far (dropped from the record once passed)
        base |= previous.model_dump(include={"steps_from_seq", "steps_through_seq", "steps_dropped"})
    record: ContextCompacted | None = None
    cut = choose_cut(view, sizes.keep_bytes, older_bytes=sizes.older_bytes)
    if cut is not None:
        done = await summarize(host, turn, view[:cut])
        if isinstance(done, TurnEnd):
            return done
        if done is not None:
            record = _summary_record(base, view, cut, previous, done)
            view = apply(view, record)
            prev_summary = done.text
    failed = cut is not None and record is None
    budget_bytes = int((target if failed else max(target, fits)) / ratio) - fixed
    if sum(message_bytes(e.msg) for e in view) > budget_bytes:
        steps_budget = int(target / ratio) - fixed  # a long turn's steps: down to the target
        record, view = _fall_back(view, budget_bytes, host, base, previous, record, prev_summary, steps_budget)
    if record is None:
        # Not a warning, and not tried again at every step: the step waits until the view has grown.
        host.history.gave_up(before)
        logger.info("session {}: the view cannot be compacted further (~{} tokens)", host.agent.session_id, before)
        return None
    after = int((fixed + sum(message_bytes(e.msg) for e in view)) * ratio)
    record = record.model_copy(update={"tokens_after": after})
    await host.write(partial(commit, host, record=record))
    logger.info(
        "session {}: context compacted ({}): {} message(s) through seq {}, ~{} -> ~{} tokens",
        host.agent.session_id,
        record.mode,
        record.messages,
        record.through_seq,
        before,
        after,
    )
    # The view as a restart rebuilds it; the prefix changed, so the wire form starts afresh.
    await host.history.reload()
    if after > host.agent.config.context.compact_at * host.agent.model.context_window:
        host.history.gave_up(after)  # freed too little: not again before the view has grown
    return None


def _summary_record(
    base: dict[str, Any], view: list[Entry], cut: int, previous: ContextCompacted | None, done: Summary
) -> ContextCompacted:
    """The record of a compaction that summarized ``view[:cut]``."""
    kept = view[cut:]
    elided = [i for i in (previous.elided if previous else []) if i in tool_ids(kept)]
    if base.get("steps_through_seq", 0) <= view[cut - 1].seq:  # the summary covers them
        base = base | {"steps_from_seq": 0, "steps_through_seq": 0, "steps_dropped": 0}
    return ContextCompacted(
        **base,
        mode="summary",
        through_seq=view[cut - 1].seq,
        summary=done.text,
        elided=elided,
        messages=sum(1 for e in view[:cut] if not e.summary),
        model=done.model.spec,
        call_id=done.call_id,
        usage=done.usage,
        cost=done.cost,
    )


@dataclass(frozen=True, slots=True)
class _Sizes:
    """What a compaction aims at, in tokens and model-neutral bytes (see :func:`_sizes`)."""

    fixed: int  # bytes of the system prompt and tool specs (never compacted)
    ratio: float  # tokens per model-neutral byte
    target: float  # tokens the whole prompt aims at after the compaction
    fits: float  # tokens below which the fallback leaves the view alone
    keep_bytes: int  # bytes of the verbatim part
    older_bytes: int  # bytes of the older part a summary request may carry


def _sizes(host: Attempts, request: ModelRequest, view: list[Entry], max_tokens: int) -> _Sizes:
    policy, window = host.agent.config.context, host.agent.model.context_window
    fixed = len(host.agent.config.system or "") + specs_size(request.tools)
    neutral = fixed + sum(message_bytes(e.msg) for e in view)
    # Tokens per model-neutral byte, as this model measures and the calibration bounds it.
    ratio = host.history.estimator.ratio * max(1.0, request.prompt_bytes / max(neutral, 1))
    # The whole prompt after the compaction aims at ``compact_to`` of the window (never past the
    # room the output limit leaves); the verbatim part gets what the fixed part and the summary leave.
    target = min(policy.compact_to * window, policy.compact_at * window, window - max_tokens)
    summary_room = summary_limit(host, host.agent.summary_model or host.agent.model)
    keep_bytes = max(0, int((target - summary_room) / ratio) - fixed)
    # The fallback aims at the target when the summary call failed; otherwise it only trims what
    # still would not leave room below the trigger (the verbatim turns stay whole where they can).
    fits = min(policy.compact_at * window, window - max_tokens) * 0.75
    # What the summary request may carry of the older part: its model's window less the output
    # limit, the fixed part and the instruction, at that model's calibrated ratio (with a margin).
    smodel = host.agent.summary_model or host.agent.model
    sratio = estimator_for(smodel.spec).ratio * ratio / host.history.estimator.ratio
    room = (smodel.context_window - summary_room - 64) / (sratio * 1.1)
    older_bytes = max(0, int(room) - fixed - len(SUMMARY_INSTRUCTION))
    return _Sizes(fixed, ratio, target, fits, keep_bytes, older_bytes)


def _fall_back(
    view: list[Entry],
    budget_bytes: int,
    host: Attempts,
    base: dict[str, Any],
    previous: ContextCompacted | None,
    record: ContextCompacted | None,
    prev_summary: str | None,
    steps_budget: int | None = None,
) -> tuple[ContextCompacted | None, list[Entry]]:
    """Elide large tool results, then drop the oldest turns, until the view fits ``budget_bytes``;
    then, if the running turn alone is too big, its oldest steps down to ``steps_budget``."""
    fb = plan_fallback(view, budget_bytes, host.agent.config.context, steps_budget=steps_budget)
    if not fb.elided and fb.cut is None and fb.steps is None:
        return record, view
    start = record if record is not None else previous
    elided = [i for i in (start.elided if start else []) if i in tool_ids(view)] + fb.elided
    update: dict[str, Any] = {"elided": elided}
    dropped = 0
    if fb.cut is not None:
        dropped = sum(1 for e in view[: fb.cut] if not e.summary)
        update |= {
            "mode": "dropped",
            "through_seq": view[fb.cut - 1].seq,
            "summary": dropped_summary(prev_summary, dropped),
        }
    if record is not None:
        record = record.model_copy(update=update)
    else:
        through = previous.through_seq if previous else 0
        fields: dict[str, Any] = {"mode": "elided", "through_seq": through, "summary": prev_summary}
        record = ContextCompacted(**(base | fields | update))
    if fb.steps is not None:
        u = newest_user(view)
        assert u is not None
        left = sum(1 for e in view[u + 1 : fb.steps] if not e.summary)
        # ONE note for the turn: its count carries the previous one's (replaced, never appended to).
        same = start is not None and start.steps_from_seq == view[u].seq
        update = {
            "mode": "dropped",
            "steps_from_seq": view[u].seq,
            "steps_through_seq": view[fb.steps - 1].seq,
            "steps_dropped": (start.steps_dropped if same and start else 0) + left,
        }
        record = record.model_copy(update=update)
        dropped += left
    if dropped:
        record = record.model_copy(update={"messages": record.messages + dropped})
    return record, apply(view, record)


def commit(host: Attempts, tx: Tx, *, record: ContextCompacted) -> None:
    """Write the ``context/compacted`` event and settle its summary call, in one transaction."""
    data = record.model_dump(by_alias=True, exclude={"type"}, exclude_none=True, mode="json")
    if record.call_id is not None:
        usage, cost, call_id, guard = record.usage or Usage(), record.cost, record.call_id, host.agent.guard
        settle_call(tx, call_id, usage, cost)
        tx.after_commit(lambda: guard.settle(call_id, usage.total, cost))
    tx.emit(host.agent.session_id, COMPACTED, data)


async def summarize(host: Attempts, turn: OpenedTurn, older: list[Entry]) -> Summary | TurnEnd | None:
    """The summary of ``older`` by a model call, charged like any other; ``None`` when it failed or
    would not fit the summarizing model's window (the caller falls back)."""
    model = host.agent.summary_model or host.agent.model
    limit = summary_limit(host, model)
    ask = ConvMessage(role="user", content=[TextBlock(text=SUMMARY_INSTRUCTION)])
    request = ModelRequest(
        host.agent.config.system,
        tuple([e.msg for e in older] + [ask]),
        host.agent.tools.specs(),
        limit,
        purpose="summary",
    )
    request = dataclasses.replace(request, prompt_bytes=model.measure(request))
    estimator = estimator_for(model.spec)
    bound = estimator.bound(request.prompt_bytes)
    if bound + limit > model.context_window:
        logger.info("session {}: the summary request (~{} tokens) would not fit", host.agent.session_id, bound)
        return None
    call_id = CallId.new()
    held = await host.reserve(turn, model, bound, limit, 1, call_id)
    if isinstance(held, TurnEnd):
        return held
    try:
        response = await host.complete_in_time(request, turn.turn_id, model, quiet=True)
    except OutOfTime as cut:
        await host.cleanup(turn, CANCELLED_TOOL_TEXT, error_class="deadline")
        return TurnEnd(reason=EndReason.BUDGET, error=str(cut))
    except ModelError as exc:
        logger.warning("session {}: the summary call failed ({}); falling back", host.agent.session_id, exc)
        likely = estimator.likely(request.prompt_bytes)
        await host.settle_failed(turn, call_id, exc, attempt=1, retry=False, prompt_bound=bound, prompt_estimate=likely)
        return None
    usage = response.usage
    cost = model.price.cost(usage) if model.price else 0.0
    estimator.observe(request.prompt_bytes, usage.prompt_tokens)
    text = "".join(b.text for b in response.content if isinstance(b, TextBlock)).strip()
    if not text or response.finish_reason is not FinishReason.END_TURN:
        # Settled with a ``model/error`` event like any failed attempt, so whoever counts the session's
        # spend from its events (a goal) sees these tokens too, not only the guard.
        unusable = ModelError(ModelErrorKind.MALFORMED, "the summary call gave no usable summary", usage=usage)
        await host.settle_failed(turn, call_id, unusable, attempt=1, retry=False, prompt_bound=bound)
        return None
    return Summary(text, call_id, usage, cost, model)
