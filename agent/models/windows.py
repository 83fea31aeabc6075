"""A model's context window: what the servers people run say of it, and where goald's figure came from.

A server that refuses a prompt as too long usually states its window, each in its own words; goald
reads the figure from the refusal (and the prompt's size, when stated) so that compaction aims at
the real window at once, instead of an assumed one. :data:`REFUSALS` is the one table of those
answers: a pattern per server, each with an example recorded from that server, and a test reads
every example back (``tests/agent/test_windows.py``). A new server's wording is a new row.

Where a model's window figure came from is recorded with it (:data:`WindowSource`): the
configuration, goald's table of known models, the default assumed for an unknown one, a server's
refusal, or the server itself, asked at first use (``llama-server``'s ``GET /props``, vLLM's
``max_model_len`` in ``GET /v1/models``, Ollama's ``POST /api/show``: :func:`window_from_probe`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

#: Where a model's context window figure came from (shown by ``goald status`` and ``goal show``).
WindowSource = str
CONFIG: Final = "config"
KNOWN_MODEL: Final = "known model"
DEFAULT: Final = "default"
SERVER_REFUSAL: Final = "server refusal"
SERVER_PROPS: Final = "server /props"
SERVER_MODELS: Final = "server /v1/models"
SERVER_SHOW: Final = "server /api/show"
#: The sources that come from the server itself: its word is final (until it says otherwise).
FROM_SERVER: Final = frozenset({SERVER_REFUSAL, SERVER_PROPS, SERVER_MODELS, SERVER_SHOW})


@dataclass(frozen=True, slots=True)
class Refusal:
    """One server's "the prompt does not fit the window" answer, as a row of :data:`REFUSALS`."""

    #: The server (or API) that answers this way.
    server: str
    #: The answer's text; named groups ``window`` (the window, tokens) and ``tokens`` (what the
    #: server counted), each optional.
    pattern: re.Pattern[str]
    #: An answer recorded from that server (a test reads it back).
    example: str
    #: ``tokens`` counts the requested output too (vLLM's "you requested": prompt + ``max_tokens``).
    includes_output: bool = False


@dataclass(frozen=True, slots=True)
class StatedWindow:
    """What a refusal states: the window and the size the server counted (each ``None`` if not stated)."""

    server: str
    window: int | None
    tokens: int | None
    includes_output: bool = False

    def prompt_tokens(self, max_tokens: int) -> int | None:
        """The prompt's size in tokens, as far as the refusal tells it (``max_tokens``: the request's
        output limit, which some servers count in)."""
        if self.tokens is None:
            return None
        if self.includes_output:
            return self.tokens - max_tokens if self.tokens > max_tokens else None
        return self.tokens


def _p(text: str) -> re.Pattern[str]:
    return re.compile(text, re.IGNORECASE)


#: The refusal answers of the servers people run, most specific first (the first match wins).
REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "llama.cpp llama-server",
        _p(r"request \((?P<tokens>\d+) tokens\) exceeds the available context size \((?P<window>\d+) tokens\)"),
        '{"error":{"code":400,"message":"request (2253 tokens) exceeds the available context size (2048 tokens),'
        ' try increasing it","type":"exceed_context_size_error"}}',
    ),
    Refusal(
        # Ollama asked not to truncate (``"truncate": false``) passes on its runner's (llama.cpp's)
        # answer, escaped inside its own error string; the row above reads it. Its own words state
        # no figure.
        "Ollama",
        _p(r"input length exceeds (?:the|maximum) context length|prompt is longer than the context length"),
        '{"error":"the input length exceeds the context length"}',
    ),
    Refusal(
        "LM Studio",
        _p(
            r"keep the first (?P<tokens>\d+) tokens when context the overflows\. However, the model is loaded"
            r" with context length of only (?P<window>\d+) tokens"
        ),
        '{"error":"Trying to keep the first 6269 tokens when context the overflows. However, the model is loaded'
        " with context length of only 4096 tokens, which is not enough. Try to load the model with a larger"
        ' context length, or provide a shorter input"}',
    ),
    Refusal(
        "Anthropic",
        _p(r"prompt is too long: (?P<tokens>\d+) tokens > (?P<window>\d+) maximum"),
        '{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens >'
        ' 200000 maximum"}}',
    ),
    Refusal(
        "OpenAI",
        _p(r"maximum context length is (?P<window>\d+) tokens\. However, your messages resulted in (?P<tokens>\d+)"),
        '{"error":{"message":"This model\'s maximum context length is 8192 tokens. However, your messages'
        ' resulted in 9000 tokens. Please reduce the length of the messages.","type":"invalid_request_error",'
        '"param":"messages","code":"context_length_exceeded"}}',
    ),
    Refusal(
        # vLLM (and llama-cpp-python's server, which words it the same) counts the output limit in.
        "vLLM",
        _p(
            r"maximum context length is (?P<window>\d+) tokens\. However, you requested (?P<tokens>\d+) tokens"
            r"(?! \(\d+ in the messages)"
        ),
        '{"object":"error","message":"This model\'s maximum context length is 2048 tokens. However, you requested'
        ' 2253 tokens. Please reduce the length of the messages or completion.","type":"BadRequestError",'
        '"param":null,"code":400}',
        includes_output=True,
    ),
    Refusal(
        # The older wording (OpenAI's, vLLM's, llama-cpp-python's) splits the request: the prompt is
        # "in the messages".
        "OpenAI-compatible (older wording)",
        _p(
            r"maximum context length is (?P<window>\d+) tokens\. However, you requested \d+ tokens"
            r" \((?P<tokens>\d+) in the messages"
        ),
        '{"error":{"message":"This model\'s maximum context length is 2048 tokens. However, you requested 2253'
        " tokens (1229 in the messages, 1024 in the completion). Please reduce the length of the messages or"
        ' completion.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}',
    ),
    Refusal(
        # llama-cpp-python's own exception text, where a proxy passes it on unformatted.
        "llama-cpp-python",
        _p(r"Requested tokens \((?P<tokens>\d+)\) exceed context window of (?P<window>\d+)"),
        '{"error":{"message":"Requested tokens (2253) exceed context window of 2048","type":"internal_server_error"}}',
    ),
)

