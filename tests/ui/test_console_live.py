"""The console's live pages, attempt bars, refused forms and phone layout, in headless
Chromium against a real `sasflow api` with a scheduler and an agent on PostgreSQL and
RabbitMQ: a run's page and the runs list change as events are recorded (no reload), a run's
attempts show as bars with durations and errors, a refused form keeps what was typed, a
completed run's resubmit form defaults to a choice that works, a phone shows the State
column; and the live streams keep the session check and never hold up the server's stop."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, Response, expect
from sqlalchemy import Engine, select

from sasflow.ops import registrations, tokens
from sasflow.ops import schedules as schedule_ops
from sasflow.schedules.definition import Schedule
from sasflow.states import RunState
from sasflow.store.db import run_transaction
from sasflow.store.schema import alerts, events
from sasflow.transport.topology import Names
from tests import harness, services
from tests.api.cluster import add_schedule, register_scheduler
from tests.api.server import ApiServer, api_server, make_token
from tests.apps import ops
from tests.ui.conftest import PHONE
from tests.ui.runs import submit as _submit
from tests.ui.runs import wait_state as _wait_state
from tests.ui.test_console import _alert, _operator, _sign_in

pytestmark = [pytest.mark.integration, pytest.mark.ui]

MARK = "window.sasflowNotReloaded = 7"
"""Set on the page before the change: still there after it, the page was not reloaded."""


DURATION = r"(\d+ ms|\d+\.\d\d s)"
"""A duration as the bars write it (under a minute)."""


def _seconds(text: str) -> float:
    value, unit = text.split(" ")
    return float(value) / (1000 if unit == "ms" else 1)


def _not_reloaded(page: Page) -> None:
    assert page.evaluate("window.sasflowNotReloaded") == 7


def test_a_run_page_follows_its_run_live(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    """Opened while step a works, the page turns to completed by itself as the scheduler and
    the agent finish the run: its state, its steps, its attempt bars and its timeline; the
    actions, made for a running run, are said to be stale until reloaded."""
    _, token = _operator(store)
    _sign_in(page, console, token)
    run_id = _submit(store, module_names, services.unique("live"), value=2, delay=2)
    _wait_state(store, run_id, RunState.RUNNING)
    page.goto(f"{console.base_url}/ui/runs/{run_id}")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Run {run_id} running")
    page.evaluate(MARK)
    expect(page.get_by_role("heading", level=1)).to_have_text(
        f"Run {run_id} completed", timeout=20_000
    )
    _not_reloaded(page)
    bars = page.locator("#run-bars tr.attempt")
    expect(bars).to_have_count(2)
    expect(bars.filter(has_text="processed")).to_have_count(2)
    expect(page.locator("#run-events")).to_contain_text("running → completed")
    # the actions stay as loaded (a form may be half typed): the page says they are stale
    expect(page.get_by_role("status")).to_contain_text("The run is now completed")
    expect(page.get_by_role("button", name=f"Cancel run {run_id}")).to_be_visible()
    page.get_by_role("link", name="Reload").click()
    expect(page.get_by_role("button", name=f"Resubmit run {run_id}")).to_be_visible()
    expect(page.get_by_role("button", name=f"Cancel run {run_id}")).to_have_count(0)


def test_the_runs_list_shows_a_new_run_without_reload_and_keeps_ticked_boxes(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    """The list filtered by a key text gains the runs submitted after it was opened; a run
    ticked for a bulk action stays ticked when the rows are replaced."""
    _, token = _operator(store)
    _sign_in(page, console, token)
    tag = services.unique("fresh")
    page.goto(f"{console.base_url}/ui/runs?text={tag}")
    expect(page.get_by_role("cell", name="No run matches.")).to_be_visible()
    page.evaluate(MARK)
    first = _submit(store, module_names, f"{tag}-1", value=1)
    expect(page.get_by_role("link", name=str(first), exact=True)).to_be_visible(timeout=15_000)
    page.get_by_label(f"Select run {first}").check()
    second = _submit(store, module_names, f"{tag}-2", value=1)
    expect(page.get_by_role("link", name=str(second), exact=True)).to_be_visible(timeout=15_000)
    _wait_state(store, second, RunState.COMPLETED)
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name=str(second)))
    expect(row).to_contain_text("completed", timeout=15_000)
    expect(page.get_by_label(f"Select run {first}")).to_be_checked()
    _not_reloaded(page)


def test_the_attempts_show_as_bars_with_durations_and_their_error(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    """Step a works 1 s and succeeds, step b is refused: each attempt is a bar (queued,
    waiting for the agent, executing) with its durations, b's with the agent's error beside
    it."""
    _, token = _operator(store)
    run_id = _submit(store, module_names, services.unique("bars"), value=3, delay=1, fail=True)
    _wait_state(store, run_id, RunState.ERROR)
    _sign_in(page, console, token)
    page.goto(f"{console.base_url}/ui/runs/{run_id}")
    attempts = page.locator("#run-bars tr.attempt")
    expect(attempts).to_have_count(2)
    a, b = attempts.nth(0), attempts.nth(1)
    expect(a.get_by_role("rowheader")).to_have_text("a")
    expect(a.locator(".dur-queued")).to_have_text(re.compile(rf"^queued {DURATION}$"))
    expect(a.locator(".dur-waiting")).to_have_text(re.compile(rf"^waiting {DURATION}$"))
    # step a slept 1 s in the agent; its segment runs from the recorded `started` to the
    # recorded reply, each stamped when the scheduler applied it: about 1 s
    expect(a.locator(".dur-executing")).to_have_text(re.compile(rf"^executing {DURATION}$"))
    executing = _seconds(a.locator(".dur-executing").inner_text().removeprefix("executing "))
    assert 0.5 <= executing <= 5, executing
    label = a.get_by_role("img").get_attribute("aria-label") or ""
    assert re.fullmatch(rf"queued {DURATION}, waiting {DURATION}, executing {DURATION}", label)
    expect(a).to_contain_text("processed")
    expect(b.get_by_role("rowheader")).to_have_text("b")
    expect(b.locator(".attempt-error")).to_have_text("PermanentError: remote refused b")
    expect(b.locator(".seg-executing")).to_have_count(1)
    width = b.locator(".seg-executing").evaluate("el => el.getBoundingClientRect().width")
    assert width > 0


def test_a_refused_form_comes_back_with_what_was_typed(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    """A resubmission with an input that is not JSON, a cancellation whose reason is blank,
    and a sign-in with a wrong token: each page comes back with the typed values and the error
    next to its field; nothing changed."""
    _, token = _operator(store)
    failed = _submit(store, module_names, services.unique("typed"), value=5, fail=True)
    _wait_state(store, failed, RunState.ERROR)
    page.goto(f"{console.base_url}/ui/login?next=/ui/runs/{failed}")
    page.get_by_label("API token").fill("sft_wrong")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("unknown or revoked token")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(rf"/ui/runs/{failed}$"))  # where it was going
    typed = '{"value": 5, "note": "half typed'
    page.get_by_label("From").select_option("b")
    page.get_by_label("Input (JSON object; edit to correct it)").fill(typed)
    page.get_by_label("Reason for resubmitting").fill("customer fixed the address")
    page.get_by_role("button", name=f"Resubmit run {failed}").click()
    field = page.get_by_label("Input (JSON object; edit to correct it)")
    expect(field).to_have_value(typed)
    expect(field).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#input-error")).to_contain_text("not valid JSON")
    expect(page.get_by_label("Reason for resubmitting")).to_have_value("customer fixed the address")
    expect(page.get_by_label("From")).to_have_value("b")
    assert harness.run_states(store)[failed] == RunState.ERROR

    running = _submit(store, module_names, services.unique("typed"), value=1, delay=3)
    _wait_state(store, running, RunState.RUNNING)
    page.goto(f"{console.base_url}/ui/runs/{running}")
    page.get_by_label("Reason for cancelling").fill("   ")  # passes `required`, not the server
    page.get_by_label("Compensate what it did").check()
    page.get_by_role("button", name=f"Cancel run {running}").click()
    expect(page.locator("#cancel-reason-error")).to_have_text("a reason is required")
    expect(page.get_by_label("Compensate what it did")).to_be_checked()
    assert harness.run_states(store)[running] == RunState.RUNNING


def test_a_completed_runs_resubmit_form_default_works(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    """A completed run has no failed step: its form defaults to its first step, so a reason
    alone resubmits it (before, the default was refused with a 409)."""
    name, token = _operator(store)
    run_id = _submit(store, module_names, services.unique("again"), value=4)
    _wait_state(store, run_id, RunState.COMPLETED)
    _sign_in(page, console, token)
    page.goto(f"{console.base_url}/ui/runs/{run_id}")
    expect(page.get_by_label("From")).to_have_value("a")
    page.get_by_label("Reason for resubmitting").fill("replay for the audit")
    page.get_by_role("button", name=f"Resubmit run {run_id}").click()
    expect(page).to_have_url(re.compile(rf"/ui/runs/{run_id}$"))

    def resubmitted() -> list[str]:
        with store.connect() as conn:
            return list(
                conn.execute(
                    select(events.c.actor).where(
                        events.c.run_id == run_id,
                        events.c.reason == "resubmitted: replay for the audit",
                    )
                ).scalars()
            )

    harness.wait_for(lambda: len(resubmitted()) > 0, what="the resubmission's events")
    assert set(resubmitted()) == {name}
    _wait_state(store, run_id, RunState.COMPLETED)


def test_a_phone_shows_the_state_column_and_the_bars(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    """At 390 px the runs table hides its lower-priority columns, never State; a run's bars
    fit the screen."""
    _, token = _operator(store)
    run_id = _submit(store, module_names, services.unique("phone"), value=1, fail=True)
    _wait_state(store, run_id, RunState.ERROR)
    _sign_in(page, console, token)
    page.set_viewport_size(PHONE)
    page.goto(f"{console.base_url}/ui/runs")
    state = page.get_by_role("columnheader", name="State")
    expect(state).to_be_in_viewport()
    box = state.bounding_box()
    assert box is not None
    assert box["x"] + box["width"] <= PHONE["width"]
    expect(page.get_by_role("columnheader", name="Created (UTC)")).to_be_hidden()
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name=str(run_id)))
    expect(row.get_by_text("error", exact=True)).to_be_in_viewport()
    page.goto(f"{console.base_url}/ui/runs/{run_id}")
    bar = page.locator("#run-bars .bar").first
    bar.scroll_into_view_if_needed()
    expect(bar).to_be_in_viewport()
    bar_box = bar.bounding_box()
    assert bar_box is not None
    assert bar_box["x"] + bar_box["width"] <= PHONE["width"]


def test_the_list_pages_refresh_their_table(page: Page, console: ApiServer, store: Engine) -> None:
    """Agents, alerts (incidents and one alert a row, each keeping its query), schedules,
    schedulers and limits re-read their table every 5 s (htmx, its timer run ahead here)."""
    _, token = _operator(store)
    page.clock.install()
    _sign_in(page, console, token)
    for path in (
        "/ui/agents",
        "/ui/alerts",
        "/ui/alerts?all=true",
        "/ui/alerts?view=alerts",
        "/ui/alerts?view=alerts&all=true",
        "/ui/schedules",
        "/ui/schedulers",
        "/ui/limits",
    ):
        page.goto(console.base_url + path)
        expect(page.locator("#live-table")).to_be_visible()
        with page.expect_response(_refresh_of(path), timeout=10_000):
            page.clock.fast_forward(5_000)
        expect(page.locator("#live-table")).to_have_count(1)


def test_the_incidents_list_does_not_refresh_while_an_incident_is_ticked(
    page: Page, console: ApiServer, store: Engine
) -> None:
    """A ticked incident holds the list's refresh (it would untick it), even with the focus
    elsewhere; once unticked, the next 5 s refreshes it."""
    _, token = _operator(store)
    alert = _alert(store, "queue stuck")
    with store.connect() as conn:
        incident = conn.execute(
            select(alerts.c.incident_id).where(alerts.c.id == alert)
        ).scalar_one()
    page.clock.install()
    _sign_in(page, console, token)
    refreshes: list[str] = []
    page.on(
        "request",
        lambda request: (
            refreshes.append(request.url)
            if request.headers.get("hx-request") == "true" and "/ui/alerts" in request.url
            else None
        ),
    )
    page.goto(f"{console.base_url}/ui/alerts")
    box = page.get_by_label(f"Select incident {incident}")
    box.check()
    page.get_by_role("heading", level=1).click()  # the focus leaves the table
    page.clock.fast_forward(5_000)
    expect(box).to_be_checked()
    box.uncheck()
    page.get_by_role("heading", level=1).click()
    with page.expect_response(_refresh_of("/ui/alerts"), timeout=10_000):
        page.clock.fast_forward(5_000)
    assert len(refreshes) == 1, refreshes  # the one after unticking: none while ticked


def _refresh_of(path: str) -> Callable[[Response], bool]:
    """Is this answer htmx's refresh of `path`?"""

    def check(answer: Response) -> bool:
        return (
            answer.url.endswith(path)
            and answer.request.headers.get("hx-request") == "true"
            and answer.ok
        )

    return check


