"""The OpenAI-compatible provider: chat completions through the official ``openai`` SDK.

One implementation serves every server that speaks the chat-completions protocol (OpenAI,
DeepSeek, OpenRouter, Ollama, vLLM, the llama.cpp server): only ``base_url`` differs. Decisions:

* The SDK never retries (``max_retries=0``): the driver retries with its own backoff and records
  every attempt as a ``model_calls`` row, so a hidden SDK retry would be an unrecorded,
  unbudgeted call.
* Every call streams, with ``stream_options.include_usage`` so the last chunk carries the usage.
  Text deltas go to ``on_delta`` (ephemeral); tool calls are assembled from their deltas by
  index, arguments possibly split anywhere, even mid-JSON.
* A failure is classified precisely (see :mod:`agent.models.classify` for the status table): the
  driver retries rate limits, server errors, timeouts and dropped connections; the goal engine
  pauses at once on authentication failures. A stream that ends without a finish reason is a
  dropped connection, a failed attempt, never a short answer. The finish reason is read first: an
  answer cut off by the output limit (``length``) keeps its tool calls as notes, never run (their
  arguments are cut mid-JSON). A chunk that is not valid JSON, or tool arguments of a complete
  answer that do not parse, are ``malformed``. (``data: [DONE]`` ends the stream as in
  the SDK, but the finish reason is the completeness signal; a body cut at the HTTP level, before
  its last chunk, is a dropped connection.)
* The stream is read as raw server-sent events (see :mod:`agent.models._http`): each chunk is
  plain JSON checked where it is read; an ``{"error": ...}`` in place of a chunk is classified as
  the SDK would have raised it: by its ``code`` as an HTTP status, else a server error (never a
  dropped connection: the server answered, then failed its answer), and counted so by the breaker.
* Error messages never carry the API key, whatever the server echoes back.
* The SDK is imported when a provider is constructed, never at ``import agent``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, cast

from loguru import logger

from agent.messages import ToolUseBlock
from agent.models._http import (
    END,
    StreamErrorItem,
    StreamingHTTPModel,
    answer_started,
    as_object,
)
from agent.models.base import (
    DeltaCallback,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    ModelResponse,
)
from agent.models.body import JSONLog, dump_json
from agent.models.classify import status_kind
from agent.models.openai_messages import take
from agent.models.openai_stream import Assembly, answer_text
from agent.spend import Price, Usage, estimator_for

if TYPE_CHECKING:
    import httpx2
    from openai import AsyncOpenAI

TokensParam = Literal["max_tokens", "max_completion_tokens"]


class OpenAIModel(StreamingHTTPModel["AsyncOpenAI"]):
    """A model behind any OpenAI-compatible chat-completions server. See the module docstring."""

    provider = "openai"
    _default_host = "api.openai.com"

    def __init__(
        self,
        name: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_tokens: int = 4096,
        context_window: int | None = None,
        price: Price | None = None,
        provider: str = "openai",
        max_tokens_param: TokensParam | None = None,
        window_source: str | None = None,
    ) -> None:
        """Build a provider; no connection is made before the first call.

        Args:
            name: the model name the server knows (``gpt-4o-mini``, ``deepseek-chat``, ``llama3.1:8b``).
            base_url: the server's ``/v1`` URL; ``None`` is OpenAI itself.
            api_key: the key (the daemon reads it from the environment or a credential). Local servers
                that need none get a placeholder.
            timeout: seconds the HTTP client waits for the connection and for each read.
            max_tokens: default output limit of a call (a session may set its own).
            context_window: the model's context size, in tokens; ``None`` (not configured): the size
                goald knows for the model's name, else 128,000, until the server states its
                own (asked at first use where it says, or read from a refusal).
            window_source: where a given ``context_window`` came from (default ``config``).
            price: prices per million tokens, for cost accounting.
            provider: the provider's name in model specs (``PROVIDER:MODEL``).
            max_tokens_param: how the output limit is sent; OpenAI's newer models want
                ``max_completion_tokens`` (the default when ``base_url`` is ``None``); most compatible
                servers know ``max_tokens`` (the default otherwise).
        """
        import openai  # noqa: F401  (lazily, and here so a missing SDK fails when the model is built)

        super().__init__(
            name,
            provider=provider,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_tokens=max_tokens,
            context_window=context_window,
            price=price,
            default_window=128_000,
            window_source=window_source,
        )
        self.max_tokens_param: TokensParam = max_tokens_param or (
            "max_completion_tokens" if base_url is None else "max_tokens"
        )
        self._warned_no_usage = False
        #: How the server counts tokens for a call that reported no usage (:meth:`_server_counts`):
        #: ``None`` not asked yet, else one of :data:`TOKENIZER_ROUTES` or ``"none"``.
        self.tokenizer: str | None = None

    def _probe_options(self) -> dict[str, Any]:
        return {"security": {"bearer_auth": True}}

    def _make_client(self) -> AsyncOpenAI:
        import openai

        return openai.AsyncOpenAI(
            api_key=self._api_key or "no-key", base_url=self.base_url, max_retries=0, timeout=self.timeout
        )

    def measure(self, request: ModelRequest) -> int:
        """Bytes of the request body; converts each message the conversation added, once."""
        return sum(len(p) for p in self._body_pieces(request, take(request)))

    def _body_pieces(self, request: ModelRequest, log: JSONLog) -> list[bytes | bytearray]:
        # The keys in the order the SDK's ``create`` sends them.
        tokens_key = b"max_completion_tokens" if self.max_tokens_param == "max_completion_tokens" else b"max_tokens"
        pieces: list[bytes | bytearray] = [b'{"model":%s,"stream":true,"messages":[' % dump_json(self.name)]
        if log.system_json:
            pieces.append(log.system_json)
            if log.body:
                pieces.append(b",")
        pieces.append(log.body)
        pieces.append(b'],"%s":%d,"stream_options":{"include_usage":true}' % (tokens_key, request.max_tokens))
        if log.tools_json:
            pieces.append(b',"tools":')
            pieces.append(log.tools_json)
        pieces.append(b"}")
        return pieces

    async def complete(self, request: ModelRequest, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Stream one chat completion. Raises :class:`ModelError` classified as the module docstring says."""
        import httpx2
        import openai

        client = self._sdk()
        body = b"".join(self._body_pieces(request, take(request)))
        got = Assembly()
        # The body is sent as prepared and the stream read raw (see agent.models._http); the
        # options are those of ``create``.
        opening = partial(
            client.post,
            "/chat/completions",
            cast_to=httpx2.Response,
            content=body,
            options={"headers": {"Content-Type": "application/json"}, "security": {"bearer_auth": True}},
            stream=True,
            stream_cls=None,
        )
        failures = (openai.APIError, httpx2.RequestError)
        chunks = await self._read_stream(
            cast("Callable[[], Awaitable[httpx2.Response]]", opening), got, on_delta, unit="chunk", failures=failures
        )
        if chunks == 0 and got.finish is None:
            raise self._empty("chunk")  # nothing began: charged nothing, no dropped connection
        with answer_started():
            if got.finish is None:
                raise ModelError(
                    ModelErrorKind.CONNECTION,
                    f"the stream from {self.provider} ended after {chunks} chunk(s) without a finish_reason"
                    " (connection dropped?)",
                    usage=got.usage,
                )
            content = got.content()
        finish = got.finish_reason(any(isinstance(b, ToolUseBlock) for b in content))
        usage = got.usage
        if usage is None:
            usage = await self._estimate_usage(body, request.max_tokens, got)
            return ModelResponse(content=content, finish_reason=finish, usage=usage, estimated=True)
        return ModelResponse(content=content, finish_reason=finish, usage=usage)

    async def _estimate_usage(self, body: bytes, max_tokens: int, got: Assembly) -> Usage:
        """A server that ignores ``include_usage``: charge an estimate so budgets still bind. Counted by
        the server's own tokenizer where it has one (:meth:`_server_counts`); else the prompt at the
        model's running ratio of tokens to bytes (calibrated by the calls that did report usage:
        :meth:`~agent.spend.PromptEstimator.likely`) and the answer at the same ratio. The answer
        is never charged more than the call's ``max_tokens``."""
        if not self._warned_no_usage:
            self._warned_no_usage = True
            logger.warning("{} sent no usage for model {}; charging estimates", self.provider, self.name)
        answer = answer_text(got)
        prompt, output = await self._server_counts(body, answer)
        if output is not None and got.finish in ("stop", "tool_calls"):
            output += 1  # the end-of-answer token the model generated, counted by the server, not in the text
        estimator = estimator_for(self.spec)
        if prompt is None:
            prompt = estimator.likely(len(body))
        if output is None:
            output = math.ceil(len(answer.encode()) * estimator.typical_ratio)
        return Usage(input_tokens=prompt, output_tokens=min(max(1, output), max(1, max_tokens)))

    async def _server_counts(self, body: bytes, answer: str) -> tuple[int | None, int | None]:
        """The prompt's and the answer's tokens as the server's own tokenizer counts them, where it has
        one: ``llama-server`` (``POST /apply-template`` puts the request through its chat template,
        ``POST /tokenize`` counts the prompt with its special tokens, then the answer), vLLM (``POST
        /tokenize`` with the messages and tools counts the templated prompt, then the answer). Asked
        only for a call that reported no usage, of a self-hosted server (a ``base_url``); a server
        with neither (404s, or answers of another shape) is not asked again. ``None`` for a figure
        not counted (the caller estimates it)."""
        if self.base_url is None or self.tokenizer == "none":
            return None, None
        root = self.base_url.rstrip("/").removesuffix("/v1")
        request = json.loads(body)
        routes = [self.tokenizer] if self.tokenizer is not None else list(TOKENIZER_ROUTES)
        for route in routes:
            try:
                if route == "llama-server":
                    templated = as_object(await self._ask("post", root + "/apply-template", request), "templated")
                    text = templated.get("prompt")
                    if not isinstance(text, str):
                        raise TypeError("/apply-template answered no prompt")
                    prompt = _count(
                        await self._ask(
                            "post", root + "/tokenize", {"content": text, "add_special": True, "parse_special": True}
                        )
                    )
                    output = (
                        _count(
                            await self._ask(
                                "post",
                                root + "/tokenize",
                                {"content": answer, "add_special": False, "parse_special": False},
                            )
                        )
                        if answer
                        else 0
                    )
                else:
                    asked = {k: request[k] for k in ("model", "messages", "tools") if k in request}
                    prompt = _count(
                        await self._ask("post", root + "/tokenize", {**asked, "add_generation_prompt": True}), "count"
                    )
                    output = _count(
                        await self._ask(
                            "post",
                            root + "/tokenize",
                            {"model": self.name, "prompt": answer, "add_special_tokens": False},
                        ),
                        "count",
                    )
            except Exception as exc:  # best effort: the estimate falls back to the running ratio
                why = self._redact(f"{type(exc).__name__}: {exc}")
                logger.debug("model {}: the {} tokenizer route counted nothing ({})", self.spec, route, why)
                # An error status (a 404) or an answer of another shape: another server's route.
                answered = getattr(exc, "status_code", None) is not None or isinstance(
                    exc, TypeError | KeyError | ValueError
                )
                if self.tokenizer is None and answered:
                    continue
                return None, None  # no answer at all, or a route that worked failed this once
            if self.tokenizer is None:
                logger.info("model {}: usage-less calls are counted by the server's tokenizer ({})", self.spec, route)
            self.tokenizer = route
            return prompt, output
        self.tokenizer = "none"
        return None, None

    def _item(self, event: str | None, data: str) -> object:
        # As the SDK's stream: ``[DONE]`` ends it; an object with an ``error`` is an error.
        if data.startswith("[DONE]"):
            return END
        chunk = json.loads(data)
        if isinstance(chunk, dict) and chunk.get("error"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else None
            if not message or not isinstance(message, str):
                message = "An error occurred during streaming"
            raise StreamErrorItem(message, error)
        return chunk

    def _failure(self, exc: Exception, usage: Usage | None) -> ModelError:
        import httpx2
        import openai

        if isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException):
            return self._timed_out(usage)
        if isinstance(exc, openai.APIConnectionError):
            return self._unreachable(exc, exc.message, usage)
        if isinstance(exc, httpx2.RequestError):
            # The stream broke after the headers (the SDK said so as a connection error caused by it).
            return self._unreachable(exc, str(exc), usage, cause=exc)
        if isinstance(exc, openai.APIStatusError):
            detail = _detail(exc.body) or exc.message
            code = exc.code if isinstance(exc.code, str) else None
            return self._http_error(exc.status_code, detail, exc.response.headers, usage, code, exc.body)
        if isinstance(exc, openai.APIResponseValidationError):
            return ModelError(
                ModelErrorKind.MALFORMED,
                f"{self.provider} sent a response that does not fit the chat-completions schema: {exc.message}",
                usage=usage,
            )
        if not isinstance(exc, StreamErrorItem):
            return ModelError(ModelErrorKind.SERVER, self._redact(f"{self.provider} failed: {exc}")[:1000], usage=usage)
        # An error reported inside the stream ({"error": {...}} in place of a chunk): the server
        # answered and then failed its answer (llama-server's 500 when the model's output leaves the
        # tool-call format). A server fault, not a dropped connection: retried, and counted against
        # the breaker as a server error (``server``, whatever its ``code``, when it states none).
        code = exc.body.get("code") if isinstance(exc.body, dict) else None
        code_status: int | None = None
        if isinstance(code, int):
            code_status = code
        elif isinstance(code, str) and code.isdigit():
            code_status = int(code)
        said = f"error {code_status}" if code_status is not None else "an error"
        return ModelError(
            status_kind(code_status) if code_status is not None else ModelErrorKind.SERVER,
            self._redact(
                f"{self.provider} failed its answer: HTTP 200, then {said} inside the stream"
                f" (a server fault, not a dropped connection): {exc.message}"
            )[:1000],
            usage=usage,
            status=code_status,
        )


#: The servers' tokenizer routes :meth:`OpenAIModel._server_counts` knows, in the order it tries them.
TOKENIZER_ROUTES = ("llama-server", "vllm")


def _count(answer: object, key: str | None = None) -> int:
    """The tokens a ``/tokenize`` answer counts: its ``key`` (vLLM's ``count``), else its ``tokens``' length."""
    data = as_object(answer, "the /tokenize answer")
    if key is not None:
        count = data[key]
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise TypeError(f"/tokenize answered {key} {count!r}")
        return count
    tokens = data["tokens"]
    if not isinstance(tokens, list):
        raise TypeError("/tokenize answered no list of tokens")
    return len(tokens)


def _detail(body: object) -> str | None:
    """The human part of an error body (``{"message": ...}`` or ``{"error": {"message": ...}}``)."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
        return json.dumps(body)[:500]
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return None
