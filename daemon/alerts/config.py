"""The ``[notify]`` settings: where notifications go, how they are grouped and retried.

Validated when the configuration loads, so a bad sink stops the daemon before it starts with the
key and the reason (an unknown ``kinds`` entry, a URL that is not http(s), a template that is not
JSON once filled in or names an unknown placeholder, two sinks with one name). Secrets (an HMAC key,
an ntfy token, a URL that is itself a secret such as a chat incoming webhook's) are *named* (an
environment variable or a systemd credential), never written into the file, and never logged: a
sink shows up in logs by its name only.
"""

from __future__ import annotations

import json
import re
import string
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent.sandbox.network import NetworkSetting
from agent.secret import SecretSource
from daemon.alerts.kinds import NotificationKind

#: The placeholders a payload template may use (``$name`` or ``${name}``), each filled JSON-escaped.
TEMPLATE_FIELDS = (
    "id",
    "kind",
    "status",
    "reason",
    "summary",
    "title",
    "goal_id",
    "goal_key",
    "provider",
    "schedule",
    "count",
    "time",
    "host",
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    return value


class _Sink(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: How logs, ``goald notify test NAME`` and the delivery records name the sink.
    name: str
    #: The kinds this sink receives (empty: every kind).
    kinds: list[NotificationKind] = []
    timeout_seconds: float = Field(default=10.0, gt=0, le=600)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit")
        return value

    def wants(self, kind: str) -> bool:
        """Whether this sink receives notifications of ``kind``."""
        return not self.kinds or kind in self.kinds


class _HttpSink(_Sink):
    #: The endpoint (or ``url_secret``, when the URL is itself a secret).
    url: str | None = None
    url_secret: SecretSource | None = None
    #: Extra request headers (not secret).
    headers: dict[str, str] = {}

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return _http_url(value) if value is not None else None

    @model_validator(mode="after")
    def _one_url(self) -> _HttpSink:
        if (self.url is None) == (self.url_secret is None):
            raise ValueError("give exactly one of url or url_secret")
        return self


class WebhookSink(_HttpSink):
    """A generic JSON webhook: POSTs the documented payload (or ``template`` filled in)."""

    type: Literal["webhook"]
    #: HMAC-SHA256 key: the body's signature goes in ``X-Goald-Signature: sha256=<hex>``.
    secret: SecretSource | None = None
    #: A JSON text with ``$placeholders`` (see :data:`TEMPLATE_FIELDS`) sent instead of the payload,
    #: e.g. ``{"text": "$summary"}`` for a chat's incoming webhook.
    template: str | None = None

    @field_validator("template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is None:
            return None
        tpl = string.Template(value)
        if not tpl.is_valid():
            raise ValueError("is not a valid template: write $name or ${name}, and $$ for a dollar sign")
        unknown = sorted(set(tpl.get_identifiers()) - set(TEMPLATE_FIELDS))
        if unknown:
            raise ValueError(f"names unknown placeholder(s) {unknown}; known: {', '.join(TEMPLATE_FIELDS)}")
        sample = {name: 'a "quoted" value\nwith a newline' for name in TEMPLATE_FIELDS}
        try:
            json.loads(fill(value, sample))
        except ValueError as exc:
            raise ValueError(f"is not JSON once its placeholders are filled in: {exc}") from None
        return value


class NtfySink(_HttpSink):
    """An ntfy-style plain-text POST: the summary as the body, title, priority and tags as headers."""

    type: Literal["ntfy"]
    #: ``min``, ``low``, ``default``, ``high`` or ``urgent`` (ntfy's names), by kind; others ``default``.
    priority: dict[NotificationKind, Literal["min", "low", "default", "high", "urgent"]] = {}
    tags: list[str] = []
    #: A bearer token (``Authorization: Bearer``), for a protected topic.
    token: SecretSource | None = None


class CommandSink(_Sink):
    """A command run in the sandbox: the payload as JSON in ``$GOALD_NOTIFICATION`` and ``payload.json``
    in its working directory; exit 0 means delivered."""

    type: Literal["command"]
    command: list[str] = Field(min_length=1)
    #: The command's network (a pager's CLI needs one): ``"off"``, ``{allow = [names]}`` (through
    #: the daemon's proxy, attempts logged) or ``"host"`` (unsafe); ``true``/``false`` as ``"host"``/``"off"``.
    network: NetworkSetting = "off"
    #: Secret environment variables of the command, by name (redacted from its output).
    secrets: dict[str, SecretSource] = {}
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)


AnySink = Annotated[WebhookSink | NtfySink | CommandSink, Field(discriminator="type")]


class NotifySettings(BaseModel):
    """``[notify]``: sinks, grouping, retries and the dead-man URL."""

    model_config = ConfigDict(extra="forbid")

    #: Where notifications go (``[[notify.sinks]]`` tables).
    sinks: list[AnySink] = []
    #: Seconds notifications of one cause wait to be sent as one message.
    group_window_seconds: float = Field(default=5.0, ge=0, le=3600)
    #: The first retry's delay; doubled after each failed attempt, up to ``retry_max_seconds``.
    retry_first_seconds: float = Field(default=1.0, gt=0, le=3600)
    retry_max_seconds: float = Field(default=600.0, gt=0, le=86_400)
    #: Attempts per message and sink before it is recorded ``failed`` (the default, at the default
    #: backoff, keeps trying for about 16 hours).
    max_attempts: int = Field(default=100, ge=1, le=100_000)
    #: Seconds a fully delivered (or failed) message and its attempts are kept.
    keep_seconds: float = Field(default=7 * 86_400.0, ge=0)
    #: A URL requested (GET) every ``deadman_interval_seconds`` while the daemon is healthy.
    deadman_url: str | None = None
    deadman_url_secret: SecretSource | None = None
    deadman_interval_seconds: float = Field(default=60.0, ge=1, le=86_400)
    #: A goal's question (``goal_question``) is sent again every this many seconds until it is
    #: answered, at most ``question_repeat_max`` times more (0: sent once).
    question_repeat_seconds: float = Field(default=3600.0, ge=1, le=7 * 86_400)
    question_repeat_max: int = Field(default=3, ge=0, le=100)

    @field_validator("deadman_url")
    @classmethod
    def _deadman(cls, value: str | None) -> str | None:
        return _http_url(value) if value is not None else None

    @model_validator(mode="after")
    def _check(self) -> NotifySettings:
        names = [s.name for s in self.sinks]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"sink names must be unique: {', '.join(twice)} given more than once")
        if self.retry_max_seconds < self.retry_first_seconds:
            raise ValueError("retry_max_seconds must be at least retry_first_seconds")
        if self.deadman_url is not None and self.deadman_url_secret is not None:
            raise ValueError("give at most one of deadman_url or deadman_url_secret")
        return self

    def sinks_for(self, kind: str) -> list[str]:
        """The names of the sinks that receive ``kind``."""
        return [s.name for s in self.sinks if s.wants(kind)]


def fill(template: str, values: dict[str, str]) -> str:
    """``template`` with each placeholder replaced by its value JSON-escaped (quotes not added)."""
    return string.Template(template).substitute({k: json.dumps(v, ensure_ascii=False)[1:-1] for k, v in values.items()})