def _signed_in_client(server: ApiServer, token: str) -> httpx.Client:
    """An HTTP client holding a console session (the sign-in form posted with its CSRF)."""
    client = httpx.Client(base_url=server.base_url, timeout=30)
    form = client.get("/ui/login").text
    found = re.search(r'name="csrf" value="([^"]+)"', form)
    assert found is not None
    answer = client.post("/ui/login", data={"csrf": found.group(1), "token": token, "next": "/ui"})
    assert answer.status_code == 303
    return client


def test_a_live_stream_needs_a_session_and_ends_when_its_token_is_revoked(
    console: ApiServer, store: Engine, module_names: Names
) -> None:
    """Without a session the stream is a redirect to the sign-in page; with one it sends the
    list's rows, and once the token is revoked its next re-read ends it."""
    anonymous = httpx.get(f"{console.base_url}/ui/runs/live", follow_redirects=False)
    assert (anonymous.status_code, anonymous.headers["location"]) == (
        303,
        "/ui/login?next=%2Fui%2Fruns%2Flive",
    )
    name = services.unique("revoked")
    token = make_token(store, name, "read")
    tag = services.unique("stream")
    with (
        contextlib.closing(_signed_in_client(console, token)) as client,
        client.stream("GET", f"/ui/runs/live?text={tag}") as stream,
    ):
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        assert next(lines) == "retry: 2000"
        assert next(lines) == ""
        assert next(lines).startswith('data: {"runs-rows": ')  # the page it did not see
        run_transaction(store, lambda conn: tokens.revoke(conn, name, actor="test", reason="x"))
        _submit(store, module_names, f"{tag}-1", value=1)  # an event: the stream re-reads
        rest = _until_end(lines)
    assert rest[-2:] == ["event: end", "data: signed out"]


