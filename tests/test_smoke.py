"""A first end-to-end pass through the runtime: one follow-up, tool calls, idle."""

from __future__ import annotations

from agent import EventType, Reply, ScriptedModel


async def test_followup_runs_a_turn_with_tools_to_idle(open_runtime) -> None:
    model = ScriptedModel([Reply.call("noop"), Reply.call("noop"), Reply.say("done")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        assert await agent.followup("hello") is None
        snap = await agent.when_idle()
        events = await rt.store.events_after(sid, 0)
    model.assert_done()
    types = [e.type for e in events]
    assert types.count(EventType.TOOL_RESULT) == 2
    assert types[-2:] == [EventType.TURN_END, EventType.STATUS]
    assert events[-1].seq == snap.seq
    assert events[-2].data["reason"] == "end_turn"
