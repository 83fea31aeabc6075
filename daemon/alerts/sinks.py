"""The sinks: a JSON webhook, an ntfy-style plain-text POST, and a command run in the sandbox.

Each sink turns one message into one attempt and reports its outcome (:class:`agent.outbox.Attempt`);
it never raises for a failed delivery, and it never logs a secret (an HMAC key, a token, a secret URL,
a response body is cut short and logged by the sender under the sink's name only).

Every delivery carries the message's stable id, for the receiver to de-duplicate: ``Idempotency-Key``
and ``X-Goald-Notification-Id`` headers on HTTP, ``id`` in the JSON payload, and
``GOALD_NOTIFICATION_ID`` for a command.

The HTTP client (``httpx2``) is imported when the first HTTP sink is built, not at module level: the
daemon's start-up path stays free of the HTTP stack (tests/daemon/test_startup_imports.py), and a
daemon without HTTP sinks never loads it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent import SandboxPolicy, SandboxUnavailable
from agent.outbox import Attempt
from agent.sandbox import Network, Sandbox
from daemon.alerts.config import CommandSink, NotifySettings, NtfySink, WebhookSink, fill
from daemon.alerts.payload import dumps, signature, template_values

if TYPE_CHECKING:
    import httpx2

#: Characters of a failed answer's body kept in the attempt's record.
ERROR_BODY_CHARS = 200
#: ntfy's title header is one short line.
TITLE_CHARS = 120

#: Builds the sandbox of a command sink's run: (work directory, policy) → sandbox.
SandboxFor = Callable[[Path, SandboxPolicy], Sandbox]


class Sink(Protocol):
    """Delivers one message's payload; reports the attempt's outcome."""

    name: str

    async def deliver(self, payload: dict[str, Any]) -> Attempt:
        """One attempt (never raises for a failed delivery)."""
        ...


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300] or type(exc).__name__


def _headers(payload: dict[str, Any], extra: dict[str, str]) -> dict[str, str]:
    return {
        **extra,
        "Idempotency-Key": str(payload["id"]),
        "X-Goald-Notification-Id": str(payload["id"]),
        "X-Goald-Kind": str(payload["kind"]),
        "User-Agent": "goald",
    }


async def _post(client: httpx2.AsyncClient, url: str, body: bytes, headers: dict[str, str], seconds: float) -> Attempt:
    started = time.monotonic()
    try:
        response = await client.post(url, content=body, headers=headers, timeout=seconds)
    except Exception as exc:  # every transport failure is one failed attempt, retried later
        return Attempt(ok=False, error=_error(exc), seconds=round(time.monotonic() - started, 4))
    seconds = round(time.monotonic() - started, 4)
    if 200 <= response.status_code < 300:
        return Attempt(ok=True, status=response.status_code, seconds=seconds)
    text = " ".join(response.text[:ERROR_BODY_CHARS].split())
    return Attempt(ok=False, status=response.status_code, error=f"HTTP {response.status_code}: {text}", seconds=seconds)


class HttpClient:
    """One HTTP connection pool shared by the HTTP sinks and the dead-man request (made on first use)."""

    def __init__(self) -> None:
        self._client: httpx2.AsyncClient | None = None

    def get(self) -> httpx2.AsyncClient:
        """The client (imported and built on first use: see the module docstring)."""
        if self._client is None:
            import httpx2  # the HTTP stack loads only when an HTTP sink is used

            self._client = httpx2.AsyncClient(follow_redirects=False)
        return self._client

    async def aclose(self) -> None:
        """Close the pool."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _url(conf: WebhookSink | NtfySink, what: str) -> str | Attempt:
    """The sink's URL, given or read from its secret; a failed attempt naming what has no value."""
    url = conf.url or (conf.url_secret.read() if conf.url_secret is not None else None)
    if url:
        return url
    assert conf.url_secret is not None
    return Attempt(ok=False, error=f"{what} has no value ({conf.url_secret.describe()})", permanent=True)


class Webhook:
    """A generic JSON webhook (optionally signed, optionally templated)."""

    def __init__(self, conf: WebhookSink, http: HttpClient) -> None:
        self.name = conf.name
        self.conf = conf
        self.http = http

    async def deliver(self, payload: dict[str, Any]) -> Attempt:
        """POST the payload (or the filled template) as JSON."""
        conf = self.conf
        url = _url(conf, "the webhook's URL")
        if isinstance(url, Attempt):
            return url
        body = fill(conf.template, template_values(payload)).encode() if conf.template else dumps(payload)
        headers = _headers(payload, {"Content-Type": "application/json", **conf.headers})
        if conf.secret is not None:
            key = conf.secret.read()
            if key is None:
                return Attempt(
                    ok=False, error=f"the signing key has no value ({conf.secret.describe()})", permanent=True
                )
            headers["X-Goald-Signature"] = signature(key, body)
        return await _post(self.http.get(), url, body, headers, conf.timeout_seconds)


