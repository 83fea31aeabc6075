"""``[web]``: where the status page listens and who may see it.

The page is off unless ``enabled = true``. It listens on a TCP address (``listen``, loopback by
default) and/or a unix socket (``socket``, for an operator's reverse proxy). A non-loopback
``listen`` is refused when the configuration is read (exit 78, naming the key) unless
``allow_remote = true`` says that something (a TLS-terminating proxy, a private network) stands in
front: the page's tokens travel in cookies, which plain HTTP on an open network gives away.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from daemon.metrics_service import is_loopback, split_listen

#: The token file's name in the state directory (unless ``tokens_file`` names another).
TOKENS_FILE = "web-tokens.json"


class WebSettings(BaseModel):
    """``[web]``: the status page."""

    model_config = ConfigDict(extra="forbid")

    #: Serve the page (``goald serve`` starts it with the daemon).
    enabled: bool = False
    #: ``HOST:PORT`` to listen on (``None``: no TCP listener; then ``socket`` must be set).
    listen: str | None = "127.0.0.1:8470"
    #: A unix socket to listen on as well (mode 0660 is left to the operator's proxy setup: 0600 here).
    socket: Path | None = None
    #: Allow ``listen`` on an address that is not loopback (TLS or a private network in front).
    allow_remote: bool = False
    #: Where the hashed tokens are kept (default: ``<state_dir>/web-tokens.json``).
    tokens_file: Path | None = None
    #: Events one live page may have waiting before its stream is closed (it reconnects and
    #: catches up from the store by sequence number): what bounds the daemon's memory per page.
    live_backlog: int = Field(default=2000, ge=10, le=1_000_000)
    #: Live pages served at once; one more is answered 503 (each holds a subscription).
    max_live_pages: int = Field(default=64, ge=1, le=10_000)
    #: Mark the cookie ``Secure`` (set it when the page is reached through HTTPS only).
    secure_cookie: bool = False
    #: The page's address as people reach it (``https://goald.example.org``): the base of the signed
    #: answer links in question notifications. Default: ``http://`` + ``listen``.
    public_url: str | None = Field(default=None, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")

    @model_validator(mode="after")
    def _check(self) -> WebSettings:
        if self.listen is not None:
            host, _port = split_listen(self.listen)
            if not self.allow_remote and not is_loopback(host):
                raise ValueError(
                    f"listen {self.listen!r} is not a loopback address: the page's cookies would cross the"
                    " network in the clear (use 127.0.0.1 or ::1, or put TLS in front and set allow_remote = true)"
                )
        if self.enabled and self.listen is None and self.socket is None:
            raise ValueError("enabled, but neither listen nor socket is set: the page would be nowhere")
        if self.socket is not None and not self.socket.expanduser().is_absolute():
            raise ValueError(f"socket must be an absolute path, got {str(self.socket)!r}")
        return self

    def base_url(self) -> str | None:
        """Where people reach the page (``public_url``, else ``http://`` + ``listen``); ``None`` when off."""
        if not self.enabled:
            return None
        if self.public_url is not None:
            return self.public_url.rstrip("/")
        return f"http://{self.listen}" if self.listen is not None else None

    def tokens_path(self, state_dir: Path) -> Path:
        """The token file."""
        return self.tokens_file.expanduser() if self.tokens_file is not None else state_dir.expanduser() / TOKENS_FILE
