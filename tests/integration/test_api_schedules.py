"""Schedules, schedulers and agents over the HTTP API, served by a real `sasflow api` process
on PostgreSQL and RabbitMQ: the same ops as the CLI, audited with the token's name, 404 for
unknown ids and names, 409 where the ops refuse a state, 403 for a `read` token's action.

Scheduler and agent registrations are written with the store functions the real processes
use (a scheduler registers a lease row, an agent's heartbeat an instance row)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine, select

from sasflow.schedules.definition import Schedule
from sasflow.store.cluster import fleet
from sasflow.store.db import run_transaction
from sasflow.store.schema import audit, runs
from tests.api.cluster import add_schedule, register_scheduler
from tests.api.server import ApiServer, make_token, module_api_fixture
from tests.apps import basic

pytestmark = pytest.mark.integration


api = module_api_fixture()


def _audited(module_engine: Engine, action: str) -> list[tuple[str, str | None]]:
    with module_engine.connect() as conn:
        rows = conn.execute(
            select(audit.c.actor, audit.c.reason).where(audit.c.action == action)
        ).all()
    return [(r.actor, r.reason) for r in rows]


def test_schedules_list_show_pause_resume_trigger(api: ApiServer, module_engine: Engine) -> None:
    added = add_schedule(
        module_engine,
        Schedule("hourly", "pipeline", every=3600, input={"text": "hi"}),
        basic.registry,
    )
    sid = added["id"]
    reader = make_token(module_engine, "sched-reader", "read")
    operator = make_token(module_engine, "sched-operator", "operate", "read")
    with api.client(reader) as http:
        listed = http.get("/v1/schedules").json()["schedules"]
        assert [(s["id"], s["name"], s["paused"]) for s in listed] == [(sid, "hourly", False)]
        by_name = http.get("/v1/schedules/hourly").json()
        assert (by_name["id"], by_name["timing"], by_name["ticks"]) == (sid, "every 3600s", [])
        assert by_name["next_tick_at"] == listed[0]["next_tick_at"]
        assert (by_name["owner"], by_name["owner_name"], by_name["owner_live"]) == (
            None,
            None,
            False,
        )
        missing = http.get("/v1/schedules/nope")
        assert (missing.status_code, missing.json()["error"]) == (404, "schedule_not_found")
        denied = http.post(f"/v1/schedules/{sid}/pause")
        assert (denied.status_code, denied.json()["error"]) == (403, "forbidden")
    with api.client(operator) as http:
        paused = http.post(f"/v1/schedules/{sid}/pause", json={"reason": "maintenance"})
        assert (paused.status_code, paused.json()["paused"]) == (200, True)
        again = http.post(f"/v1/schedules/{sid}/pause")
        assert (again.status_code, again.json()["error"]) == (409, "invalid_action")
        assert "paused already" in again.json()["message"]
        resumed = http.post("/v1/schedules/hourly/resume")
        assert (resumed.status_code, resumed.json()["paused"]) == (200, False)
        not_paused = http.post(f"/v1/schedules/{sid}/resume")
        assert not_paused.status_code == 409
        fired = http.post(f"/v1/schedules/{sid}/trigger", json={"reason": "now"}).json()
        assert fired["run_id"] is not None
        assert http.post("/v1/schedules/nope/trigger").status_code == 404
        unknown_action = http.post(f"/v1/schedules/{sid}/explode")
        assert (unknown_action.status_code, unknown_action.json()["fields"][0]["field"]) == (
            422,
            "path.action",
        )
        bad = http.post(f"/v1/schedules/{sid}/pause", json={"reason": ""})
        assert (bad.status_code, bad.json()["error"]) == (422, "validation_error")
        shown = http.get(f"/v1/schedules/{sid}").json()
    assert [t["run_id"] for t in shown["ticks"]] == [fired["run_id"]]
    assert shown["ticks"][0]["fired_by"] == "sched-operator"
    with module_engine.connect() as conn:
        run = conn.execute(select(runs.c.workflow).where(runs.c.id == fired["run_id"])).one()
    assert run.workflow == "pipeline"
    assert _audited(module_engine, "schedules.pause") == [("sched-operator", "maintenance")]
    assert _audited(module_engine, "schedules.resume") == [("sched-operator", None)]
    assert _audited(module_engine, "schedules.trigger") == [("sched-operator", "now")]


def test_schedulers_cluster_view_drain_undrain(api: ApiServer, module_engine: Engine) -> None:
    register_scheduler(module_engine, "sched-a")
    register_scheduler(module_engine, "sched-scope", assignment="scope")
    reader = make_token(module_engine, "cluster-reader", "read")
    operator = make_token(module_engine, "cluster-operator", "operate", "read")
    with api.client(reader) as http:
        view = http.get("/v1/schedulers").json()
        (mine,) = [s for s in view["schedulers"] if s["name"] == "sched-a"]
        assert (mine["state"], mine["M"], mine["X"], mine["address"]) == (
            "online",
            5,
            0,
            "127.0.0.1:0",
        )
        assert {"K", "S", "N", "lease_age_s", "leader", "epoch", "range"} <= set(mine)
        assert mine["S"] >= 1
        assert view["plan"]["state"] == "none"
        (scoped,) = [s for s in view["schedulers"] if s["name"] == "sched-scope"]
        assert (scoped["leader"], scoped["epoch"], scoped["range"]) == (False, None, "none")
        assert (mine["leader"], mine["epoch"], mine["range"]) == (False, None, None)
        assert http.post("/v1/schedulers/sched-a/drain").status_code == 403
    with api.client(operator) as http:
        drained = http.post("/v1/schedulers/sched-a/drain", json={"reason": "upgrade"})
        assert (drained.status_code, drained.json()["scheduler"]["state"]) == (200, "drained")
        again = http.post("/v1/schedulers/sched-a/drain")
        assert (again.status_code, again.json()["error"]) == (409, "invalid_action")
        unknown = http.post("/v1/schedulers/nobody/drain")
        assert (unknown.status_code, unknown.json()["error"]) == (404, "scheduler_not_found")
        undrained = http.post("/v1/schedulers/sched-a/undrain")
        assert (undrained.status_code, undrained.json()["scheduler"]["state"]) == (200, "online")
        assert http.post("/v1/schedulers/sched-a/undrain").status_code == 409
    assert _audited(module_engine, "schedulers.drain") == [("cluster-operator", "upgrade")]
    assert _audited(module_engine, "schedulers.undrain") == [("cluster-operator", None)]


def test_agents_fleet_view_with_breakers(api: ApiServer, module_engine: Engine) -> None:
    report = fleet.InstanceReport(
        instance_id=uuid.uuid4().hex,
        agent="api-agent",
        hostname="localhost",
        pid=2,
        version="1",
        concurrency=4,
        in_flight=1,
        breakers={"echo": "open"},
        interval_s=60.0,
    )
    run_transaction(module_engine, lambda conn: fleet.record_heartbeats(conn, [report]))
    with api.client(make_token(module_engine, "fleet-reader", "read")) as http:
        schemas = http.get("/openapi.json").json()["components"]["schemas"]
        assert {
            "AgentListResponse",
            "SchedulerListResponse",
            "ScheduleDetailResponse",
            "TriggeredResponse",
        } <= set(schemas)
        found = http.get("/v1/agents", params={"agent": "api-agent"}).json()["agents"]
        assert http.get("/v1/agents", params={"agent": "other"}).json() == {
            "agents": [],
            "paused": [],
        }
    assert [(a["agent"], a["state"], a["breakers"], a["in_flight"]) for a in found] == [
        ("api-agent", "live", {"echo": "open"}, 1)
    ]
    with api.client() as http:
        assert http.get("/v1/agents").status_code == 401
