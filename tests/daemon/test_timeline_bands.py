"""``goal/timeline``'s bands (:mod:`daemon.rpc.timeline`), from events as a goal writes them: the
goal's decision at an idle is in the band that idle ended, a band is open only while its session
runs, a person's action after an idle begins the next band, and a failed tool call is counted
from the stored ``isError``."""

from __future__ import annotations

from typing import Any

from agent.events import Event
from daemon.rpc.timeline import TimelinePage, split_bands, timeline_answer

GOAL = "goal_01TEST"


def _events(*specs: tuple[str, dict[str, Any]]) -> list[Event]:
    return [
        Event(session_id="s1", seq=i, type=kind, data=data, at="2026-12-04T00:00:00+00:00")
        for i, (kind, data) in enumerate(specs, start=1)
    ]


def _round(n: int, *, tool_error: bool = False) -> list[tuple[str, dict[str, Any]]]:
    src = {"kind": "goal", "ref": f"{GOAL}#{n}"}
    return [
        ("message/queued", {"source": src, "delivery": "followup"}),
        ("status", {"status": "running"}),
        ("turn/start", {}),
        ("message/admitted", {"source": src, "delivery": "followup"}),
        ("tool/result", {"toolUseId": "t1", "name": "write_file", "content": "x", "isError": tool_error}),
        ("goal/claim", {"goalId": GOAL, "summary": "done", "evidence": "e"}),
        ("turn/end", {"reason": "end_turn"}),
        ("status", {"status": "idle"}),
    ]


def test_the_decision_at_an_idle_is_in_the_band_it_ended_and_a_goal_at_rest_has_no_running_band() -> None:
    events = _events(
        ("session/created", {}),
        ("goal/changed", {"goalId": GOAL, "status": "active", "uid": 0}),
        *_round(1, tool_error=True),
        ("goal/verified", {"goalId": GOAL, "passed": False}),
        *_round(2),
        ("goal/verified", {"goalId": GOAL, "passed": False}),
        ("goal/changed", {"goalId": GOAL, "from": "active", "status": "paused", "reason": "unverified"}),
        ("goal/changed", {"goalId": GOAL, "from": "paused", "status": "cancelled", "web": "alice"}),
    )
    bands = split_bands(events)
    assert [(b.first_seq, b.last_seq) for b in bands] == [(1, 11), (12, 21), (22, 22)]
    one, two, cancel = (b.fold for b in bands)
    assert one.summary == "round 1 · 1 turn(s) · 1 tool call(s), 1 failed · → active by uid 0 · verification refused"
    assert (
        two.summary == "round 2 · 1 turn(s) · 1 tool call(s) · verification refused"
        " · → paused (unverified: completion claims refused)"
    )
    assert cancel.summary == "cancelled by web:alice · → cancelled by web:alice"
    assert not any(f.running for f in (one, two, cancel))
    answer = timeline_answer(GOAL, "s1", TimelinePage(list(reversed(bands)), None))
    assert [b["open"] for b in answer["bands"]] == [False, False, False]
    assert answer["lastSeq"] == 22 and answer["bands"][2]["failedToolCalls"] == 1


def test_a_band_is_open_while_its_session_runs() -> None:
    bands = split_bands(_events(*_round(1)[:5]))
    assert len(bands) == 1 and bands[0].fold.running
    assert bands[0].fold.summary.endswith(" · running")
    assert timeline_answer(GOAL, "s1", TimelinePage(bands, None), events=False)["bands"][0].keys() >= {
        "open",
        "summary",
    }
