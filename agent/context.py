"""The model's view of a session, its size, and compaction.

The event log is the truth and is never rewritten; the model sees a *view* of it. Without a
compaction the view is every history event in order (:func:`history_message`). A durable
``context/compacted`` event (:class:`~agent.payloads.ContextCompacted`) changes the view: history
events up to its ``through_seq`` are replaced by one user message carrying its summary, and the
results of the tool calls it lists are elided (head and tail kept, a marker between). The latest
such event alone defines the view, so a restart rebuilds exactly the view the driver had
(:func:`load_view`), and a compaction is one transaction: a crash leaves the view with it or
without it, never half of it.

Decisions, and why:

* **Size.** No tokenizer (none that downloads data at run time): a prompt's size is the provider's
  reported prompt tokens of the last call plus an upper bound of what was added since, bytes times
  the model's calibrated ratio (:class:`ContextMeter`). Right after a compaction (or a restart) there
  is no last call, and the whole prompt is bounded from its bytes.
* **When.** Before each model call, when the estimate passes ``compact_at`` of the window (default
  80%), or when it and the call's output limit together would not fit the window.
* **What.** The older part of the view is summarized by a model call (the session's own model, or a
  cheaper ``summary_model``), charged to the session's spend guard and checked before the call like
  any other. The newest turns stay verbatim: the kept part starts at a message that is not a tool
  result (a call and its result are never split) and always includes the newest user message,
  where a goal's card (its continuation: objective, round, budget left, notes) rides, so no
  compaction can make the agent forget its goal. The summary request is the older part itself with
  the session's system prompt and tools, plus one instruction: it extends a prefix the provider
  has just seen, so a prompt cache applies to it too.
* **Fallback.** When the summary call fails (or its request would not fit the summarizing model's
  window): large tool results are elided first, oldest first; then, if the view still does not fit,
  the oldest turns are dropped, with a marker saying so (the previous summary, if any, is kept). The
  system prompt and the newest user message are never dropped.
* **A turn that outgrows the window** (one user message, then thousands of tool calls): once the
  turns before its newest user message are gone, its own oldest steps are left out, whole (a call
  and its results together, cut only before an assistant message), the user message that opened it
  kept verbatim, with ONE note after it counting what was left out (replaced at each compaction,
  never appended to), so a turn of any length fits. The stored events of that part are not read again.
* **Prefix stability.** Between compactions the view only grows at its end, so each request extends
  the previous one byte for byte; the driver starts a fresh :class:`~agent.models.base.WireCache`
  at a compaction, the only point where the prefix changes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from agent.events import HISTORY_TYPES, Event, EventType
from agent.messages import TextBlock, ToolResultBlock, content_from_python
from agent.models.base import ConvMessage, message_bytes
from agent.payloads import ContextCompacted
from agent.spend import PromptEstimator, Usage
from agent.store import Store

COMPACTED = EventType.CONTEXT_COMPACTED
#: The system prompt of a summary call made with a dedicated summary model.
SUMMARY_INSTRUCTION = (
    "The conversation above is being compacted to fit the context window: it will be replaced by your "
    "summary. Write that summary now, as plain text, without calling any tool. Keep what the work needs "
    "to go on: the task and its constraints, decisions made and why, what was done (files, commands, "
    "results), what failed, open questions and the next steps. Quote exact names, paths and numbers."
)
SUMMARY_HEADER = "[Summary of the earlier conversation, compacted to fit the context window]\n"
DROPPED_NOTE = "[{n} earlier message(s) were left out to fit the context window; no summary of them could be made]"
#: The note a previous fallback left at the end of the summary (its count is read back).
_DROPPED_TAIL = re.compile("(?:\n\n)?" + re.escape(DROPPED_NOTE).replace(re.escape("{n}"), r"(\d+)") + "$")
STEPS_NOTE = (
    "[{n} earlier message(s) of this turn (tool calls and their results) were left out to fit the context"
    " window; the work they did is in the files and the state they changed]"
)
ELIDED_MARK = "\n[... {n} characters elided to fit the context window ...]\n"
PAGE = 5000


class ContextPolicy(BaseModel):
    """When and how a session's view is compacted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Compact when the estimated prompt passes this share of the model's context window.
    compact_at: float = Field(default=0.8, gt=0, le=1)
    #: Share of the window the whole prompt (system prompt, tools, summary, newest turns) aims at after
    #: a compaction: well below ``compact_at``, so the next compaction is many turns away and the
    #: provider's prompt cache holds between them. The newest user message and what follows it are
    #: kept whatever their size.
    compact_to: float = Field(default=0.4, gt=0, lt=1)
    #: Share of the window a summary may take (also capped by ``summary_max_tokens`` and the
    #: summarizing model's own output limit).
    summary_share: float = Field(default=0.1, gt=0, lt=1)
    #: The summary's output limit in tokens.
    summary_max_tokens: int = Field(default=2048, ge=16)
    #: The fallback elides tool results longer than this many characters...
    elide_over: int = Field(default=2000, ge=64)
    #: ... keeping this many characters of their head and as many of their tail.
    elide_keep: int = Field(default=400, ge=0)


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of the view and the sequence number of the event it comes from."""

    seq: int
    msg: ConvMessage
    #: The summary message (its ``seq`` is the boundary it covers).
    summary: bool = False


def history_message(event: Event) -> ConvMessage | None:
    """The conversation message an event contributes, if any."""
    data = event.data
    if event.type == EventType.MESSAGE_ADMITTED:
        return ConvMessage(role="user", content=content_from_python(data["content"]))
    if event.type == EventType.ASSISTANT_MESSAGE:
        return ConvMessage(role="assistant", content=content_from_python(data["content"]))
    if event.type == EventType.TOOL_RESULT:
        block = ToolResultBlock(tool_use_id=data["toolUseId"], content=data["content"], is_error=data["isError"])
        return ConvMessage(role="tool", content=[block])
    return None


def dropped_summary(previous: str | None, dropped: int) -> str:
    """The summary after a fallback dropped ``dropped`` more messages: the previous summary with ONE
    note of every message dropped so far (a note the previous one carried is counted in and replaced,
    never appended to), so the note stays bounded however many compactions drop."""
    before = 0
    if previous is not None and (m := _DROPPED_TAIL.search(previous)):
        before, previous = int(m.group(1)), previous[: m.start()]
    note = DROPPED_NOTE.format(n=before + dropped)
    return f"{previous}\n\n{note}" if previous else note


def elide(text: str, keep: int) -> str:
    """``text`` with its middle replaced by a marker, ``keep`` characters of head and tail kept."""
    cut = len(text) - 2 * keep
    if cut <= len(ELIDED_MARK) + 8:
        return text
    return text[:keep] + ELIDED_MARK.format(n=cut) + (text[-keep:] if keep else "")


def _elided(msg: ConvMessage, ids: set[str], keep: int) -> ConvMessage:
    blocks = [
        ToolResultBlock(tool_use_id=b.tool_use_id, content=elide(b.content, keep), is_error=b.is_error)
        if isinstance(b, ToolResultBlock) and b.tool_use_id in ids
        else b
        for b in msg.content
    ]
    return ConvMessage(role=msg.role, content=blocks)


def summary_message(summary: str) -> ConvMessage:
    """The user message that stands for the summarized part of the conversation."""
    return ConvMessage(role="user", content=[TextBlock(text=SUMMARY_HEADER + summary)])


def _steps(compaction: ContextCompacted | None) -> tuple[int, int] | None:
    """The part of a turn ``compaction`` leaves out, as ``(from, through]`` sequence numbers (if any)."""
    if compaction is None or compaction.steps_through_seq <= max(compaction.through_seq, compaction.steps_from_seq):
        return None
    return compaction.steps_from_seq, compaction.steps_through_seq


def _steps_entry(compaction: ContextCompacted) -> Entry:
    note = STEPS_NOTE.format(n=compaction.steps_dropped)
    return Entry(compaction.steps_through_seq, ConvMessage(role="user", content=[TextBlock(text=note)]), summary=True)


def _with_steps(compaction: ContextCompacted, entries: Iterable[Entry]) -> list[Entry]:
    """``entries`` (after the summary) without the steps ``compaction`` leaves out, its note in their place."""
    out: list[Entry] = []
    span = _steps(compaction)
    placed = span is None
    for entry in entries:
        if span is not None and span[0] < entry.seq <= span[1]:
            continue
        if not placed and span is not None and entry.seq > span[1]:
            out.append(_steps_entry(compaction))
            placed = True
        out.append(entry)
    if not placed:
        out.append(_steps_entry(compaction))
    return out


def build_view(compaction: ContextCompacted | None, events: Iterable[Event]) -> list[Entry]:
    """The model's view from the latest compaction and the history events after its boundary."""
    out: list[Entry] = []
    through, ids, keep = 0, set[str](), 0
    if compaction is not None:
        through, ids, keep = compaction.through_seq, set(compaction.elided), compaction.elide_keep
    for event in events:
        if event.seq <= through:
            continue
        msg = history_message(event)
        if msg is None:
            continue
        if ids and msg.role == "tool":
            msg = _elided(msg, ids, keep)
        out.append(Entry(event.seq, msg))
    if compaction is None:
        return out
    head = [Entry(through, summary_message(compaction.summary), summary=True)] if compaction.summary is not None else []
    return head + _with_steps(compaction, out)


