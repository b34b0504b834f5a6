"""A small TCP proxy for tests: one listening port in front of a switchable backend, which
can re-chunk the backend's chunked HTTP responses at random boundaries (as an intermediary
may): each chunk it receives is sent on as HTTP chunks of 1 to 64 bytes, each in a TCP segment
of its own."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (point a proxy's backend at it to keep clients
    out)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        return int(listener.getsockname()[1])


def url_through(url: str, port: int) -> str:
    """`url` (credentials, path and query kept) with its host and port replaced by 127.0.0.1 and
    `port`: the same service, reached through a proxy."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class Proxy:
    """Forwards each accepted connection to `backend` (a port on 127.0.0.1, switchable)."""

    def __init__(self, backend: int, *, rechunk: bool = False, seed: int = 14) -> None:
        self.backend = backend
        self.rechunk = rechunk
        self.chunks = 0
        """Pieces sent to clients (more than the backend's writes when re-chunking)."""
        self._random = random.Random(seed)  # noqa: S311 - split points, not secrets
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="proxy", daemon=True)

    def __enter__(self) -> Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        # close() alone does not wake the thread blocked in accept() (Linux): the join below
        # then waited its full 5 s. shutdown() makes that accept() fail at once.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()
        self._thread.join(5)

    def cut(self) -> None:
        """Drop every connection open through the proxy, as a network cut does (new ones
        still go to `backend`: point it at a closed port first to keep them out)."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.backend), timeout=5)
            except OSError:
                client.close()  # the backend is down: the client sees a closed connection
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink, split in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(source, sink, split), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, split: bool) -> None:
        rechunker = _Rechunker(self._pieces) if split and self.rechunk else None
        try:
            while data := source.recv(65536):
                if rechunker is None:
                    sink.sendall(data)
                    continue
                for piece in rechunker.feed(data):
                    sink.sendall(piece)
                    self.chunks += 1
                    time.sleep(0.0002)  # separate TCP segments, not one coalesced write
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _pieces(self, data: bytes) -> Iterator[bytes]:
        start = 0
        while start < len(data):
            with self._lock:
                size = self._random.randint(1, 64)
            yield data[start : start + size]
            start += size


class _Rechunker:
    """Re-frames one chunked HTTP response (head passed on as is): chunk data is re-cut by
    `pieces` into chunks of its own sizes."""

    def __init__(self, pieces: Callable[[bytes], Iterator[bytes]]) -> None:
        self._pieces = pieces
        self._buffer = b""
        self._in_head = True
        self._passthrough = False  # a response not chunked: the rest goes on as it comes
        self._remaining = 0  # bytes left of the current chunk's data

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._passthrough:
            yield data
            return
        self._buffer += data
        if self._in_head:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head, self._buffer = self._buffer[: end + 4], self._buffer[end + 4 :]
            self._in_head = False
            yield head
            if b"transfer-encoding: chunked" not in head.lower():
                self._passthrough = True
                if self._buffer:
                    yield self._buffer
                self._buffer = b""
                return
        while self._buffer:
            if self._remaining:
                data, self._buffer = (
                    self._buffer[: self._remaining],
                    self._buffer[self._remaining :],
                )
                self._remaining -= len(data)
                for piece in self._pieces(data):
                    yield b"%x\r\n%s\r\n" % (len(piece), piece)
                continue
            line_end = self._buffer.find(b"\r\n")
            if line_end < 0:
                return
            line, rest = self._buffer[:line_end], self._buffer[line_end + 2 :]
            if line == b"":  # the CRLF closing a chunk's data
                self._buffer = rest
                continue
            size = int(line.split(b";")[0], 16)
            self._buffer = rest
            if size == 0:  # the last chunk (no trailers here); the next response may follow
                yield b"0\r\n\r\n"
                self._buffer = self._buffer[2:]
                self._in_head = True
                return
            self._remaining = size
