"""Invariant 4, no stranded input: a waking message made durable at any instant is admitted
without any further message, and ``status`` never reads idle while one is queued.

The classic race is a follow-up enqueued after the driver's last inbox check and before its idle
commit. goald closes it in two places (see :mod:`agent.inbox` and ``Agent._run``): the check and
the idle commit are one transaction (``settle_idle``), and an enqueue that commits after it flips
the status back to ``running`` itself and sets the driver's wake flag, which the driver checks
before it sleeps. These tests aim follow-ups at every side of those steps:

* (a) from a ``turn/end`` subscriber — a store hub listener and a resumable subscription;
* (b) from a callback scheduled with ``loop.call_soon`` when the turn's last assistant message
  commits, i.e. just before the driver's closing transaction, then delayed by 0, 1, 2, …
  event-loop yields so the enqueue sweeps across the driver's closing transaction, its
  resumption, the wake-flag check and the driver's sleep (with and without a stale wake flag
  left by steering admitted mid-turn);
* (c) from a concurrent task at random moments (fixed seed, 300 iterations; the ``soak`` marker
  runs the full 1,000 of the same seeded sequence) while a scripted
  model answers at once or after tiny delays and asks for random tool calls;
* (d) while ``interrupt()`` settles: from a racing task, from listeners on the interrupted
  turn's cleanup and ``turn/end`` (keeping or discarding queued input), with an interrupt that
  lands as the turn opens, with a second interrupt during the first one's cleanup, and with
  interrupts and follow-ups at random moments (100 rounds; 300 in the soak).

Every test runs with an :class:`IdleChecker` on the store's hub: on each committed ``status``
idle event it reads the committed state through a second connection (SQLite's WAL readers and
PostgreSQL's autocommit reads see committed data) and records a violation if a waking message was
queued at that sequence number.

The module is part of the store contract: every test runs on SQLite and on PostgreSQL. The two
random campaigns run their full counts on SQLite and fewer rounds on PostgreSQL in CI (every
transaction there is a round trip to the server and the checker's reads are too), which keeps the
suite's runtime down; the ``soak`` marker runs the full counts (1,000 and 300) on both stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import storekit
from pydantic import BaseModel
from storekit import Location

from agent import (
    AgentStatus,
    Event,
    EventType,
    FinishReason,
    FunctionTool,
    MessageId,
    ModelErrorKind,
    ModelRequest,
    Reply,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolCall,
    ToolContext,
)
from agent.driver import Agent

#: The store contract: every test here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.both_stores

WAKING = ("followup", "steer")
TIMEOUT = 10.0


# -- the idle checker ----------------------------------------------------------------------------


class IdleChecker:
    """A hub listener: at every committed idle status, no waking message may be queued.

    It replays, through its own connection, the session's committed events up to the idle
    event's sequence number (the inbox state as of that commit, exactly), and also asks the
    inbox table directly for waking messages queued before that sequence number that are still
    queued now (which, if any, were certainly queued at the idle commit too).
    """

    def __init__(self, location: Location) -> None:
        self.conn = storekit.connect(location)
        self.checked = 0
        self.violations: list[str] = []
        self._replayed: dict[str, int] = {}
        self._queued: dict[str, set[str]] = {}

    def __call__(self, event: Event) -> None:
        if event.type != EventType.STATUS or event.data.get("status") != "idle":
            return
        try:
            self._check(event.session_id, event.seq)
        except Exception as exc:  # the hub swallows listener errors; keep them for the test
            self.violations.append(f"checker failed at {event.session_id}#{event.seq}: {exc!r}")

    def _check(self, sid: str, seq: int) -> None:
        last = self._replayed.get(sid, 0)
        queued = self._queued.setdefault(sid, set())
        rows = self.conn.execute(
            "SELECT seq, type, data FROM events WHERE session_id=? AND seq>? AND seq<=? ORDER BY seq",
            (sid, last, seq),
        ).fetchall()
        if [r["seq"] for r in rows] != list(range(last + 1, seq + 1)):
            self.violations.append(f"{sid}: events {last + 1}..{seq} are not all committed when idle is published")
        for r in rows:
            data = json.loads(r["data"])
            if r["type"] == EventType.MESSAGE_QUEUED and data["delivery"] in WAKING:
                queued.add(data["messageId"])
            elif r["type"] in (EventType.MESSAGE_ADMITTED, EventType.MESSAGE_CANCELLED):
                queued.discard(data["messageId"])
        self._replayed[sid] = seq
        if queued:
            self.violations.append(f"{sid}: idle committed at seq {seq} while {sorted(queued)} were queued")
        still = self.conn.execute(
            "SELECT id FROM inbox WHERE session_id=? AND fate='queued' AND delivery IN (?, ?) AND queued_seq<?",
            (sid, *WAKING, seq),
        ).fetchall()
        if still:
            self.violations.append(f"{sid}: idle at seq {seq}, yet {[r['id'] for r in still]} queued before it")
        self.checked += 1

    def queued_waking(self, sid: str) -> list[str]:
        """Waking messages of ``sid`` queued now (committed state)."""
        rows = self.conn.execute(
            "SELECT id FROM inbox WHERE session_id=? AND fate='queued' AND delivery IN (?, ?)", (sid, *WAKING)
        ).fetchall()
        return [r["id"] for r in rows]

    def assert_clean(self, min_checks: int) -> None:
        """No violation, and at least ``min_checks`` idle commits were checked."""
        assert self.violations == []
        assert self.checked >= min_checks


@contextlib.asynccontextmanager
async def checked(
    opener: Callable[..., Any], db_path: Location, model: ScriptedModel, tools: list[Any] | None = None
) -> AsyncIterator[tuple[Runtime, IdleChecker]]:
    """A runtime on ``db_path`` with an :class:`IdleChecker` listening to its hub."""
    async with opener(model, tools=tools) as rt:
        checker = IdleChecker(db_path)
        remove = rt.store.hub.add_listener(checker)
        try:
            yield rt, checker
        finally:
            remove()
            checker.conn.close()


# -- helpers -------------------------------------------------------------------------------------


class NoArgs(BaseModel):
    """No arguments."""


class SpinArgs(BaseModel):
    """How many event-loop yields to spin for."""

    n: int = 0


async def _noop(args: NoArgs, ctx: ToolContext) -> str:
    return "ok"


async def _spin(args: SpinArgs, ctx: ToolContext) -> str:
    for _ in range(args.n):
        await asyncio.sleep(0)
    return f"spun {args.n}"


def noop_tool() -> FunctionTool[NoArgs]:
    return FunctionTool("noop", "does nothing", NoArgs, _noop, repeat_safe=True)


def spin_tool() -> FunctionTool[SpinArgs]:
    return FunctionTool("spin", "yields to the event loop n times", SpinArgs, _spin, repeat_safe=True)


def last_text(request: ModelRequest) -> str:
    """The text of the prompt's last message ('' for a tool result)."""
    if not request.messages:
        return ""
    return "".join(b.text for b in request.messages[-1].content if isinstance(b, TextBlock))


