"""Typed, time-sortable identifiers.

An id is a type prefix (``msg_``, ``ses_``, ``turn_``, ...) followed by 26 Crockford base32
characters: 48 bits of milliseconds since the epoch, then 80 bits that are random for the first
id of a millisecond and incremented for the following ones, so ids made by one process sort in
the order they were made. Ids are validated whenever they are parsed: a malformed id never
reaches the store.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, ClassVar, Self

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from agent.errors import InvalidInput

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_DECODE = {c: i for i, c in enumerate(_ALPHABET)}
_BODY_LEN = 26


class _Clock:
    """Monotonic ULID body generator (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0

    def next_body(self) -> str:
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms <= self._last_ms:
                ms = self._last_ms
                rand = self._last_rand + 1
            else:
                rand = int.from_bytes(os.urandom(10), "big") >> 1  # leave room to increment
            self._last_ms, self._last_rand = ms, rand
        value = (ms << 80) | (rand & ((1 << 80) - 1))
        out = []
        for _ in range(_BODY_LEN):
            out.append(_ALPHABET[value & 31])
            value >>= 5
        return "".join(reversed(out))


_clock = _Clock()


class TypedId(str):
    """A string id with a fixed type prefix. Subclasses set ``prefix``."""

    prefix: ClassVar[str] = ""

    @classmethod
    def new(cls) -> Self:
        """Make a fresh id of this type."""
        return cls(cls.prefix + _clock.next_body())

    @classmethod
    def parse(cls, value: object) -> Self:
        """Validate ``value`` and return it as this id type.

        Raises:
            InvalidInput: naming the expected form when ``value`` is not a valid id of this type.
        """
        if isinstance(value, cls):
            return value
        if not isinstance(value, str):
            raise InvalidInput(f"{cls.__name__} must be a string, got {type(value).__name__}")
        if not value.startswith(cls.prefix):
            raise InvalidInput(f"malformed {cls.__name__} {value[:40]!r}: must start with {cls.prefix!r}")
        body = value[len(cls.prefix) :]
        if len(body) != _BODY_LEN or any(c not in _DECODE for c in body):
            raise InvalidInput(
                f"malformed {cls.__name__} {value[:40]!r}: expected {cls.prefix!r} and "
                f"{_BODY_LEN} Crockford base32 characters"
            )
        if _DECODE[body[0]] > 7:
            raise InvalidInput(f"malformed {cls.__name__} {value[:40]!r}: value out of range")
        return cls(value)

    @property
    def timestamp_ms(self) -> int:
        """Milliseconds since the epoch at which the id was made."""
        value = 0
        for c in self[len(self.prefix) :][:10]:
            value = (value << 5) | _DECODE[c]
        return value >> 2

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def validate(value: object) -> TypedId:
            try:
                return cls.parse(value)
            except InvalidInput as exc:
                raise ValueError(str(exc)) from None

        return core_schema.no_info_plain_validator_function(
            validate, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )


class MessageId(TypedId):
    """Identity of one input message; proves receipt and later admission or cancellation."""

    prefix = "msg_"


class SessionId(TypedId):
    """Identity of one agent session (conversation, inbox and event log)."""

    prefix = "ses_"


class TurnId(TypedId):
    """Identity of one driver pass (turn)."""

    prefix = "turn_"


class GuardId(TypedId):
    """Identity of one spend guard (a budget shared by one or more sessions)."""

    prefix = "grd_"
