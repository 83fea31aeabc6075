"""``goald goal show`` names the context window of the goal's model and where the figure came from
(issue 25), as ``goald status`` does: a real daemon with an ``openai`` provider pointed at a local
server that answers ``GET /props`` with the body a real llama-server sent (``tests/wire/``), and no
window in the configuration, so the daemon asks the server at the model's first use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness import TEST_MODELS, Daemon, wait_goal
from providers_server import ProviderServer, Respond, openai_text

WIRE = Path(__file__).resolve().parent.parent / "wire"
LIMIT = 60.0


def recorded_body(name: str) -> dict[str, Any]:
    """The JSON body of a recorded whole answer."""
    return dict(json.loads(json.loads((WIRE / name).read_text())["body"]))


async def test_goal_show_names_the_window_the_server_stated_and_its_source(tmp_path: Path) -> None:
    props = recorded_body("llama_server_props.captured.response.json")
    stated = int(props["default_generation_settings"]["n_ctx"])
    async with ProviderServer() as server:
        server.probe_answers["/props"] = Respond.json(200, props)
        server.add(Respond.stream(openai_text(["Nothing to do yet."])))
        local = {"kind": "openai", "api_key_env": "WINDOW_TEST_KEY", "base_url": server.url + "/v1"}
        d = Daemon(tmp_path / "state", config={"providers": {"local": local, **TEST_MODELS["providers"]}})
        try:
            d.start(extra_env={"WINDOW_TEST_KEY": "sk-window-test"})
            made = await d.acli_json("goal", "add", "Look around", "--model", "local:smol", "--max-rounds", "1")
            g = await wait_goal(d.socket_path, made["goalId"], {"exhausted", "paused", "failed", "completed"}, LIMIT)
            assert g["status"] == "exhausted", g
            code, out, err = await d.acli("goal", "show", made["goalId"])
            assert code == 0, err
            assert f"window:     {stated:,} tokens (server /props)" in out.splitlines(), out
            code, status, err = await d.acli("status")
            assert code == 0, err
            assert f"smol: context window {stated:,} tokens (server /props)" in status, status
            assert [p.path for p in server.probes][-1] == "/props"
        finally:
            d.close()