def last_role(request: ModelRequest) -> str:
    return request.messages[-1].role if request.messages else ""


async def yields(n: int) -> None:
    """Let the event loop run ``n`` rounds (no wall-clock waiting)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def idle(agent: Agent) -> int:
    """Wait (bounded) for whole-agent idle; returns the idle event's sequence number."""
    snap = await asyncio.wait_for(agent.when_idle(), TIMEOUT)
    assert snap.status is AgentStatus.IDLE
    return snap.seq


async def inbox_rows(rt: Runtime, sid: str) -> dict[str, dict[str, Any]]:
    rows = await rt.store.read(
        lambda c: c.execute("SELECT * FROM inbox WHERE session_id=? ORDER BY queued_seq", (sid,)).fetchall()
    )
    return {r["id"]: dict(r) for r in rows}


async def turns(rt: Runtime, sid: str) -> list[dict[str, Any]]:
    rows = await rt.store.read(
        lambda c: c.execute("SELECT * FROM turns WHERE session_id=? ORDER BY start_seq", (sid,)).fetchall()
    )
    return [dict(r) for r in rows]


async def admissions(rt: Runtime, sid: str) -> dict[str, list[int]]:
    """message id -> sequence numbers of its ``message/admitted`` events."""
    out: dict[str, list[int]] = {}
    for e in await rt.store.events_after(sid, 0, limit=10**6, types=[EventType.MESSAGE_ADMITTED]):
        out.setdefault(e.data["messageId"], []).append(e.seq)
    return out


