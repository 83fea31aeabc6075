"""The table of the servers' "does not fit the window" answers, and reading a window from a server.

Every row of :data:`agent.models.windows.REFUSALS` carries an answer recorded from its server; each
is read back here (which server, the window, the size counted) and classified ``context_length``
as an HTTP 400 would be. The readers of the servers' own descriptions (``llama-server``'s
``/props``, vLLM's ``/v1/models``, Ollama's ``/api/show``) are pinned on their real shapes.
"""

from __future__ import annotations

import json

import pytest

from agent import ModelErrorKind
from agent.models.classify import error_kind, reported_prompt_tokens
from agent.models.windows import (
    REFUSALS,
    read_refusal,
    window_from_models,
    window_from_props,
    window_from_show,
)

#: What each row's example states: (window, tokens counted, counts the output limit in).
EXPECTED = {
    "llama.cpp llama-server": (2048, 2253, False),
    "Ollama": (None, None, False),
    "LM Studio": (4096, 6269, False),
    "Anthropic": (200_000, 210_000, False),
    "OpenAI": (8192, 9000, False),
    "vLLM": (2048, 2253, True),
    "OpenAI-compatible (older wording)": (2048, 1229, False),
    "llama-cpp-python": (2048, 2253, False),
}


def _message(example: str) -> tuple[str, object]:
    """The human text of a recorded answer and its JSON (as a provider reads them)."""
    body = json.loads(example)
    inner = body.get("error", body)
    if isinstance(inner, dict):
        return str(inner.get("message", "")), inner
    return str(inner), body


def test_every_server_has_a_row_with_an_example() -> None:
    assert {row.server for row in REFUSALS} == set(EXPECTED)


@pytest.mark.parametrize("row", REFUSALS, ids=lambda row: row.server)
def test_each_recorded_refusal_states_its_figures_and_is_context_length(row: object) -> None:
    from agent.models.windows import Refusal

    assert isinstance(row, Refusal)
    text, body = _message(row.example)
    stated = read_refusal(text, body)
    assert stated is not None and stated.server == row.server
    assert (stated.window, stated.tokens, stated.includes_output) == EXPECTED[row.server]
    code = body.get("code") if isinstance(body, dict) and isinstance(body.get("code"), str) else None
    assert error_kind(400, text, code, body) is ModelErrorKind.CONTEXT_LENGTH


def test_the_prompt_size_leaves_out_the_output_limit_where_the_server_counts_it_in() -> None:
    vllm = read_refusal("This model's maximum context length is 2048 tokens. However, you requested 2253 tokens.")
    assert vllm is not None and vllm.prompt_tokens(max_tokens=1024) == 1229
    llama = read_refusal("request (2253 tokens) exceeds the available context size (2048 tokens), try increasing it")
    assert llama is not None and llama.prompt_tokens(max_tokens=1024) == 2253


def test_ollama_passing_on_llama_cpp_s_answer_states_the_figures() -> None:
    # Ollama asked not to truncate ("truncate": false): its runner's answer, escaped in its own.
    body = {
        "error": '{"error":{"code":400,"message":"request (8889 tokens) exceeds the available context size'
        ' (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":8889,"n_ctx":4096}}'
    }
    stated = read_refusal(str(body["error"]), body)
    assert stated is not None and (stated.window, stated.tokens) == (4096, 8889)


def test_llama_server_s_error_fields_state_the_window_when_the_words_do_not() -> None:
    body = {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 2253,
        "n_ctx": 2048,
    }
    stated = read_refusal(str(body["message"]), body)
    assert stated is not None and (stated.window, stated.tokens) == (2048, 2253)
    assert error_kind(400, str(body["message"]), None, body) is ModelErrorKind.CONTEXT_LENGTH


def test_other_answers_are_no_refusal_for_length() -> None:
    assert read_refusal("Incorrect API key provided") is None
    assert error_kind(400, "invalid tool schema") is ModelErrorKind.BAD_REQUEST
    # A server error that states the window in a known wording is one (llama-cpp-python unformatted).
    assert error_kind(500, "Requested tokens (2253) exceed context window of 2048") is ModelErrorKind.CONTEXT_LENGTH
    assert error_kind(500, "context size") is ModelErrorKind.SERVER
    assert reported_prompt_tokens("prompt is too long: 5000 tokens > 4000 maximum") == 5000


def test_the_servers_own_descriptions() -> None:
    props = {"default_generation_settings": {"n_ctx": 2048, "params": {"n_predict": -1}}, "total_slots": 1}
    assert window_from_props(props) == 2048
    assert window_from_props({"n_ctx": 4096}) == 4096
    assert window_from_props({"error": "not found"}) is None
    models = {
        "object": "list",
        "data": [
            {"id": "other", "object": "model", "max_model_len": 8192},
            {"id": "Qwen/Qwen2.5-0.5B", "object": "model", "owned_by": "vllm", "max_model_len": 2048},
        ],
    }
    assert window_from_models(models, "Qwen/Qwen2.5-0.5B") == 2048
    assert window_from_models({"data": [{"id": "x", "max_model_len": 4096}]}, "y") == 4096  # the only one
    assert window_from_models({"data": [{"id": "llama", "meta": {"n_ctx_train": 8192}}]}, "llama") is None
    show = {
        "parameters": 'num_ctx                        4096\nstop                           "<|im_end|>"',
        "model_info": {"general.architecture": "llama", "llama.context_length": 8192},
    }
    assert window_from_show(show) == 4096
    assert window_from_show({"model_info": {"qwen2.context_length": 32768}}) == 32768
    assert window_from_show({"modelfile": "FROM x"}) is None


def test_a_guarded_model_learns_through_and_status_names_the_window_and_its_source() -> None:
    from agent import ModelRegistry, ScriptedModel
    from agent.models.health import GuardedModel, ProviderHealth
    from daemon.cli.status import status_lines

    inner = ScriptedModel([], name="small", context_window=128_000)
    health = ProviderHealth("local")
    guarded = GuardedModel(inner, health)
    assert guarded.window_info() == {"contextWindow": 128_000, "windowSource": "default"}
    assert guarded.learn_window(2048, "server refusal")
    assert not guarded.learn_window(2048, "server refusal")  # nothing new
    assert (inner.context_window, inner.window_source) == (2048, "server refusal")
    assert (guarded.context_window, guarded.window_source) == (2048, "server refusal")
    snapshot = health.snapshot()
    assert snapshot["models"] == {"small": {"contextWindow": 2048, "windowSource": "server refusal"}}
    registry = ModelRegistry({"local:small": guarded})
    assert registry.windows()["local:small"] == {"contextWindow": 2048, "windowSource": "server refusal"}
    health_answer = {"version": "x", "status": "ready", "uptimeSeconds": 1, "sessionsRunning": 0}
    lines = status_lines({**health_answer, "providers": {"local": snapshot}})
    assert "    small: context window 2,048 tokens (server refusal)" in lines
