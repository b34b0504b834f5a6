"""`Client`: the Python SDK of `sasflow api` (REST tasks, alerts, the subscription stream).

Blocking, on httpx; one `Client` per thread. Every failed call raises `ApiError` with the
server's error code and message (docs/api.md lists them).
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import httpx

from sasflow.client.errors import ApiError
from sasflow.client.subscription import StreamFilter, StreamUpdate, Subscription

JSONObject = dict[str, Any]


@dataclass(frozen=True)
class Page:
    """One page of a listing, and the cursor of the next (None on the last)."""

    items: list[JSONObject]
    next_cursor: int | None = field(default=None)


class Client:
    """Calls `sasflow api` at `base_url` with a bearer `token`.

    >>> with Client("http://127.0.0.1:8080", token) as api:   # doctest: +SKIP
    ...     run = api.submit("order", {"order_id": 7}, key="order-7")
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        verify: bool | str = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            verify=verify,
            transport=transport,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    # -- runs ----------------------------------------------------------------------------

    def submit(
        self,
        workflow: str,
        input: JSONObject,  # noqa: A002 - the API's name for the run's input
        *,
        key: str | None = None,
        priority: int | None = None,
        version: int | None = None,
        callback_url: str | None = None,
        pool: str | None = None,
    ) -> JSONObject:
        """Submit a run; idempotent on (workflow, key). Returns `{"id", "created",
        "input_differs", "message", "run"}` (`input_differs`: the key's run was recorded with
        another input, which it keeps)."""
        body: JSONObject = {"workflow": workflow, "input": input}
        optional = {
            "key": key,
            "priority": priority,
            "version": version,
            "callback_url": callback_url,
            "pool": pool,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return self._call("POST", "/v1/runs", json=body)

    def submit_many(self, runs: Sequence[Mapping[str, Any]]) -> list[JSONObject]:
        """Submit up to 1,000 runs in one request and one transaction, each a mapping as the
        body of `submit` takes it (`workflow`, `input`, and optionally `key`, `priority`,
        `version`, `callback_url`, `pool`, `start_at`). Returns one answer per run, in order:
        `{"index", "status", ...}` with `status` `created` or `duplicate` (and `id`, `key`,
        `input_differs`), or `refused` (and `error`, `message`, `retry_after` for
        `backlog_full`): a refused run raises nothing, submit it again as its answer says."""
        answer = self._call("POST", "/v1/runs/batch", json={"runs": [dict(r) for r in runs]})
        items: list[JSONObject] = answer["runs"]
        return items

    def get(self, run_id: int) -> JSONObject:
        """One run with its steps and last events."""
        return self._call("GET", f"/v1/runs/{run_id}")

    def page(
        self,
        *,
        state: str | Sequence[str] | None = None,
        workflow: str | None = None,
        key: str | None = None,
        cursor: int | None = None,
        limit: int | None = None,
    ) -> Page:
        """One page of runs matching the filters, newest first (`state`: one or several)."""
        states = [state] if isinstance(state, str) else list(state or ())
        params: list[tuple[str, str | int]] = [("state", s) for s in states]
        optional = {"workflow": workflow, "key": key, "cursor": cursor, "limit": limit}
        params += [(k, v) for k, v in optional.items() if v is not None]
        body = self._call("GET", "/v1/runs", params=params)
        return Page(list(body["runs"]), body.get("next_cursor"))

    def list(
        self,
        *,
        state: str | Sequence[str] | None = None,
        workflow: str | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> Iterator[JSONObject]:
        """Every run matching the filters, fetching page after page as they are iterated."""
        cursor: int | None = None
        while True:
            page = self.page(state=state, workflow=workflow, key=key, cursor=cursor, limit=limit)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel(self, run_id: int, reason: str, *, compensate: bool = False) -> JSONObject:
        """Cancel a run (audited with the token's name)."""
        return self._call(
            "POST",
            f"/v1/runs/{run_id}/cancel",
            json={"reason": reason, "compensate": compensate},
        )

    def resubmit(
        self,
        run_id: int,
        reason: str,
        *,
        from_step: str | None = None,
        input: JSONObject | None = None,  # noqa: A002 - the API's name for the step's input
    ) -> JSONObject:
        """Run a finished run again, from `from_step` if given, with a new input if given."""
        body: JSONObject = {"reason": reason}
        if from_step is not None:
            body["from_step"] = from_step
        if input is not None:
            body["input"] = input
        return self._call("POST", f"/v1/runs/{run_id}/resubmit", json=body)

    # -- alerts --------------------------------------------------------------------------

    def alerts(
        self,
        *,
        include_acknowledged: bool = False,
        kind: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[JSONObject]:
        """The open alerts (all with `include_acknowledged`), newest first."""
        params: dict[str, str | int] = {"include_acknowledged": str(include_acknowledged).lower()}
        if kind is not None:
            params["kind"] = kind
        if limit is not None:
            params["limit"] = limit
        return list(self._call("GET", "/v1/alerts", params=params)["alerts"])

    def acknowledge_alert(self, alert_id: int, reason: str) -> JSONObject:
        """Acknowledge an alert (audited with the token's name)."""
        return self._call("POST", f"/v1/alerts/{alert_id}/ack", json={"reason": reason})

    # -- the subscription stream ---------------------------------------------------------

    def subscription(
        self,
        where: StreamFilter | Mapping[str, Any],
        handler: Callable[[StreamUpdate], None],
        *,
        name: str = "sdk",
        subscriber_id: str | None = None,
        max_backoff: float = 15.0,
        stop: threading.Event | None = None,
        on_failure: Callable[[JSONObject], None] | None = None,
    ) -> Subscription:
        """A subscription, not started: `run()` it in a thread of its own to keep control.
        `on_failure` gets each FAILURE record (an agent instance lost; never acknowledged)."""
        return Subscription(
            self._http,
            StreamFilter.of(where),
            handler,
            name=name,
            subscriber_id=subscriber_id,
            max_backoff=max_backoff,
            stop=stop,
            on_failure=on_failure,
        )

    def subscribe(
        self,
        where: StreamFilter | Mapping[str, Any],
        handler: Callable[[StreamUpdate], None],
        *,
        name: str = "sdk",
        subscriber_id: str | None = None,
        stop: threading.Event | None = None,
        on_failure: Callable[[JSONObject], None] | None = None,
    ) -> Subscription:
        """Follow the stream until `stop` is set: call `handler` with each UPDATE and
        acknowledge it when the handler returns; reconnect on a lost or dead stream (5 missed
        heartbeats), with exponential backoff capped at 15 s, as the same subscriber.
        `on_failure` gets each FAILURE record (an agent instance lost)."""
        subscription = self.subscription(
            where, handler, name=name, subscriber_id=subscriber_id, stop=stop, on_failure=on_failure
        )
        subscription.run()
        return subscription

    def _call(self, method: str, path: str, **kwargs: Any) -> JSONObject:
        response = self._http.request(method, path, **kwargs)
        if response.is_error:
            raise ApiError.of(response)
        body = response.json()
        if not isinstance(body, dict):
            raise ApiError(response.status_code, "bad_response", "the body is not a JSON object")
        return body