async def assert_settled(rt: Runtime, agent: Agent, checker: IdleChecker) -> None:
    """After an idle: the agent reads idle and nothing waking (nothing at all) is queued."""
    assert agent.status is AgentStatus.IDLE
    assert checker.queued_waking(agent.session_id) == []
    rows = await inbox_rows(rt, agent.session_id)
    assert [mid for mid, r in rows.items() if r["fate"] == "queued"] == []


# -- (a) from a turn/end subscriber ---------------------------------------------------------------


def chain_rule(request: ModelRequest) -> Reply:
    """Vary how turns end, so a turn/end of every ordinary kind triggers a follow-up."""
    text = last_text(request)
    if text.endswith(":tool") and last_role(request) == "user":
        return Reply.call("noop")
    if text.endswith(":error"):
        return Reply.fail(ModelErrorKind.BAD_REQUEST, "scripted non-retryable failure")
    if text.endswith(":max_tokens"):
        return Reply.say("cut off", finish=FinishReason.MAX_TOKENS)
    return Reply.say("ok")


ENDINGS = ("plain", "tool", "error", "max_tokens")


def chained(i: int) -> str:
    return f"chain {i}:{ENDINGS[i % len(ENDINGS)]}"


async def assert_chain(rt: Runtime, agent: Agent, checker: IdleChecker, n: int) -> None:
    """n+1 messages, each admitted alone by its own turn, each after the turn/end that caused it."""
    sid = agent.session_id
    await assert_settled(rt, agent, checker)
    rows = await inbox_rows(rt, sid)
    texts = [json.loads(r["content"])[0]["text"] for r in rows.values()]
    assert texts == [chained(i) for i in range(n + 1)]
    assert all(r["fate"] == "admitted" for r in rows.values())
    all_turns = await turns(rt, sid)
    assert len(all_turns) == n + 1
    by_turn = {t["id"]: t for t in all_turns}
    msgs = list(rows.values())
    assert [m["turn_id"] for m in msgs] == [t["id"] for t in all_turns]
    for prev, msg in itertools.pairwise(msgs):
        # queued after the previous turn ended; admitted by the next turn
        assert msg["queued_seq"] > by_turn[prev["turn_id"]]["end_seq"]
        assert by_turn[msg["turn_id"]]["start_seq"] > msg["queued_seq"]
    reasons = [t["end_reason"] for t in all_turns]
    assert set(reasons) == {"end_turn", "error", "max_tokens"}
    admitted = await admissions(rt, sid)
    assert sorted(admitted) == sorted(rows)
    assert all(len(seqs) == 1 for seqs in admitted.values())
    checker.assert_clean(min_checks=n + 1)


async def test_followup_from_a_turn_end_listener_is_admitted_by_a_later_turn(open_runtime, db_path) -> None:
    n = 24
    model = ScriptedModel(chain_rule, record=False)
    async with checked(open_runtime, db_path, model, [noop_tool()]) as (rt, checker):
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        issued: list[asyncio.Task[None]] = []
        all_issued = asyncio.Event()

        def on_event(event: Event) -> None:
            if event.session_id != sid or event.type != EventType.TURN_END or len(issued) >= n:
                return
            # A synchronous listener runs right after the commit that ended the turn (and, here,
            # committed idle); the follow-up it starts must open a new turn by itself.
            issued.append(asyncio.get_running_loop().create_task(agent.followup(chained(len(issued) + 1))))
            if len(issued) == n:
                all_issued.set()

        remove = rt.store.hub.add_listener(on_event)
        await agent.followup(chained(0))
        async with asyncio.timeout(TIMEOUT):
            await all_issued.wait()
            await asyncio.gather(*issued)
        await idle(agent)
        remove()
        await assert_chain(rt, agent, checker, n)