async def latest_compaction(store: Store, session_id: str) -> ContextCompacted | None:
    """The session's latest ``context/compacted`` event, if any."""
    latest: ContextCompacted | None = None
    after = 0
    while True:
        page = await store.events_after(session_id, after, limit=PAGE, types=(COMPACTED,))
        for event in page:
            if isinstance(event.payload, ContextCompacted):
                latest = event.payload
            after = event.seq
        if len(page) < PAGE:
            return latest


async def load_view(store: Store, session_id: str) -> tuple[ContextCompacted | None, list[Entry]]:
    """The latest compaction and the view it makes of the stored history (what a restart sees)."""
    compaction = await latest_compaction(store, session_id)
    events: list[Event] = []
    after = compaction.through_seq if compaction is not None else 0
    skip = _steps(compaction)  # the steps left out of a long turn are not read
    while True:
        page = await store.events_after(session_id, after, limit=PAGE, types=HISTORY_TYPES)
        if skip is not None and page and page[-1].seq > skip[0]:
            events.extend(e for e in page if e.seq <= skip[0])
            after, skip = max(after, skip[1]), None
            continue
        events.extend(page)
        if page:
            after = page[-1].seq
        if len(page) < PAGE:
            return compaction, build_view(compaction, events)


# -- the estimate --------------------------------------------------------------------------------


