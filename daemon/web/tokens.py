"""Named access tokens of the status page, stored hashed in the state directory.

``goald web token add NAME [--read-only]`` prints a new token once; the file keeps only a random
per-token salt and ``sha256(salt + token)``. A token is 32 random bytes, so a fast hash is enough
(a slow password hash guards low-entropy secrets; nothing here is guessable), and a leaked file
does not give the tokens away. The file is JSON, mode 0600, replaced atomically; the daemon
re-reads it when it changes, so a token added or removed while it runs applies at the next request.

What the browser keeps is not the token: after the first visit (``?token=``) the page sets a
cookie ``NAME.MAC`` where ``MAC = HMAC(digest, "cookie")``, and the forms carry
``HMAC(digest, "csrf")``. Both derive from the stored digest, which only the daemon reads: they
cannot be forged without the file, they do not reveal the token, and removing the token revokes
them at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from daemon.errors import DaemonError

#: What a token's name may be: it is shown in events as the caller ("web:NAME").
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
PREFIX = "gwt_"


class TokenError(DaemonError, ValueError):
    """A token name that is invalid, taken or unknown (the message says which)."""


@dataclass(frozen=True)
class WebToken:
    """One named token as stored (never the token itself)."""

    name: str
    read_only: bool
    created: str
    salt: str
    digest: str

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` is this token (constant time)."""
        return hmac.compare_digest(_digest(self.salt, secret), self.digest)

    def mac(self, purpose: str) -> str:
        """A value derived from the stored digest for ``purpose`` (``cookie``, ``csrf``)."""
        return hmac.new(bytes.fromhex(self.digest), purpose.encode(), hashlib.sha256).hexdigest()

    @property
    def cookie(self) -> str:
        """The cookie that stands for this token after the first visit."""
        return f"{self.name}.{self.mac('cookie')}"

    @property
    def csrf(self) -> str:
        """The token that forms and scripts send with every state-changing request."""
        return self.mac("csrf")


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode()).hexdigest()


class TokenFile:
    """The token file: read (cached by its modification time) and changed atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._tokens: dict[str, WebToken] = {}

    def tokens(self) -> dict[str, WebToken]:
        """Every token by name (an absent file: none)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._tokens = None, {}
            return {}
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            raw = json.loads(self.path.read_text() or "{}")
            self._tokens = {
                str(t["name"]): WebToken(
                    name=str(t["name"]),
                    read_only=bool(t.get("readOnly", False)),
                    created=str(t.get("created", "")),
                    salt=str(t["salt"]),
                    digest=str(t["digest"]),
                )
                for t in raw.get("tokens", [])
            }
            self._stamp = stamp
        return self._tokens

    def check(self, secret: str) -> WebToken | None:
        """The token ``secret`` is, or ``None``."""
        if not secret.startswith(PREFIX):
            return None
        found = None
        for token in self.tokens().values():
            if token.matches(secret):  # no early exit: the time does not tell which name matched
                found = token
        return found

    def by_cookie(self, value: str) -> WebToken | None:
        """The token a cookie stands for, or ``None``."""
        name, _, mac = value.partition(".")
        token = self.tokens().get(name)
        if token is None or not hmac.compare_digest(token.mac("cookie"), mac):
            return None
        return token

    def add(self, name: str, *, read_only: bool = False) -> str:
        """Make a token named ``name``; returns it (the only time it is seen).

        Raises:
            TokenError: the name is invalid or taken (nothing was written).
        """
        if not NAME.match(name):
            raise TokenError(f"token name {name!r}: letters, digits and _.@- only, at most 64, starting alphanumeric")
        tokens = dict(self.tokens())
        if name in tokens:
            raise TokenError(f"a token named {name!r} exists: remove it first to replace it")
        secret = PREFIX + secrets.token_urlsafe(32)
        salt = secrets.token_hex(16)
        tokens[name] = WebToken(
            name=name,
            read_only=read_only,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            salt=salt,
            digest=_digest(salt, secret),
        )
        self._write(tokens)
        return secret

    def remove(self, name: str) -> None:
        """Remove the token ``name`` (its cookies stop working at once).

        Raises:
            TokenError: there is no such token.
        """
        tokens = dict(self.tokens())
        if tokens.pop(name, None) is None:
            raise TokenError(f"no token named {name!r}")
        self._write(tokens)

    def _write(self, tokens: dict[str, WebToken]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = {
            "tokens": [
                {"name": t.name, "readOnly": t.read_only, "created": t.created, "salt": t.salt, "digest": t.digest}
                for t in tokens.values()
            ]
        }
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self._stamp = None
