"""Signed one-time links that answer a goal's question from a notification (a phone, a chat).

A link is ``<public url>/answer/<token>``; the token is ``<question id>.<option>.<expiry>.<mac>``:
option ``N`` (from 1) answers with that option, ``0`` opens a form for an answer in words; the
expiry is the question's deadline (seconds since the epoch); the MAC is HMAC-SHA256 of the three
under a key of its own (``<state_dir>/answer-links.key``, 32 random bytes, mode 0600, made at the
first start), base64url. So a link:

* cannot be forged: a changed question id, option or expiry fails the MAC;
* is one-time: it answers through the same conditional update as every other path, so once the
  question is closed (by this link, another, the CLI, the default at its deadline, a withdrawal) it
  is refused with who answered and when;
* opens nothing else: the key signs links only, the token is checked only on ``/answer/``, and it
  is neither a status page token nor a cookie.

Opening a link (``GET``) only shows the question and a button: link previews and mail scanners
fetch URLs, and must not answer. The button, or an ntfy action button, ``POST``\\s it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from daemon.errors import DaemonError

#: The key's file in the state directory.
KEY_FILE = "answer-links.key"
_TOKEN = re.compile(r"^(q_[0-9A-HJKMNP-TV-Z]{26})\.(\d{1,2})\.(\d{1,12})\.([A-Za-z0-9_-]{43})$")


class LinkRefused(DaemonError):
    """A link that is malformed, forged or expired (nothing was read or changed)."""


def load_key(state_dir: Path) -> bytes:
    """The links' key, made (0600, 32 random bytes) if the state directory has none yet."""
    path = state_dir / KEY_FILE
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(32))
        finally:
            os.close(fd)
    key = path.read_bytes()
    if len(key) < 32:
        raise DaemonError(f"{path} holds {len(key)} bytes: remove it and restart to make a new key")
    return key


class AnswerLinks:
    """Makes and checks the links of one daemon (``base``: the status page's public address)."""

    def __init__(self, key: bytes | Path, base: str | None) -> None:
        #: The key, or the state directory it is read from (made there if missing) at first use.
        self._key = key
        self.base = base.rstrip("/") if base else None

    def _secret(self) -> bytes:
        if isinstance(self._key, Path):
            self._key = load_key(self._key)
        return self._key

    def _mac(self, question_id: str, option: int, expiry: int) -> str:
        digest = hmac.new(self._secret(), f"{question_id}.{option}.{expiry}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def token(self, question_id: str, option: int, expires: datetime) -> str:
        """The token of ``option`` (0: in words) of ``question_id``, valid until ``expires``."""
        expiry = int(expires.timestamp())
        return f"{question_id}.{option}.{expiry}.{self._mac(question_id, option, expiry)}"

    def check(self, token: str, now: datetime | None = None) -> tuple[str, int]:
        """The question id and option a token answers.

        Raises:
            LinkRefused: malformed, forged, or past its expiry.
        """
        found = _TOKEN.match(token)
        if found is None:
            raise LinkRefused("this is not an answer link (it is malformed or cut short)")
        qid, option, expiry, mac = found.group(1), int(found.group(2)), int(found.group(3)), found.group(4)
        if not hmac.compare_digest(mac, self._mac(qid, option, expiry)):
            raise LinkRefused("this answer link is not valid (it was changed, or made by another daemon)")
        if (now or datetime.now(UTC)).timestamp() > expiry:
            raise LinkRefused("this answer link has expired: the question's deadline has passed")
        return qid, option

    def urls(self, question: dict[str, Any]) -> dict[str, Any]:
        """``answerUrl`` (an answer in words) and ``answerUrls`` (one per option) of a notification's question."""
        if self.base is None:
            return {}
        expires = datetime.fromisoformat(str(question["deadline"]))
        qid = str(question["id"])
        options = list(question.get("options") or [])
        return {
            "answerUrl": f"{self.base}/answer/{self.token(qid, 0, expires)}",
            "answerUrls": [
                {"option": i, "label": label, "url": f"{self.base}/answer/{self.token(qid, i, expires)}"}
                for i, label in enumerate(options, 1)
            ],
        }

    def decorate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` with its answer links when it is an open question's (``goal_question``)."""
        question = payload.get("question")
        if payload.get("kind") != "goal_question" or not isinstance(question, dict) or self.base is None:
            return payload
        return {**payload, **self.urls(question)}


__all__ = ["KEY_FILE", "AnswerLinks", "LinkRefused", "load_key"]
