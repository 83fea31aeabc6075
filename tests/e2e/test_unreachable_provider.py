"""End-to-end: a provider on a closed port spends none of a goal's rounds (issue 25, Must show 3).

A real daemon runs a goal with ``--max-rounds 3`` on an ``openai``-kind provider whose ``base_url``
is a port on 127.0.0.1 nothing listens on. Every call is refused; each turn ends ``error``
(``connection``) before any model answer, so the round is not counted and waits for the provider
(docs/architecture.md#infrastructure-trouble-is-not-the-goals). Meanwhile ``goald goal show`` says
the goal waits for the provider, ``goald goal list`` says so in its activity column, and ``goald
status`` calls the provider ``failing``. After the outage the port opens: a local server speaking
the OpenAI streaming wire format (``tests/providers_server.py``) answers, and the goal completes in
its 3 rounds, the retries shown apart.

Two outages. The issue's, 60 s, under the ``soak`` marker: the goal added as an operator would
(``goald goal add --max-rounds 3``), its failed round waiting the default base backoff (30 s) before
each try, so it fails two or three times and the test takes about a minute and a half. In the
per-push run, 18 s with the goal's ``rules.errorBackoffSeconds`` at 16 s (given through
``goal/create``, which takes the goal's stop rules): the same path, one failed try (4 attempts in
about 3.5 s) and the second after the port opened (at about 19.5 s, where the default backoff
would wait until 33.5 s). The three CLI reads run at once and have about 14 s: ``goald status``
must come between the first try and the second (whose first failure, the 5th in a row, would open
the provider's breaker), ``goal show`` and ``goal list`` before the port opens.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, rpc, wait_goal
from providers_server import (
    ProviderServer,
    Recorded,
    Respond,
    is_probe,
    oa_call,
    oa_chunk,
    oa_usage,
    openai_stream,
    openai_text,
)

LIMIT = 100.0
_ROUND = re.compile(r"Round (\d+) of 3")


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound once by the OS, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LateServer(ProviderServer):
    """The local OpenAI-compatible server, on a port chosen before it opens. Rounds 1 and 2 answer
    a line of text; round 3 claims completion, then ends its turn."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.fixed = port

    async def __aenter__(self) -> LateServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.fixed)
        self.port = self.fixed
        return self

    async def _read_request(self, reader: asyncio.StreamReader) -> Recorded | None:
        request = await super()._read_request(reader)
        if request is not None and not is_probe(request):
            self.add(self._respond(request))  # taken by this same request, right after
        return request

    def _respond(self, request: Recorded) -> Respond:
        messages = request.body["messages"]
        if messages[-1]["role"] == "tool":
            return Respond.stream(openai_text(["Claimed."], usage=oa_usage(40, 2)))
        text = json.dumps(messages[-1].get("content"))
        rounds = _ROUND.findall(text)
        if rounds and rounds[-1] == "3":
            claim = json.dumps({"summary": "three notes", "evidence": "rounds 1 to 3 answered"})
            return Respond.stream(
                openai_stream(
                    [
                        oa_chunk(role="assistant", content=""),
                        oa_chunk(tool_calls=[oa_call(0, id="call_claim", name="goal_complete", args=claim)]),
                        oa_chunk(finish="tool_calls"),
                        oa_chunk(no_choices=True, usage=oa_usage(40, 6)),
                    ]
                )
            )
        return Respond.stream(openai_text([f"Note {rounds[-1] if rounds else '?'} written."], usage=oa_usage(40, 4)))


def field(out: str, name: str) -> str:
    m = re.search(rf"^{name}:\s+(.*)$", out, re.M)
    assert m is not None, f"no {name}: line in\n{out}"
    return m[1]


async def until(probe: Any, what: str, limit: float = 30.0) -> Any:
    """Poll ``probe()`` (every 0.2 s, at most ``limit`` s) until it returns something truthy."""
    found = None
    for _ in range(int(limit / 0.2)):
        if found := await probe():
            break
        await asyncio.sleep(0.2)
    assert found, f"{what}: not within {limit:.0f}s"
    return found


