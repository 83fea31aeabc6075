"""The providers' server-sent-events parser decodes a stream as the SDKs' own decoder does.

The providers read the answer's stream themselves (:mod:`agent.models._http`); these pin that the
events are the ones the SDK would have produced, however the bytes are split into chunks.
"""

from __future__ import annotations

import random

import pytest

from agent.models.sse import SSEParser

STREAM = (
    b": a comment first\n"
    b'data: {"a": 1}\n\n'
    b"event: content_block_delta\r\n"
    b'data: {"text": "caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac"}\r\n\r\n'
    b"data: first line\r"
    b"data:second line, no space\r\r"
    b"id: 7\nretry: 1500\n\n"
    b"event: ping\ndata:\n\n"
    b"unknown: field\nevent: named only\n\n"
    b"data:  two spaces keep one\n\n"
    b"\n\n\n"
    b"data: [DONE]\n\n"
    b"data: an event never finished\n"
)


def sdk_events(chunks: list[bytes]) -> list[tuple[str | None, str]]:
    from openai._streaming import SSEDecoder

    return [(sse.event, sse.data) for sse in SSEDecoder().iter_bytes(iter(chunks))]


def our_events(chunks: list[bytes]) -> list[tuple[str | None, str]]:
    parser = SSEParser()
    return [event for chunk in chunks for event in parser.feed(chunk)]


def split(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, 12)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def test_whole_stream_gives_the_sdk_events() -> None:
    events = our_events([STREAM])
    assert events == sdk_events([STREAM])
    assert events[0] == (None, '{"a": 1}')
    assert events[1] == ("content_block_delta", '{"text": "café 東京"}')
    assert events[2] == (None, "first line\nsecond line, no space")
    assert (None, "") in events  # id and retry alone still dispatch an event
    assert events[-1] == (None, "[DONE]")


def test_any_split_gives_the_sdk_events() -> None:
    whole = our_events([STREAM])
    for seed in range(300):
        chunks = split(STREAM, random.Random(seed))
        assert our_events(chunks) == sdk_events(chunks) == whole, f"split {seed}: {chunks}"


def test_a_crlf_split_between_chunks_ends_one_line() -> None:
    assert our_events([b"data: x\r", b"\n\r", b"\ndata: y\n\n"]) == [(None, "x"), (None, "y")]


def test_one_byte_at_a_time() -> None:
    chunks = [STREAM[i : i + 1] for i in range(len(STREAM))]
    assert our_events(chunks) == our_events([STREAM])


def test_a_line_that_is_not_utf8_raises() -> None:
    with pytest.raises(UnicodeDecodeError):
        SSEParser().feed(b"data: \xff\xfe\n\n")