class Ntfy:
    """An ntfy-style plain-text POST: the summary as the body; title, priority and tags as headers."""

    def __init__(self, conf: NtfySink, http: HttpClient) -> None:
        self.name = conf.name
        self.conf = conf
        self.http = http

    async def deliver(self, payload: dict[str, Any]) -> Attempt:
        """POST the summary as text."""
        conf = self.conf
        url = _url(conf, "the ntfy URL")
        if isinstance(url, Attempt):
            return url
        goal = payload.get("goal") or {}
        title = f"goald: {payload['kind'].replace('_', ' ')}" + (f" - {goal['title']}" if goal.get("title") else "")
        headers = _headers(payload, {"Content-Type": "text/plain; charset=utf-8", **conf.headers})
        # HTTP headers are latin-1: ntfy takes a title as is, so non-latin-1 text is replaced.
        headers["Title"] = title[:TITLE_CHARS].encode("latin-1", "replace").decode("latin-1")
        headers["Priority"] = conf.priority.get(payload["kind"], "default")
        if conf.tags:
            headers["Tags"] = ",".join(conf.tags)
        if payload.get("answerUrls") or payload.get("answerUrl"):
            headers["Actions"] = ntfy_actions(payload)
        if conf.token is not None:
            token = conf.token.read()
            if token is None:
                return Attempt(ok=False, error=f"the ntfy token has no value ({conf.token.describe()})", permanent=True)
            headers["Authorization"] = f"Bearer {token}"
        body = str(payload.get("summary", payload["kind"])).encode()
        return await _post(self.http.get(), url, body, headers, conf.timeout_seconds)


#: ntfy shows at most three action buttons.
NTFY_ACTIONS = 3


def ntfy_actions(payload: dict[str, Any]) -> str:
    """ntfy's ``Actions`` header of a question: one button per option (each POSTs its signed link),
    or, without options (or past three), a ``view`` button that opens the link's page to answer in words."""
    options = list(payload.get("answerUrls") or [])
    parts = []
    for o in options[:NTFY_ACTIONS]:
        label = str(o["label"]).replace('"', "'").replace(";", ",")
        parts.append(f'http, "{label}", {o["url"]}, method=POST, clear=true')
    if (not options or len(options) > NTFY_ACTIONS) and payload.get("answerUrl"):
        parts = [*parts[: NTFY_ACTIONS - 1], f"view, answer, {payload['answerUrl']}"]
    return "; ".join(parts).encode("latin-1", "replace").decode("latin-1")


class Command:
    """A command run in the sandbox, in a fresh private work directory holding ``payload.json``."""

    def __init__(self, conf: CommandSink, sandbox_for: SandboxFor) -> None:
        self.name = conf.name
        self.conf = conf
        self.sandbox_for = sandbox_for

    async def deliver(self, payload: dict[str, Any]) -> Attempt:
        """Run the command; exit 0 is delivered."""
        conf = self.conf
        secrets: dict[str, str] = {}
        for name, ref in conf.secrets.items():
            value = ref.read()
            if value is None:
                return Attempt(ok=False, error=f"secret {name} has no value ({ref.describe()})", permanent=True)
            secrets[name] = value
        text = json.dumps(payload, ensure_ascii=False)
        workdir = Path(tempfile.mkdtemp(prefix="goald-notify-"))
        try:
            (workdir / "payload.json").write_text(text)
            policy = SandboxPolicy(network=Network.of(conf.network), secrets=secrets)
            env = {
                "GOALD_NOTIFICATION": text,
                "GOALD_NOTIFICATION_ID": str(payload["id"]),
                "GOALD_NOTIFICATION_KIND": str(payload["kind"]),
                "GOALD_NOTIFICATION_SUMMARY": str(payload.get("summary", "")),
            }
            try:
                sandbox = self.sandbox_for(workdir, policy)
                sandbox = dataclasses.replace(sandbox, env={**sandbox.env, **env})
                if sandbox.run_as is not None:  # a root daemon: the directory is the sandbox user's
                    for path in (workdir, workdir / "payload.json"):
                        os.chown(path, *sandbox.run_as)
                result = await sandbox.run(
                    conf.command, timeout=conf.timeout_seconds, output_cap=2000, merge_stderr=True
                )
            except SandboxUnavailable as exc:
                return Attempt(ok=False, error=f"the command cannot run: {exc}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if result.exit_code == 0:
            return Attempt(ok=True, status=0, seconds=result.seconds)
        what = "timed out" if result.timed_out else f"exit {result.exit_code}"
        tail = " ".join(result.stdout[-ERROR_BODY_CHARS:].split())
        return Attempt(ok=False, status=result.exit_code, error=f"{what}: {tail}", seconds=result.seconds)


def build_sinks(conf: NotifySettings, http: HttpClient, sandbox_for: SandboxFor) -> dict[str, Sink]:
    """Every configured sink, by name."""
    sinks: dict[str, Sink] = {}
    for s in conf.sinks:
        match s:
            case WebhookSink():
                sinks[s.name] = Webhook(s, http)
            case NtfySink():
                sinks[s.name] = Ntfy(s, http)
            case CommandSink():
                sinks[s.name] = Command(s, sandbox_for)
    return sinks