#: Words of a "does not fit the window" answer that no row above reads (figures unknown).
CONTEXT_WORDS = (
    "context_length_exceeded",
    "exceed_context_size_error",
    "prompt is too long",
    "maximum context length",
    "context length",
    "context size",
    "context window",
)


def read_refusal(text: str, body: object = None) -> StatedWindow | None:
    """What a "does not fit the window" answer states, or ``None`` if ``text`` is no such answer.

    ``body``: the answer's JSON, when there is one (llama-server also states ``n_ctx`` and
    ``n_prompt_tokens`` as fields of its error).
    """
    fields = _error_fields(body)
    n_ctx, n_prompt = _int(fields.get("n_ctx")), _int(fields.get("n_prompt_tokens"))
    for row in REFUSALS:
        m = row.pattern.search(text)
        if m is None:
            continue
        found = m.groupdict()
        window = _int(found.get("window")) or n_ctx
        tokens = _int(found.get("tokens")) or n_prompt
        return StatedWindow(row.server, window, tokens, row.includes_output and tokens == _int(found.get("tokens")))
    if n_ctx is not None or any(word in text.lower() for word in CONTEXT_WORDS):
        return StatedWindow("unknown", n_ctx, n_prompt)
    return None


def _error_fields(body: object) -> Mapping[str, Any]:
    if isinstance(body, dict):
        inner = body.get("error", body)
        return inner if isinstance(inner, dict) else body
    return {}


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.isdigit():
        return int(value) or None
    return None


# -- asking the server ------------------------------------------------------------------------------


def window_from_props(body: object) -> int | None:
    """``llama-server``'s ``GET /props``: ``default_generation_settings.n_ctx`` (or a top-level ``n_ctx``)."""
    if not isinstance(body, dict):
        return None
    settings = body.get("default_generation_settings")
    if isinstance(settings, dict) and (n := _int(settings.get("n_ctx"))) is not None:
        return n
    return _int(body.get("n_ctx"))


def window_from_models(body: object, name: str) -> int | None:
    """vLLM's ``GET /v1/models``: the ``max_model_len`` of the model named ``name`` (or of the only one)."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    models = [m for m in body["data"] if isinstance(m, dict)]
    named = [m for m in models if m.get("id") == name] or (models if len(models) == 1 else [])
    return _int(named[0].get("max_model_len")) if named else None


_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)\s*$", re.MULTILINE)


def window_from_show(body: object) -> int | None:
    """Ollama's ``POST /api/show``: the model's ``num_ctx`` parameter when it sets one, else (capped
    by it) the ``<arch>.context_length`` of its ``model_info``."""
    if not isinstance(body, dict):
        return None
    params = body.get("parameters")
    num_ctx = _int(m.group(1)) if isinstance(params, str) and (m := _NUM_CTX.search(params)) else None
    info = body.get("model_info")
    trained = None
    if isinstance(info, dict):
        trained = next((_int(v) for k, v in info.items() if str(k).endswith(".context_length") and _int(v)), None)
    if num_ctx is not None and trained is not None:
        return min(num_ctx, trained)
    return num_ctx or trained


__all__ = [
    "CONFIG",
    "CONTEXT_WORDS",
    "DEFAULT",
    "FROM_SERVER",
    "KNOWN_MODEL",
    "REFUSALS",
    "SERVER_MODELS",
    "SERVER_PROPS",
    "SERVER_REFUSAL",
    "SERVER_SHOW",
    "Refusal",
    "StatedWindow",
    "WindowSource",
    "read_refusal",
    "window_from_models",
    "window_from_props",
    "window_from_show",
]