@pytest.mark.parametrize(
    ("outage", "backoff"),
    [
        pytest.param(18.0, 16.0, id="18s-outage-16s-backoff"),
        pytest.param(60.0, None, id="60s-outage-default-backoff", marks=pytest.mark.soak),
    ],
)
async def test_a_closed_port_spends_no_round_and_the_goal_completes_in_its_three(
    tmp_path: Path, outage: float, backoff: float | None
) -> None:
    """``outage``: how long the port stays closed, in seconds, from the goal's creation; ``backoff``:
    the goal's base backoff (``None``: the default, the goal added with ``goald goal add``)."""
    port = closed_port()
    oa = {
        "kind": "openai",
        "api_key_env": "UNREACHABLE_TEST_KEY",
        "base_url": f"http://127.0.0.1:{port}/v1",
        "context_window": 32_000,
    }
    d = Daemon(tmp_path / "state", config={"providers": {"oa": oa, **TEST_MODELS["providers"]}})
    try:
        d.start(extra_env={"UNREACHABLE_TEST_KEY": "sk-unreachable-test"})
        if backoff is None:
            code, out, err = await d.acli(
                "goal", "add", "Write three notes", "--model", "oa:gpt-test", "--max-rounds", "3"
            )
            assert code == 0, err
            gid = out.split()[0]
        else:
            spec = {
                "objective": "Write three notes",
                "model": "oa:gpt-test",
                "budgets": {"maxRounds": 3},
                "rules": {"errorBackoffSeconds": backoff},
            }
            gid = (await rpc(d.socket_path, "goal/create", spec))["goalId"]
        opens_at = time.monotonic() + outage

        # The outage: round 1's turn failed before any answer; the goal waits for the provider.
        async def waiting() -> dict[str, Any] | None:
            g = await rpc(d.socket_path, "goal/get", {"goalId": gid})
            return g if g["infraStreak"] >= 1 and g["notBefore"] else None

        during = await until(waiting, "the goal waiting for the provider", limit=outage - 2)
        assert time.monotonic() < opens_at, "the outage ended before the goal was seen waiting"
        assert (during["status"], during["rounds"], during["errorStreak"]) == ("active", 0, 0)

        async def cli_waiting(*args: str) -> str | None:
            """The output of ``goald ARGS`` once it says the goal waits (a try of the round, a few
            milliseconds every ``backoff`` seconds, may be caught running)."""
            code, out, err = await d.acli(*args)
            assert code == 0, err
            return out if "waiting for provider" in out else None

        # The three reads at once (each CLI call takes seconds on a loaded machine): the provider is
        # failing from the first try's last attempt (4 to a try) to the second try's first, which
        # would open its breaker (5 in a row), and all three must come before the port opens.
        (code, status, err), show, listed = await asyncio.gather(
            d.acli("status"),
            until(lambda: cli_waiting("goal", "show", gid), "goal show: waiting", limit=outage - 2),
            until(lambda: cli_waiting("goal", "list"), "goal list: waiting", limit=outage - 2),
        )
        assert time.monotonic() < opens_at, "the outage ended before goal show, goal list and status were read"
        assert code == 0, err
        line = next(x.strip() for x in status.splitlines() if x.strip().startswith("oa "))
        assert re.fullmatch(r"oa failing \(\d+ in a row, last: connection: .+\)", line), line
        assert field(show, "status") == "active"
        why = field(show, "why")
        assert why.startswith("waiting for the provider: connection") and "not counted as rounds" in why, why
        assert re.match(r"round 1: waiting for provider oa, then the round runs again \(not counted\) until ", field(
            show, "activity"
        )), show  # fmt: skip
        assert field(show, "rounds") == "0 of 3 used, 3 left"
        assert field(show, "retries").startswith("1 round(s) cut short by infrastructure trouble, run again")
        row = next(line for line in listed.splitlines() if line.startswith(gid))
        assert re.search(r"\bactive\s+-\s+waiting for provider until \d\d:\d\d\s", row), row

        # The port opens: the next try of round 1 gets its answer, and the goal runs its 3 rounds.
        await asyncio.sleep(max(0.0, opens_at - time.monotonic()))
        async with LateServer(port) as server:
            final = await wait_goal(d.socket_path, gid, {"completed", "paused", "exhausted", "failed"}, LIMIT)
            code, shown, err = await d.acli("goal", "show", gid)
            assert code == 0, err
            code, status_after, _ = await d.acli("status")
            events = (await rpc(d.socket_path, "session/events", {"sessionId": final["sessionId"], "afterSeq": 0}))[
                "events"
            ]
        server.assert_done()
    finally:
        d.close()

    assert (final["status"], final["statusReason"]) == ("completed", "no_verification"), final
    assert (final["rounds"], final["errorStreak"], final["infraStreak"]) == (3, 0, 0)
    retries = final["infraRounds"]
    assert retries >= 1
    # Every round the server answered: 1 and 2 a line each, 3 a claim and its last line.
    assert len(server.requests) == 4
    refs = [e["data"]["source"]["ref"] for e in events if e["type"] == "message/admitted"]
    assert refs == [f"{gid}#1"] + [f"{gid}#1/retry{k}" for k in range(1, retries + 1)] + [f"{gid}#2", f"{gid}#3"]
    ends = [(e["data"]["reason"], e["data"].get("errorKind")) for e in events if e["type"] == "turn/end"]
    assert ends == [("error", "connection")] * retries + [("end_turn", None)] * 3
    # Shown apart, and nothing of the outage is the goal's reason any more.
    assert field(shown, "rounds") == "3 of 3 used, 0 left"
    assert field(shown, "retries").startswith(f"{retries} round(s) cut short by infrastructure trouble")
    assert not re.search(r"^why:", shown, re.M)
    assert next(x.strip() for x in status_after.splitlines() if x.strip().startswith("oa ")) == "oa ok"