class ContextMeter:
    """A session's prompt-size estimate: the last reported prompt tokens plus a bound of what was added."""

    def __init__(self, estimator: PromptEstimator) -> None:
        self.estimator = estimator
        self._last: tuple[int, int] | None = None

    def estimate(self, prompt_bytes: int) -> int:
        """Estimated prompt tokens of a prompt of ``prompt_bytes`` bytes that extends the last one."""
        last = self._last
        if last is None or prompt_bytes < last[0]:
            return self.estimator.bound(prompt_bytes)
        return last[1] + math.ceil((prompt_bytes - last[0]) * self.estimator.ratio)

    def observe(self, prompt_bytes: int, usage: Usage) -> None:
        """A call with a prompt of ``prompt_bytes`` bytes reported ``usage``."""
        if usage.prompt_tokens > 0:
            self._last = (prompt_bytes, usage.prompt_tokens)

    def reset(self) -> None:
        """The view changed (compaction, reload): the next estimate is a bound from bytes alone."""
        self._last = None

    def likely(self, prompt_bytes: int) -> int:
        """The likely prompt tokens of a prompt of ``prompt_bytes`` bytes (the running ratio for what
        was added since the last reported call): whether a request fits the window is decided on it."""
        last = self._last
        if last is None or prompt_bytes < last[0]:
            return self.estimator.likely(prompt_bytes)
        return last[1] + math.ceil((prompt_bytes - last[0]) * self.estimator.typical_ratio)

    def refused(self, prompt_bytes: int, tokens: int) -> None:
        """The provider refused a prompt of ``prompt_bytes`` bytes as too long, having counted ``tokens``
        (as its answer states them, else at least the window).

        The estimate was too low: calibrate it, so later prompts are bounded higher.
        """
        self.estimator.observe(prompt_bytes, tokens)
        self._last = None

    def over(self, prompt_bytes: int, max_tokens: int, window: int, policy: ContextPolicy) -> bool:
        """Whether a prompt of ``prompt_bytes`` bytes calls for a compaction first."""
        tokens = self.estimate(prompt_bytes)
        return tokens > policy.compact_at * window or tokens + max_tokens > window


# -- planning ------------------------------------------------------------------------------------


def newest_user(view: Sequence[Entry]) -> int | None:
    """Index of the newest user message of the view that is not the summary (never compacted away)."""
    for i in range(len(view) - 1, -1, -1):
        if view[i].msg.role == "user" and not view[i].summary:
            return i
    return None


def _cuts(view: Sequence[Entry]) -> list[int]:
    """Where the view may be cut (``view[:k]`` replaced): never before a tool result, never past
    the newest user message, and only when something besides the summary lies before the cut."""
    limit = newest_user(view)
    if limit is None:
        limit = len(view) - 1
    out = []
    for k in range(1, limit + 1):
        if view[k].msg.role == "tool":
            continue
        if any(not e.summary for e in view[:k]):
            out.append(k)
    return out