async def test_followup_from_a_turn_end_subscription_is_admitted_by_a_later_turn(open_runtime, db_path) -> None:
    n = 24
    model = ScriptedModel(chain_rule, record=False)
    async with checked(open_runtime, db_path, model, [noop_tool()]) as (rt, checker):
        sid = await rt.create_session()
        agent = await rt.agent(sid)

        async def consumer() -> int:
            count = 0
            async with contextlib.aclosing(rt.store.hub.subscribe(rt.store, sid, 0)) as events:
                async for event in events:
                    if event.type == EventType.TURN_END:
                        count += 1
                        await agent.followup(chained(count))
                        if count == n:
                            return count
            return count

        task = asyncio.create_task(consumer())
        await agent.followup(chained(0))
        assert await asyncio.wait_for(task, TIMEOUT) == n
        await idle(agent)
        await assert_chain(rt, agent, checker, n)


# -- (b) around the idle commit -------------------------------------------------------------------

#: Loop rounds between the last step's commit and the enqueue: small ones land before the closing
#: transaction, large ones (even on a slow, loaded machine) after the driver went to sleep.
LATE_ROUNDS = [*range(40), 60, 100, 200, 400]


@pytest.mark.parametrize("steered", [False, True], ids=["plain", "stale-wake"])
async def test_followup_landing_around_the_idle_commit_is_admitted(open_runtime, db_path, steered: bool) -> None:
    """A follow-up scheduled with call_soon as the model gives the turn's last answer, k loop rounds
    later.

    The sweep over k moves the enqueue from before the driver's closing transaction (which commits
    the last answer with the turn's end: agent.step) to after the driver is asleep on its wake flag.
    With ``steered``, the turn admits a steer mid-turn, which leaves the wake flag set, so the driver
    also passes through an extra check after idle.
    """
    holder: dict[str, Agent] = {}

    async def poke(args: NoArgs, ctx: ToolContext) -> str:
        await holder["agent"].steer("steer: also this")
        return "poked"

    def rule(request: ModelRequest) -> Reply:
        if steered and last_role(request) == "user" and last_text(request).startswith("go"):
            return Reply.call("poke")
        if armed:
            # The go turn's last answer: the driver is about to commit it, with the turn's end.
            k, late_id, late = armed.pop("k"), armed.pop("id"), armed.pop("tasks")
            loop.call_soon(lambda: late.append(loop.create_task(enqueue_late(k, late_id))))
        return Reply.say("done")

    model = ScriptedModel(rule, record=False)
    tools = [FunctionTool("poke", "enqueues a steer", NoArgs, poke)]
    loop = asyncio.get_running_loop()
    armed: dict[str, Any] = {}  # this round's k and late message id, until scheduled
    async with checked(open_runtime, db_path, model, tools) as (rt, checker):
        sid = await rt.create_session()
        agent = holder["agent"] = await rt.agent(sid)
        before_end = after_idle = 0

        async def enqueue_late(k: int, late_id: MessageId) -> None:
            await yields(k)
            await agent.followup(f"late {k}", message_id=late_id)

        for k in LATE_ROUNDS:
            go_id, late_id = MessageId.new(), MessageId.new()
            late: list[asyncio.Task[None]] = []
            armed.update(k=k, id=late_id, tasks=late)
            await agent.followup(f"go {k}", message_id=go_id)
            await idle(agent)
            assert not armed
            assert len(late) == 1
            await asyncio.wait_for(late[0], TIMEOUT)
            await idle(agent)  # at once if the late turn is over already; else its idle

            rows = await inbox_rows(rt, sid)
            go, msg = rows[go_id], rows[late_id]
            assert go["fate"] == msg["fate"] == "admitted"
            assert msg["turn_id"] != go["turn_id"]  # a later turn, opened without any further message
            by_turn = {t["id"]: t for t in await turns(rt, sid)}
            go_turn, late_turn = by_turn[go["turn_id"]], by_turn[msg["turn_id"]]
            assert late_turn["start_seq"] > go_turn["end_seq"]
            assert late_turn["end_reason"] == "end_turn"
            if msg["queued_seq"] < go_turn["end_seq"]:
                before_end += 1  # seen by the closing transaction's check: no idle in between
                assert not await status_idle_between(rt, sid, go_turn["end_seq"], late_turn["start_seq"])
            else:
                after_idle += 1  # idle was committed; the enqueue flipped it back and woke the driver
                assert await status_idle_between(rt, sid, go_turn["end_seq"], msg["queued_seq"])
            if steered:  # the steer joined the go turn mid-turn (leaving the wake flag set behind it)
                steer = [r for r in rows.values() if r["delivery"] == "steer"][-1]
                assert steer["turn_id"] == go["turn_id"]
            await assert_settled(rt, agent, checker)
        # the sweep really straddles the idle commit
        assert before_end > 0
        assert after_idle > 0
        assert all(r["fate"] == "admitted" for r in (await inbox_rows(rt, sid)).values())
        checker.assert_clean(min_checks=len(LATE_ROUNDS))


