"""RecordIO framing of the subscription stream: each record is its length in bytes in ASCII
decimal, a line feed, then that many bytes of JSON.

    records     = *record
    record      = record-size LF record-data
    record-size = 1*DIGIT
    record-data = record-size(OCTET)

Intermediaries may split the byte stream anywhere, so `Decoder` takes chunks of any size and
yields whole records. Used by the API server (encoding) and the SDK (decoding); no
dependencies, so the SDK stays light.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sasflow.errors import InvalidMessageError

MAX_RECORD_BYTES = 16 * 1024 * 1024
"""A record larger than this is a broken stream, not a big update."""

_MAX_SIZE_DIGITS = len(str(MAX_RECORD_BYTES))


def encode(record: dict[str, Any]) -> bytes:
    """One record: the compact JSON of `record`, prefixed by its size."""
    data = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
    return b"%d\n%s" % (len(data), data)


class Decoder:
    """Incremental decoder: `feed` bytes as they arrive, get the records they complete."""

    def __init__(self, *, max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        self._buffer = bytearray()
        self._size: int | None = None
        self._max = max_record_bytes

    def feed(self, chunk: bytes) -> Iterator[dict[str, Any]]:
        """The records completed by `chunk`; raises InvalidMessageError on a broken stream."""
        self._buffer += chunk
        while True:
            if self._size is None:
                newline = self._buffer.find(b"\n")
                if newline < 0:
                    if len(self._buffer) > _MAX_SIZE_DIGITS:
                        raise InvalidMessageError("RecordIO: record size line too long")
                    return
                self._size = self._parse_size(bytes(self._buffer[:newline]))
                del self._buffer[: newline + 1]
            if len(self._buffer) < self._size:
                return
            data = bytes(self._buffer[: self._size])
            del self._buffer[: self._size]
            self._size = None
            yield _parse_record(data)

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a whole record."""
        return len(self._buffer)

    def _parse_size(self, line: bytes) -> int:
        if not line.isdigit() or len(line) > _MAX_SIZE_DIGITS:
            raise InvalidMessageError(f"RecordIO: bad record size {line[:20]!r}")
        size = int(line)
        if size > self._max:
            raise InvalidMessageError(f"RecordIO: record of {size} bytes exceeds {self._max}")
        return size


def _parse_record(data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data)
    except ValueError as exc:
        raise InvalidMessageError(f"RecordIO: record is not JSON: {exc}") from exc
    if not isinstance(record, dict):
        raise InvalidMessageError("RecordIO: record is not a JSON object")
    return record
