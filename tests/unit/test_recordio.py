"""RecordIO framing (sasflow.recordio): records survive any split of the byte stream, and a
broken stream is an error, never a silently skipped record."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sasflow.errors import InvalidMessageError
from sasflow.recordio import Decoder, encode

RECORDS: list[dict[str, Any]] = [
    {"type": "SUBSCRIBED", "subscriber_id": "s-1", "heartbeat_interval_seconds": 15.0},
    {"type": "UPDATE", "uuid": "u-1", "run": 7, "state": "running", "key": "ünïcode ✓"},
    {"type": "HEARTBEAT"},
    {"type": "UPDATE", "uuid": "u-2", "run": 7, "state": "completed", "detail": "x" * 5000},
]


def test_a_record_is_its_byte_length_a_line_feed_and_the_json() -> None:
    assert encode({"type": "HEARTBEAT"}) == b'20\n{"type":"HEARTBEAT"}'
    data = encode({"k": "é"})
    assert data == b'10\n{"k":"\xc3\xa9"}'  # the length counts bytes, not characters


def test_records_survive_any_split_of_the_stream() -> None:
    """Fed one byte at a time, whole, or in random chunks, the decoder yields every record
    once, in order."""
    stream = b"".join(encode(r) for r in RECORDS)
    rng = random.Random(14)  # noqa: S311 - a seeded split, not a secret
    splits: list[list[bytes]] = [[stream], [stream[i : i + 1] for i in range(len(stream))]]
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 40)))
        splits.append([stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)])
    for chunks in splits:
        decoder = Decoder()
        got = [record for chunk in chunks for record in decoder.feed(chunk)]
        assert got == RECORDS
        assert decoder.pending == 0


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (b"x1\n{}", "bad record size"),
        (b"-2\n{}", "bad record size"),
        (b"123456789012\n", "bad record size"),
        (b"1234567890123", "size line too long"),
        (b"3\n{x}", "not JSON"),
        (b"2\n[]", "not a JSON object"),
        (b"99999999\n", "exceeds"),
    ],
)
def test_a_broken_stream_is_an_error(stream: bytes, message: str) -> None:
    with pytest.raises(InvalidMessageError, match=message):
        list(Decoder().feed(stream))
