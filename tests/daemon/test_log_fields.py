"""The journal datagram and the ids a log line is about, built from real loguru records."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from loguru import logger

from daemon.logs import journal_datagram, subject_ids

if TYPE_CHECKING:
    from loguru import Message

GOAL = "goal_01JZZZZZZZZZZZZZZZZZZZZZZZ"
SESSION = "ses_01JYYYYYYYYYYYYYYYYYYYYYYY"


def records(emit: object) -> list[Message]:
    got: list[Message] = []
    handler = logger.add(got.append, level="DEBUG", format="{message}")
    try:
        assert callable(emit)
        emit()
    finally:
        logger.remove(handler)
    return got


def test_a_multi_line_message_uses_the_binary_field_and_ids_come_from_the_text() -> None:
    (msg,) = records(lambda: logger.warning("goal {} stalled\non session {}", GOAL, SESSION))
    data = journal_datagram(msg.record)
    head = b"MESSAGE\n"
    assert data.startswith(head)
    (size,) = struct.unpack("<Q", data[len(head) : len(head) + 8])
    body = data[len(head) + 8 : len(head) + 8 + size].decode()
    assert body == f"goal {GOAL} stalled\non session {SESSION}"
    rest = data[len(head) + 8 + size + 1 :].decode().splitlines()
    assert "PRIORITY=4" in rest and f"GOAL_ID={GOAL}" in rest and f"SESSION_ID={SESSION}" in rest


def test_bound_ids_win_and_a_line_about_nothing_has_none() -> None:
    other = "goal_01JXXXXXXXXXXXXXXXXXXXXXXX"
    bound, plain = records(lambda: (logger.bind(goal_id=other).info("about {}", GOAL), logger.info("daemon serving")))
    assert subject_ids(bound.record) == (other, None)
    assert subject_ids(plain.record) == (None, None)
    assert b"GOAL_ID" not in journal_datagram(plain.record)
    # An id-like word that is not a whole id is not taken.
    (short,) = records(lambda: logger.info("goal_123 is not an id"))
    assert subject_ids(short.record) == (None, None)