async def status_idle_between(rt: Runtime, sid: str, low: int, high: int) -> bool:
    """Whether an idle status event was committed with ``low <= seq <= high``."""
    events = await rt.store.events_after(sid, low - 1, upto=high, types=[EventType.STATUS])
    return any(e.data["status"] == "idle" for e in events)


# -- (c) from another task at random moments ------------------------------------------------------

SEED = 4_2024
ITERATIONS = 300
#: The soak's count (``pytest -m soak``): the same seeded campaign, carried on.
SOAK_ITERATIONS = 1000
#: Fewer on PostgreSQL, to keep the suite's runtime down (see the module docstring).
PG_ITERATIONS = 50
PER_SESSION = 100


class Ticker:
    """Counts committed events per session and lets a task wait for the next one."""

    def __init__(self) -> None:
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    def __call__(self, event: Event) -> None:
        for fut in self._waiters.pop(event.session_id, []):
            if not fut.done():
                fut.set_result(None)

    async def next(self, sid: str) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(sid, []).append(fut)
        await asyncio.wait_for(fut, TIMEOUT)


@pytest.mark.parametrize("full", [False, pytest.param(True, marks=pytest.mark.soak)], ids=["ci", "soak"])
async def test_followups_at_random_moments_are_never_stranded(open_runtime, db_path, full: bool) -> None:
    rng = random.Random(SEED)
    model_rng = random.Random(SEED + 1)

    async def rule(request: ModelRequest) -> Reply:
        await yields(model_rng.randrange(0, 6))
        delay = model_rng.choice((0.0, 0.0, 0.0, 0.0, 0.0005))
        roll = model_rng.random()
        if roll < 0.25:
            return Reply(tool_calls=[ToolCall("spin", {"n": model_rng.randrange(0, 12)})], delay=delay)
        if roll < 0.32:
            return Reply(tool_calls=[ToolCall("noop"), ToolCall("spin", {"n": model_rng.randrange(0, 6)})], delay=delay)
        return Reply.say("ok", delay=delay)

    model = ScriptedModel(rule, record=False)
    ticker = Ticker()
    async with checked(open_runtime, db_path, model, [noop_tool(), spin_tool()]) as (rt, checker):
        rt.store.hub.add_listener(ticker)
        enqueued: dict[str, list[str]] = {}
        idle_samples = 0
        agent: Agent | None = None

        async def random_moment(agent: Agent) -> None:
            """Somewhere in the agent's life: after some loop rounds, or some events into a turn."""
            nonlocal idle_samples
            if rng.random() < 0.5:
                await yields(rng.randrange(0, 40))
            else:
                for _ in range(rng.randint(1, 8)):
                    if agent.status is not AgentStatus.RUNNING:
                        break  # idle: no further event is due
                    await ticker.next(agent.session_id)  # running: at least its idle event is due
                await yields(rng.randrange(0, 4))
            if agent.status is AgentStatus.IDLE:
                # every message of this session is published by now, so idle must mean none waits
                idle_samples += 1
                assert checker.queued_waking(agent.session_id) == []

        async def enqueuer(agent: Agent, i: int, n: int) -> None:
            for j in range(n):
                await random_moment(agent)
                mid = MessageId.new()
                enqueued[agent.session_id].append(mid)
                if rng.random() < 0.25:
                    await agent.steer(f"steer {i}.{j}", message_id=mid)
                else:
                    await agent.followup(f"followup {i}.{j}", message_id=mid)

        # The soak runs the full count on both stores (issue 30: PostgreSQL's writes of a session
        # hold their own lock now); CI runs fewer on PostgreSQL, a round trip per write.
        iterations = SOAK_ITERATIONS if full else PG_ITERATIONS if storekit.is_postgres(db_path) else ITERATIONS
        for i in range(iterations):
            if i % PER_SESSION == 0:
                sid = await rt.create_session()
                agent = await rt.agent(sid)
                enqueued[sid] = []
            assert agent is not None
            if rng.random() < 0.7:
                mid = MessageId.new()
                enqueued[agent.session_id].append(mid)
                await agent.followup(f"start {i}", message_id=mid)
            await asyncio.wait_for(enqueuer(agent, i, rng.randint(1, 4)), TIMEOUT)
            await idle(agent)
            await assert_settled(rt, agent, checker)

        for sid, ids in enqueued.items():
            rows = await inbox_rows(rt, sid)
            assert sorted(rows) == sorted(ids)
            assert {r["fate"] for r in rows.values()} == {"admitted"}
            admitted = await admissions(rt, sid)
            assert sorted(admitted) == sorted(ids)
            assert all(len(seqs) == 1 for seqs in admitted.values())  # exactly once
        assert idle_samples > 0
        checker.assert_clean(min_checks=iterations)


