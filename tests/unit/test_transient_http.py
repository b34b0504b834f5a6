"""The HTTP clients' failures an agent retries by default (httpx, requests, urllib3, urllib),
each raised for real against a local port that refuses or a local server that answers a status,
and the `Retry-After` it honours."""

from __future__ import annotations

import email.utils
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import requests
import urllib3

from sasflow.agents import Agent, Defer, PermanentError, TransientHttp
from sasflow.agents.transient import parse_retry_after
from sasflow.errors import DefinitionError


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens there now: a connection is refused


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, _, retry_after = self.path.strip("/").partition("-")
        self.send_response(int(status))
        if retry_after:
            self.send_header("Retry-After", retry_after.replace("_", " "))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib's name
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """GET /<status>[-<Retry-After>] answers that status (spaces of the value as `_`)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join()
    httpd.server_close()


def _raised(action: Callable[[], object]) -> BaseException:
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - the test wants whatever the client raises
        return exc
    raise AssertionError("the client raised nothing")


def _httpx_status(url: str) -> None:
    httpx.get(url, timeout=5).raise_for_status()


def _requests_status(url: str) -> None:
    requests.get(url, timeout=5).raise_for_status()


def _urllib_status(url: str) -> None:
    try:
        urllib.request.urlopen(url, timeout=5).close()  # noqa: S310 - a local http server
    except urllib.error.HTTPError as exc:
        exc.close()  # its status and headers stay readable
        raise


REFUSED: dict[str, Callable[[str], object]] = {
    "httpx": lambda url: httpx.get(url, timeout=5),
    "requests": lambda url: requests.get(url, timeout=5),
    "urllib3": lambda url: urllib3.PoolManager(retries=False).request("GET", url),
    "urllib3 with retries": lambda url: urllib3.PoolManager(retries=1).request("GET", url),
    "urllib": lambda url: urllib.request.urlopen(url, timeout=5),  # noqa: S310 - local http
}
STATUS: dict[str, Callable[[str], object]] = {
    "httpx": _httpx_status,
    "requests": _requests_status,
    "urllib": _urllib_status,
}


@pytest.mark.parametrize("client", sorted(REFUSED))
def test_a_refused_connection_is_transient_for_every_client(client: str) -> None:
    error = _raised(lambda: REFUSED[client](f"http://127.0.0.1:{_closed_port()}/"))
    assert not isinstance(error, ConnectionError | TimeoutError), "the built-ins already retry"
    assert Agent("svc").is_transient(error)
    assert not Agent("svc", http=None).is_transient(error)
    assert not Agent("svc", http=TransientHttp(network=False)).is_transient(error)


def test_a_timeout_is_transient() -> None:
    with socket.socket() as listening:  # accepts, never answers
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}/"
        errors = [
            _raised(lambda: httpx.get(url, timeout=0.05)),
            _raised(lambda: requests.get(url, timeout=0.05)),
        ]
    assert [type(e).__name__ for e in errors] == ["ReadTimeout", "ReadTimeout"]
    assert [Agent("svc").is_transient(e) for e in errors] == [True, True]


@pytest.mark.parametrize("client", sorted(STATUS))
@pytest.mark.parametrize(
    ("status", "transient"),
    [
        *[(500, True), (502, True), (503, True), (504, True), (429, True), (408, True)],
        *[(501, False), (400, False), (404, False), (409, False)],
    ],
)
def test_statuses_retried_by_default(
    server: str, client: str, status: int, transient: bool
) -> None:
    error = _raised(lambda: STATUS[client](f"{server}/{status}"))
    assert Agent("svc").is_transient(error) is transient


def test_the_statuses_are_a_one_line_policy(server: str) -> None:
    only_503 = Agent("svc", http=TransientHttp(statuses=frozenset({503})))
    assert only_503.is_transient(_raised(lambda: _httpx_status(f"{server}/503")))
    assert not only_503.is_transient(_raised(lambda: _httpx_status(f"{server}/500")))


@pytest.mark.parametrize("client", sorted(STATUS))
def test_retry_after_in_seconds_is_read_from_every_client(server: str, client: str) -> None:
    error = _raised(lambda: STATUS[client](f"{server}/429-7"))
    assert Agent("svc").retry_after(error) == 7.0
    assert Agent("svc", http=TransientHttp(retry_after=False)).retry_after(error) is None


def test_retry_after_as_an_http_date(server: str) -> None:
    date = email.utils.formatdate(timeval=2_000_000_000 + 120, usegmt=True)
    assert parse_retry_after(date, now=2_000_000_000) == 120.0
    error = _raised(lambda: _httpx_status(f"{server}/503-{date.replace(' ', '_')}"))
    wait = Agent("svc").retry_after(error)
    assert wait is not None
    assert wait > 0


def test_unreadable_or_past_retry_after() -> None:
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-3") is None
    assert parse_retry_after("Tue, 15 Nov 1994 08:12:31 GMT") == 0.0


def test_no_retry_after_on_a_status_that_is_not_retried(server: str) -> None:
    error = _raised(lambda: _httpx_status(f"{server}/400-5"))
    assert Agent("svc").retry_after(error) is None


def test_the_handlers_own_verdicts_win() -> None:
    agent = Agent("svc")
    assert not agent.is_transient(PermanentError("no"))
    assert not agent.is_transient(Defer(1))
    assert agent.is_transient(ConnectionRefusedError())


def test_an_ssl_failure_is_not_retried() -> None:
    assert not Agent("svc").is_transient(requests.exceptions.SSLError("bad certificate"))


def test_importing_the_agents_loads_no_http_client() -> None:
    """The classification reads class names: `import sasflow.agents` imports no client."""
    code = (
        "import sys, sasflow.agents\n"
        "heavy = ('httpx', 'requests', 'urllib3')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_urllib_http_error_carries_its_status() -> None:
    error = urllib.error.HTTPError("http://x/", 503, "busy", None, None)  # type: ignore[arg-type]
    assert Agent("svc").is_transient(error)
    error.close()


def test_a_client_that_gave_up_after_its_own_retries_is_retried(server: str) -> None:
    """requests with urllib3's status retries raises RetryError after the last 503."""
    session = requests.Session()
    retries = urllib3.Retry(total=1, status_forcelist=[503], backoff_factor=0)
    session.mount("http://", requests.adapters.HTTPAdapter(max_retries=retries))
    with session:
        error = _raised(lambda: session.get(f"{server}/503", timeout=5))
    assert type(error).__name__ == "RetryError"
    assert Agent("svc").is_transient(error)


def test_the_statuses_must_be_http_statuses() -> None:
    assert TransientHttp(statuses={503}).statuses == frozenset({503})  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="HTTP statuses"):
        TransientHttp(statuses=frozenset({5003}))


def test_classes_are_known_by_their_package_not_their_private_module() -> None:
    """An httpx that left `__module__` as its private module still has its errors retried."""
    network = type("NetworkError", (Exception,), {"__module__": "httpx._exceptions"})
    private = type("ConnectError", (network,), {"__module__": "httpx._exceptions"})
    assert Agent("svc").is_transient(private("refused"))
    mine = type("NetworkError", (Exception,), {"__module__": "myapp.errors"})
    assert not Agent("svc").is_transient(mine("refused"))