def _until_end(lines: Iterator[str], within: float = 20) -> list[str]:
    """The lines up to an `end` event's data, or to the first line read after `within`
    seconds (a quiet stream sends a keep-alive every 15 s)."""
    found: list[str] = []
    deadline = time.monotonic() + within
    for line in lines:
        found.append(line)
        if found[-2:-1] == ["event: end"] or time.monotonic() > deadline:
            break
    return found


def test_stopping_the_server_ends_its_live_pages_at_once(
    page: Page,
    tmp_path: Path,
    store: Engine,
    module_database: str,
    module_names: Names,
) -> None:
    """A run's page holds a live stream open; SIGTERM ends it at once, so the server stops
    without waiting out uvicorn's graceful-shutdown timeout."""
    _, token = _operator(store)
    run_id = _submit(store, module_names, services.unique("stop"), value=1)
    with api_server(
        tmp_path,
        database_url=module_database,
        broker_url=services.broker_url(),
        namespace=module_names.namespace,
        app="tests.apps.ops",
        name="stopping",
    ) as server:
        _sign_in(page, server, token)
        with page.expect_response(lambda answer: "/live" in answer.url):
            page.goto(f"{server.base_url}/ui/runs/{run_id}")
        server.process.terminate()
        server.process.wait(15)  # killed after uvicorn's graceful 5 s at worst
    log = server.log_text()
    assert "timeout graceful shutdown exceeded" not in log, log


