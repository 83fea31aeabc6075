"""Compaction end to end: a real daemon against a local server that enforces a context window.

``goald serve`` runs as a process (``harness.Daemon``) with an ``openai`` provider pointed at a
local OpenAI-compatible server on 127.0.0.1 (``providers_server``). The server's token rule, the
one this test states: a request's tokens are its body bytes / 4; past ``WINDOW`` it answers 400
``context_length_exceeded`` the way OpenAI and vLLM do. Otherwise it plays a deterministic agent, a
pure function of the request: at round N (read from the newest ``Round N`` continuation) it writes
``rN.txt`` and reads ``report.log``, a large file of the goal's work directory (so every round adds
a large tool result), then says the round is done; at the target round it claims completion, and
the goal's ``--verify`` command checks every round's file. A summary request (its last message is
the compaction instruction) gets a short summary.

The goal must reach verified completion across several compactions, and no request may be refused
for length after the first calibration (the 400s are counted). The daemon's compaction shares come
from its config (``context_compact_at``, ``context_compact_to``, ``context_summary_share``), so
this also shows they reach the sessions; :func:`test_context_settings_reach_the_agent_config`
shows the pass-through directly, and the settings tests the validation.

CI runs a shorter goal; the 100-round goal is a soak.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from harness import Daemon, all_events, wait_goal
from providers_server import (
    ProviderServer,
    Recorded,
    Respond,
    context_length_refusal,
    oa_call,
    oa_chunk,
    oa_usage,
    openai_stream,
    openai_text,
)

from agent import SessionRow
from agent.context import SUMMARY_INSTRUCTION
from daemon.host import Host
from daemon.settings import ConfigError, load_settings

WINDOW = 12000
#: Bytes of ``report.log``, read whole each round (an eighth of the window in tokens).
REPORT_BYTES = 6000
COMPACT_AT, COMPACT_TO, SUMMARY_SHARE = 0.8, 0.3, 0.05
_ROUND = re.compile(r"\bRound (\d+)\b")


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def objective(target: int) -> str:
    """The goal's objective (the server's agent reads nothing from it; it must survive compaction)."""
    return f"Keep a file per round and finish at round {target}, reading report.log each round."


class WindowedAgent:
    """The server's rule (see the module docstring); records what each request was."""

    def __init__(self, server: ProviderServer, target: int) -> None:
        self.server = server
        self.target = target
        #: Per request: "refused", "summary" or "turn".
        self.kinds: list[str] = []
        server.on_request = self.answer

    def refused(self) -> list[int]:
        """Indices of the requests refused for length."""
        return [i for i, k in enumerate(self.kinds) if k == "refused"]

    def answer(self, req: Recorded) -> None:
        tokens = len(req.raw) // 4
        if tokens > WINDOW:
            self.kinds.append("refused")
            self.server.add(context_length_refusal(WINDOW, tokens))
            return
        usage = oa_usage(tokens, 20)
        messages = req.body["messages"]
        if _text(messages[-1]) == SUMMARY_INSTRUCTION:
            self.kinds.append("summary")
            self.server.add(Respond.stream(openai_text([f"Earlier: {len(messages)} messages of work."], usage=usage)))
            return
        self.kinds.append("turn")
        n = step = 0
        for i in range(len(messages) - 1, -1, -1):
            found = _ROUND.search(_text(messages[i])) if messages[i]["role"] == "user" else None
            if found:
                n = int(found.group(1))
                step = sum(1 for m in messages[i + 1 :] if m["role"] == "assistant")
                break
        calls: list[tuple[str, dict[str, Any]]] = []
        if step == 0 and n >= self.target:
            calls = [("goal_complete", {"summary": "every round done", "evidence": "one file per round"})]
        elif step == 0:
            calls = [
                ("write_file", {"path": f"r{n}.txt", "content": f"round {n}\n"}),
                ("read_file", {"path": "report.log"}),
            ]
        if not calls:
            self.server.add(Respond.stream(openai_text([f"round {n} done"], usage=usage)))
            return
        chunks = [oa_chunk(role="assistant")]
        for i, (name, args) in enumerate(calls):
            chunks.append(oa_chunk(tool_calls=[oa_call(i, id=f"call_{n}_{i}", name=name, args=json.dumps(args))]))
        chunks += [oa_chunk(finish="tool_calls"), oa_chunk(no_choices=True, usage=usage)]
        self.server.add(Respond.stream(openai_stream(chunks)))


