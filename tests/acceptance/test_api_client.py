"""The SDK's REST methods against a real `sasflow api`: submit (idempotent), get, list across
pages, cancel, resubmit, alerts, and errors as ApiError."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from sasflow.client import ApiError, Client
from tests.acceptance.conftest import Serve
from tests.api.server import make_token

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(60)]


def test_the_sdk_rest_methods(serve: Serve, engine: Engine) -> None:
    secret = make_token(engine, "gina", "submit", "read", "operate")
    with Client(serve("api").base_url, secret) as api:
        made = api.submit("pipeline", {"text": "a"}, key="k-1", priority=5)
        assert made["created"] is True
        again = api.submit("pipeline", {"text": "other"}, key="k-1")
        assert (again["created"], again["id"]) == (False, made["id"])
        runs = [made["id"], *(api.submit("pipeline", {"text": str(i)})["id"] for i in range(4))]

        shown = api.get(made["id"])
        assert (shown["run"]["id"], shown["run"]["priority"]) == (made["id"], 5)
        assert [r["id"] for r in api.list(workflow="pipeline", limit=2)] == sorted(
            runs, reverse=True
        )  # three pages
        assert [r["id"] for r in api.list(state=["pending"], key="k-1")] == [made["id"]]

        assert api.cancel(made["id"], "changed my mind")["state"] == "cancelled"
        assert api.resubmit(made["id"], "try again")["id"] == made["id"]
        assert api.get(made["id"])["run"]["state"] in {"pending", "running"}  # again
        assert api.alerts() == []

        with pytest.raises(ApiError) as missing:
            api.get(10**9)
        assert (missing.value.status, missing.value.code) == (404, "run_not_found")
        with pytest.raises(ApiError) as unknown:
            api.submit("nope", {})
        assert unknown.value.status == 404
        assert "pipeline" in unknown.value.message