def test_refused_acknowledgement_and_bulk_forms_keep_the_input(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    """A blank note on an alert, a bulk preview with no run ticked and a bulk confirmation with
    a blank reason: each page comes back with its filter, ticks and text, the error beside."""
    _, token = _operator(store)
    alert = _alert(store, "disk full")
    tag = services.unique("bulkform")
    failed = _submit(store, module_names, f"{tag}-1", value=1, fail=True)
    _wait_state(store, failed, RunState.ERROR)
    _sign_in(page, console, token)
    page.goto(f"{console.base_url}/ui/alerts/{alert}")
    page.get_by_label("Note").fill("  ")
    page.get_by_role("button", name=f"Acknowledge alert #{alert}").click()
    expect(page.locator("#note-error")).to_have_text("a reason is required")
    expect(page.get_by_label("Note")).to_have_value("  ")

    page.goto(f"{console.base_url}/ui/runs?state=error&text={tag}")
    page.get_by_role("button", name="Preview resubmitting the selected runs").click()
    expect(page.locator("#bulk-error")).to_have_text("no run selected: tick the runs first")
    expect(page.get_by_label("Text (key, input, output, errors)")).to_have_value(tag)
    expect(page.get_by_label("error", exact=True)).to_be_checked()
    page.get_by_label(f"Select run {failed}").check()
    page.get_by_role("button", name="Preview resubmitting the selected runs").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Preview: resubmit 1 run(s)")
    page.get_by_label("Reason").fill(" ")
    page.get_by_role("button", name="Resubmit these 1 run(s)").click()
    expect(page.locator("#bulk-reason-error")).to_have_text("a reason is required")
    expect(page.get_by_role("heading", level=1)).to_have_text("Preview: resubmit 1 run(s)")
    expect(page.get_by_role("link", name=str(failed), exact=True)).to_be_visible()
    assert harness.run_states(store)[failed] == RunState.ERROR


def test_refused_bulk_cancel_forms_keep_the_input(
    page: Page, console: ApiServer, store: Engine, module_names: Names
) -> None:
    """A bulk cancel preview with no run ticked comes back as the runs list, its filter and
    compensate box kept; its confirmation with a blank reason as the same preview, the error
    beside the reason; confirmed with a reason, it cancels the run and says so."""
    _, token = _operator(store)
    tag = services.unique("bulkcancel")
    running = _submit(store, module_names, f"{tag}-1", value=1, delay=4)
    _wait_state(store, running, RunState.RUNNING)
    _sign_in(page, console, token)
    page.goto(f"{console.base_url}/ui/runs?state=running&text={tag}")
    page.get_by_label("and compensate what they did").check()
    with page.expect_response(lambda answer: answer.url.endswith("/ui/bulk/cancel/preview")) as got:
        page.get_by_role("button", name="Preview cancelling the selected runs").click()
    assert got.value.status == 400
    expect(page.locator("#bulk-error")).to_have_text("no run selected: tick the runs first")
    expect(page.get_by_label("Text (key, input, output, errors)")).to_have_value(tag)
    expect(page.get_by_label("running", exact=True)).to_be_checked()
    expect(page.get_by_label("and compensate what they did")).to_be_checked()
    page.get_by_label(f"Select run {running}").check()
    page.get_by_role("button", name="Preview cancelling the selected runs").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Preview: cancel 1 run(s)")
    page.get_by_label("Reason for cancelling").fill(" ")
    page.get_by_role("button", name="Cancel these 1 run(s)").click()
    expect(page.locator("#bulk-reason-error")).to_have_text("a reason is required")
    expect(page.get_by_role("heading", level=1)).to_have_text("Preview: cancel 1 run(s)")
    expect(page.get_by_label("Reason for cancelling")).to_have_value(" ")
    assert harness.run_states(store)[running] == RunState.RUNNING
    page.get_by_label("Reason for cancelling").fill("wrong batch")
    page.get_by_role("button", name="Cancel these 1 run(s)").click()
    expect(page.get_by_role("status")).to_contain_text("1 run cancelled")
    assert harness.run_states(store)[running] != RunState.RUNNING


def test_a_refused_schedule_or_scheduler_action_keeps_the_page_and_reason(
    page: Page, console: ApiServer, store: Engine
) -> None:
    """Confirming a pause from a confirmation page opened before the schedule was paused
    meanwhile comes back (409) as that confirmation page, the schedule as it is now, the
    refusal in its form and the reason typed kept; the same for undraining a scheduler
    undrained meanwhile."""
    _, token = _operator(store)
    schedule = add_schedule(
        store, Schedule(services.unique("stale"), "ops", every=3600), ops.registry
    )
    scheduler = services.unique("stale")
    register_scheduler(store, scheduler)
    _sign_in(page, console, token)
    page.goto(f"{console.base_url}/ui/schedules/{schedule['id']}")
    page.get_by_role("button", name=f"Pause {schedule['name']}…").click()
    title = f"Pause schedule {schedule['name']}?"
    expect(page.get_by_role("heading", level=1)).to_have_text(title)
    run_transaction(
        store,
        lambda conn: schedule_ops.set_paused(
            conn, schedule["name"], paused=True, actor="other", reason=None, namespace="x"
        ),
    )
    page.get_by_label("Reason for pausing (optional)").fill("night window")
    pause = f"/ui/schedules/{schedule['id']}/pause"
    with page.expect_response(lambda answer: answer.url.endswith(pause)) as got:
        page.get_by_role("button", name=f"Confirm: pause {schedule['name']}").click()
    assert got.value.status == 409
    expect(page.get_by_role("alert")).to_contain_text("is paused already")
    # the confirmation page again, the schedule as it is now (paused), the text kept
    expect(page.get_by_role("heading", level=1)).to_have_text(title)
    expect(page.locator("dl.facts")).to_contain_text("paused")
    reason = page.get_by_label("Reason for pausing (optional)")
    expect(reason).to_have_value("night window")
    expect(reason).to_have_attribute("aria-describedby", "confirm-error")
    expect(page.get_by_role("link", name="Back, do nothing")).to_have_attribute(
        "href", f"/ui/schedules/{schedule['id']}"
    )

    page.goto(f"{console.base_url}/ui/schedulers")
    row = page.get_by_role("row").filter(has_text=scheduler)
    row.get_by_role("button", name=f"Drain {scheduler}…").click()
    page.get_by_role("button", name=f"Confirm: drain {scheduler}").click()
    expect(page.get_by_role("status")).to_contain_text(f"Scheduler {scheduler} drained")
    expect(row.locator(".state")).to_have_text("drained")
    row.get_by_role("button", name=f"Undrain {scheduler}…").click()
    run_transaction(
        store,
        lambda conn: registrations.undrain(
            conn, scheduler, actor="other", reason=None, namespace="x"
        ),
    )
    page.get_by_label("Reason for undraining (optional)").fill("back from maintenance")
    page.get_by_role("button", name=f"Confirm: undrain {scheduler}").click()
    expect(page.get_by_role("alert")).to_contain_text("is not on the offline list")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Undrain scheduler {scheduler}?")
    expect(page.get_by_label("Reason for undraining (optional)")).to_have_value(
        "back from maintenance"
    )