# -- (d) while an interrupt settles ---------------------------------------------------------------

SWEEP = 48


def slow_rule(entered: asyncio.Event, phase: str) -> Callable[[ModelRequest], Reply]:
    """'slow …' prompts hang (in the model or in a tool) until interrupted; the rest answer at once."""

    def rule(request: ModelRequest) -> Reply:
        if last_role(request) == "user" and last_text(request).startswith("slow"):
            if phase == "tool":
                return Reply.call("hang")
            entered.set()
            return Reply.say("never finished", delay=60)
        return Reply.say("ok")

    return rule


def hang_tool(entered: asyncio.Event) -> FunctionTool[NoArgs]:
    async def hang(args: NoArgs, ctx: ToolContext) -> str:
        entered.set()
        await asyncio.Event().wait()
        return "unreachable"

    return FunctionTool("hang", "never returns", NoArgs, hang)


async def assert_after_interrupt(
    rt: Runtime, agent: Agent, checker: IdleChecker, slow_id: str, late_id: str, discarded: str | None = None
) -> None:
    rows = await inbox_rows(rt, agent.session_id)
    by_turn = {t["id"]: t for t in await turns(rt, agent.session_id)}
    slow_turn = by_turn[rows[slow_id]["turn_id"]]
    assert slow_turn["end_reason"] == "cancelled"
    late = rows[late_id]
    assert late["fate"] == "admitted"
    late_turn = by_turn[late["turn_id"]]
    assert late_turn["start_seq"] > slow_turn["end_seq"]
    assert late_turn["end_reason"] == "end_turn"
    if discarded is not None:
        assert rows[discarded]["fate"] == "cancelled"
        assert rows[discarded]["cancel_reason"] == "discarded"
    await assert_settled(rt, agent, checker)


@pytest.mark.parametrize("phase", ["model", "tool"])
async def test_followup_racing_an_interrupt_is_admitted_after_it(open_runtime, db_path, phase: str) -> None:
    entered = asyncio.Event()
    model = ScriptedModel(slow_rule(entered, phase), record=False)
    async with checked(open_runtime, db_path, model, [hang_tool(entered)]) as (rt, checker):
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        for k in range(SWEEP):
            entered.clear()
            slow_id, late_id = MessageId.new(), MessageId.new()
            await agent.followup(f"slow {k}", message_id=slow_id)
            await asyncio.wait_for(entered.wait(), TIMEOUT)

            async def late(k: int = k, late_id: MessageId = late_id) -> None:
                await yields(k)
                await agent.followup(f"after interrupt {k}", message_id=late_id)

            async with asyncio.timeout(TIMEOUT):
                await asyncio.gather(agent.interrupt(), late())
            await idle(agent)
            await assert_after_interrupt(rt, agent, checker, slow_id, late_id)
        checker.assert_clean(min_checks=SWEEP)


