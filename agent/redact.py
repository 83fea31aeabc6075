"""Redaction of secret values from text before it is stored.

A goal's tools may hold secrets (a git token, a database URL) in their environment, and a command
can print them. Everything a tool returns is recorded as an event and sent to a model, so the exact
value of every known secret is replaced with ``[redacted]`` first. Only exact values are caught: an
encoded or split secret is not, which is why secrets reach only the goals named in the config.
Values shorter than :data:`MIN_LENGTH` are ignored: redacting ``"1"`` would mangle every number.

The same rule keeps a provider's API key out of its error messages (:func:`redact`): there is one
redactor, whatever the secret.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: What a secret value is replaced with.
MARK = "[redacted]"
#: Shorter values are not treated as secrets.
MIN_LENGTH = 4


class Redactor:
    """Replaces each exact secret value (``len >= 4``) with ``[redacted]``."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if len(s) >= MIN_LENGTH}
        # Longest first, so a secret that contains another is replaced whole.
        self._values = tuple(sorted(values, key=lambda s: (-len(s), s)))
        self._pattern = re.compile("|".join(re.escape(s) for s in self._values)) if self._values else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def __repr__(self) -> str:
        # Never the values themselves.
        return f"Redactor({len(self._values)} secret(s))"

    @property
    def longest(self) -> int:
        """Length of the longest secret (0 when there is none)."""
        return len(self._values[0]) if self._values else 0

    def redact(self, text: str) -> str:
        """``text`` with every secret value replaced."""
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(MARK, text)

    def union(self, other: Redactor | None) -> Redactor:
        """A redactor for the secrets of both."""
        if other is None or not other:
            return self
        if not self:
            return other
        return Redactor((*self._values, *other._values))


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with every occurrence of each given secret replaced (``None`` and short values ignored)."""
    return Redactor(s for s in secrets if s).redact(text)