def choose_cut(
    view: Sequence[Entry],
    keep_bytes: int,
    size: Callable[[ConvMessage], int] = message_bytes,
    older_bytes: int | None = None,
) -> int | None:
    """The cut for a summary: the earliest one that leaves at most ``keep_bytes`` verbatim, else the
    latest one there is (``None``: nothing can be summarized). With ``older_bytes``, the part to
    summarize must also fit that many bytes (the summary request has to fit its model's window): the
    cut moves earlier, keeping more verbatim, rather than making a request that cannot be sent."""
    cuts = _cuts(view)
    if not cuts:
        return None
    sizes = [size(e.msg) for e in view]
    chosen = cuts[-1]
    for k in cuts:
        if sum(sizes[k:]) <= keep_bytes:
            chosen = k
            break
    if older_bytes is not None:
        fitting = [k for k in cuts if k <= chosen and sum(sizes[:k]) <= older_bytes]
        if fitting:
            return fitting[-1]
    return chosen


@dataclass(frozen=True, slots=True)
class Fallback:
    """What the fallback did: the tool results elided and, if turns were dropped, the cut."""

    elided: list[str]
    cut: int | None
    #: The running turn's steps left out: ``view[newest user + 1 : steps]`` (``None``: none).
    steps: int | None = None


def plan_fallback(
    view: Sequence[Entry],
    budget_bytes: int,
    policy: ContextPolicy,
    size: Callable[[ConvMessage], int] = message_bytes,
    steps_budget: int | None = None,
) -> Fallback:
    """Make the view fit ``budget_bytes``: elide large tool results oldest first, then drop the oldest
    turns, then (when the running turn alone is too big) its oldest steps, down to ``steps_budget``."""
    sizes = [size(e.msg) for e in view]
    total = sum(sizes)
    elided: list[str] = []
    for i, entry in enumerate(view):
        if total <= budget_bytes:
            break
        for block in entry.msg.content:
            if isinstance(block, ToolResultBlock) and len(block.content) > policy.elide_over:
                shorter = len(elide(block.content, policy.elide_keep))
                if shorter < len(block.content):
                    elided.append(block.tool_use_id)
                    total -= len(block.content) - shorter
                    sizes[i] -= len(block.content) - shorter
    if total <= budget_bytes:
        return Fallback(elided, None)
    cuts = _cuts(view)
    for k in cuts:
        if sum(sizes[k:]) + len(DROPPED_NOTE) + 64 <= budget_bytes:
            return Fallback(elided, k)
    cut = cuts[-1] if cuts else None
    return Fallback(elided, cut, _steps_cut(view, sizes, cut, steps_budget or budget_bytes))


def _steps_cut(view: Sequence[Entry], sizes: list[int], cut: int | None, budget_bytes: int) -> int | None:
    """Where the running turn's oldest steps end when even the turns before it are gone (``None``:
    nothing to leave out): before an assistant message (a call and its results stay together), the
    newest user message and the newest step kept, the earliest that fits ``budget_bytes``."""
    u = newest_user(view)
    if u is None:
        return None
    head = sum(sizes[cut or 0 : u + 1]) + len(STEPS_NOTE) + 16 + (len(DROPPED_NOTE) + 64 if cut else 0)
    starts = [j for j in range(u + 1, len(view)) if view[j].msg.role == "assistant" and not view[j].summary]
    # Only where a message of the turn is left out, and never the newest step.
    starts = [j for j in starts[:-1] if any(not e.summary for e in view[u + 1 : j])]
    for j in starts:
        if head + sum(sizes[j:]) <= budget_bytes:
            return j
    return starts[-1] if starts else None


def apply(view: Sequence[Entry], compaction: ContextCompacted) -> list[Entry]:
    """What ``view`` becomes under ``compaction`` (for planning; the driver then reloads the view
    from the store, exactly as a restart would)."""
    out: list[Entry] = []
    ids = set(compaction.elided)
    for entry in view:
        if entry.summary or entry.seq <= compaction.through_seq:
            continue
        msg = _elided(entry.msg, ids, compaction.elide_keep) if ids and entry.msg.role == "tool" else entry.msg
        out.append(Entry(entry.seq, msg))
    summary = compaction.summary
    head = [] if summary is None else [Entry(compaction.through_seq, summary_message(summary), summary=True)]
    return head + _with_steps(compaction, out)


def tool_ids(view: Iterable[Entry]) -> set[str]:
    """The tool calls whose results are in ``view``."""
    return {b.tool_use_id for e in view for b in e.msg.content if isinstance(b, ToolResultBlock)}