@pytest.mark.parametrize("discard", [False, True], ids=["keep", "discard"])
@pytest.mark.parametrize("trigger", ["cleanup", "turn_end"])
@pytest.mark.parametrize("phase", ["model", "tool"])
async def test_followup_issued_while_the_interrupted_turn_settles(
    open_runtime, db_path, phase: str, trigger: str, discard: bool
) -> None:
    """A listener on the interrupted turn's cleanup (or its turn/end) enqueues a follow-up."""
    entered = asyncio.Event()
    model = ScriptedModel(slow_rule(entered, phase), record=False)
    async with checked(open_runtime, db_path, model, [hang_tool(entered)]) as (rt, checker):
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        # the cleanup commits model/charged (open reservation) or the hung call's error result
        wanted = {"cleanup": (EventType.MODEL_CHARGED, EventType.TOOL_RESULT), "turn_end": (EventType.TURN_END,)}
        armed: dict[str, Any] = {}  # this round's k, late message id and task list, until used

        def on_event(event: Event) -> None:
            if armed and event.session_id == sid and event.type in wanted[trigger]:
                k, late_id, late = armed.pop("k"), armed.pop("id"), armed.pop("tasks")
                late.append(
                    asyncio.get_running_loop().create_task(agent.followup(f"after interrupt {k}", message_id=late_id))
                )

        rt.store.hub.add_listener(on_event)
        for k in range(8):
            entered.clear()
            slow_id, late_id, queued_id = MessageId.new(), MessageId.new(), MessageId.new()
            await agent.followup(f"slow {k}", message_id=slow_id)
            await asyncio.wait_for(entered.wait(), TIMEOUT)
            await agent.followup(f"queued before the interrupt {k}", message_id=queued_id)
            late: list[asyncio.Task[None]] = []
            armed.update(k=k, id=late_id, tasks=late)
            async with asyncio.timeout(TIMEOUT):
                await agent.interrupt(discard_queued=discard)
                assert late, "the interrupted turn's events are published before interrupt() returns"
                await late[0]
            await idle(agent)
            await assert_after_interrupt(rt, agent, checker, slow_id, late_id, queued_id if discard else None)
            if not discard:
                rows = await inbox_rows(rt, sid)
                assert rows[queued_id]["turn_id"] == rows[late_id]["turn_id"]  # both in the next turn
        checker.assert_clean(min_checks=8)


async def test_interrupt_as_the_turn_opens_does_not_strand_input(open_runtime, db_path) -> None:
    """An interrupt k loop rounds after ``turn/start`` commits, then a follow-up.

    Small k lands after the driver created the turn's task but before that task first ran (so the
    turn body never got to handle the cancel); the turn must still end and the follow-up run.
    """

    async def rule(request: ModelRequest) -> Reply:
        await yields(20)  # a model that takes a few loop rounds to answer
        return Reply.say("ok")

    model = ScriptedModel(rule, record=False)
    async with checked(open_runtime, db_path, model) as (rt, checker):
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        armed: dict[str, Any] = {}
        spawned: list[asyncio.Task[None]] = []
        started = asyncio.Event()

        async def interrupt_then_follow(k: int, late_id: MessageId) -> None:
            await yields(k)
            await agent.interrupt()
            await agent.followup(f"after interrupt {k}", message_id=late_id)

        def on_event(event: Event) -> None:
            if armed and event.session_id == sid and event.type == EventType.TURN_START:
                k, late_id = armed.pop("k"), armed.pop("id")
                spawned.append(asyncio.get_running_loop().create_task(interrupt_then_follow(k, late_id)))
                started.set()

        rt.store.hub.add_listener(on_event)
        cancelled_early = 0
        for k in range(12):
            go_id, late_id = MessageId.new(), MessageId.new()
            started.clear()
            armed.update(k=k, id=late_id)
            await agent.followup(f"go {k}", message_id=go_id)
            async with asyncio.timeout(TIMEOUT):
                await started.wait()
                await spawned[-1]
            await idle(agent)
            rows = await inbox_rows(rt, sid)
            by_turn = {t["id"]: t for t in await turns(rt, sid)}
            go_turn, late_turn = by_turn[rows[go_id]["turn_id"]], by_turn[rows[late_id]["turn_id"]]
            assert go_turn["end_reason"] in ("cancelled", "end_turn")
            cancelled_early += go_turn["end_reason"] == "cancelled" and go_turn["steps"] == 0
            assert late_turn["start_seq"] > go_turn["end_seq"]
            assert late_turn["end_reason"] == "end_turn"
            await assert_settled(rt, agent, checker)
        # How many k land in the "task created, not yet started" window depends on the machine's
        # load, so it is not asserted; every iteration above asserts the invariant itself.
        del cancelled_early
        checker.assert_clean(min_checks=12)