async def _run_goal(tmp_path: Path, target: int) -> None:
    state = tmp_path / "state"
    workdir = state / "work" / "long"
    workdir.mkdir(parents=True)
    line = "build step ok: " + "y" * 64 + "\n"
    (workdir / "report.log").write_text((line * (REPORT_BYTES // len(line) + 1))[:REPORT_BYTES])
    async with ProviderServer() as server:
        agent = WindowedAgent(server, target)
        config = {
            "context_compact_at": COMPACT_AT,
            "context_compact_to": COMPACT_TO,
            "context_summary_share": SUMMARY_SHARE,
            "providers": {
                "local": {
                    "kind": "openai",
                    "base_url": server.url + "/v1",
                    "api_key_env": "WINDOW_TEST_API_KEY",
                    "context_window": WINDOW,
                    "max_tokens": 256,
                }
            },
        }
        d = Daemon(state, config=config)
        try:
            d.start(extra_env={"WINDOW_TEST_API_KEY": "sk-window-test-1234"})
            created = await d.acli_json(
                "goal", "add", objective(target), "--model", "local:windowed", "--workdir", str(workdir),
                "--max-rounds", str(target + 5), "--stall-rounds", "1000",
                "--verify", f"test $(ls r*.txt | wc -l) -eq {target - 1}",
            )  # fmt: skip
            goal = await wait_goal(d.socket_path, created["goalId"], {"completed", "paused", "failed", "exhausted"}, 90)
            events = await all_events(d.socket_path, created["sessionId"])
            assert d.terminate() == 0
        finally:
            d.close()
    assert not server.unexpected

    assert (goal["status"], goal["statusReason"]) == ("completed", "verified"), goal
    assert sorted(p.name for p in workdir.glob("r*.txt")) == sorted(f"r{n}.txt" for n in range(1, target))
    # The work added far more than one window: only compaction let the goal finish.
    assert target * REPORT_BYTES // 4 > 3 * WINDOW
    compactions = [e for e in events if e["type"] == "context/compacted"]
    summaries = agent.kinds.count("summary")
    assert len(compactions) >= 3 and summaries >= 3, (len(compactions), agent.kinds)
    # Every request the server accepted fit the window, and none was refused for length after the
    # first calibration (the first answer that reported usage).
    assert all(len(r.raw) // 4 <= WINDOW for i, r in enumerate(server.requests) if agent.kinds[i] != "refused")
    first_answered = min(i for i, k in enumerate(agent.kinds) if k != "refused")
    late = [i for i in agent.refused() if i > first_answered]
    assert not late, f"refused for length after the first calibration: requests {late} of {len(agent.kinds)}"
    # The objective rides in every turn's prompt, after every compaction too.
    turns = [r for r, k in zip(server.requests, agent.kinds, strict=True) if k == "turn"]
    assert all(objective(target) in "".join(_text(m) for m in r.body["messages"]) for r in turns)
    # The configured target share: the first turn after each summary is well below the trigger.
    after = [
        len(server.requests[i + 1].raw) // 4
        for i, k in enumerate(agent.kinds[:-1])
        if k == "summary" and agent.kinds[i + 1] == "turn"
    ]
    peak = max(len(r.raw) // 4 for r in turns)
    print(
        f"{target} rounds, {len(server.requests)} requests, {len(compactions)} compactions, "
        f"{len(agent.refused())} refused for length; turn prompts peak {peak} tokens, "
        f"after a compaction {min(after)}-{max(after)} tokens (window {WINDOW}, the first request "
        f"{len(server.requests[0].raw) // 4})"
    )
    # The prompt after a compaction aims at the configured share of the window; the newest round (its
    # continuation, calls and large results) is kept whatever its size, so it may add one round.
    one_round = REPORT_BYTES // 4 + 500
    assert after and max(after) <= COMPACT_TO * WINDOW + one_round < COMPACT_AT * WINDOW


async def test_a_real_daemon_keeps_a_long_goal_within_an_enforced_window(tmp_path: Path) -> None:
    await _run_goal(tmp_path, target=30)


@pytest.mark.soak
async def test_a_real_daemon_runs_a_hundred_round_goal_within_an_enforced_window(tmp_path: Path) -> None:
    await _run_goal(tmp_path, target=100)


# -- the settings ---------------------------------------------------------------------------------


def test_context_settings_reach_the_agent_config(tmp_path: Path) -> None:
    settings = load_settings(
        None, state_dir=tmp_path, context_compact_at=0.7, context_compact_to=0.25, context_summary_share=0.05
    )
    host = Host(settings)
    row = SessionRow(id="ses_01J00000000000000000000000", model="scripted:demo", created_at="2026-01-01T00:00:00Z")
    policy = host._resolve(row).config.context
    assert (policy.compact_at, policy.compact_to, policy.summary_share) == (0.7, 0.25, 0.05)
    # Unset, they are the agent runtime's own defaults.
    default = Host(load_settings(None, state_dir=tmp_path))._resolve(row).config.context
    assert (default.compact_at, default.compact_to, default.summary_share) == (0.8, 0.4, 0.1)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"context_compact_to": 0.8}, "key 'context_compact_to': Value error, must be below context_compact_at (0.8)"),
        ({"context_compact_at": 0.5, "context_compact_to": 0.6}, "context_compact_to': Value error, must be below"),
        ({"context_summary_share": 0.4}, "key 'context_summary_share': Value error, must be below context_compact_to"),
        ({"context_compact_to": 0.2, "context_summary_share": 0.3}, "context_summary_share': Value error, must be"),
        ({"context_compact_to": 0}, "key 'context_compact_to': Input should be greater than 0"),
        ({"context_compact_to": 1}, "key 'context_compact_to': Input should be less than 1"),
        ({"context_summary_share": -0.1}, "key 'context_summary_share': Input should be greater than 0"),
    ],
)
def test_context_shares_out_of_order_are_refused_by_name(tmp_path: Path, values: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, state_dir=tmp_path, **values)
    assert named in str(err.value)