async def test_second_interrupt_while_the_first_settles_does_not_strand_input(open_runtime, db_path) -> None:
    """A second ``interrupt()`` k rounds after the first (during its cleanup), a follow-up racing both."""
    entered = asyncio.Event()
    model = ScriptedModel(slow_rule(entered, "tool"), record=False)
    async with checked(open_runtime, db_path, model, [hang_tool(entered)]) as (rt, checker):
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        for k in range(16):
            entered.clear()
            slow_id, late_id = MessageId.new(), MessageId.new()
            await agent.followup(f"slow {k}", message_id=slow_id)
            await asyncio.wait_for(entered.wait(), TIMEOUT)

            async def second(k: int = k) -> None:
                await yields(k)
                await agent.interrupt()

            async def late(k: int = k, late_id: MessageId = late_id) -> None:
                await yields(k)
                await agent.followup(f"after interrupt {k}", message_id=late_id)

            async with asyncio.timeout(TIMEOUT):
                await asyncio.gather(agent.interrupt(), second(), late())
            await idle(agent)
            await assert_after_interrupt(rt, agent, checker, slow_id, late_id)
        checker.assert_clean(min_checks=16)


@pytest.mark.parametrize("full", [False, pytest.param(True, marks=pytest.mark.soak)], ids=["ci", "soak"])
async def test_followups_and_interrupts_at_random_moments(open_runtime, db_path, full: bool) -> None:
    """Interrupts land anywhere (before a turn opens, as it opens, mid-step, mid-tool, after it)."""
    rng = random.Random(SEED + 2)
    pg_rng = random.Random(SEED + 3)  # PostgreSQL's own draws, so SQLite's sequence stays as it was
    mid_rng = random.Random(SEED + 4)  # SQLite's mid-turn waits (every fifth round)

    async def rule(request: ModelRequest) -> Reply:
        await yields(rng.randrange(0, 30))
        if last_role(request) == "user" and rng.random() < 0.5:
            return Reply.call("spin", n=rng.randrange(0, 30))
        return Reply.say("ok")

    model = ScriptedModel(rule, record=False)
    on_postgres = storekit.is_postgres(db_path)
    ticker = Ticker()
    async with checked(open_runtime, db_path, model, [spin_tool()]) as (rt, checker):
        rt.store.hub.add_listener(ticker)
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        ids: list[str] = []
        # Fewer on PostgreSQL, to keep the suite's runtime down (see the module docstring).
        rounds = 300 if full else 40 if on_postgres else 100

        async def interrupter(i: int) -> None:
            # On SQLite, loop rounds alone land mid-turn only about one time in a hundred (none at
            # all in some runs): every fifth round first lets 1..3 of the turn's events commit, so
            # interrupts surely cut turns short too (their own draws: the others stay as they were).
            if on_postgres or i % 5 == 0:
                # A transaction there is a round trip off the loop, so loop rounds alone would
                # mostly land before the turn opens: first let 0..3 of the turn's events commit.
                draws = pg_rng.randrange(0, 4) if on_postgres else mid_rng.randrange(1, 4)
                for _ in range(draws):
                    if agent.status is not AgentStatus.RUNNING:
                        break
                    await ticker.next(sid)
            await yields(rng.randrange(0, 60))
            await agent.interrupt()

        async def sender(j: int) -> None:
            await yields(rng.randrange(0, 60))
            mid = MessageId.new()
            ids.append(mid)
            await agent.followup(f"racing {j}", message_id=mid)

        for i in range(rounds):
            first = MessageId.new()
            ids.append(first)
            await agent.followup(f"round {i}", message_id=first)
            async with asyncio.timeout(TIMEOUT):
                await asyncio.gather(interrupter(i), *(sender(j) for j in range(rng.randint(0, 2))))
            await idle(agent)
            await assert_settled(rt, agent, checker)
        rows = await inbox_rows(rt, sid)
        assert sorted(rows) == sorted(ids)
        assert {r["fate"] for r in rows.values()} == {"admitted"}
        admitted = await admissions(rt, sid)
        assert all(len(admitted[m]) == 1 for m in ids)
        reasons = {t["end_reason"] for t in await turns(rt, sid)}
        assert "cancelled" in reasons  # some interrupts really cut a turn short
        assert "end_turn" in reasons
        checker.assert_clean(min_checks=rounds)
